"""Device classes (attngen.devices): every GPU architecture maps to one class and one kernel target,
the names `attngen tune --device` takes resolve to the classes the shipped database uses, and the
runtime maps a GPU through the same table."""

from __future__ import annotations

import sqlite3

import pytest
import torch

from attngen import devices
from attngen.env import REPO_ROOT
from attngen.runtime import dispatch


@pytest.mark.parametrize("capability, name, target", [
    ((8, 0), "a100", "sm80"), ((8, 6), "sm86", "sm80"), ((8, 9), "sm89", "sm80"), ((9, 0), "h100", "sm90"),
])
def test_each_architecture_has_its_class_and_target(capability, name, target):
    assert devices.class_of_capability(*capability) == name
    assert devices.PROFILES[name].target == devices.target_of_capability(*capability) == target


def test_architecture_names_are_aliases_of_the_stored_class_names():
    assert devices.canonical("sm90") == "h100" and devices.canonical("sm80") == "a100"
    assert devices.canonical("sm89") == "sm89" and devices.canonical("auto") == "auto"
    with pytest.raises(ValueError, match="unknown device class 'sm75'"):
        devices.canonical("sm75")


def test_the_shipped_database_uses_class_names():
    con = sqlite3.connect(f"file:{REPO_ROOT / 'tuning_db' / 'attngen.sqlite'}?mode=ro", uri=True)
    try:
        stored = {r[0] for r in con.execute("SELECT DISTINCT device_class FROM attngen_winners")}
    finally:
        con.close()
    assert stored and stored <= set(devices.PROFILES), stored


def test_gpus_outside_every_profile():
    """A newer GPU runs the sm80 kernels under a class of its own (what the runtime's
    device_class says for it and what `attngen tune --device auto` stores winners under); below
    sm80 nothing runs."""
    assert devices.class_of_capability(10, 0) is None
    assert devices.target_of_capability(10, 0) == "sm80"
    assert devices.own_class(10, 0) == "sm100" and devices.own_class(12, 1) == "sm121"
    assert devices.own_class(9, 0) == "h100" and devices.own_class(7, 5) is None
    p = devices.profile(devices.canonical("sm100"))
    assert (p.name, p.target, p.capabilities) == ("sm100", "sm80", ((10, 0),))
    for name in ("sm75", "sm08", "sm1", "sm100x", "b200"):
        with pytest.raises(ValueError, match="unknown device class"):
            devices.canonical(name)
    assert devices.canonical("sm90") == "h100"  # a profile's alias stays its profile
    with pytest.raises(ValueError, match="sm80"):
        devices.target_of_capability(7, 5)
    assert "in no device profile" in devices.describe("sm100")


@pytest.mark.parametrize("capability, gpu, name", [
    ((8, 9), "NVIDIA L40S", "sm89"), ((8, 6), "NVIDIA A10", "sm86"), ((9, 0), "NVIDIA H100 80GB HBM3", "h100"),
    ((9, 0), "NVIDIA H200", "h200"), ((9, 0), "NVIDIA GH200 480GB", "h100"), ((12, 0), "NVIDIA RTX PRO 6000", "sm120"),
])
def test_the_runtime_maps_a_gpu_through_the_same_table(monkeypatch, capability, gpu, name):
    """dispatch.device_class of a CUDA device, with the capability and name queries answered for
    a GPU this machine does not have."""
    monkeypatch.setattr(dispatch, "_capability", lambda index: capability)
    monkeypatch.setattr(dispatch, "_gpu_name", lambda index: gpu)
    assert dispatch.device_class(torch.device("cuda", 0), interpret=False) == name
    assert dispatch.device_class(torch.device("cuda", 0), interpret=True) == devices.CPU_CLASS


def test_a_gpu_models_class_inside_its_architectures():
    """h200: the H200 by name, sm90 kernels, tuned under its own class with h100 behind it; the
    architecture's alias stays h100, and `--device h200` refuses an H100."""
    assert devices.own_class(9, 0, "NVIDIA H200") == "h200"
    assert devices.own_class(9, 0, "NVIDIA H100 80GB HBM3") == devices.own_class(9, 0) == "h100"
    assert devices.class_of_capability(9, 0) == "h100" and devices.canonical("sm90") == "h100"
    assert devices.canonical("h200") == "h200" and devices.PROFILES["h200"].target == "sm90"
    assert devices.lineage("h200") == ("h200", "h100") and devices.lineage("h100") == ("h100",)
    assert devices.lineage("sm120") == ("sm120",)
    assert "use the h100 class's" in devices.describe("h200")

    def info(name):
        return devices.DeviceInfo(name, (9, 0), "570", "12.8", "2.11", "3.6.0")

    assert devices.check_profile(info("NVIDIA H200"), "h200") is None
    assert devices.check_profile(info("NVIDIA H200"), "h100") is None  # the architecture's class
    why = devices.check_profile(info("NVIDIA H100 80GB HBM3"), "h200")
    assert why and "class h100" in why and "--device h200 needs an H200" in why, why
