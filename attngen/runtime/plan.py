"""The generic plan: one family's launches for one call key, whatever the family.

A plan miss resolves the family's kernel spec, module and config (attngen.runtime.dispatch), then
decides, here and nowhere else in the runtime, which kernels of the family run:
* a config that needs the copy engine (`tma`) on a host-bound shape, or on tensors the copy engine
  cannot address, is replaced by the family's portable config (Family.portable: the pointer
  kernels' tiles, every TMA / Gluon knob off), unless the config was forced;
* a later call whose tensors are not 16-byte aligned runs the plan's portable twin, built once
  from the shapes and strides the plan kept (no tensor of the first call stays alive).
Inside one config, the launcher of the family chooses among its kernels (Gluon -> TMA -> pointer,
attngen.kernels) and every config it launches passes the family's validity filter.

A family's plan is a subclass that says what a call allocates, passes and returns: `bind` (the
launcher's arguments from the call's tensors), `prepare` (a call's name -> tensor dict and its
outputs), `finish`, and ALIGNED (the input names whose alignment decides the copy engine).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from attngen import env
from attngen.buckets import ShapeBucket, bucket_of
from attngen.families.base import Family
from attngen.kernels.launch import CompiledLaunch
from attngen.runtime import dispatch, loader
from attngen.runtime.plans import aligned
from attngen.spec import KernelSpec


@dataclass(frozen=True)
class Dims:
    """What kernel choice and config need from a call's (B, H, S, D) views or packed tensors."""

    hq: int
    hkv: int
    dqk: int
    dv: int
    bucket: ShapeBucket

    @staticmethod
    def of(q, k, v, packed: bool, cu_q=None, max_q: int = 0, max_k: int = 0) -> "Dims":
        if packed:
            hq = q.shape[1]
            return Dims(hq, k.shape[1], q.shape[2], v.shape[2],
                        bucket_of(max(max_q, 1), max(max_k, 1), (cu_q.numel() - 1) * hq))
        B, hq, sq, dqk = q.shape
        return Dims(hq, k.shape[1], dqk, v.shape[3], bucket_of(sq, k.shape[2], B * hq))


def check_device(device: torch.device, interpret: bool) -> None:
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"q: device {device} is not supported (cuda, or cpu through Triton's interpreter)")
    if device.type == "cpu" and not interpret:
        raise ValueError("q: CPU tensors run through Triton's interpreter, which is off in this process: "
                         "set TRITON_INTERPRET=1 before importing attngen/triton, or move the tensors to a GPU")


def kernel_spec(family: str, dtype: torch.dtype, device: torch.device, dqk: int, dv: int, gqa: int,
                mask: str, softcap: float, varlen: bool, kernel: tuple[str, str] | None = None,
                expr=None) -> tuple[KernelSpec, bool]:
    """(spec, interpret) for a validated call (plan misses only). kernel: the spec's (dtype, target)
    when the family fixes them (fp8 kernels: ("fp8_e4m3", "sm90") whatever the inputs and device)."""
    interpret = env.interpreting()
    check_device(device, interpret)
    dtype_name, target = kernel or (dispatch.DTYPE_NAMES[dtype], dispatch.device_target(device))
    fields = (expr.mask_expr, expr.score_expr, expr.params, expr.sinks) if expr is not None else ()
    spec = _kernel_spec(family, dtype_name, target, dqk, dv, gqa, mask, softcap > 0, varlen, *fields)
    if interpret:
        from attngen.interp import patch_interpreter

        patch_interpreter()
    return spec, interpret


@functools.lru_cache(maxsize=1024)
def _kernel_spec(*fields) -> KernelSpec:
    return KernelSpec(*fields)


HOST_BOUND_WORK = 1 << 22  # Sq x Sk x (batch x heads) classes of a bucket


def host_bound(bucket: ShapeBucket) -> bool:
    """Shapes whose kernel runs for microseconds, where the call's host time is what counts: the
    TMA kernel's four tensor descriptors cost more to build per call (H200: 31 us per warm call vs
    15 us through the pointer kernel, bare launches 11.6 / 6.1 us; B1 H4 S64 hd64,
    benchmarks/results/h200_launch_overhead_2026-11-30.json) than the copy engine saves."""
    return bucket.seqlen_q * bucket.seqlen_k * bucket.batch_heads <= HOST_BOUND_WORK


