"""Kernel families, registered in one table: each names its template, its launch-config dataclass,
the validity filter, the default table, the entry points its generated modules
define and the launcher that binds a call to them. Codegen, the runtime, the tuner and the database
all look a family up here, so a new family (FP8, split-KV decode) is one row plus its template and
launcher. Pure Python: no torch, triton or jinja2 (the launcher is imported on first use)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from attngen import spec as _spec
from attngen import configs as space


@dataclass(frozen=True)
class Family:
    name: str
    template: str  # templates/<template>
    config: type  # the frozen launch-config dataclass (attngen/configs.py)
    check: Callable  # (KernelSpec, config) -> None | reason it cannot launch
    # (KernelSpec, device_kind, seqlen_q class, window: keys a query sees under a sliding window,
    # or None) -> config
    default: Callable
    # every JIT entry point a launcher may launch; the first is the portable one every generated
    # module of the family defines (the others exist where the target and head dim have them)
    kernels: tuple[str, ...]
    # "module:function" that turns a call's tensors, mask values and config into its launches
    # (attngen.kernels.launch.Launch); the runtime plans and the tuner's objective call it
    launcher: str
    flop_factor: float  # the work of one call in forward FLOPs (the backward counts 2.5 of them)
    outputs: tuple[str, ...]  # the tensors a call writes, checked by the tuner before a config wins

    def launches(self) -> Callable:
        module, _, name = self.launcher.partition(":")
        return getattr(importlib.import_module(module), name)


FAMILIES: dict[str, Family] = {
    "fwd": Family("fwd", "attn_fwd.py.jinja", space.FwdConfig, space.check_fwd,
                  lambda spec, kind, seqlen_q=0, window=None: space.default_fwd_config(spec, kind, seqlen_q),
                  ("_attn_fwd", "_attn_fwd_tma", "_attn_fwd_ws"),
                  "attngen.kernels.fwd:fwd_launches", 1.0, ("out", "lse")),
    "bwd": Family("bwd", "attn_bwd.py.jinja", space.BwdConfig, space.check_bwd,
                  lambda spec, kind, seqlen_q=0, window=None: space.default_bwd_config(spec, kind, window),
                  ("_attn_bwd_preprocess", "_attn_bwd_dkdv", "_attn_bwd_dq", "_attn_bwd_dkdv_tma",
                   "_attn_bwd_dq_tma", "_attn_bwd_dkdv_ws", "_attn_bwd_dq_ws"),
                  "attngen.kernels.bwd:bwd_launches", 2.5, ("dq", "dk", "dv")),
}
assert set(FAMILIES) == set(_spec.FAMILIES), "spec.FAMILIES and attngen.families disagree"


def family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown kernel family {name!r} (known: {', '.join(FAMILIES)})") from None
