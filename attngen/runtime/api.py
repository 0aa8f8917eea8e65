"""The runtime's plans: validate a call once, keep its launch plan, launch. The entry points
(`attngen.attention` / `attention_varlen`, attngen.runtime.public) and the custom ops
(attngen.runtime.ops) sit above this module; it imports neither.

Three ways in, one implementation:
* eager, no gradient wanted: a plan cache keyed by shapes, strides, dtypes, device and options; a
  hit is one dict lookup, the output allocations and the launches (attngen.runtime.plans);
* eager, a gradient wanted: an autograd Function around the same plans (_EagerAttention);
* inside torch.compile: the `attngen::attention_fwd` / `attention_bwd` custom ops
  (attngen.runtime.ops), whose implementations use the same plans (dispatching a custom op
  eagerly costs more host time than a short call's kernels take on the GPU);
* a miss validates the call (errors name the argument), picks kernel and config
  (attngen.runtime.dispatch) and builds the plan.
Every plan key ends with dispatch.override() (None, or what `forced_target` / `forced_config`
scopes impose): with the device, it fixes the kernel target and any forced config, so a plan never
serves a call of another target or config.
Nothing on the traced path takes a lock, reads the environment or writes tensor attributes.
"""

from __future__ import annotations

import torch

from attngen.families import family
from attngen.runtime import dispatch, kvcache
from attngen.runtime.plan import Dims, Plan, host_bound, plan_launches  # noqa: F401 (re-exported)
from attngen.runtime.plans import PlanCache
from attngen.runtime.validate import Options, check_cu_values, dense_views, output_shapes

# the two families an attention call runs, and their launchers (attngen.families registers both)
FWD, BWD = family("fwd"), family("bwd")
fwd_launches, bwd_launches = FWD.launches(), BWD.launches()


class ForwardPlan(Plan):
    """The forward of one (shapes, strides, dtypes, device, options) key."""

    FAMILY = FWD
    ALIGNED = ("Q", "K", "V", "cu_seqlens_q", "cu_seqlens_k")

    def __init__(self, q, k, v, opts: Options, cu_q=None, cu_k=None, max_q: int = 0, max_k: int = 0,
                 extra: dict | None = None):
        self._extra = extra or {}
        packed = opts.layout == "packed"
        qv, kv, vv = (q, k, v) if packed else dense_views(q, k, v, opts.layout)
        d = Dims.of(qv, kv, vv, packed, cu_q, max_q, max_k)
        self.out_shape, self.lse_shape = output_shapes(q, v, opts.layout)
        self.dtype, self.layout, self.opts = q.dtype, opts.layout, opts
        self.resolve(q, d, opts, packed)
        # shapes and strides only, to build the portable twin should a later call's tensors not be
        # 16-byte aligned for the copy engine
        self._shadows = self.shadows(qv, kv, vv, cu_q, cu_k)
        self._max = (max_q, max_k)
        self._scratch = None
        self.bind(qv, kv, vv, cu_q, cu_k, q.device)

    def bind(self, qv, kv, vv, cu_q, cu_k, device) -> None:
        out = torch.empty(self.out_shape, dtype=self.dtype, device=device)
        lse = torch.empty(self.lse_shape, dtype=torch.float32, device=device)
        self.compile(fwd_launches(self.module, self.spec, qv, kv, vv, self.out_view(out), lse,
                                  self.opts.mask_args, self.config, cu_q, cu_k, self._max[0], extra=self._extra))

    def bind_shadows(self) -> None:
        self._scratch = None
        self.bind(*self._shadows, "meta")

    def empty(self):
        return (torch.empty(self.out_shape, dtype=self.dtype, device=self.device),
                torch.empty(self.lse_shape, dtype=torch.float32, device=self.device))

    def out_view(self, out):
        return out.transpose(1, 2) if self.layout == "bshd" else out

    def run(self, q, k, v, cu_q=None, cu_k=None, want_lse=True, extra=None):
        """(out, lse); extra: the call's expression parameters and sinks by kernel name; with want_lse=False the kernel writes the LSE into this plan's scratch
        buffer (one allocation less per call; calls are stream-ordered, and nobody reads it) and
        the returned lse is that buffer."""
        out = torch.empty(self.out_shape, dtype=self.dtype, device=self.device)
        if want_lse:
            lse = torch.empty(self.lse_shape, dtype=torch.float32, device=self.device)
        else:
            lse = self._scratch
            if lse is None:
                lse = self._scratch = torch.empty(self.lse_shape, dtype=torch.float32, device=self.device)
        tensors = {"Q": q, "K": k, "V": v, "Out": out, "Lse": lse, "cu_seqlens_q": cu_q,
                   "cu_seqlens_k": cu_k}
        if extra:
            tensors.update(extra)
        if not self.launch(tensors):
            return self.portable().run(q, k, v, cu_q, cu_k, want_lse, extra)
        return out, lse


