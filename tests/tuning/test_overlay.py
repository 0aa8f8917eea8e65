"""A user's tuning database overlays the shipped one: the runtime takes a bucket's winner from the
user's database when it has one and from the shipped database otherwise, `attngen db show` lists
both and says where each winner comes from, and `attngen db import` without --storage (an installed
attngen) adds to what ships instead of replacing it."""

from __future__ import annotations

import dataclasses
import json

import pytest

from attngen import env
from attngen.buckets import parse_bucket
from attngen.cli import main
from attngen.configs import FwdConfig
from attngen.db import winners

from tests.tuning.test_winners import URI, write

MINE = FwdConfig(32, 32, 4, 2)
SHIPPED = {"q1024_k1024_bh32": FwdConfig(64, 64, 4, 3), "q8192_k8192_bh32": FwdConfig(128, 64, 8, 2)}


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """An installed attngen: no checkout, the user cache in tmp_path, a shipped database of two
    winners. Returns (the user's database path, the shipped database path)."""
    shipped = tmp_path / "site-packages" / "attngen" / "_tuning_db" / "attngen.sqlite"
    shipped.parent.mkdir(parents=True)
    write(shipped, [(URI, "h1", "fwd", "h100", k, dataclasses.asdict(c)) for k, c in SHIPPED.items()])
    monkeypatch.setattr(env, "in_checkout", lambda: False)
    monkeypatch.setattr(env, "shipped_tuning_db_path", lambda: shipped)
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("ATTNGEN_DB", "ATTNGEN_TUNING_DB"):
        monkeypatch.delenv(name, raising=False)
    winners.reset()
    yield env.user_tuning_db_path(), shipped
    winners.reset()


def test_the_layers_an_installed_attngen_reads(installed):
    user, shipped = installed
    assert env.tuning_db_layers() == [("user", str(user)), ("shipped", str(shipped))]


def test_the_layers_of_a_checkout_and_of_attngen_db(monkeypatch, tmp_path):
    for name in ("ATTNGEN_DB", "ATTNGEN_TUNING_DB"):
        monkeypatch.delenv(name, raising=False)
    shipped = env.REPO_ROOT / "tuning_db" / "attngen.sqlite"
    assert env.tuning_db_layers() == [("shipped", str(shipped))]  # tuning writes that file itself
    monkeypatch.setenv("ATTNGEN_TUNING_DB", str(tmp_path / "mine.sqlite"))
    assert env.tuning_db_layers() == [("user", str(tmp_path / "mine.sqlite")), ("shipped", str(shipped))]
    monkeypatch.setenv("ATTNGEN_DB", str(tmp_path / "only.sqlite"))
    assert env.tuning_db_layers() == [("ATTNGEN_DB", str(tmp_path / "only.sqlite"))]


def test_user_winners_come_first_and_shipped_ones_serve_the_rest(installed):
    user, shipped = installed
    assert winners.find(URI, "h1", "h100", parse_bucket("q1024_k1024_bh32"))[:2] == (
        dataclasses.asdict(SHIPPED["q1024_k1024_bh32"]), "shipped")
    user.parent.mkdir(parents=True)
    write(user, [(URI, "h1", "fwd", "h100", "q1024_k1024_bh32", dataclasses.asdict(MINE))])
    winners.reset()
    assert winners.find(URI, "h1", "h100", parse_bucket("q1024_k1024_bh32")) == (
        dataclasses.asdict(MINE), "user", str(user), "h100")
    assert winners.find(URI, "h1", "h100", parse_bucket("q8192_k8192_bh32")) == (
        dataclasses.asdict(SHIPPED["q8192_k8192_bh32"]), "shipped", str(shipped), "h100")
    assert winners.lookup(URI, "h1", "h100", parse_bucket("q1024_k1024_bh32")) == dataclasses.asdict(MINE)


def test_db_import_adds_to_what_ships_and_db_show_says_where_each_winner_is(installed, tmp_path, capsys):
    user, shipped = installed
    mine = tmp_path / "mine.sqlite"
    write(mine, [(URI, "h1", "fwd", "h100", "q1024_k1024_bh32", dataclasses.asdict(MINE))])
    assert main(["db", "export", "--storage", str(mine), "--out", str(tmp_path / "mine.json")]) == 0
    assert json.loads((tmp_path / "mine.json").read_text())["winners"]
    assert main(["db", "import", str(tmp_path / "mine.json")]) == 0, capsys.readouterr().err
    assert user.exists()
    winners.reset()
    assert winners.find(URI, "h1", "h100", parse_bucket("q1024_k1024_bh32"))[1] == "user"
    assert winners.find(URI, "h1", "h100", parse_bucket("q8192_k8192_bh32"))[1] == "shipped"
    capsys.readouterr()
    assert main(["db", "show"]) == 0
    out = capsys.readouterr().out
    assert f"3 winners in {user} (user) over " in out and " (shipped)" in out, out
    rows = {(line.split("│")[3].strip(), line.split("│")[-2].strip()) for line in out.splitlines()
            if line.startswith("│ attn_")}
    assert rows == {("q1024_k1024_bh32", "user"), ("q1024_k1024_bh32", "shipped (overlaid)"),
                    ("q8192_k8192_bh32", "shipped")}, out
    # the GPU that measured each winner (the trial's device row), beside the class it serves
    gpus = {line.split("│")[-3].strip() for line in out.splitlines() if line.startswith("│ attn_")}
    assert gpus == {"H200"}, out


def test_explain_names_the_class_and_the_database_a_tuned_config_came_from(installed, monkeypatch):
    """On the CPU, with the device answered as an H200's (class h200, target sm90): the call's
    config is the user's h100 winner (the class h200 falls back to), and explain() says so."""
    import torch

    import attngen
    from attngen.buckets import bucket_of
    from attngen.runtime import api, dispatch, loader
    from attngen.spec import KernelSpec

    user, _ = installed
    spec = KernelSpec("fwd", "fp16", "sm90", 128, 128, 4, "causal")
    tuned = FwdConfig(32, 32, 4, 1)
    user.parent.mkdir(parents=True)
    write(user, [(spec.uri, loader.load(spec).KERNEL_HASH, "fwd", "h100", bucket_of(40, 40, 4).key,
                  dataclasses.asdict(tuned))])
    monkeypatch.setattr(dispatch, "device_target", lambda device: "sm90")
    monkeypatch.setattr(dispatch, "device_class", lambda device, interpret: "h200")
    api.clear_plans()
    try:
        q = torch.zeros(1, 4, 40, 128, dtype=torch.float16)
        k = torch.zeros(1, 1, 40, 128, dtype=torch.float16)
        info = attngen.explain(q, k, k, causal=True)
    finally:
        api.clear_plans()
    assert (info["kernel"], info["config_source"], info["device_class"]) == (spec.uri, "tuned", "h200")
    assert info["device"].startswith("h200 (H200): the sm90 kernels")
    assert info["tuned_in"] == f"user: {user} (h100 class)"
    assert info["config"]["block_m"] == 32
