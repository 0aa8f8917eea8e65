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
