"""Call -> (KernelSpec, launch config). Pure Python; the tuning database plugs in here later."""

from __future__ import annotations

import functools

import torch

from attngen.spec import KernelSpec
from attngen.tuning.space import BwdConfig, FwdConfig, default_bwd_config, default_fwd_config

DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16"}


def device_target(device: torch.device) -> str:
    """Kernel target of a device: sm90 for Hopper, sm80 for Ampere/Ada and for the CPU interpreter."""
    if device.type != "cuda":
        return "sm80"
    return _cuda_target(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _cuda_target(index: int) -> str:
    major, minor = torch.cuda.get_device_capability(index)
    if major == 9:
        return "sm90"
    if major >= 8:
        return "sm80"
    raise ValueError(f"attngen needs an sm80+ GPU; {torch.cuda.get_device_name(index)} is "
                     f"sm{major}{minor}")


def device_kind(device: torch.device, interpret: bool) -> str:
    return "cpu" if interpret else device.type


def fwd_config(spec: KernelSpec, kind: str, seqlen_q: int = 0) -> FwdConfig:
    """Launch config for a shape bucket; the tuning database plugs in here."""
    return default_fwd_config(spec, kind, seqlen_q)


def bwd_config(spec: KernelSpec, kind: str) -> BwdConfig:
    return default_bwd_config(spec, kind)