class BackwardPlan(Plan):
    """The backward of one key: preprocess, dK/dV, dQ (or fp32 atomics into a dQ accumulator)."""

    FAMILY = BWD
    ALIGNED = ("Q", "K", "V", "Out", "DO", "cu_seqlens_q", "cu_seqlens_k")

    def __init__(self, dout, q, k, v, out, lse, opts: Options, deterministic: bool, cu_q=None,
                 cu_k=None, max_q: int = 0, max_k: int = 0, pointer_only: bool = False, extra: dict | None = None):
        self._extra = extra or {}
        packed = opts.layout == "packed"
        d = Dims.of(*((q, k, v) if packed else dense_views(q, k, v, opts.layout)), packed, cu_q,
                    max_q, max_k)
        self.opts, self._max = opts, (max_q, max_k)
        self.resolve(q, d, opts, packed, misaligned=pointer_only)
        # learnable expression parameters: their gradient comes from the dQ pass
        self.atomic = self.config.atomic_dq and not deterministic and not self.spec.has_expr
        self._shadows = self.shadows(dout, q, k, v, out, lse, cu_q, cu_k)
        self.bind(dout, q, k, v, out, lse, cu_q, cu_k)

    def bind(self, dout, q, k, v, out, lse, cu_q, cu_k) -> None:
        dq, dk, dv_, delta, dq_acc = self._buffers(q, k, v, lse)
        views = [t.transpose(1, 2) if self.opts.layout == "bshd" else t
                 for t in (q, k, v, out, dout, dq_acc, dk, dv_)]
        qv, kv, vv, outv, doutv, dqv, dkv, dvv = views
        self.compile(bwd_launches(self.module, self.spec, qv, kv, vv, outv, doutv, lse, delta, dqv, dkv,
                                  dvv, self.opts.mask_args, self.config, self.atomic, cu_q, cu_k, *self._max,
                                  extra=self._extra))

    def bind_shadows(self) -> None:
        self.bind(*self._shadows)

    def dq_block_m(self) -> int:
        """The dQ pass's query rows per program (its slots of learnable parameters' partial sums)."""
        plan = getattr(self, "_portable", None) or self
        for la in plan.launches_spec:
            if la.fn.__name__.startswith("_attn_bwd_dq"):
                return la.values["BLOCK_M"]
        return 16

    def _buffers(self, q, k, v, lse):
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        delta = torch.empty(lse.shape, dtype=torch.float32, device=lse.device)
        dq_acc = torch.zeros_like(q, dtype=torch.float32) if self.atomic else dq
        return dq, dk, dv, delta, dq_acc

    def run(self, dout, q, k, v, out, lse, cu_q=None, cu_k=None, extra=None):
        dq, dk, dv, delta, dq_acc = self._buffers(q, k, v, lse)
        if q.numel() == 0 or k.numel() == 0:
            return dq.zero_(), dk.zero_(), dv.zero_()
        tensors = {"Q": q, "K": k, "V": v, "Out": out, "DO": dout, "DQ": dq_acc, "DK": dk, "DV": dv,
                   "Lse": lse, "Delta": delta, "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k}
        if extra:
            tensors.update(extra)
        if not self.launch(tensors):
            return self.portable().run(dout, q, k, v, out, lse, cu_q, cu_k, extra)
        if self.atomic:
            dq.copy_(dq_acc)
        return dq, dk, dv


_FWD = PlanCache()  # implementation-level key -> ForwardPlan
_BWD = PlanCache()
_FAST = PlanCache()  # attention()'s own argument key -> ForwardPlan (the eager no-grad fast path)


def clear_plans() -> None:
    """Forget every plan (compiled kernels stay compiled): tests and benchmarks that look at the
    plans one call builds start from here."""
    _FWD.clear(), _BWD.clear(), _FAST.clear()


def launched() -> dict[str, list[tuple[str, int]]]:
    """plan_launches of every plan kept, forward and backward."""
    return {"fwd": [x for p in _FWD.values() for x in plan_launches(p)],
            "bwd": [x for p in _BWD.values() for x in plan_launches(p)]}


def extra_key(extra: dict | None):
    """The part of a plan key that an expression call's tensors fix (their strides are bound once)."""
    if not extra:
        return None
    return tuple((n, t.shape, t.stride(), t.dtype) for n, t in sorted(extra.items()))


def _fwd_key(q, k, v, opts, cu_q, max_q, max_k, extra=None):
    return (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, q.device, opts,
            None if cu_q is None else cu_q.shape, max_q, max_k, dispatch.override(), extra_key(extra))


def forward_plan(q, k, v, opts: Options, cu_q=None, cu_k=None, max_q=0, max_k=0, extra=None) -> ForwardPlan:
    key = _fwd_key(q, k, v, opts, cu_q, max_q, max_k, extra)
    plan = _FWD.get(key)
    if plan is None:
        if cu_q is None and kvcache.routes_to_decode(q, k, opts):  # a short query on a long KV
            plan = _FWD.put(key, kvcache.DensePlan(q, k, v, opts))
        else:
            plan = _FWD.put(key, ForwardPlan(q, k, v, opts, cu_q, cu_k, max_q, max_k, extra))
    return plan


def checked_plan(q, k, v, opts: Options, cu_q=None, cu_k=None, max_q=0, max_k=0, extra=None) -> ForwardPlan:
    """forward_plan of a validated call, packed documents' cu_seqlens values checked first."""
    if opts.layout == "packed":
        check_cu_values(cu_q, cu_k, q.shape[0], k.shape[0], max_q, max_k, q.device)
    return forward_plan(q, k, v, opts, cu_q, cu_k, max_q, max_k, extra)


def forward_impl(q, k, v, opts: Options, cu_q=None, cu_k=None, max_q=0, max_k=0):
    """(out, lse) in the caller's layout; the body of the forward op."""
    return checked_plan(q, k, v, opts, cu_q, cu_k, max_q, max_k).run(q, k, v, cu_q, cu_k)


def backward_impl(dout, q, k, v, out, lse, opts: Options, deterministic: bool, cu_q=None, cu_k=None,
                  max_q=0, max_k=0, extra=None, want_params=None):
    """(dq, dk, dv); the body of the backward op. An expression call passes its tensors (extra);
    want_params (names of learnable parameters, or None): then (dq, dk, dv, {name: gradient})."""
    if dout.stride() != out.stride():  # e.g. the expanded gradient of out.sum()
        dout = dout.contiguous() if out.is_contiguous() else torch.empty_like(out).copy_(dout)
    key = (dout.stride(), q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(),
           out.stride(), q.dtype, q.device, opts, deterministic,
           None if cu_q is None else cu_q.shape, max_q, max_k, dispatch.override(), extra_key(extra))
    plan = _BWD.get(key)
    if plan is None:
        plan = _BWD.put(key, BackwardPlan(dout, q, k, v, out, lse, opts, deterministic, cu_q, cu_k,
                                          max_q, max_k, extra=extra))
    grads = plan.run(dout, q, k, v, out, lse, cu_q, cu_k, extra)
    return grads if want_params is None else (*grads, plan.dq_block_m())
