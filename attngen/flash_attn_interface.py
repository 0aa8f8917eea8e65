"""flash-attn 2's public functions over attngen's kernels: a codebase that does
`from flash_attn import flash_attn_func` can do `from attngen.flash_attn_interface import
flash_attn_func` instead and run unchanged (docs/serving.md, "flash-attn compatible module").

The arguments, their order and defaults are flash-attn's; each maps onto `attngen.attention`,
`attention_varlen`, `attention_with_kvcache` or `attention_fp8`:

* q, k, v in flash-attn's (B, S, H, D) layout (`layout="bshd"`), packed (total, H, D) for varlen;
  softmax_scale -> scale; causal, window_size, softcap as they are (bottom-right alignment);
  deterministic -> deterministic (bitwise-reproducible gradients).
* alibi_slopes (H,) or (B, H) fp32 -> a score expression `score - slope[h] * abs(q_idx - kv_idx)`
  (`slope[b, h]` for per-row slopes) with q_idx the query's position on the key axis: flash-attn's
  `-slope * |i + seqlen_k - seqlen_q - j|`. With softcap the expression caps first, as flash-attn
  does: `tanh(score / cap) * cap - slope * |...|`. The slopes get no gradient (as in flash-attn).
* return_attn_probs=True returns (out, softmax_lse, S_dmask) as flash-attn does. flash-attn only
  fills S_dmask when dropout_p > 0, which attngen cannot do (an error), so S_dmask is the empty
  tensor flash-attn returns then; softmax_lse is (B, H, Sq) fp32, (H, total_q) for varlen.
* FlashAttention-3's q_descale / k_descale / v_descale with float8_e4m3fn q, k, v (dense calls) ->
  `attention_fp8` (bf16 output, inference only).
* flash_attn_with_kvcache: flash-attn's causal=False default is passed explicitly (attngen's
  attention_with_kvcache defaults to True); an int cache_seqlens becomes a (B,) int32 tensor.

Arguments attngen cannot honour raise an error that names them, never a silent difference:
dropout_p > 0, alibi_slopes with fp8 inputs, descales on other inputs or on packed documents, and
keywords the installed entry points do not take (rotary_cos / rotary_sin / cache_batch_idx /
cache_leftpad on attention_with_kvcache, block_table / seqused_k on attention_varlen: checked on
the entry point's signature, so they pass through once attngen grows them).
"""

from __future__ import annotations

import functools
import inspect

from attngen import env

env.setup_interpreter()  # before anything below imports triton

import torch  # noqa: E402

from attngen.runtime import public  # noqa: E402

E4M3 = torch.float8_e4m3fn

__all__ = [
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
]


# ---- argument mapping ---------------------------------------------------------------------------

def _check_dropout(dropout_p) -> None:
    if not isinstance(dropout_p, (int, float)) or isinstance(dropout_p, bool):
        raise ValueError(f"dropout_p: expected a number, got {dropout_p!r}")
    if dropout_p != 0:
        raise NotImplementedError(f"dropout_p: attngen has no attention dropout (got {dropout_p}); "
                                  "pass 0.0 (flash-attn's advice for evaluation too)")


def _window(window_size):
    """flash-attn callers pass lists too; attngen's plan keys want a tuple."""
    return tuple(window_size) if isinstance(window_size, (list, tuple)) else window_size


def _alibi(slopes, q, heads: int, batch: int, softcap: float):
    """(score_mod text, params, softcap left to the kernel) of flash-attn's ALiBi, or (None, None,
    softcap) without slopes. batch: q's batch rows (varlen: documents)."""
    if slopes is None:
        return None, None, softcap
    if not isinstance(slopes, torch.Tensor):
        raise ValueError(f"alibi_slopes: expected an fp32 torch.Tensor ({heads},) or ({batch}, {heads}), "
                         f"got {type(slopes).__name__}")
    if slopes.dtype != torch.float32:
        raise ValueError(f"alibi_slopes: must be torch.float32 (as flash-attn), got {slopes.dtype}")
    if slopes.device != q.device:
        raise ValueError(f"alibi_slopes: on {slopes.device}, but q is on {q.device}")
    if tuple(slopes.shape) == (heads,):
        index = "h"
    elif tuple(slopes.shape) == (batch, heads):
        index = "b, h"
    else:
        raise ValueError(f"alibi_slopes: expected shape ({heads},) or ({batch}, {heads}) (one slope per "
                         f"query head, or per batch row and head), got {tuple(slopes.shape)}")
    score = "score"
    if softcap:  # flash-attn caps the scaled score, then adds the bias
        if not isinstance(softcap, (int, float)) or softcap < 0:
            raise ValueError(f"softcap: must be a number >= 0 (0 = off), got {softcap!r}")
        score = f"tanh(score / {float(softcap)!r}) * {float(softcap)!r}"
    text = f"{score} - alibi_slope[{index}] * abs(q_idx - kv_idx)"
    return text, {"alibi_slope": slopes.detach().contiguous()}, 0.0


