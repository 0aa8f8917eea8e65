"""`attngen::attention_fwd` / `attngen::attention_bwd`: torch.library custom ops with fake-tensor
implementations and registered autograd, so that torch.compile(fullgraph=True) traces attention as
one opaque node (forward and backward) and CUDA graphs capture its launches. Their implementations
are the runtime's plan-cached forward_impl / backward_impl; nothing here runs while tracing."""

from __future__ import annotations

from typing import List, Optional

import torch

from attngen.families.decode import Rotary
from attngen.runtime import api, exprs, fp8, kvcache, prefill, validate


def _opts(scale, softcap, window_left, window_right, mask, top_left, layout) -> "validate.Options":
    return validate.Options(mask, scale, softcap, window_left, window_right, top_left, layout)


@torch.library.custom_op("attngen::attention_fwd", mutates_args=())
def _fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: Optional[torch.Tensor],
         cu_seqlens_k: Optional[torch.Tensor], max_seqlen_q: int, max_seqlen_k: int, scale: float,
         softcap: float, window_left: int, window_right: int, mask: str, top_left: bool, layout: str,
         deterministic: bool) -> tuple[torch.Tensor, torch.Tensor]:
    opts = _opts(scale, softcap, window_left, window_right, mask, top_left, layout)
    return api.forward_impl(q, k, v, opts, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)


@_fwd.register_fake
def _fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, softcap,
              window_left, window_right, mask, top_left, layout, deterministic):
    out_shape, lse_shape = validate.output_shapes(q, v, layout)
    return q.new_empty(out_shape), q.new_empty(lse_shape, dtype=torch.float32)


@torch.library.custom_op("attngen::attention_bwd", mutates_args=())
def _bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
         lse: torch.Tensor, cu_seqlens_q: Optional[torch.Tensor], cu_seqlens_k: Optional[torch.Tensor],
         max_seqlen_q: int, max_seqlen_k: int, scale: float, softcap: float, window_left: int,
         window_right: int, mask: str, top_left: bool, layout: str,
         deterministic: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    opts = _opts(scale, softcap, window_left, window_right, mask, top_left, layout)
    return api.backward_impl(dout, q, k, v, out, lse, opts, deterministic, cu_seqlens_q,
                             cu_seqlens_k, max_seqlen_q, max_seqlen_k)


@_bwd.register_fake
def _bwd_fake(dout, q, k, v, out, lse, *args):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    (q, k, v, cu_q, cu_k, max_q, max_k, scale, softcap, wl, wr, mask, top_left, layout,
     deterministic) = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
    ctx.args = (max_q, max_k, scale, softcap, wl, wr, mask, top_left, layout, deterministic)
    ctx.mark_non_differentiable(lse)


def _backward(ctx, dout, _dlse):
    q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
    dq, dk, dv = _bwd(dout, q, k, v, out, lse, cu_q, cu_k, *ctx.args)
    return dq, dk, dv, None, None, None, None, None, None, None, None, None, None, None, None


torch.library.register_autograd("attngen::attention_fwd", _backward, setup_context=_setup_context)


def attention_fwd(q, k, v, cu_q, cu_k, max_q: int, max_k: int, opts: "validate.Options", deterministic: bool):
    return _fwd(q, k, v, cu_q, cu_k, max_q, max_k, opts.scale, opts.softcap, opts.window_left,
                opts.window_right, opts.mask, opts.top_left, opts.layout, deterministic)


@torch.library.custom_op("attngen::attention_kvcache", mutates_args=("k_cache", "v_cache"))
def _kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: Optional[torch.Tensor],
             k: Optional[torch.Tensor], v: Optional[torch.Tensor], block_table: Optional[torch.Tensor],
             scale: float, softcap: float, window_left: int, window_right: int, mask: str,
             new_len: int, num_splits: int, params: List[torch.Tensor], k_descale: Optional[torch.Tensor] = None,
             v_descale: Optional[torch.Tensor] = None, validate: bool = False,
             cache_batch_idx: Optional[torch.Tensor] = None, cache_leftpad: Optional[torch.Tensor] = None,
             rotary_cos: Optional[torch.Tensor] = None, rotary_sin: Optional[torch.Tensor] = None,
             rotary_interleaved: bool = True, sinks: Optional[torch.Tensor] = None, names: str = "",
             mask_expr: str = "", score_expr: str = "") -> tuple[torch.Tensor, torch.Tensor]:
    opts = _opts(scale, softcap, window_left, window_right, mask, False, "bshd")
    rotary = None if rotary_cos is None else Rotary(rotary_cos, rotary_sin, rotary_interleaved, mask != "none")
    extra = None
    if mask_expr or score_expr or sinks is not None or names:  # expressions as text (attention_kvcache)
        opts, extra, _ = exprs.expr_options(q, q.shape[2], opts, mask_expr or None, score_expr or None, sinks,
                                            dict(zip(names.split(",") if names else [], params)), set())
    return kvcache.kvcache_impl(q, k_cache, v_cache, cache_seqlens, k, v, block_table, opts, new_len, num_splits,
                                k_descale, v_descale, validate, extra, (cache_batch_idx, cache_leftpad), rotary)


@_kvcache.register_fake
def _kvcache_fake(q, k_cache, v_cache, cache_seqlens, k, v, block_table, *args):
    B, sq, hq, _ = q.shape
    return q.new_empty(B, sq, hq, v_cache.shape[3]), q.new_empty(B, hq, sq, dtype=torch.float32)


