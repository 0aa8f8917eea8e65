"""Device classes: the GPUs a tuned config is valid for, by architecture, and the kernel target each
runs. Pure Python (no torch calls here); the runtime (attngen.runtime.dispatch) and `attngen tune`
both map a GPU through this table."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceProfile:
    """A device class: the GPUs one set of tuned winners serves, and the kernels they run."""

    name: str  # the device class winners are stored under (the shipped database uses h100 / a100)
    arch: str  # what `attngen tune --device` takes besides the name: sm90, sm80, sm86, sm89
    target: str  # kernel target the class runs (a spec's `targets`): sm90 or sm80
    capabilities: tuple[tuple[int, int], ...]  # CUDA compute capabilities that belong to it
    gpus: str  # examples, for messages and `attngen tune --help`
    # a GPU model's class inside an architecture's class: GPUs whose name has a word in `models`
    # are tuned under it, and their lookups fall back to the parent's winners bucket by bucket
    # (the H200 has the H100's SMs and clocks but 1.4x its memory bandwidth: memory-bound decode
    # picks other split counts there)
    parent: str | None = None
    models: tuple[str, ...] = ()


PROFILES = {p.name: p for p in (
    DeviceProfile("a100", "sm80", "sm80", ((8, 0),), "A100, A30, A800"),
    DeviceProfile("sm86", "sm86", "sm80", ((8, 6),), "A10, A40, RTX 30"),
    DeviceProfile("sm89", "sm89", "sm80", ((8, 9),), "L4, L40S, RTX 40"),
    DeviceProfile("h100", "sm90", "sm90", ((9, 0),), "H100, GH200; H200 without winners of its own"),
    DeviceProfile("h200", "h200", "sm90", ((9, 0),), "H200", parent="h100", models=("H200",)),
)}
AUTO = "auto"  # `attngen tune --device auto`: the class of the GPU tuning runs on
ALIASES = {p.arch: p.name for p in PROFILES.values()  # sm80 -> a100, sm90 -> h100
           if p.arch != p.name and p.parent is None}
DEVICE_CHOICES = (AUTO, *sorted({*PROFILES, *ALIASES}))
CPU_CLASS = "cpu"  # Triton's interpreter: never tuned, its own default table


def canonical(name: str) -> str:
    """The class name for what `--device` was given (sm90 -> h100); auto stays auto, and so does
    the class of a GPU no profile holds (sm100, sm120, ...: see profile())."""
    if name == AUTO or name in PROFILES:
        return name
    if name in ALIASES:
        return ALIASES[name]
    if _capability_of_class(name) is not None:
        return name
    raise ValueError(f"unknown device class {name!r} (known: {', '.join(DEVICE_CHOICES)})")


def _capability_of_class(name: str) -> tuple[int, int] | None:
    """(major, minor) of a class name sm<major><minor> (sm100 -> (10, 0)) outside the profiles,
    sm80 or newer; None for any other name."""
    digits = name[2:] if name.startswith("sm") else ""
    if len(digits) < 2 or not digits.isdigit() or digits[0] == "0":
        return None
    cap = (int(digits[:-1]), int(digits[-1]))
    return cap if cap[0] >= 8 and class_of_capability(*cap) is None else None


def own_class(major: int, minor: int, gpu_name: str = "") -> str | None:
    """The class a GPU is tuned under: its model's (h200: PROFILES' `models` in its name), else
    its architecture's profile's, else sm<major><minor> for an sm80+ GPU no profile holds (a newer
    architecture: it runs the sm80 kernels, and `attngen tune` measures them there under that
    class, which the runtime reads for that GPU); None below sm80."""
    base = class_of_capability(major, minor)
    if base is None:
        return f"sm{major}{minor}" if major >= 8 else None
    for p in PROFILES.values():
        if p.parent == base and _is_model(gpu_name, p):
            return p.name
    return base


def _is_model(gpu_name: str, p: DeviceProfile) -> bool:
    """Whether the GPU's name (torch.cuda.get_device_name: "NVIDIA H200", "NVIDIA H200 NVL") has one
    of the profile's model words; "NVIDIA GH200 480GB" is not an H200."""
    return any(m in gpu_name.split() for m in p.models)


