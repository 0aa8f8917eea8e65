"""fp8 attention (the fwd_fp8 family), inference only: `attention(..., precision="fp8")` quantizes
bf16 / fp16 inputs inside the call (the prologue: Q and K rotated by the seeded random Hadamard
rotation when rotate=True, Q, K and V quantized to e4m3 per block of 128 rows, V transposed), and
`attention_fp8` takes tensors already in e4m3 with their descales (FlashAttention-3's convention:
fp32, one per (batch, KV head), or per (batch, head, block of 128 rows)); both run the fp8
attention kernel and return the output in bf16 (or the inputs' dtype).

The plan (Fp8Plan) keeps the prologue's and the attention kernel's launches and the layout of the
fp8 buffers: a call allocates them as one block (the caching allocator's cost) and takes views.
fp8 kernels are sm90 kernels: an sm89 / sm90 GPU (fp8 tensor cores) or the CPU interpreter.
"""

from __future__ import annotations

import torch

from attngen.families import family
from attngen.families import fwd_fp8 as f8
from attngen.runtime import dispatch, validate
from attngen.runtime.plan import Dims, Plan
from attngen.runtime.plans import PlanCache, aligned

FP8 = family("fwd_fp8")
E4M3 = torch.float8_e4m3fn
_PLANS = PlanCache()
_FAST = PlanCache()  # attention(precision="fp8")'s own argument key -> Fp8Plan (its eager fast path)
_FAST_QUANT = PlanCache()  # attention_fp8's own argument key -> (Fp8Plan, (B, Hq, Hkv, Sq, Sk))


def check_fp8_device(device: torch.device) -> None:
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) < (8, 9):
            raise ValueError(f"q: fp8 attention needs fp8 tensor cores (sm89 / sm90: L4, L40S, H100, H200); "
                             f"{device} is sm{major}{minor}")