def portable_reason(config, bucket: ShapeBucket, forced: bool, misaligned: bool) -> str | None:
    """Why a plan runs the family's portable (pointer) kernels instead of `config`'s, or None."""
    if not getattr(config, "tma", False):
        return None
    if misaligned:
        return "a misaligned call"
    if host_bound(bucket) and not forced:
        return "a host-bound shape"
    return None


class Plan:
    """One family's launches for one key (see the module docstring). Subclasses set FAMILY,
    ALIGNED and implement bind / prepare / finish."""

    FAMILY: Family
    ALIGNED: tuple[str, ...] = ()
    KERNEL: tuple[str, str] | None = None  # (dtype, target) the family fixes, else the call's

    def resolve(self, q, d: Dims, opts, packed: bool, misaligned: bool = False) -> None:
        """Kernel spec, module, device class and config of this plan (self.spec, .module,
        .device_class, .config, .config_source, .forced, .bucket)."""
        fam = self.FAMILY
        self.spec, interpret = kernel_spec(fam.name, q.dtype, q.device, d.dqk, d.dv, d.hq // d.hkv, opts.mask,
                                           opts.softcap, packed, self.KERNEL, getattr(opts, "expr", None))
        self.module = loader.load(self.spec)
        self.device_class = dispatch.device_class(q.device, interpret)
        self.bucket = d.bucket
        self.config, self.config_source = dispatch.select_config(self.spec, self.module.KERNEL_HASH,
                                                                 self.device_class, d.bucket, opts.window)
        self.forced = self.config_source == "forced"
        why = portable_reason(self.config, d.bucket, self.forced, misaligned)
        if why:
            self.make_portable(why)
        self.device = q.device
        self._portable = None

    def make_portable(self, why: str) -> None:
        self.config = self.FAMILY.portable(self.config, self.spec)
        self.config_source += f" (pointer kernels: {why})"

    def compile(self, launches) -> None:
        """Keep `launches` (attngen.kernels.launch.Launch) as compiled launches, without the
        tensors of the call that built them."""
        self.launches_spec = launches
        # each launch's TMA descriptors are made around each call's tensors by the launch itself
        self.launches = [CompiledLaunch(la, self.device, self.device_class == "cpu") for la in launches]
        # copy-engine kernels (host or in-kernel descriptors) need 16-byte aligned bases
        self.tma = any(la.descriptors or la.scratch for la in launches)
        for la in launches:  # a plan must not keep the first call's tensors alive
            la.values = {n: x for n, x in la.values.items() if not isinstance(x, torch.Tensor)}

    @staticmethod
    def shadows(*tensors):
        """Meta stand-ins (shapes, strides, dtypes) of a call's tensors, to build the portable twin."""
        return tuple(None if t is None else torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
                     for t in tensors)

    def portable(self) -> "Plan":
        """This plan with the family's portable config, for calls the copy engine cannot take."""
        if self._portable is None:
            plan = object.__new__(type(self))
            plan.__dict__.update(self.__dict__)
            plan.make_portable("a misaligned call")
            plan.bind_shadows()
            plan._portable = plan
            self._portable = plan
        return self._portable

    def launch(self, tensors: dict) -> bool:
        """Run the launches on a call's tensors; False (nothing launched) when they need the
        copy engine and the call's tensors are not aligned for it."""
        ok = aligned(*(tensors[n] for n in self.ALIGNED))
        if self.tma and not ok:
            return False
        for launch in self.launches:
            launch(tensors, ok)
        return True

    def bind_shadows(self) -> None:  # pragma: no cover - every family plan defines it
        raise NotImplementedError


def plan_launches(plan) -> list[tuple[str, int]]:
    """(kernel, programs) of each launch of a plan, or of the portable twin it handed its calls to
    (tensors the copy engine cannot take)."""
    return [(la.fn.__name__, la.grid) for la in (getattr(plan, "_portable", None) or plan).launches]
