"""Kernel families, registered in one table: each names its template, its launch-config dataclass,
the validity filter and the default table. Codegen, the runtime, the tuner and the database all look
a family up here, so a new family (Hopper, FP8, split-KV decode) is one row plus its template and
launcher. Pure Python: no torch, triton or jinja2."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from attngen import spec as _spec
from attngen.tuning import space


@dataclass(frozen=True)
class Family:
    name: str
    template: str  # templates/<template>
    config: type  # the frozen launch-config dataclass (tuning/space.py)
    check: Callable  # (KernelSpec, config) -> None | reason it cannot launch
    # (KernelSpec, device_kind, seqlen_q class, window: keys a query sees under a sliding window,
    # or None) -> config
    default: Callable
    kernels: tuple[str, ...]  # the @triton.jit entry points the generated module defines


FAMILIES: dict[str, Family] = {
    "fwd": Family("fwd", "attn_fwd.py.jinja", space.FwdConfig, space.check_fwd,
                  lambda spec, kind, seqlen_q=0, window=None: space.default_fwd_config(spec, kind, seqlen_q),
                  ("_attn_fwd",)),
    "bwd": Family("bwd", "attn_bwd.py.jinja", space.BwdConfig,
                  getattr(space, "check_bwd", lambda spec, cfg: None),
                  lambda spec, kind, seqlen_q=0, window=None: space.default_bwd_config(spec, kind, window),
                  ("_attn_bwd_preprocess", "_attn_bwd_dkdv", "_attn_bwd_dq")),
}
assert set(FAMILIES) == set(_spec.FAMILIES), "spec.FAMILIES and attngen.families disagree"


def family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown kernel family {name!r} (known: {', '.join(FAMILIES)})") from None
