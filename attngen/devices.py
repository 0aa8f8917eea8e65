"""Device classes: the GPUs a tuned config is valid for. Pure Python (no torch calls here)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceProfile:
    name: str  # what `attngen tune --device` takes, and the device class winners are stored under
    target: str  # kernel target of the class (sm90 / sm80)
    capabilities: tuple[tuple[int, int], ...]  # CUDA compute capabilities that belong to it


PROFILES = {
    "h100": DeviceProfile("h100", "sm90", ((9, 0),)),  # H100, H200, GH200
    "a100": DeviceProfile("a100", "sm80", ((8, 0),)),  # A100, A800
}
CPU_CLASS = "cpu"  # Triton's interpreter: never tuned, its own default table


def class_of_capability(major: int, minor: int) -> str | None:
    """The profile name of a compute capability, None when no profile holds it."""
    for p in PROFILES.values():
        if (major, minor) in p.capabilities:
            return p.name
    return None


@dataclass(frozen=True)
class DeviceInfo:
    """What `attngen tune` records with every result: the GPU and the software that measured it
    (attngen.tuning.timing.probe_cuda fills it in)."""

    gpu_name: str
    capability: tuple[int, int]
    driver: str
    cuda_version: str
    torch_version: str
    triton_version: str
    index: int = 0

    def as_record(self, device_class: str) -> dict:
        """The attngen_devices row (attngen.db.store.DEVICE_FIELDS)."""
        return {"device_class": device_class, "gpu_name": self.gpu_name,
                "capability": f"{self.capability[0]}.{self.capability[1]}", "driver": self.driver,
                "cuda_version": self.cuda_version, "torch_version": self.torch_version,
                "triton_version": self.triton_version}


def check_profile(info: DeviceInfo, profile: str) -> str | None:
    """None when the GPU belongs to the profile `attngen tune --device` names, else why not."""
    if profile not in PROFILES:
        return f"unknown device profile {profile!r} (known: {', '.join(PROFILES)})"
    p = PROFILES[profile]
    if info.capability in p.capabilities:
        return None
    major, minor = info.capability
    have = class_of_capability(major, minor)
    caps = ", ".join(f"sm{a}{b}" for a, b in p.capabilities)
    return (f"GPU {info.index} is {info.gpu_name} (sm{major}{minor}, "
            f"{'profile ' + have if have else 'in no profile'}); --device {profile} needs {caps}")
