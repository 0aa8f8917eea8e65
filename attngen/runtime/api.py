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

import functools
from dataclasses import dataclass

import torch

from attngen import env
from attngen.families import family
from attngen.kernels.common import MAX_SEQLEN, MaskArgs, default_scale, mask_kind
from attngen.runtime import dispatch, loader
from attngen.kernels.launch import make_descriptors
from attngen.runtime.plans import CompiledLaunch, PlanCache, aligned
from attngen.spec import MAX_HEAD_DIM, KernelSpec
from attngen.buckets import ShapeBucket, bucket_of
from attngen.configs import pointer_bwd_config, pointer_fwd_config

MIN_HEAD_DIM = 8


def _fail(msg: str) -> None:
    raise ValueError(msg)


def check_tensors(named: dict[str, torch.Tensor], ndim: int, shape_doc: str) -> torch.dtype:
    """Common checks: tensors, same dtype (fp16/bf16), same device, rank."""
    dtype = device = None
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            _fail(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in dispatch.DTYPE_NAMES:
            _fail(f"{name}: unsupported dtype {t.dtype} (attngen kernels take torch.float16 or "
                  f"torch.bfloat16)")
        if t.dim() != ndim:
            _fail(f"{name}: expected {ndim} dims {shape_doc}, got shape {tuple(t.shape)}")
        if dtype is None:
            dtype, device, first = t.dtype, t.device, name
        elif t.dtype != dtype:
            _fail(f"{name}: dtype {t.dtype} differs from {first}'s {dtype}")
        elif t.device != device:
            _fail(f"{name}: on {t.device}, but {first} is on {device}")
    return dtype


def check_head_dims(dqk: int, dk: int, dv: int) -> None:
    if dqk != dk:
        _fail(f"k: head dim {dk} differs from q's {dqk}")
    for name, d in (("q", dqk), ("v", dv)):
        if d > MAX_HEAD_DIM:
            _fail(f"{name}: head dim {d} is above the supported maximum {MAX_HEAD_DIM}")
        if d < MIN_HEAD_DIM:
            _fail(f"{name}: head dim {d} is below the supported minimum {MIN_HEAD_DIM}")


def check_heads(hq: int, hkv: int, hv: int, dqk: int, dk: int, dv: int) -> None:
    if hv != hkv:
        _fail(f"v: {hv} heads, k has {hkv}")
    if hkv == 0 or hq % hkv:
        _fail(f"q: {hq} query heads is not a multiple of the {hkv} KV heads of k/v")
    check_head_dims(dqk, dk, dv)


def check_options(window_size, softcap, scale) -> tuple[int, int]:
    if (not isinstance(window_size, (tuple, list)) or len(window_size) != 2
            or not all(isinstance(w, int) and not isinstance(w, bool) for w in window_size)):
        _fail(f"window_size: expected (left, right) ints, -1 = unbounded; got {window_size!r}")
    if min(window_size) < -1:
        _fail(f"window_size: sides must be >= 0 or -1 (unbounded), got {tuple(window_size)}")
    if not isinstance(softcap, (int, float)) or softcap < 0:
        _fail(f"softcap: must be a number >= 0 (0 = off), got {softcap!r}")
    if scale is not None and (not isinstance(scale, (int, float)) or scale <= 0):
        _fail(f"scale: must be a number > 0 or None, got {scale!r}")
    return int(window_size[0]), int(window_size[1])


def check_alignment(causal_alignment: str) -> bool:
    if causal_alignment not in ("bottom_right", "top_left"):
        _fail(f"causal_alignment: must be 'bottom_right' or 'top_left', got {causal_alignment!r}")
    return causal_alignment == "top_left"



def check_layout(layout) -> None:
    if layout not in ("bhsd", "bshd"):
        _fail(f"layout: must be 'bhsd' or 'bshd', got {layout!r}")


@dataclass(frozen=True)
class Options:
    """A validated call's launch-time values (hashable: part of every plan key)."""

    mask: str  # "none" | "causal" | "sliding_window"
    scale: float
    softcap: float
    window_left: int
    window_right: int
    top_left: bool
    layout: str  # "bhsd" | "bshd" | "packed"

    @property
    def window(self) -> int | None:
        """Keys one query sees at most under a sliding-window mask (None for other masks)."""
        if self.mask != "sliding_window":
            return None
        return self.window_left + self.window_right + 1  # an unbounded side counts UNBOUNDED keys

    @property
    def mask_args(self) -> MaskArgs:
        return MaskArgs(scale=self.scale, softcap=self.softcap, window_left=self.window_left,
                        window_right=self.window_right, align_top_left=self.top_left)


def make_options(head_dim: int, causal, window_size, softcap, scale, causal_alignment, layout) -> Options:
    left, right = check_options(window_size, softcap, scale)
    top_left = check_alignment(causal_alignment)
    mask, wl, wr = mask_kind(bool(causal), (left, right))
    return Options(mask, float(scale) if scale is not None else default_scale(head_dim),
                   float(softcap), wl, wr, top_left, layout)


def dense_views(q, k, v, layout: str):
    """(B, H, S, D) views of the user's tensors (no copies)."""
    if layout == "bshd":
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    return q, k, v


def check_dense(q, k, v, layout: str) -> torch.dtype:
    check_layout(layout)
    dtype = check_tensors({"q": q, "k": k, "v": v}, 4,
                          "(B, H, S, D)" if layout == "bhsd" else "(B, S, H, D)")
    qv, kv, vv = dense_views(q, k, v, layout)
    B, Hq, Sq, D = qv.shape
    Bk, Hkv, Sk, Dk = kv.shape
    Bv, Hv, Sv, Dv = vv.shape
    if Bk != B or Bv != B:
        _fail(f"k, v: batch sizes {Bk}, {Bv} differ from q's {B}")
    if Sv != Sk:
        _fail(f"v: sequence length {Sv} differs from k's {Sk}")
    check_heads(Hq, Hkv, Hv, D, Dk, Dv)
    for name, n in (("q", Sq), ("k", Sk)):
        if n > MAX_SEQLEN:
            _fail(f"{name}: sequence length {n} is above the kernels' maximum {MAX_SEQLEN} (2^30 - "
                  f"1024: their mask bounds are int32); split the sequence into several calls")
    return dtype


def check_device(device: torch.device, interpret: bool) -> None:
    if device.type not in ("cpu", "cuda"):
        _fail(f"q: device {device} is not supported (cuda, or cpu through Triton's interpreter)")
    if device.type == "cpu" and not interpret:
        _fail("q: CPU tensors run through Triton's interpreter, which is off in this process: set "
              "TRITON_INTERPRET=1 before importing attngen/triton, or move the tensors to a GPU")


@functools.lru_cache(maxsize=1024)
def _kernel_spec(*fields) -> KernelSpec:
    return KernelSpec(*fields)


def kernel_spec(family: str, dtype: torch.dtype, device: torch.device, dqk: int, dv: int, gqa: int,
                mask: str, softcap: float, varlen: bool) -> tuple[KernelSpec, bool]:
    """(spec, interpret) for a validated call (plan misses only)."""
    interpret = env.interpreting()
    check_device(device, interpret)
    spec = _kernel_spec(family, dispatch.DTYPE_NAMES[dtype], dispatch.device_target(device), dqk, dv,
                        gqa, mask, softcap > 0, varlen)
    if interpret:
        from attngen.interp import patch_interpreter

        patch_interpreter()
    return spec, interpret


# --------------------------------------------------------------------------------------------------
# plans


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


# the two families an attention call runs, and their launchers (attngen.families registers both)
FWD, BWD = family("fwd"), family("bwd")
fwd_launches, bwd_launches = FWD.launches(), BWD.launches()


def resolve(fam, q, d: Dims, opts: Options, packed: bool):
    """(spec, module, device class, config, config source) of a plan miss of family `fam`."""
    spec, interpret = kernel_spec(fam.name, q.dtype, q.device, d.dqk, d.dv, d.hq // d.hkv, opts.mask,
                                  opts.softcap, packed)
    module = loader.load(spec)
    dev_class = dispatch.device_class(q.device, interpret)
    config, source = dispatch.select_config(spec, module.KERNEL_HASH, dev_class, d.bucket, opts.window)
    return spec, module, dev_class, config, source


HOST_BOUND_WORK = 1 << 22  # Sq x Sk x (batch x heads) classes of a bucket


def host_bound(bucket: ShapeBucket) -> bool:
    """Shapes whose kernel runs for microseconds, where the call's host time is what counts: the
    TMA kernel's four tensor descriptors cost more to build per call (H200: 31 us per warm call vs
    15 us through the pointer kernel, bare launches 11.6 / 6.1 us; B1 H4 S64 hd64,
    benchmarks/results/h200_launch_overhead_2026-11-30.json) than the copy engine saves."""
    return bucket.seqlen_q * bucket.seqlen_k * bucket.batch_heads <= HOST_BOUND_WORK


class ForwardPlan:
    """The forward of one (shapes, strides, dtypes, device, options) key."""

    def __init__(self, q, k, v, opts: Options, cu_q=None, cu_k=None, max_q: int = 0, max_k: int = 0):
        packed = opts.layout == "packed"
        qv, kv, vv = (q, k, v) if packed else dense_views(q, k, v, opts.layout)
        d = Dims.of(qv, kv, vv, packed, cu_q, max_q, max_k)
        if packed:
            self.out_shape, self.lse_shape = (q.shape[0], d.hq, d.dv), (d.hq, q.shape[0])
        else:
            B, sq = qv.shape[0], qv.shape[2]
            self.out_shape = (B, sq, d.hq, d.dv) if opts.layout == "bshd" else (B, d.hq, sq, d.dv)
            self.lse_shape = (B, d.hq, sq)
        bucket = self.bucket = d.bucket
        self.dtype, self.device, self.layout, self.opts = q.dtype, q.device, opts.layout, opts
        self.spec, self.module, self.device_class, self.config, self.config_source = resolve(
            FWD, q, d, opts, packed)
        self.forced = self.config_source == "forced"
        if self.config.tma and host_bound(bucket) and not self.forced:
            # the config the pointer kernel runs (a warp-specialized config names the Triton
            # kernels' tiles it falls back to; the TMA and Gluon knobs off), so the plan and
            # explain() say what launches
            self.config = pointer_fwd_config(self.config, self.spec)
            self.config_source += " (pointer kernel: a host-bound shape)"
        out, lse = self.empty()
        self.launches_spec = fwd_launches(self.module, self.spec, qv, kv, vv, self.out_view(out), lse,
                                          opts.mask_args, self.config, cu_q, cu_k, max_q)
        self.launches = [CompiledLaunch(la, q.device, self.device_class == "cpu")
                         for la in self.launches_spec]
        self.descriptors = self.launches_spec[0].descriptors if self.launches_spec else None
        for la in self.launches_spec:  # a plan must not keep the first call's tensors alive
            la.values = {n: x for n, x in la.values.items() if not isinstance(x, torch.Tensor)}
        # shapes and strides only, to build the pointer kernel's launch should a later call's
        # tensors not be 16-byte aligned for the copy engine
        self._shadows = tuple(None if t is None else torch.empty_strided(
            t.shape, t.stride(), dtype=t.dtype, device="meta") for t in (qv, kv, vv, cu_q, cu_k))
        self._max = (max_q, max_k)
        self._fallback = None
        self._scratch = None

    def empty(self):
        return (torch.empty(self.out_shape, dtype=self.dtype, device=self.device),
                torch.empty(self.lse_shape, dtype=torch.float32, device=self.device))

    def out_view(self, out):
        return out.transpose(1, 2) if self.layout == "bshd" else out

    def run(self, q, k, v, cu_q=None, cu_k=None, want_lse=True):
        """(out, lse); with want_lse=False the kernel writes the LSE into this plan's scratch
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
        ok = aligned(q, k, v, cu_q, cu_k)
        if self.descriptors:
            if not ok:  # the copy engine needs 16-byte aligned bases: the pointer kernel serves
                return self._pointer_plan().run(q, k, v, cu_q, cu_k, want_lse)
            tensors.update(make_descriptors(self.descriptors, tensors))
        for launch in self.launches:
            launch(tensors, ok)
        return out, lse

    def _pointer_plan(self) -> "ForwardPlan":
        if self._fallback is None:
            plan = object.__new__(ForwardPlan)
            plan.__dict__.update(self.__dict__)
            plan.config = pointer_fwd_config(self.config, self.spec)
            qv, kv, vv, cu_q, cu_k = self._shadows
            out = torch.empty(self.out_shape, dtype=self.dtype, device="meta")
            lse = torch.empty(self.lse_shape, dtype=torch.float32, device="meta")
            plan.launches_spec = fwd_launches(self.module, self.spec, qv, kv, vv, self.out_view(out),
                                              lse, self.opts.mask_args, plan.config, cu_q, cu_k,
                                              self._max[0])
            plan.launches = [CompiledLaunch(la, self.device, self.device_class == "cpu")
                             for la in plan.launches_spec]
            plan.descriptors = None
            plan._scratch = None
            self._fallback = plan
        return self._fallback


class BackwardPlan:
    """The backward of one key: preprocess, dK/dV, dQ (or fp32 atomics into a dQ accumulator)."""

    def __init__(self, dout, q, k, v, out, lse, opts: Options, deterministic: bool, cu_q=None,
                 cu_k=None, max_q: int = 0, max_k: int = 0, pointer_only: bool = False):
        packed = opts.layout == "packed"
        d = Dims.of(*((q, k, v) if packed else dense_views(q, k, v, opts.layout)), packed, cu_q,
                    max_q, max_k)
        self.bucket = d.bucket
        self.spec, self.module, self.device_class, self.config, self.config_source = resolve(
            BWD, q, d, opts, packed)
        self.forced = self.config_source == "forced"
        if self.config.tma and (pointer_only or (host_bound(d.bucket) and not self.forced)):
            self.config = pointer_bwd_config(self.config)
            self.config_source += (" (pointer kernels: " + ("a misaligned call)" if pointer_only
                                                            else "a host-bound shape)"))
        self.atomic = self.config.atomic_dq and not deterministic
        dq, dk, dv_, delta, dq_acc = self._buffers(q, k, v, lse)
        views = [t.transpose(1, 2) if opts.layout == "bshd" else t
                 for t in (q, k, v, out, dout, dq_acc, dk, dv_)]
        qv, kv, vv, outv, doutv, dqv, dkv, dvv = views
        launches = bwd_launches(self.module, self.spec, qv, kv, vv, outv, doutv, lse, delta, dqv, dkv,
                                dvv, opts.mask_args, self.config, self.atomic, cu_q, cu_k, max_q, max_k)
        self.launches = [CompiledLaunch(la, q.device, self.device_class == "cpu") for la in launches]
        # the TMA kernels' descriptors, per launch (rebuilt around each call's tensors)
        self.descriptors = [la.descriptors for la in launches]
        # TMA kernels (host or in-kernel descriptors) need 16-byte aligned bases
        self.tma = any(la.descriptors or la.scratch for la in launches)
        self._args = (opts, deterministic, max_q, max_k)
        self._fallback = None

    def _buffers(self, q, k, v, lse):
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        delta = torch.empty(lse.shape, dtype=torch.float32, device=lse.device)
        dq_acc = torch.zeros_like(q, dtype=torch.float32) if self.atomic else dq
        return dq, dk, dv, delta, dq_acc

    def run(self, dout, q, k, v, out, lse, cu_q=None, cu_k=None):
        dq, dk, dv, delta, dq_acc = self._buffers(q, k, v, lse)
        if q.numel() == 0 or k.numel() == 0:
            return dq.zero_(), dk.zero_(), dv.zero_()
        tensors = {"Q": q, "K": k, "V": v, "Out": out, "DO": dout, "DQ": dq_acc, "DK": dk, "DV": dv,
                   "Lse": lse, "Delta": delta, "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k}
        ok = aligned(q, k, v, out, dout, cu_q, cu_k)
        if self.tma:
            if not ok:  # the copy engine needs 16-byte aligned bases: the pointer kernels serve
                if self._fallback is None:
                    opts, det, max_q, max_k = self._args
                    self._fallback = BackwardPlan(dout, q, k, v, out, lse, opts, det, cu_q, cu_k,
                                                  max_q, max_k, pointer_only=True)
                return self._fallback.run(dout, q, k, v, out, lse, cu_q, cu_k)
            for launch, descs in zip(self.launches, self.descriptors):
                launch({**tensors, **make_descriptors(descs, tensors)} if descs else tensors, ok)
        else:
            for launch in self.launches:
                launch(tensors, ok)
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


def plan_launches(plan) -> list[tuple[str, int]]:
    """(kernel, programs) of each launch of a plan, or of the pointer plan it handed its calls to
    (tensors the copy engine cannot take)."""
    return [(la.fn.__name__, la.grid) for la in (getattr(plan, "_fallback", None) or plan).launches]


def launched() -> dict[str, list[tuple[str, int]]]:
    """plan_launches of every plan kept, forward and backward."""
    return {"fwd": [x for p in _FWD.values() for x in plan_launches(p)],
            "bwd": [x for p in _BWD.values() for x in plan_launches(p)]}


def _fwd_key(q, k, v, opts, cu_q, max_q, max_k):
    return (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, q.device, opts,
            None if cu_q is None else cu_q.shape, max_q, max_k, dispatch.override())


def forward_plan(q, k, v, opts: Options, cu_q=None, cu_k=None, max_q=0, max_k=0) -> ForwardPlan:
    key = _fwd_key(q, k, v, opts, cu_q, max_q, max_k)
    plan = _FWD.get(key)
    if plan is None:
        plan = _FWD.put(key, ForwardPlan(q, k, v, opts, cu_q, cu_k, max_q, max_k))
    return plan


def checked_plan(q, k, v, opts: Options, cu_q=None, cu_k=None, max_q=0, max_k=0) -> ForwardPlan:
    """forward_plan of a validated call, packed documents' cu_seqlens values checked first."""
    if opts.layout == "packed":
        check_cu_values(cu_q, cu_k, q.shape[0], k.shape[0], max_q, max_k, q.device)
    return forward_plan(q, k, v, opts, cu_q, cu_k, max_q, max_k)


def forward_impl(q, k, v, opts: Options, cu_q=None, cu_k=None, max_q=0, max_k=0):
    """(out, lse) in the caller's layout; the body of the forward op."""
    return checked_plan(q, k, v, opts, cu_q, cu_k, max_q, max_k).run(q, k, v, cu_q, cu_k)


def backward_impl(dout, q, k, v, out, lse, opts: Options, deterministic: bool, cu_q=None, cu_k=None,
                  max_q=0, max_k=0):
    """(dq, dk, dv); the body of the backward op."""
    if dout.stride() != out.stride():  # e.g. the expanded gradient of out.sum()
        dout = dout.contiguous() if out.is_contiguous() else torch.empty_like(out).copy_(dout)
    key = (dout.stride(), q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(),
           out.stride(), q.dtype, q.device, opts, deterministic,
           None if cu_q is None else cu_q.shape, max_q, max_k, dispatch.override())
    plan = _BWD.get(key)
    if plan is None:
        plan = _BWD.put(key, BackwardPlan(dout, q, k, v, out, lse, opts, deterministic, cu_q, cu_k,
                                          max_q, max_k))
    return plan.run(dout, q, k, v, out, lse, cu_q, cu_k)


def check_cu_seqlens(name: str, cu: torch.Tensor, host: torch.Tensor, total: int,
                     device: torch.device) -> int:
    """Validate cu_seqlens (`host` is its CPU copy); returns the number of documents."""
    if cu.device != device:
        _fail(f"{name}: on {cu.device}, but q is on {device}")
    if int(host[0]) != 0:
        _fail(f"{name}: must start at 0, starts at {int(host[0])}")
    if int(host[-1]) != total:
        _fail(f"{name}: must end at the packed length {total}, ends at {int(host[-1])}")
    if cu.numel() > 1 and bool((host[1:] < host[:-1]).any()):
        i = int((host[1:] < host[:-1]).nonzero()[0])
        _fail(f"{name}: must be non-decreasing, but entry {i + 1} ({int(host[i + 1])}) < entry {i} "
              f"({int(host[i])})")
    return cu.numel() - 1


def _cu_metadata(name: str, cu) -> None:
    if not isinstance(cu, torch.Tensor):
        _fail(f"{name}: expected an int32 torch.Tensor, got {type(cu).__name__}")
    if cu.dtype != torch.int32:
        _fail(f"{name}: must be torch.int32, got {cu.dtype}")
    if cu.dim() != 1 or cu.numel() < 1:
        _fail(f"{name}: must be 1-D with num_docs + 1 entries, got shape {tuple(cu.shape)}")


def _check_cu_values(cu_q, cu_k, Tq, Tk, max_seqlen_q, max_seqlen_k, device) -> None:
    host = torch.cat([cu_q.to(cu_k.device), cu_k]).cpu()  # one device-to-host copy
    host_q, host_k = host[:cu_q.numel()], host[cu_q.numel():]
    check_cu_seqlens("cu_seqlens_q", cu_q, host_q, Tq, device)
    check_cu_seqlens("cu_seqlens_k", cu_k, host_k, Tk, device)
    for name, mx, h in (("max_seqlen_q", max_seqlen_q, host_q), ("max_seqlen_k", max_seqlen_k, host_k)):
        if not isinstance(mx, int) or isinstance(mx, bool) or mx < 0:
            _fail(f"{name}: must be an int >= 0, got {mx!r}")
        lens = h[1:] - h[:-1]
        if lens.numel() and int(lens.max()) > mx:
            _fail(f"{name}: {mx} is below the longest document ({int(lens.max())})")




def check_cu_values(cu_q, cu_k, Tq, Tk, max_seqlen_q, max_seqlen_k, device) -> None:
    """Value checks need the values on the host (a device sync). A training step passes the same
    cu_seqlens to every layer, so a tensor that passed once is not checked again until it is
    modified in place (its version counter moves) or used with other sizes. Runs inside the op's
    implementation, never on a traced path."""
    key = (id(cu_q), id(cu_k), cu_q._version, cu_k._version, Tq, Tk, max_seqlen_q, max_seqlen_k)
    if getattr(cu_q, "_attngen_checked", None) != key or getattr(cu_k, "_attngen_checked", None) != key:
        _check_cu_values(cu_q, cu_k, Tq, Tk, max_seqlen_q, max_seqlen_k, device)
        cu_q._attngen_checked = cu_k._attngen_checked = key


def check_varlen(q, k, v, cu_q, cu_k, max_q, max_k) -> torch.dtype:
    dtype = check_tensors({"q": q, "k": k, "v": v}, 3, "(total, H, D)")
    Tq, Hq, D = q.shape
    Tk, Hkv, Dk = k.shape
    Tv, Hv, Dv = v.shape
    if Tv != Tk:
        _fail(f"v: packed length {Tv} differs from k's {Tk}")
    check_heads(Hq, Hkv, Hv, D, Dk, Dv)
    _cu_metadata("cu_seqlens_q", cu_q)
    _cu_metadata("cu_seqlens_k", cu_k)
    if cu_k.numel() != cu_q.numel():
        _fail(f"cu_seqlens_k: {cu_k.numel() - 1} documents, cu_seqlens_q has {cu_q.numel() - 1}")
    for name, mx in (("max_seqlen_q", max_q), ("max_seqlen_k", max_k)):
        if not isinstance(mx, int) or isinstance(mx, bool) or mx < 0:
            _fail(f"{name}: must be an int >= 0, got {mx!r}")
        if mx > MAX_SEQLEN:
            _fail(f"{name}: {mx} is above the kernels' longest document {MAX_SEQLEN} (2^30 - 1024: "
                  f"their mask bounds are int32); split the document")
    return dtype
