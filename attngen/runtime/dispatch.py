"""Call -> (KernelSpec, launch config). Pure Python: runs on a plan miss only, never per call.

The kernel target is the device's own (sm90 on Hopper, sm80 on Ampere/Ada and the CPU interpreter)
unless a `forced_target(...)` scope says otherwise; the plan caches key on that override
(`override()`), so a plan made under one target is never reused under another.

Config order: a `forced_config` scope's config, then the tuning database's winner for (kernel, device class, shape bucket), else its
nearest tuned bucket (attngen.db.winners; a GPU model's class, h200, falls back to its parent's
winners bucket by bucket), else the family's default table
(attngen.configs). The database is read once per process, lazily.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Iterator

import torch

from attngen import env
from attngen.families import family
from attngen.spec import TARGETS, KernelSpec
from attngen.buckets import ShapeBucket
from attngen.devices import CPU_CLASS, own_class, target_of_capability
from attngen.kernels.launch import capability as _capability

DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16"}


_forced: str | None = None  # the target of the innermost forced_target scope (process-wide)
# family -> the config of the innermost forced_config scope that names it (process-wide)
_forced_configs: dict[str, object] = {}


def override():
    """The target a `forced_target` scope imposes (None outside one), paired with the configs of
    the `forced_config` scopes when there are any. Part of every plan-cache key."""
    if not _forced_configs:
        return _forced
    return _forced, tuple(sorted(_forced_configs.items()))


@contextlib.contextmanager
def forced_config(**configs) -> Iterator[None]:
    """Within this scope, plans of the named families run the given configs instead of the tuned
    or default ones: `forced_config(fwd=FwdConfig(...), bwd=BwdConfig(...))`. This is how the
    correctness grids force every kernel path the dispatcher can choose (pointer, TMA, Gluon,
    persistent, each knob). A forced config must pass the family's validity filter for the call's
    kernel (else a ValueError with the filter's reason); the plan's own downgrade for host-bound
    shapes is skipped, while the launchers' fallbacks for calls a kernel cannot take (tensors the
    copy engine cannot address, 64-bit offsets) stay. Process-wide, restored on exit, nests."""
    for name, cfg in configs.items():
        fam = family(name)
        if not isinstance(cfg, fam.config):
            raise ValueError(f"{name}: expected a {fam.config.__name__}, got {type(cfg).__name__}")
    before = dict(_forced_configs)
    _forced_configs.update(configs)
    try:
        yield
    finally:
        _forced_configs.clear()
        _forced_configs.update(before)


@contextlib.contextmanager
def forced_target(target: str) -> Iterator[None]:
    """Within this scope, calls that build a plan use `target`'s kernel family instead of the
    device's own: e.g. `forced_target("sm80")` runs the sm80 family (pointer kernels) on a Hopper
    GPU, as `attngen bench`'s `attngen-sm80` provider does. Process-wide (not per thread: the
    autograd engine runs backwards on threads of its own), restored on exit, exceptions included;
    nests. Plans are cached per override, so warm calls stay one lookup and never cross targets.
    "sm90" needs an sm90 GPU (or the CPU interpreter)."""
    global _forced
    if target not in TARGETS:
        raise ValueError(f"target: must be one of {', '.join(TARGETS)}, got {target!r}")
    before, _forced = _forced, target
    try:
        yield
    finally:
        _forced = before


def native_target(device: torch.device) -> str:
    """Kernel target of the device itself: sm90 for Hopper, sm80 for Ampere/Ada and for the CPU
    interpreter."""
    if device.type != "cuda":
        return "sm80"
    return _capability_target(*_capability(_index(device)))


def device_target(device: torch.device) -> str:
    """Kernel target of a call on `device`: the forced_target scope's, else native_target's."""
    native = native_target(device)
    if _forced is None or _forced == native:
        return native
    if _forced == "sm90" and device.type == "cuda":
        raise ValueError(f"q: forced_target('sm90') needs an sm90 GPU; {device} is {native}-family")
    return _forced


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def _capability_target(major: int, minor: int) -> str:
    try:
        return target_of_capability(major, minor)
    except ValueError as exc:
        raise ValueError(f"q: {exc}") from None


@functools.lru_cache(maxsize=None)
def _gpu_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


def device_class(device: torch.device, interpret: bool) -> str:
    """The class tuned configs are stored under (attngen.devices.PROFILES: a100 = sm80, sm86, sm89,
    h100 = sm90, h200 = an H200, whose lookups fall back to h100's winners), cpu for the
    interpreter, or sm<cc> for a newer GPU no profile holds (the sm80 kernels: default configs, or
    what `attngen tune` stored under that class)."""
    if interpret or device.type != "cuda":
        return CPU_CLASS
    index = _index(device)
    major, minor = _capability(index)
    return own_class(major, minor, _gpu_name(index)) or f"sm{major}{minor}"


def device_kind(device: torch.device, interpret: bool) -> str:
    return "cpu" if interpret else device.type


def select_config(spec: KernelSpec, kernel_hash: str, dev_class: str, bucket: ShapeBucket,
                  window: int | None = None):
    """(config, source): source says where it came from ("tuned" or "default"). `window`: the keys
    one query sees at most under a sliding-window mask (the default table's tiles depend on it)."""
    fam = family(spec.family)
    forced = _forced_configs.get(spec.family)
    if forced is not None:
        why = fam.check(spec, forced)
        if why is not None:
            raise ValueError(f"forced_config({spec.family}=...): {forced} cannot launch {spec.uri}: {why}")
        return forced, "forced"
    host_only = fam.host_descriptors is not None and not env.kernel_descriptors()
    if dev_class != CPU_CLASS:
        from attngen.db import winners  # stdlib sqlite3 only; read once per process

        row = winners.lookup(spec.uri, kernel_hash, dev_class, bucket)
        if row is not None:
            names = {f.name for f in dataclasses.fields(fam.config)}
            cfg = fam.config(**{k: v for k, v in row.items() if k in names})
            if fam.check(spec, cfg) is None:
                return (fam.host_descriptors(cfg, spec), "tuned") if host_only else (cfg, "tuned")
    kind = "cpu" if dev_class == CPU_CLASS else "cuda"
    cfg = fam.default(spec, kind, bucket.seqlen_q, window)
    return (fam.host_descriptors(cfg, spec) if host_only else cfg), "default"