def lineage(name: str) -> tuple[str, ...]:
    """The classes whose winners serve a GPU of class `name`, most specific first: (h200, h100)
    for an H200, (name,) for every other class."""
    out = [name]
    while name in PROFILES and PROFILES[name].parent is not None:
        name = PROFILES[name].parent
        out.append(name)
    return tuple(out)


def profile(name: str) -> DeviceProfile:
    """The profile of a class name (canonical), made up for the class of a GPU no profile holds:
    the sm80 kernels on that one capability. KeyError for an unknown name."""
    if name in PROFILES:
        return PROFILES[name]
    cap = _capability_of_class(name)
    if cap is None:
        raise KeyError(name)
    return DeviceProfile(name, name, "sm80", (cap,), f"sm{cap[0]}{cap[1]} GPUs")


def class_of_capability(major: int, minor: int) -> str | None:
    """The architecture's profile name of a compute capability (never a model's class: own_class
    picks that from the GPU's name), None when no profile holds it."""
    for p in PROFILES.values():
        if p.parent is None and (major, minor) in p.capabilities:
            return p.name
    return None


def target_of_capability(major: int, minor: int) -> str:
    """The kernel target a GPU runs: sm90 on Hopper, sm80 on every other sm8x+ GPU (a GPU in no
    class runs the sm80 kernels with their default configs). ValueError below sm80."""
    if major == 9:
        return "sm90"
    if major >= 8:
        return "sm80"
    raise ValueError(f"attngen needs an sm80+ GPU (Ampere or newer); this one is sm{major}{minor}")


def describe(name: str) -> str:
    """One line on a device class: its GPUs and the kernels it runs."""
    if name == CPU_CLASS:
        return "cpu: Triton's interpreter, default configs (never tuned)"
    p = PROFILES.get(name)
    if p is None:  # sm<cc> of a GPU no profile holds
        return (f"{name}: in no device profile, the sm80 kernels under a class of its own (default "
                f"configs until `attngen tune` runs on such a GPU)")
    if p.parent is not None:
        return (f"{p.name} ({p.gpus}): the {p.target} kernels; buckets without an {p.name} winner "
                f"use the {p.parent} class's")
    return f"{p.name} ({p.arch}: {p.gpus}): the {p.target} kernels"


def no_class_message(gpu_name: str, capability: tuple[int, int]) -> str:
    """Why a GPU older than sm80 has no class (own_class is None only there)."""
    major, minor = capability
    return f"{gpu_name} (sm{major}{minor}) is older than sm80: attngen's kernels need sm80 or newer"


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


def check_profile(info: DeviceInfo, name: str) -> str | None:
    """None when the GPU belongs to the class `attngen tune --device` names, else why not."""
    try:
        p = profile(canonical(name))
    except (ValueError, KeyError):
        return f"unknown device class {name!r} (known: {', '.join(DEVICE_CHOICES)})"
    major, minor = info.capability
    if info.capability in p.capabilities and (not p.models or _is_model(info.gpu_name, p)):
        return None
    have = own_class(major, minor, info.gpu_name)
    needs = ", ".join(f"sm{a}{b}" for a, b in p.capabilities)
    if p.models:
        needs = f"an {' or '.join(p.models)} ({needs})"
    return (f"GPU {info.index} is {info.gpu_name} (sm{major}{minor}, "
            f"{'class ' + have if have else 'older than sm80'}); --device {name} needs {needs} "
            f"({p.gpus}); --device auto picks the GPU's own class")


def busy_gpu(device, ms: float = 300.0) -> None:
    """Keep the GPU busy for about `ms` milliseconds before something is timed. A GPU left idle for
    seconds (a bench row's providers built on the host, torch.compile's first import, the tuner
    compiling configs) clocks down, and the first thing timed after such a pause ran 3-4x slower
    than the same call later in the run (H200: the first decode row, whichever provider came
    first)."""
    import time

    import torch

    src = torch.empty(1 << 26, dtype=torch.int16, device=device)
    dst = torch.empty_like(src)
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        for _ in range(20):
            dst.copy_(src)
        torch.cuda.synchronize(device)
