"""Call -> (KernelSpec, launch config). Pure Python: runs on a plan miss only, never per call.

Config order: the tuning database's winner for (kernel, device class, shape bucket), else its
nearest tuned bucket (attngen.tuning.winners), else the family's default table
(attngen.tuning.space). The database is read once per process, lazily.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from attngen.families import family
from attngen.spec import KernelSpec
from attngen.tuning.buckets import ShapeBucket
from attngen.tuning.devices import CPU_CLASS, class_of_capability

DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16"}


def device_target(device: torch.device) -> str:
    """Kernel target of a device: sm90 for Hopper, sm80 for Ampere/Ada and for the CPU interpreter."""
    if device.type != "cuda":
        return "sm80"
    return _capability_target(*_capability(_index(device)))


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def _capability_target(major: int, minor: int) -> str:
    if major == 9:
        return "sm90"
    if major >= 8:
        return "sm80"
    raise ValueError(f"q: attngen needs an sm80+ GPU; this one is sm{major}{minor}")


def device_class(device: torch.device, interpret: bool) -> str:
    """The class tuned configs are stored under: h100 / a100 (attngen.tuning.devices), cpu for the
    interpreter, or sm<cc> for a GPU no profile holds (defaults only)."""
    if interpret or device.type != "cuda":
        return CPU_CLASS
    major, minor = _capability(_index(device))
    return class_of_capability(major, minor) or f"sm{major}{minor}"


def device_kind(device: torch.device, interpret: bool) -> str:
    return "cpu" if interpret else device.type


def select_config(spec: KernelSpec, template_hash: str, dev_class: str, bucket: ShapeBucket):
    """(config, source): source says where it came from ("tuned" or "default")."""
    fam = family(spec.family)
    if dev_class != CPU_CLASS:
        from attngen.tuning import winners  # stdlib sqlite3 only; read once per process

        row = winners.lookup(spec.uri, template_hash, dev_class, bucket)
        if row is not None:
            names = {f.name for f in dataclasses.fields(fam.config)}
            cfg = fam.config(**{k: v for k, v in row.items() if k in names})
            if fam.check(spec, cfg) is None:
                return cfg, "tuned"
    kind = "cpu" if dev_class == CPU_CLASS else "cuda"
    return fam.default(spec, kind, bucket.seqlen_q), "default"
