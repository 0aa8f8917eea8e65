"""`attngen.attention`: validate a call, pick and load the generated kernel, launch it."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from attngen import env
from attngen.kernels.common import MaskArgs, default_scale, mask_kind
from attngen.kernels.bwd import attn_bwd, attn_bwd_varlen
from attngen.kernels.fwd import attn_fwd, attn_fwd_varlen
from attngen.runtime import dispatch, loader
from attngen.spec import MAX_HEAD_DIM, KernelSpec


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
        if d < 16 or d % 8:
            _fail(f"{name}: head dim {d} must be a multiple of 8, at least 16")


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


@functools.lru_cache(maxsize=1024)
def _kernel_spec(*fields) -> KernelSpec:
    return KernelSpec(*fields)


def kernel_for(family: str, dtype: torch.dtype, device: torch.device, dqk: int, dv: int, gqa: int,
               mask: str, softcap: float, varlen: bool) -> tuple[KernelSpec, bool]:
    """(spec, interpret) for a validated call."""
    interpret = env.interpreting()
    if device.type not in ("cpu", "cuda"):
        _fail(f"q: device {device} is not supported (cuda, or cpu through Triton's interpreter)")
    if device.type == "cpu" and not interpret:
        _fail("q: CPU tensors run through Triton's interpreter, which is off in this process: set "
              "TRITON_INTERPRET=1 before importing attngen/triton, or move the tensors to a GPU")
    spec = _kernel_spec(family, dispatch.DTYPE_NAMES[dtype], dispatch.device_target(device), dqk, dv,
                        gqa, mask, softcap > 0, varlen)
    if interpret and dtype == torch.bfloat16:
        from attngen.interp import patch_bf16_dot

        patch_bf16_dot()
    return spec, interpret


@dataclass(frozen=True)
class _Call:
    """Everything a call decided before launching: one object for forward and backward."""

    spec: KernelSpec  # the forward kernel; backward uses spec.replace(family="bwd")
    mask: MaskArgs
    kind: str  # "cuda" | "cpu" (interpreter): picks the default configs
    deterministic: bool
    max_seqlen_q: int = 0
    max_seqlen_k: int = 0


def _run_forward(q, k, v, cu_q, cu_k, call: _Call, out):
    spec = call.spec
    mod = loader.load(spec)
    if spec.varlen:
        cfg = dispatch.fwd_config(spec, call.kind, call.max_seqlen_q)
        lse = torch.empty((q.shape[1], q.shape[0]), dtype=torch.float32, device=q.device)
        attn_fwd_varlen(mod, spec, q, k, v, out, lse, cu_q, cu_k, call.max_seqlen_q, call.mask, cfg)
    else:
        cfg = dispatch.fwd_config(spec, call.kind, q.shape[2])
        lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
        attn_fwd(mod, spec, q, k, v, out, lse, call.mask, cfg)
    return out, lse


def _apply(q, k, v, cu_q, cu_k, call: _Call, out):
    """Through autograd only when a gradient is wanted (the Function costs tens of microseconds)."""
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _Attention.apply(q, k, v, cu_q, cu_k, call, out)
    return _run_forward(q, k, v, cu_q, cu_k, call, out)


class _Attention(torch.autograd.Function):
    """Dense (B, H, S, D) views or packed (T, H, D) tensors (call.spec.varlen)."""

    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, call: _Call, out):
        out, lse = _run_forward(q, k, v, cu_q, cu_k, call, out)
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
        ctx.call = call
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
        call: _Call = ctx.call
        spec = call.spec.replace(family="bwd")
        mod = loader.load(spec)
        cfg = dispatch.bwd_config(spec, call.kind)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        if spec.varlen:
            attn_bwd_varlen(mod, spec, q, k, v, out, dout, lse, dq, dk, dv, cu_q, cu_k,
                            call.max_seqlen_q, call.max_seqlen_k, call.mask, cfg, call.deterministic)
        else:
            attn_bwd(mod, spec, q, k, v, out, dout, lse, dq, dk, dv, call.mask, cfg,
                     call.deterministic)
        return dq, dk, dv, None, None, None, None


def attention(q, k, v, *, causal=False, window_size=(-1, -1), softcap=0.0, scale=None,
              layout="bhsd", return_lse=False, deterministic=False, causal_alignment="bottom_right"):
    """Scaled dot-product attention through attngen's generated Triton kernels; differentiable.

    q (B, Hq, Sq, D), k/v (B, Hkv, Sk, D) with layout="bhsd" (as SDPA); (B, S, H, D) with
    layout="bshd" (as flash-attn). Returns out in q's layout, and with return_lse also the fp32
    logsumexp (B, Hq, Sq) (not differentiable). window_size=(left, right) as flash-attn, -1 =
    unbounded; causal_alignment "bottom_right" (flash-attn, default) or "top_left" (SDPA) places the
    diagonal when Sq != Sk. deterministic=True makes the backward bitwise reproducible (dQ in its
    own pass instead of atomics). CPU tensors run through Triton's interpreter (slow; for tests).
    """
    if layout not in ("bhsd", "bshd"):
        _fail(f"layout: must be 'bhsd' or 'bshd', got {layout!r}")
    dtype = check_tensors({"q": q, "k": k, "v": v}, 4,
                          "(B, H, S, D)" if layout == "bhsd" else "(B, S, H, D)")
    left, right = check_options(window_size, softcap, scale)
    top_left = check_alignment(causal_alignment)
    if layout == "bshd":
        qv, kv, vv = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    else:
        qv, kv, vv = q, k, v
    B, Hq, Sq, D = qv.shape
    Bk, Hkv, Sk, Dk = kv.shape
    Bv, Hv, Sv, Dv = vv.shape
    if Bk != B or Bv != B:
        _fail(f"k, v: batch sizes {Bk}, {Bv} differ from q's {B}")
    if Sv != Sk:
        _fail(f"v: sequence length {Sv} differs from k's {Sk}")
    check_heads(Hq, Hkv, Hv, D, Dk, Dv)
    mask, wl, wr = mask_kind(bool(causal), (left, right))
    spec, interpret = kernel_for("fwd", dtype, q.device, D, Dv, Hq // Hkv, mask, softcap, False)
    call = _Call(spec=spec, mask=MaskArgs(scale=float(scale) if scale is not None else default_scale(D),
                                          softcap=float(softcap), window_left=wl, window_right=wr,
                                          align_top_left=top_left),
                 kind=dispatch.device_kind(q.device, interpret), deterministic=bool(deterministic))
    if layout == "bshd":
        out = torch.empty((B, Sq, Hq, Dv), dtype=dtype, device=q.device)
        out_v = out.transpose(1, 2)
    else:
        out = out_v = torch.empty((B, Hq, Sq, Dv), dtype=dtype, device=q.device)
    o, lse = _apply(qv, kv, vv, None, None, call, out_v)
    if layout == "bshd":
        o = o.transpose(1, 2)
    return (o, lse) if return_lse else o


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


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                     causal=False, window_size=(-1, -1), softcap=0.0, scale=None,
                     return_lse=False, deterministic=False, causal_alignment="bottom_right"):
    """Attention over packed documents: q (total_q, Hq, D), k/v (total_k, Hkv, D), cu_seqlens int32
    (num_docs + 1) as flash-attn. No token attends across a document boundary, and key blocks of
    other documents are never scheduled. Returns out (total_q, Hq, Dv), with return_lse also the
    fp32 logsumexp (Hq, total_q). Differentiable."""
    dtype = check_tensors({"q": q, "k": k, "v": v}, 3, "(total, H, D)")
    left, right = check_options(window_size, softcap, scale)
    top_left = check_alignment(causal_alignment)
    Tq, Hq, D = q.shape
    Tk, Hkv, Dk = k.shape
    Tv, Hv, Dv = v.shape
    if Tv != Tk:
        _fail(f"v: packed length {Tv} differs from k's {Tk}")
    check_heads(Hq, Hkv, Hv, D, Dk, Dv)
    _cu_metadata("cu_seqlens_q", cu_seqlens_q)
    _cu_metadata("cu_seqlens_k", cu_seqlens_k)
    if cu_seqlens_k.numel() != cu_seqlens_q.numel():
        _fail(f"cu_seqlens_k: {cu_seqlens_k.numel() - 1} documents, cu_seqlens_q has "
              f"{cu_seqlens_q.numel() - 1}")
    # Value checks need the values on the host (a device sync). A training step passes the same
    # cu_seqlens to every layer, so a tensor that passed once is not checked again until it is
    # modified in place (its version counter moves) or used with other sizes.
    key = (id(cu_seqlens_q), id(cu_seqlens_k), cu_seqlens_q._version, cu_seqlens_k._version, Tq, Tk,
           max_seqlen_q, max_seqlen_k)
    if (getattr(cu_seqlens_q, "_attngen_checked", None) != key
            or getattr(cu_seqlens_k, "_attngen_checked", None) != key):
        _check_cu_values(cu_seqlens_q, cu_seqlens_k, Tq, Tk, max_seqlen_q, max_seqlen_k, q.device)
        cu_seqlens_q._attngen_checked = cu_seqlens_k._attngen_checked = key
    mask, wl, wr = mask_kind(bool(causal), (left, right))
    spec, interpret = kernel_for("fwd", dtype, q.device, D, Dv, Hq // Hkv, mask, softcap, True)
    call = _Call(spec=spec, mask=MaskArgs(scale=float(scale) if scale is not None else default_scale(D),
                                          softcap=float(softcap), window_left=wl, window_right=wr,
                                          align_top_left=top_left),
                 kind=dispatch.device_kind(q.device, interpret), deterministic=bool(deterministic),
                 max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)
    out = torch.empty((Tq, Hq, Dv), dtype=dtype, device=q.device)
    o, lse = _apply(q, k, v, cu_seqlens_q, cu_seqlens_k, call, out)
    return (o, lse) if return_lse else o