def _no_descales(where: str, **descales) -> None:
    for name, d in descales.items():
        if d is not None:
            raise ValueError(f"{name}: descales go with float8_e4m3fn q, k, v ({where})")


def _result(res, q, return_attn_probs: bool):
    """flash-attn's return from attngen's (out, or (out, lse) when return_attn_probs): out, or
    (out, softmax_lse, S_dmask) with S_dmask the empty tensor flash-attn gives whenever dropout is
    off."""
    if not return_attn_probs:
        return res
    out, lse = res
    return out, lse, torch.empty((0,), dtype=q.dtype, device=q.device)


@functools.lru_cache(maxsize=None)
def _keywords(fn) -> frozenset:
    return frozenset(inspect.signature(fn).parameters)


def _pass_through(fn, entry: str, **given) -> dict:
    """The given (not None) arguments, when the installed `fn` takes them; else an error naming the
    first it lacks (never dropped silently)."""
    kw = {n: x for n, x in given.items() if x is not None}
    for name in kw:
        if name not in _keywords(fn):
            raise NotImplementedError(f"{name}: this attngen's {entry} takes no {name!r} argument, so it cannot "
                                      "be honoured; leave it None or update attngen")
    return kw


# ---- dense ----------------------------------------------------------------------------------------

def _dense(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
           return_attn_probs, q_descale=None, k_descale=None, v_descale=None):
    _check_dropout(dropout_p)
    window_size = _window(window_size)
    if isinstance(q, torch.Tensor) and q.dtype == E4M3:
        if alibi_slopes is not None:
            raise NotImplementedError("alibi_slopes: attngen's fp8 kernels take no score expressions; "
                                      "ALiBi needs bf16 / fp16 inputs")
        res = public.attention_fp8(q, k, v, q_descale, k_descale, v_descale, causal=causal,
                                   window_size=window_size, softcap=softcap, scale=softmax_scale, layout="bshd",
                                   return_lse=bool(return_attn_probs))
        return _result(res, q, return_attn_probs)
    _no_descales("dense calls", q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
    heads, batch = (q.shape[2], q.shape[0]) if isinstance(q, torch.Tensor) and q.dim() == 4 else (0, 0)
    score_mod, params, softcap = _alibi(alibi_slopes, q, heads, batch, softcap)
    res = public.attention(q, k, v, causal=causal, window_size=window_size, softcap=softcap, scale=softmax_scale,
                           layout="bshd", return_lse=bool(return_attn_probs), deterministic=bool(deterministic),
                           score_mod=score_mod, params=params)
    return _result(res, q, return_attn_probs)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False, *, q_descale=None,
                    k_descale=None, v_descale=None):
    """flash-attn's flash_attn_func: q (B, Sq, H, D), k / v (B, Sk, Hkv, D), Hkv dividing H;
    fp16 / bf16, differentiable. Returns out (B, Sq, H, Dv), or with return_attn_probs (out,
    softmax_lse (B, H, Sq) fp32, S_dmask (empty)). FlashAttention-3's q_descale / k_descale /
    v_descale (fp32 (B, Hkv)) go with float8_e4m3fn q, k, v: attngen.attention_fp8 (bf16 output,
    inference only). dropout_p > 0 is an error."""
    return _dense(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                  return_attn_probs, q_descale, k_descale, v_descale)