def _text_only(mask_text, score_text) -> None:
    for name, fn in (("mask_mod", mask_text), ("score_mod", score_text)):
        if fn is not None and not isinstance(fn, str):
            raise ValueError(f"{name}: inside torch.compile attngen takes expressions as text (a Python "
                             "callable is traced outside the compiled region: attngen.trace_mask_mod / "
                             "trace_score_mod give its text and tensors)")


def attention_kvcache(q, k_cache, v_cache, cache_seqlens, k, v, block_table, opts, new_len: int, num_splits: int,
                      k_descale=None, v_descale=None, validate: bool = False, indices=(None, None), rotary=None,
                      sinks=None, params=None, mask_text=None, score_text=None):
    """The custom op's call. Expressions (mask_text / score_text) only as text: a Python callable
    cannot be traced inside torch.compile (attngen.trace_mask_mod / trace_score_mod give its text
    and tensors outside the compiled region)."""
    _text_only(mask_text, score_text)
    cos, sin, interleaved = rotary[:3] if rotary else (None, None, True)
    names = sorted(params or {})
    return _kvcache(q, k_cache, v_cache, cache_seqlens, k, v, block_table, opts.scale, opts.softcap,
                    opts.window_left, opts.window_right, opts.mask, new_len, num_splits, [params[n] for n in names],
                    k_descale, v_descale, validate, *indices, cos, sin, interleaved, sinks, ",".join(names),
                    mask_text or "", score_text or "")


@torch.library.custom_op("attngen::attention_prefill_paged", mutates_args=())
def _prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
             cu_seqlens_k: Optional[torch.Tensor], max_seqlen_q: int, max_seqlen_k: int, block_table: torch.Tensor,
             seqused_k: Optional[torch.Tensor], scale: float, softcap: float, window_left: int, window_right: int,
             mask: str, top_left: bool, validate: bool, params: List[torch.Tensor],
             sinks: Optional[torch.Tensor] = None, names: str = "", mask_expr: str = "",
             score_expr: str = "") -> tuple[torch.Tensor, torch.Tensor]:
    opts = _opts(scale, softcap, window_left, window_right, mask, top_left, "packed")
    extra = None
    if mask_expr or score_expr or sinks is not None or names:  # expressions as text, as attention_kvcache's
        opts, extra, _ = exprs.expr_options(q, q.shape[1], opts, mask_expr or None, score_expr or None, sinks,
                                            dict(zip(names.split(",") if names else [], params)), set())
    return prefill.prefill_impl(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, block_table,
                                seqused_k, opts, validate, extra)


@_prefill.register_fake
def _prefill_fake(q, k, v, *args, **kwargs):
    return q.new_empty(q.shape[0], q.shape[1], v.shape[3]), q.new_empty(q.shape[1], q.shape[0], dtype=torch.float32)


def attention_prefill_paged(q, k, v, cu_q, cu_k, max_q: int, max_k: int, block_table, seqused_k, opts,
                            validate: bool = False, sinks=None, params=None, mask_text=None, score_text=None):
    """The custom op's call; expressions only as text (as attention_kvcache's)."""
    _text_only(mask_text, score_text)
    names = sorted(params or {})
    return _prefill(q, k, v, cu_q, cu_k, max_q, max_k, block_table, seqused_k, opts.scale, opts.softcap,
                    opts.window_left, opts.window_right, opts.mask, opts.top_left, validate,
                    [params[n] for n in names], sinks, ",".join(names), mask_text or "", score_text or "")


_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


@torch.library.custom_op("attngen::attention_fp8", mutates_args=())
def _fp8(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_descale: Optional[torch.Tensor],
         k_descale: Optional[torch.Tensor], v_descale: Optional[torch.Tensor], cu_seqlens_q: Optional[torch.Tensor],
         cu_seqlens_k: Optional[torch.Tensor], max_seqlen_q: int, max_seqlen_k: int, scale: float, softcap: float,
         window_left: int, window_right: int, mask: str, top_left: bool, layout: str, rotate: bool,
         out_dtype: str) -> tuple[torch.Tensor, torch.Tensor]:
    opts = _opts(scale, softcap, window_left, window_right, mask, top_left, layout)
    descales = None if q_descale is None else (q_descale, k_descale, v_descale)
    return fp8.fp8_impl(q, k, v, opts, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, rotate, descales,
                        _DTYPES.get(out_dtype))


@_fp8.register_fake
def _fp8_fake(q, k, v, q_descale, k_descale, v_descale, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
              scale, softcap, window_left, window_right, mask, top_left, layout, rotate, out_dtype):
    out_shape, lse_shape = validate.output_shapes(q, v, layout)
    dtype = _DTYPES.get(out_dtype) or (torch.bfloat16 if q.dtype == fp8.E4M3 else q.dtype)
    return q.new_empty(out_shape, dtype=dtype), q.new_empty(lse_shape, dtype=torch.float32)


def attention_fp8(q, k, v, descales, cu_q, cu_k, max_q: int, max_k: int, opts, rotate: bool, out_dtype):
    qd, kd, vd = descales or (None, None, None)
    name = {torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(out_dtype, "")
    return _fp8(q, k, v, qd, kd, vd, cu_q, cu_k, max_q, max_k, opts.scale, opts.softcap, opts.window_left,
                opts.window_right, opts.mask, opts.top_left, opts.layout, rotate, name)