class Fp8Plan(Plan):
    """The launches of one fp8 call key: the prologue (bf16 / fp16 inputs) and the attention."""

    FAMILY = FP8
    ALIGNED = ()
    KERNEL = ("fp8_e4m3", "sm90")  # the kernel spec's dtype and target, whatever the device

    def __init__(self, q, k, v, opts, cu_q=None, cu_k=None, max_q: int = 0, max_k: int = 0,
                 quantized: bool = False, rotate: bool = True, seed: int = f8.ROTATION_SEED,
                 out_dtype: torch.dtype = torch.bfloat16, descales=None):
        check_fp8_device(q.device)
        packed = opts.layout == "packed"
        self.packed, self.quantized, self.opts = packed, quantized, opts
        qv, kv, vv = (q, k, v) if packed else validate.dense_views(q, k, v, opts.layout)
        d = Dims.of(qv, kv, vv, packed, cu_q, max_q, max_k)
        self.out_shape, self.lse_shape = validate.output_shapes(q, v, opts.layout)
        self.out_dtype, self.max = out_dtype, (max_q, max_k)
        self.resolve(q, d, opts, packed)
        self.device = q.device
        # the rotation's +-1 matrix in the inputs' dtype (None: no rotation, or e4m3 inputs)
        self.rot = f8.rotation(f8.qk_width(self.spec), seed, q.dtype, q.device) if rotate and not quantized else None
        self.bufs_shapes = f8.buffers(self.spec, qv, kv, vv, packed, max_q, max_k, cu_q)
        if quantized:  # the caller's fp8 Q and K are used as they are; V is transposed per call
            self.bufs_shapes = {n: s for n, s in self.bufs_shapes.items() if n == "Vt"}
        self.bufs_layout = f8.alloc_layout(self.bufs_shapes)
        # a call that does not return the LSE writes it into the buffers' allocation, when that
        # has fp32 views already (the descales: not for e4m3 inputs)
        self.bufs_layout_lse = (f8.alloc_layout({**self.bufs_shapes, "Lse": (self.lse_shape, "fp32")})
                                if self.bufs_layout[1] else None)
        out, lse = self.empty()
        self.perm16 = False
        self.copy_v = quantized and not packed  # V^T by the module's copy kernel, in run()
        bufs = self.buffers(qv, kv, vv, descales)
        # bf16 / fp16 dense inputs: the Gluon kernel may quantize Q itself (q16; the prologue then
        # leaves Q out)
        q16 = None if quantized or packed else qv
        attn = f8.fp8_launches(self.module, self.spec, bufs["Q8"], bufs["K8"], bufs["Vt"], bufs["QScale"],
                               bufs["KScale"], bufs["VScale"], self.out_view(out), lse, opts.mask_args,
                               self.config, cu_q, cu_k, max_q, q16=q16, rot=self.rot)
        self.perm16 = f8.key_order16(self.module, attn)  # V^T in the order the attention kernel reads
        self.q_in_kernel = f8.q_in_kernel(attn)
        # the launches take their tensors from one dict a call, by the attention kernel's names:
        # bf16 / fp16 inputs, the prologue (one launch); e4m3 dense inputs, V into V^T by the
        # module's copy kernel (its X / X8 renamed into the dict; packed: transpose_v)
        if not quantized:
            launches = [f8.prologue_launch(self.module, self.spec, qv, kv, vv, bufs, self.rot, cu_q, cu_k, max_q,
                                           max_k, self.perm16, quant_q=not self.q_in_kernel)]
        else:
            launches = [f8.copy_v_launch(self.module, vv, bufs["Vt"], self.perm16)] if self.copy_v else []
        self.compile(launches + attn)
        self.raw = False  # every launch replays through the raw launcher (set after a call)
        if self.copy_v:
            self.launches[0].rename({"X": "v", "X8": "Vt", "cu_seqlens": "cu_seqlens_k"})

    def empty(self):
        return (torch.empty(self.out_shape, dtype=self.out_dtype, device=self.device),
                torch.empty(self.lse_shape, dtype=torch.float32, device=self.device))

    def out_view(self, out):
        return out.transpose(1, 2) if self.opts.layout == "bshd" else out

    def buffers(self, qv, kv, vv, descales) -> dict:
        """The plan-building call's fp8 tensors and descales (buffers()' names), for the launches'
        shapes and strides: the prologue's outputs, or (quantized) the caller's Q8 / K8, the V^T
        buffer (filled by run()) and the descales as (B or docs, heads, blocks) views."""
        bufs = f8.carve(self.bufs_layout, self.device)
        if self.quantized:
            bufs.update(Q8=qv, K8=kv, QScale=descales[0], KScale=descales[1], VScale=descales[2])
        return bufs

    @staticmethod
    def transpose_v(vv, vt) -> None:
        """A caller's packed e4m3 V (T, H, D) into V^T (H, D, T_pad) (keys contiguous, zero
        padding; dense V goes through the copy kernel)."""
        vt[..., :vv.shape[0]].copy_(vv.permute(1, 2, 0))
        vt[..., vv.shape[0]:].view(torch.uint8).zero_()

    def run(self, q, k, v, cu_q=None, cu_k=None, descales=None, want_lse: bool = True):
        """(out, lse) of one call. The launches take only base addresses from the tensors (their
        strides are the plan's), so the caller's tensors and the output go as they are, not as
        (B, H, S, D) views. With want_lse=False the LSE may go into the fp8 buffers' allocation
        (nobody reads it; lse is then None). Once every launch replays through the raw launcher
        (CompiledLaunch.ready), the fp8 buffers go to it as addresses inside their one allocation
        instead of tensor views (seven views cost more host time than both launches)."""
        out = torch.empty(self.out_shape, dtype=self.out_dtype, device=self.device)
        layout = self.bufs_layout if want_lse or self.bufs_layout_lse is None else self.bufs_layout_lse
        # the direct launches need the 16-byte aligned bases the kernels were compiled for: the
        # caller's tensors decide (the buffers and outputs come from torch's allocator)
        ok = aligned(q, k, v, cu_q, cu_k, *descales) if self.quantized else aligned(q, k, v, cu_q, cu_k)
        if self.raw and ok:
            flat = torch.empty(layout[0], dtype=torch.uint8, device=self.device)
            t = f8.addresses(layout, flat.data_ptr())
        else:
            t = f8.carve(layout, self.device)
        lse = t.get("Lse")
        if want_lse or lse is None:
            lse = t["Lse"] = torch.empty(self.lse_shape, dtype=torch.float32, device=self.device)
        if self.quantized:
            if self.copy_v:  # the copy kernel reads the caller's V (its strides are the plan's)
                t["v"] = v
            else:
                self.transpose_v(v, t["Vt"])
            t["Q"], t["K"] = q, k
            t["QScale"], t["KScale"], t["VScale"] = descales
        else:
            t["Q"], t["K"] = t["Q8"], t["K8"]
            t["q"], t["k"], t["v"], t["Rot"] = q, k, v, self.rot
        t["Out"], t["cu_seqlens_q"], t["cu_seqlens_k"] = out, cu_q, cu_k
        for launch in self.launches:
            launch(t, ok)
        if not self.raw:  # packed e4m3 V is transposed into a view: that plan keeps the views
            self.raw = all(la.ready for la in self.launches) and not (self.quantized and not self.copy_v)
        return out, (lse if want_lse else None)

    def bind_shadows(self) -> None:  # no portable twin: the key carries the inputs' alignment
        raise NotImplementedError