def _unpack(name: str, packed, parts: int, ndim: int, axis: int):
    if not isinstance(packed, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(packed).__name__}")
    if packed.dim() != ndim or packed.shape[axis] != parts:
        want = {(5, 3): "(B, S, 3, H, D)", (5, 2): "(B, S, 2, Hkv, D)", (4, 3): "(total, 3, H, D)",
                (4, 2): "(total, 2, Hkv, D)"}[(ndim, parts)]
        raise ValueError(f"{name}: expected shape {want}, got {tuple(packed.shape)}")
    return packed.unbind(axis)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash-attn's flash_attn_qkvpacked_func: qkv (B, S, 3, H, D); as flash_attn_func."""
    q, k, v = _unpack("qkv", qkv, 3, 5, 2)
    return _dense(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                  return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash-attn's flash_attn_kvpacked_func: q (B, Sq, H, D), kv (B, Sk, 2, Hkv, D); as
    flash_attn_func."""
    k, v = _unpack("kv", kv, 2, 5, 2)
    return _dense(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                  return_attn_probs)


# ---- varlen ---------------------------------------------------------------------------------------

def _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
            window_size, softcap, alibi_slopes, deterministic, return_attn_probs, block_table=None,
            seqused_k=None, q_descale=None, k_descale=None, v_descale=None):
    _check_dropout(dropout_p)
    if isinstance(q, torch.Tensor) and q.dtype == E4M3:
        raise NotImplementedError("q: float8_e4m3fn packed documents: attngen.attention_fp8 takes dense "
                                  "tensors only; pass bf16 / fp16 q, k, v to attngen.attention_varlen(..., "
                                  "precision='fp8'), which quantizes them inside the call")
    _no_descales("dense calls only: attngen takes pre-quantized fp8 tensors only in (B, S, H, D)",
                 q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
    extra = _pass_through(public.attention_varlen, "attention_varlen", block_table=block_table,
                          seqused_k=seqused_k)
    heads = q.shape[1] if isinstance(q, torch.Tensor) and q.dim() == 3 else 0
    docs = cu_seqlens_q.numel() - 1 if isinstance(cu_seqlens_q, torch.Tensor) else 0
    score_mod, params, softcap = _alibi(alibi_slopes, q, heads, docs, softcap)
    res = public.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal,
                                  window_size=_window(window_size), softcap=softcap, scale=softmax_scale,
                                  return_lse=bool(return_attn_probs), deterministic=bool(deterministic),
                                  score_mod=score_mod, params=params, **extra)
    return _result(res, q, return_attn_probs)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None, *, seqused_k=None,
                           q_descale=None, k_descale=None, v_descale=None):
    """flash-attn's flash_attn_varlen_func: q (total_q, H, D), k / v (total_k, Hkv, D), cu_seqlens
    int32 (docs + 1); differentiable. Returns out (total_q, H, Dv), or with return_attn_probs (out,
    softmax_lse (H, total_q) fp32, S_dmask (empty)). block_table / seqused_k go to
    attngen.attention_varlen when it takes them (else an error naming them); descales and fp8
    inputs are an error here (attngen's pre-quantized fp8 path is dense only)."""
    return _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
                   causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs, block_table,
                   seqused_k, q_descale, k_descale, v_descale)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False,
                                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    """flash-attn's flash_attn_varlen_qkvpacked_func: qkv (total, 3, H, D); as flash_attn_varlen_func
    with the same offsets for queries and keys."""
    q, k, v = _unpack("qkv", qkv, 3, 4, 1)
    return _varlen(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, softmax_scale, causal,
                   window_size, softcap, alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash-attn's flash_attn_varlen_kvpacked_func: q (total_q, H, D), kv (total_k, 2, Hkv, D); as
    flash_attn_varlen_func."""
    k, v = _unpack("kv", kv, 2, 4, 1)
    return _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
                   causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs)


# ---- KV cache -------------------------------------------------------------------------------------

def _cache_seqlens(cache_seqlens, q, k_cache):
    """flash-attn takes an int for every row: a (B,) int32 tensor on the cache's device."""
    if isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool):
        return torch.full((q.shape[0],), cache_seqlens, dtype=torch.int32, device=k_cache.device)
    return cache_seqlens


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False):
    """flash-attn's flash_attn_with_kvcache (inference): q (B, Sq, H, D) with Sq from 1 to 16;
    caches (B, S_max, Hkv, D), or paged (num_pages, page_size, Hkv, D) with block_table (page_size
    a multiple of 16); new k / v (B, n, Hkv, D) written into the caches in place at cache_seqlens
    (an int or a (B,) int32 tensor) and attended in the same call. causal defaults to False, as
    flash-attn's. Returns out (B, Sq, H, Dv), or (out, softmax_lse (B, H, Sq) fp32) with
    return_softmax_lse. Rotary embedding, cache_batch_idx and cache_leftpad go to
    attngen.attention_with_kvcache when it takes them; otherwise they are an error naming them."""
    fn = public.attention_with_kvcache
    rotary = {}
    if rotary_cos is not None or rotary_sin is not None:
        rotary = _pass_through(fn, "attention_with_kvcache", rotary_cos=rotary_cos, rotary_sin=rotary_sin)
        rotary.update(_pass_through(fn, "attention_with_kvcache", rotary_interleaved=rotary_interleaved))
    extra = _pass_through(fn, "attention_with_kvcache", cache_batch_idx=cache_batch_idx,
                          cache_leftpad=cache_leftpad)
    heads, batch = (q.shape[2], q.shape[0]) if isinstance(q, torch.Tensor) and q.dim() == 4 else (0, 0)
    score_mod, params, softcap = _alibi(alibi_slopes, q, heads, batch, softcap)
    return fn(q, k_cache, v_cache, _cache_seqlens(cache_seqlens, q, k_cache), k=k, v=v, block_table=block_table,
              causal=bool(causal), window_size=_window(window_size), softcap=softcap, scale=softmax_scale,
              return_lse=bool(return_softmax_lse), num_splits=num_splits, score_mod=score_mod, params=params,
              **rotary, **extra)