_ONES: dict = {}  # device -> a 1-element fp32 1.0 (descale_views of None)


def _ones(device) -> torch.Tensor:
    """The 1.0 the kernels read for a None descale: one tensor per device, made outside
    torch.compile's tracing and CUDA-graph capture (a tensor made there belongs to the traced or
    captured program)."""
    if torch.compiler.is_compiling():
        return torch.ones(1, device=device)
    one = _ONES.get(device)
    if one is None:
        one = torch.ones(1, device=device)
        if not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            _ONES[device] = one
    return one


def descale_views(name: str, d, batch: int, heads: int, kv_heads: int, seqlen: int, device) -> torch.Tensor:
    """A caller's descale as a (batch, heads, blocks) fp32 view: None (1.0), (B, Hkv) (one per KV
    head, FlashAttention-3's convention; Q's is shared by the query heads of a group), (B, heads)
    or per block (B, heads, ceil(S / 128))."""
    blocks = -(-seqlen // f8.SCALE_BLOCK)
    if d is None:
        return _ones(device).as_strided((batch, heads, 1), (0, 0, 0))
    if not isinstance(d, torch.Tensor):
        raise ValueError(f"{name}: expected an fp32 torch.Tensor or None, got {type(d).__name__}")
    if d.dtype != torch.float32:
        raise ValueError(f"{name}: must be torch.float32, got {d.dtype}")
    if d.device != device:
        raise ValueError(f"{name}: on {d.device}, but q is on {device}")
    if d.dim() == 2 and tuple(d.shape) == (batch, kv_heads) and kv_heads != heads:
        d = d.repeat_interleave(heads // kv_heads, dim=1)
    if d.dim() == 2 and tuple(d.shape) == (batch, heads):
        return d.as_strided((batch, heads, 1), (d.stride(0), d.stride(1), 0))  # one per head, any block
    if d.dim() == 3 and tuple(d.shape) == (batch, heads, blocks):
        return d
    raise ValueError(f"{name}: shape {tuple(d.shape)}; expected ({batch}, {kv_heads}) (per KV head), "
                     f"({batch}, {heads}) or ({batch}, {heads}, {blocks}) (per block of {f8.SCALE_BLOCK} rows)")


def descale_key(d):
    """A descale argument's part of attention_fp8's fast-path key (AttributeError: not a tensor,
    the full path says)."""
    return None if d is None else (d.shape, d.stride(), d.dtype, d.device)


def descales_of(dims: tuple, q_descale, k_descale, v_descale, device) -> tuple:
    """attention_fp8's three descales as (batch, heads, blocks) views; dims (B, Hq, Hkv, Sq, Sk)."""
    B, hq, hkv, sq, sk = dims
    return (descale_views("q_descale", q_descale, B, hq, hkv, sq, device),
            descale_views("k_descale", k_descale, B, hkv, hkv, sk, device),
            descale_views("v_descale", v_descale, B, hkv, hkv, sk, device))


def check_precision(precision, rotate) -> bool:
    """True for an fp8 call; None / "default" keep the inputs' precision."""
    if precision not in (None, "default", "fp8"):
        raise ValueError(f"precision: must be None (the inputs' precision) or 'fp8', got {precision!r}")
    if not isinstance(rotate, bool):
        raise ValueError(f"rotate: must be True or False, got {rotate!r}")
    return precision == "fp8"


def no_grad_check(*tensors) -> None:
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        raise ValueError("q: fp8 attention is inference only (no backward); call it under torch.no_grad(), "
                         "or use precision=None for training")


def bases_aligned(q, k) -> bool:
    """q's and k's bases 16-byte aligned: what the copy engine needs to read them (attention_fp8's
    e4m3 q and k, or a 16-bit q the Gluon kernel quantizes itself); part of the plan key and of
    both fast-path keys."""
    return (q.data_ptr() | k.data_ptr()) % 16 == 0


def fp8_plan(q, k, v, opts, cu_q=None, cu_k=None, max_q: int = 0, max_k: int = 0, rotate: bool = True,
             descales=None, out_dtype: torch.dtype | None = None) -> Fp8Plan:
    """The plan of a validated fp8 call: bf16 / fp16 inputs (descales None), or e4m3 ones."""
    quantized = q.dtype == E4M3
    out_dtype = out_dtype or (torch.bfloat16 if quantized else q.dtype)
    # e4m3 inputs go to the kernel as they are, and the Gluon kernel reads a 16-bit q itself when
    # it quantizes Q inside: whether the copy engine can read them (16-byte aligned bases) decides
    # the kernel, so it is part of the key (and of both fast-path keys in runtime.public)
    aligned = bases_aligned(q, k)
    key = (dispatch.override(), aligned, q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype,
           q.device, opts,
           None if cu_q is None else cu_q.shape, max_q, max_k, rotate, out_dtype,
           None if descales is None else tuple((d.shape, d.stride()) for d in descales))
    plan = _PLANS.get(key)
    if plan is None:
        if opts.layout == "packed":
            validate.check_cu_values(cu_q, cu_k, q.shape[0], k.shape[0], max_q, max_k, q.device)
        plan = _PLANS.put(key, Fp8Plan(q, k, v, opts, cu_q, cu_k, max_q, max_k, quantized, rotate,
                                       out_dtype=out_dtype, descales=descales))
    elif opts.layout == "packed":
        validate.check_cu_values(cu_q, cu_k, q.shape[0], k.shape[0], max_q, max_k, q.device)
    return plan


def fp8_impl(q, k, v, opts, cu_q=None, cu_k=None, max_q: int = 0, max_k: int = 0, rotate: bool = True,
             descales=None, out_dtype: torch.dtype | None = None):
    """(out, lse) of a validated fp8 call: bf16 / fp16 inputs (descales None), or e4m3 ones."""
    plan = fp8_plan(q, k, v, opts, cu_q, cu_k, max_q, max_k, rotate, descales, out_dtype)
    return plan.run(q, k, v, cu_q, cu_k, descales)


def check_quantized(q, k, v, layout: str) -> None:
    """attention_fp8's tensors: e4m3, 4-D, Q / K head dims a multiple of 16 (rows 16-byte aligned)."""
    validate.check_layout(layout)
    validate.check_tensors({"q": q, "k": k, "v": v}, 4, "(B, H, S, D)" if layout == "bhsd" else "(B, S, H, D)",
                           dtypes=(E4M3,))
    qv, kv, vv = validate.dense_views(q, k, v, layout)
    if kv.shape[0] != qv.shape[0] or vv.shape[0] != qv.shape[0]:
        raise ValueError(f"k, v: batch sizes {kv.shape[0]}, {vv.shape[0]} differ from q's {qv.shape[0]}")
    if vv.shape[2] != kv.shape[2]:
        raise ValueError(f"v: sequence length {vv.shape[2]} differs from k's {kv.shape[2]}")
    validate.check_heads(qv.shape[1], kv.shape[1], vv.shape[1], qv.shape[3], kv.shape[3], vv.shape[3])
    if qv.shape[3] % 16:
        raise ValueError(f"q: head dim {qv.shape[3]} must be a multiple of 16 for e4m3 inputs (pad Q and K "
                         "with zero columns; Q.K^T is unchanged)")
    for name, t in (("q", qv), ("k", kv)):
        if t.stride(3) != 1:
            raise ValueError(f"{name}: the head dim must be contiguous (stride 1), got strides {tuple(t.stride())}")
