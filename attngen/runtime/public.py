"""The public entry points, `attngen.attention` / `attention_varlen`, over the runtime's plans
(attngen.runtime.api) and, inside torch.compile, its custom ops (attngen.runtime.ops).

* eager, no gradient wanted: a warm call is one dict lookup (api._FAST; precision="fp8":
  fp8._FAST; attention_with_kvcache: kvcache._FAST), the output allocations and the launches;
* eager, a gradient wanted: an autograd Function around the same plans (_EagerAttention);
* inside torch.compile: the `attngen::attention_fwd` / `attention_bwd` custom ops, whose
  implementations use the same plans.
"""

from __future__ import annotations

import dataclasses

import torch

from attngen import env
from attngen.families.decode import MAX_SPLITS, Rotary
from attngen.runtime import api, dispatch, expr_ops, exprs, fp8, kvcache, ops, prefill, validate, variants
from attngen.runtime.validate import make_options


def _wants_grad(q, k, v) -> bool:
    return torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)


def attention(q, k, v, *, causal=False, window_size=(-1, -1), softcap=0.0, scale=None,
              layout="bhsd", return_lse=False, deterministic=False, causal_alignment="bottom_right",
              precision=None, rotate=True, mask_mod=None, score_mod=None, sinks=None, params=None, variant=None):
    """Scaled dot-product attention through attngen's generated Triton kernels; differentiable.

    q (B, Hq, Sq, D), k/v (B, Hkv, Sk, D) with layout="bhsd" (as SDPA); (B, S, H, D) with
    layout="bshd" (as flash-attn). Head dims 8..256, any value. Returns out in q's layout, and with
    return_lse also the fp32 logsumexp (B, Hq, Sq) (not differentiable). window_size=(left, right)
    as flash-attn, -1 = unbounded; causal_alignment "bottom_right" (flash-attn, default) or
    "top_left" (SDPA) places the diagonal when Sq != Sk. deterministic=True makes the backward
    bitwise reproducible (dQ in its own pass instead of atomics). CPU tensors run through Triton's
    interpreter (slow; for tests). Works under torch.compile(fullgraph=True) and CUDA graphs.
    precision="fp8" (inference only, sm89 / sm90): Q, K and V are quantized to e4m3 inside the call
    (per block of 128 rows; with rotate=True Q and K first get the same random Hadamard rotation,
    which spreads outlier features before quantization) and the fp8 kernels run; the output keeps
    q's dtype.

    Expressions (docs/spec.md): mask_mod(b, h, q_idx, kv_idx) -> bool and score_mod(score, b, h,
    q_idx, kv_idx) -> float, Python callables as FlexAttention's (traced once into the spec
    language: no torch.compile, no recompile for new lengths; tensors they index become parameters)
    or expression text whose parameters come in `params` ({name: tensor}); they combine with
    causal / window_size (the built-in mask and the expression must both keep a pair). q_idx is
    the query's position on the key axis (row + Sk - Sq under the default bottom-right alignment).
    sinks (Hq,): a learned logit per query head that joins every row's softmax denominator
    (gpt-oss); differentiable. variant="<name>": a `kernels:` entry of the shipped spec files (or of
    files given to attngen.load_variants) sets the mask, window, softcap, scale and expressions; the
    call brings `params` and `sinks` as the entry declares them.
    """
    if variant is not None:
        hq, batch = (q.shape[1], q.shape[0]) if layout == "bhsd" else (q.shape[2], q.shape[0])
        causal, window_size, softcap, scale, mask_mod, score_mod = _variant(
            variant, causal, window_size, softcap, scale, mask_mod, score_mod, params, sinks, hq, batch)
    if mask_mod is not None or score_mod is not None or sinks is not None or params:
        return _expr_attention(q, k, v, causal, window_size, softcap, scale, layout, return_lse, deterministic,
                               causal_alignment, precision, mask_mod, score_mod, sinks, params)
    if precision is not None and fp8.check_precision(precision, rotate):
        return _fp8_attention(q, k, v, causal, window_size, softcap, scale, causal_alignment, layout, return_lse,
                              rotate)
    compiling = torch.compiler.is_compiling()
    if not compiling:
        try:  # the fast path: a warm call is this lookup, two allocations and the launches
            key = (q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype, k.dtype,
                   v.dtype, q.device, k.device, v.device, layout, causal, window_size, softcap, scale,
                   causal_alignment, dispatch.override())
            plan = api._FAST.get(key)
        except (AttributeError, TypeError):  # not tensors, unhashable options: the full path says
            key = plan = None
        if plan is not None:
            if _wants_grad(q, k, v):
                out, lse = _EagerAttention.apply(q, k, v, plan, bool(deterministic))
            else:
                out, lse = plan.run(q, k, v, want_lse=bool(return_lse))
            return (out, lse) if return_lse else out
    validate.check_dense(q, k, v, layout)
    opts = validate.make_options(q.shape[-1], causal, window_size, softcap, scale, causal_alignment, layout)
    if compiling:
        out, lse = ops.attention_fwd(q, k, v, None, None, 0, 0, opts, bool(deterministic))
        return (out, lse) if return_lse else out
    plan = api.forward_plan(q, k, v, opts)
    if key is not None:
        api._FAST.put(key, plan)
    if _wants_grad(q, k, v):
        out, lse = _EagerAttention.apply(q, k, v, plan, bool(deterministic))
    else:
        out, lse = plan.run(q, k, v, want_lse=bool(return_lse))
    return (out, lse) if return_lse else out


def _variant(name, causal, window_size, softcap, scale, mask_mod, score_mod, params, sinks, hq: int, batch: int):
    """(causal, window_size, softcap, scale, mask_mod, score_mod) of a call of variant `name`."""
    kw = variants.call_options(name, {"causal": causal, "window_size": window_size, "softcap": softcap,
                                      "mask_mod": mask_mod, "score_mod": score_mod, "scale": scale},
                               params, sinks, hq, batch)
    return (kw["causal"], kw["window_size"], kw["softcap"], kw.get("scale", scale), kw["mask_mod"],
            kw["score_mod"])


def _expr_attention(q, k, v, causal, window_size, softcap, scale, layout, return_lse, deterministic,
                    causal_alignment, precision, mask_mod, score_mod, sinks, params):
    """attention() with expressions or sinks (eager; attngen.runtime.exprs)."""
    if precision is not None:
        raise ValueError("precision: the fp8 kernels take no expressions or sinks")
    validate.check_dense(q, k, v, layout)
    opts = validate.make_options(q.shape[-1], causal, window_size, softcap, scale, causal_alignment, layout)
    if torch.compiler.is_compiling():  # one custom op, expressions as text
        out, lse = expr_ops.attention_expr(q, k, v, opts, sinks, params or {}, mask_mod, score_mod)
        return (out, lse) if return_lse else out
    hq = q.shape[1] if layout == "bhsd" else q.shape[2]
    opts, extra, learn = exprs.expr_options(q, hq, opts, mask_mod, score_mod, sinks, params)
    out, lse = exprs.expr_attention(q, k, v, opts, extra, learn, sinks, bool(deterministic))
    return (out, lse) if return_lse else out


class _EagerAttention(torch.autograd.Function):
    """Eager calls that want a gradient: lighter than dispatching the custom op (which
    torch.compile traces instead); the same plans and the same backward implementation."""

    @staticmethod
    def forward(ctx, q, k, v, plan: api.ForwardPlan, deterministic: bool, cu_q=None, cu_k=None,
                max_q: int = 0, max_k: int = 0):
        out, lse = plan.run(q, k, v, cu_q, cu_k)
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
        ctx.opts, ctx.deterministic, ctx.max_qk = plan.opts, deterministic, (max_q, max_k)
        ctx.mark_non_differentiable(lse)
        # the engine would otherwise hand the backward a zero-filled gradient of lse (an
        # allocation and a fill launch each backward; H200: 15-20 us of host time a call)
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        if dout is None:  # out took no part in what is differentiated: no gradient
            return None, None, None, None, None, None, None, None, None
        q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
        dq, dk, dv = api.backward_impl(dout, q, k, v, out, lse, ctx.opts, ctx.deterministic, cu_q, cu_k,
                                   *ctx.max_qk)
        return dq, dk, dv, None, None, None, None, None, None




def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                     causal=False, window_size=(-1, -1), softcap=0.0, scale=None,
                     return_lse=False, deterministic=False, causal_alignment="bottom_right",
                     precision=None, rotate=True, mask_mod=None, score_mod=None, sinks=None, params=None,
                     variant=None, block_table=None, seqused_k=None):
    """Attention over packed documents: q (total_q, Hq, D), k/v (total_k, Hkv, D), cu_seqlens int32
    (num_docs + 1) as flash-attn. No token attends across a document boundary, and key blocks of
    other documents are never scheduled. Returns out (total_q, Hq, Dv), with return_lse also the
    fp32 logsumexp (Hq, total_q). Differentiable (precision="fp8": inference only, as attention()).
    mask_mod / score_mod / sinks / params as attention()'s, inside each document (b is the
    document, q_idx / kv_idx its own positions); variant as attention()'s.

    Chunked prefill on a paged KV cache (flash-attn's varlen call with a block table; inference
    only, docs/serving.md): k / v (num_pages, page_size, Hkv, D), page_size a multiple of 16, and
    block_table (B, max_pages) int32: key j of sequence b is in page block_table[b, j // page_size].
    Sequence b's keys are its first seqused_k[b] (int32 (B,)) positions, else cu_seqlens_k[b + 1] -
    cu_seqlens_k[b]; its queries (any number) sit at its last positions (causal and windows
    bottom-right, unless causal_alignment="top_left"). Metadata out of range is never followed
    outside the cache (docs/decode.md, "Metadata out of range"; attngen.check_kvcache())."""
    if block_table is not None or seqused_k is not None:
        opts, check = prefill.prepare(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, block_table, seqused_k, causal,
            window_size, softcap, scale, causal_alignment, {"precision": precision, "variant": variant})
        extra = None
        if mask_mod is not None or score_mod is not None or sinks is not None or params:
            if torch.compiler.is_compiling():  # one custom op, expressions as text
                out, lse = ops.attention_prefill_paged(
                    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, block_table, seqused_k, opts,
                    check, None if sinks is None else sinks.detach(), {n: t.detach() for n, t in (params or {}).items()},
                    mask_mod, score_mod)
                return (out, lse) if return_lse else out
            opts, extra, _ = exprs.expr_options(q, q.shape[1], opts, mask_mod, score_mod,
                                                None if sinks is None else sinks.detach(),
                                                {n: t.detach() for n, t in (params or {}).items()}, set())
        if torch.compiler.is_compiling():
            out, lse = ops.attention_prefill_paged(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                                   block_table, seqused_k, opts, check)
        else:
            out, lse = prefill.prefill_impl(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                            block_table, seqused_k, opts, check, extra)
        return (out, lse) if return_lse else out
    validate.check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    if variant is not None:
        causal, window_size, softcap, scale, mask_mod, score_mod = _variant(
            variant, causal, window_size, softcap, scale, mask_mod, score_mod, params, sinks, q.shape[1],
            cu_seqlens_q.numel() - 1)
    if mask_mod is not None or score_mod is not None or sinks is not None or params:
        if precision is not None:
            raise ValueError("precision: the fp8 kernels take no expressions or sinks")
        opts = validate.make_options(q.shape[-1], causal, window_size, softcap, scale, causal_alignment, "packed")
        if torch.compiler.is_compiling():  # one custom op, expressions as text
            out, lse = expr_ops.attention_expr(q, k, v, opts, sinks, params or {}, mask_mod, score_mod, cu_seqlens_q,
                                               cu_seqlens_k, max_seqlen_q, max_seqlen_k)
            return (out, lse) if return_lse else out
        opts, extra, learn = exprs.expr_options(q, q.shape[1], opts, mask_mod, score_mod, sinks, params)
        out, lse = exprs.expr_attention(q, k, v, opts, extra, learn, sinks, bool(deterministic), cu_seqlens_q,
                                        cu_seqlens_k, max_seqlen_q, max_seqlen_k)
        return (out, lse) if return_lse else out
    if precision is not None and fp8.check_precision(precision, rotate):
        return _fp8_call(q, k, v, causal, window_size, softcap, scale, causal_alignment, "packed", return_lse,
                         rotate, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    opts = validate.make_options(q.shape[-1], causal, window_size, softcap, scale, causal_alignment, "packed")
    if torch.compiler.is_compiling():
        out, lse = ops.attention_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                     opts, bool(deterministic))
    elif _wants_grad(q, k, v):  # eager: the autograd Function, as attention()'s (the custom op
        # costs more host time than the kernels of a short call take on the GPU)
        plan = api.checked_plan(q, k, v, opts, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
        out, lse = _EagerAttention.apply(q, k, v, plan, bool(deterministic), cu_seqlens_q,
                                         cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    else:
        out, lse = api.forward_impl(q, k, v, opts, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    return (out, lse) if return_lse else out


def attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=None, *, k=None, v=None, block_table=None,
                           causal=True, window_size=(-1, -1), softcap=0.0, scale=None, return_lse=False,
                           num_splits=0, k_descale=None, v_descale=None, validate=None, mask_mod=None,
                           score_mod=None, sinks=None, params=None, variant=None, cache_batch_idx=None,
                           cache_leftpad=None, rotary_cos=None, rotary_sin=None, rotary_interleaved=True):
    """Attention of a short query on a KV cache (decoding), split over the key axis.

    mask_mod / score_mod / params / sinks: expressions and learned sinks as attention() takes them
    (q_idx is the query's position in the row's keys: kv_len - Sq + i); inference only; inside
    torch.compile as text (the `attngen::attention_kvcache` custom op takes them).

    q (B, Sq, Hq, D), Sq from 1 to 16; caches (B, S_max, Hkv, D), or paged (num_pages, page_size,
    Hkv, D) with `block_table` (B, max_pages) int32 (page_size a multiple of 16); the head dim
    contiguous. cache_seqlens (B,) int32: the keys already in each row (None: every row is full,
    S_max keys; required with a paged cache or new k / v). k / v (B, n, Hkv, D): new keys and
    values, written into the caches in place at cache_seqlens (cache_seqlens itself is not
    changed) and seen by this call. causal and window_size are bottom-right: query token i sits at
    key position kv_len - Sq + i. num_splits: slices of the key axis (0: from shapes). Returns out
    (B, Sq, Hq, Dv), with return_lse also the fp32 logsumexp (B, Hq, Sq). Inference only (no
    gradient); works under torch.compile(fullgraph=True) and CUDA graphs (the split comes from
    shapes, never from cache_seqlens values).

    As flash-attn's flash_attn_with_kvcache (dense caches only, as flash-attn 2):
    cache_batch_idx (B,) int32: batch row b of q / k / v uses cache row cache_batch_idx[b] (the
    caches may then have any number of rows; duplicate indices with new k / v: which row's tokens
    land is unspecified). cache_leftpad (B,) int32: row b's keys start at cache position
    cache_leftpad[b]: its keys are [cache_leftpad, cache_seqlens + n) (cache_seqlens counts from
    position 0, pad included; new tokens go to cache_seqlens as without a pad); causal, window and
    expressions number the keys from the pad (kv_len = cache_seqlens + n - cache_leftpad).
    rotary_cos / rotary_sin (seqlen_ro, rotary_dim / 2), q's dtype or fp32, with new k / v: RoPE of
    the first rotary_dim dims of q and the new keys, fused (fp32, rounded to q's dtype once; the
    keys are stored rotated). rotary_interleaved (default True, as flash-attn): pairs (0, 1),
    (2, 3), ...; False: GPT-NeoX halves (i, i + rotary_dim / 2). Positions as flash-attn's, counted
    from cache position 0 (a left pad is not subtracted): new key t at cache_seqlens + t; query
    token i at cache_seqlens + i when causal or local (window_size != (-1, -1)), else every query
    token at cache_seqlens. seqlen_ro must be at least the row capacity (+ Sq - n when the query
    is longer than the new tokens).

    An fp8 cache: k_cache / v_cache in torch.float8_e4m3fn (q, k, v and the output stay bf16 /
    fp16) holding K / k_descale and V / v_descale; the descales fp32 (B, Hkv) (None: 1.0). The
    kernel reads the e4m3 values, widens them exactly to q's dtype and applies the descales in
    fp32; new k / v are divided by the descales and rounded to e4m3 (saturating) as they are
    written.

    Metadata out of range (a row's cache_seqlens below 0 or, with the new tokens, above its
    capacity -- max_pages x page_size paged, S_max dense --, a block-table entry outside
    [0, num_pages) for a page a row uses, a cache_batch_idx outside [0, k_cache.shape[0]), a
    cache_leftpad outside [0, cache_seqlens]) is never followed outside the caches: the kernels
    clamp the row's keys to its capacity, never read or write a page or cache row outside the
    cache (a row with a bad cache_batch_idx sees no key), clamp the pad and write no new token that
    has no room (such a row's output is not meaningful). Entries past the pages a row uses may
    hold anything (-1 padding). CPU metadata is checked before the launch: a ValueError naming the
    argument, the row and the value, nothing written. GPU metadata is not copied to the host (no sync: CUDA graphs keep
    working): the kernels record the row in a device flag, and `attngen.check_kvcache()` reads it
    (a sync) and raises the same way. validate=True checks GPU metadata before the launch with
    one device-to-host copy (None: only if ATTNGEN_CHECK_KVCACHE=1; skipped while a CUDA graph is
    captured). See docs/decode.md, "Metadata out of range".
    """
    key = None
    if variant is None and mask_mod is None and score_mod is None and sinks is None and not params \
            and not torch.compiler.is_compiling():
        try:  # the fast path: a warm call is this lookup, the metadata check where it runs, the launches
            check = env.check_kvcache() if validate is None else bool(validate)
            # the optional tensors' part is None when none is given (a plain decode step: nine
            # `is None` tests instead of nine _meta calls in the key)
            key = (_meta(q), _meta(k_cache), _meta(v_cache), _meta(cache_seqlens),
                   None if k is None and v is None and block_table is None and k_descale is None
                   and v_descale is None and cache_batch_idx is None and cache_leftpad is None
                   and rotary_cos is None and rotary_sin is None else
                   tuple(map(_meta, (k, v, block_table, k_descale, v_descale, cache_batch_idx, cache_leftpad,
                                     rotary_cos, rotary_sin))),
                   rotary_interleaved, causal, type(causal), window_size, softcap, scale, num_splits,
                   type(num_splits), check, dispatch.override())
            hit = kvcache._FAST.get(key)
        except (AttributeError, TypeError):  # not tensors, unhashable options: the full path says
            key = hit = None
        if hit is not None and not (torch.is_grad_enabled() and _kv_grad(q, k_cache, v_cache, k, v)):
            plan, new_len, per_token = hit
            indices = (cache_batch_idx, cache_leftpad)
            kvcache.check_meta(q, k_cache, cache_seqlens, block_table, new_len, check, indices)
            rotary = None if rotary_cos is None else Rotary(rotary_cos, rotary_sin, rotary_interleaved, per_token)
            out, lse = plan.run_cache(q, k_cache, v_cache, cache_seqlens, block_table, k_descale, v_descale, k, v,
                                      None, indices, rotary, want_lse=bool(return_lse))
            return (out, lse) if return_lse else out
    if variant is not None:  # as attention()'s (causal's default here is True: the variant decides)
        causal, window_size, softcap, scale, mask_mod, score_mod = _variant(
            variant, False if causal is True else causal, window_size, softcap, scale, mask_mod, score_mod, params,
            sinks, q.shape[2], q.shape[0])
    new_len = kvcache.check_args(q, k_cache, v_cache, cache_seqlens, k, v, block_table, k_descale, v_descale,
                                 cache_batch_idx, cache_leftpad, rotary_cos, rotary_sin, rotary_interleaved)
    indices = (cache_batch_idx, cache_leftpad)
    if not isinstance(num_splits, int) or isinstance(num_splits, bool) or not 0 <= num_splits <= MAX_SPLITS:
        raise ValueError(f"num_splits: must be an int from 0 (from shapes) to {MAX_SPLITS}, got {num_splits!r}")
    if torch.is_grad_enabled() and _kv_grad(q, k_cache, v_cache, k, v):
        raise ValueError("q: attention_with_kvcache is inference only (no gradient); call it under "
                         "torch.no_grad() or use attention() for training")
    opts = make_options(q.shape[-1], causal, window_size, softcap, scale, "bottom_right", "bshd")
    check = env.check_kvcache() if validate is None else bool(validate)
    # flash-attn's rotary positions: per query token when causal or local (the built-in mask, before
    # an expression takes it in)
    rotary = None if rotary_cos is None else Rotary(rotary_cos, rotary_sin, rotary_interleaved, opts.mask != "none")
    if mask_mod is not None or score_mod is not None or sinks is not None or params:
        if torch.compiler.is_compiling():  # one custom op, expressions as text
            out, lse = ops.attention_kvcache(q, k_cache, v_cache, cache_seqlens, k, v, block_table, opts, new_len,
                                             num_splits, k_descale, v_descale, check, indices, rotary, sinks,
                                             params, mask_mod, score_mod)
            return (out, lse) if return_lse else out
        opts, extra, _ = exprs.expr_options(q, q.shape[2], opts, mask_mod, score_mod,
                                            None if sinks is None else sinks.detach(),
                                            {n: t.detach() for n, t in (params or {}).items()})
        out, lse = kvcache.kvcache_impl(q, k_cache, v_cache, cache_seqlens, k, v, block_table, opts, new_len,
                                        num_splits, k_descale, v_descale, check, extra, indices, rotary)
        return (out, lse) if return_lse else out
    if torch.compiler.is_compiling():
        out, lse = ops.attention_kvcache(q, k_cache, v_cache, cache_seqlens, k, v, block_table, opts, new_len,
                                         num_splits, k_descale, v_descale, check, indices, rotary)
    else:
        out, lse = kvcache.kvcache_impl(q, k_cache, v_cache, cache_seqlens, k, v, block_table, opts, new_len,
                                        num_splits, k_descale, v_descale, check, None, indices, rotary,
                                        keep=None if key is None else (kvcache._FAST, key))
    return (out, lse) if return_lse else out


def _meta(t):
    """What a warm attention_with_kvcache call's fast-path key holds of a tensor argument."""
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device)


def _kv_grad(*ts) -> bool:
    return any(t is not None and t.requires_grad for t in ts)


def _fp8_attention(q, k, v, causal, window_size, softcap, scale, causal_alignment, layout, return_lse, rotate):
    """attention(precision="fp8"); eager, a warm call is one dict lookup (fp8._FAST, keyed as
    api._FAST plus rotate and whether q's and k's bases are 16-byte aligned: the Gluon kernel may
    read q by TMA), the allocations and the launches."""
    key = None
    if not torch.compiler.is_compiling():
        try:
            key = (q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype, k.dtype,
                   v.dtype, q.device, k.device, v.device, layout, causal, window_size, softcap, scale,
                   causal_alignment, rotate, dispatch.override(), fp8.bases_aligned(q, k))
            plan = fp8._FAST.get(key)
        except (AttributeError, TypeError):  # not tensors, unhashable options: the full path says
            key = plan = None
        if plan is not None:
            fp8.no_grad_check(q, k, v)
            out, lse = plan.run(q, k, v, want_lse=bool(return_lse))
            return (out, lse) if return_lse else out
    validate.check_dense(q, k, v, layout)
    return _fp8_call(q, k, v, causal, window_size, softcap, scale, causal_alignment, layout, return_lse, rotate,
                     fast=(fp8._FAST, key, None))


def _fp8_call(q, k, v, causal, window_size, softcap, scale, causal_alignment, layout, return_lse, rotate,
              cu_q=None, cu_k=None, max_q=0, max_k=0, descales=None, out_dtype=None, fast=None):
    """The fp8 family's call (attention / attention_varlen with precision="fp8", attention_fp8);
    fast: (cache, key, extra): the entry point's fast-path cache and its key of this call (None:
    none), which keeps the plan (with `extra`, when not None, as (plan, extra))."""
    fp8.no_grad_check(q, k, v)
    opts = validate.make_options(q.shape[-1], causal, window_size, softcap, scale, causal_alignment, layout)
    if torch.compiler.is_compiling():
        out, lse = ops.attention_fp8(q, k, v, descales, cu_q, cu_k, max_q, max_k, opts, rotate, out_dtype)
    else:
        plan = fp8.fp8_plan(q, k, v, opts, cu_q, cu_k, max_q, max_k, rotate, descales, out_dtype)
        if fast is not None and fast[1] is not None:
            cache, key, extra = fast
            cache.put(key, plan if extra is None else (plan, extra))
        out, lse = plan.run(q, k, v, cu_q, cu_k, descales, want_lse=bool(return_lse))
    return (out, lse) if return_lse else out


def attention_fp8(q, k, v, q_descale=None, k_descale=None, v_descale=None, *, causal=False,
                  window_size=(-1, -1), softcap=0.0, scale=None, layout="bhsd", return_lse=False,
                  causal_alignment="bottom_right", out_dtype=torch.bfloat16):
    """Attention on tensors already in fp8 (torch.float8_e4m3fn), inference only (sm89 / sm90, or the
    CPU interpreter): real values are q * q_descale, k * k_descale, v * v_descale.

    q (B, Hq, S, D), k / v (B, Hkv, S, D) with layout="bhsd" ((B, S, H, D) with "bshd"); the head
    dim of q and k a multiple of 16, contiguous. Descales fp32 (None = 1): (B, Hkv) as
    FlashAttention-3 (q's shared by the query heads of a KV group), (B, H) per head, or
    (B, H, ceil(S / 128)) per block of 128 rows; k_descale and v_descale of the same form. V is
    copied transposed (keys contiguous, the operand layout of Hopper's fp8 P.V) in each call;
    no rotation is applied (rotate Q and K yourself, with the same orthogonal matrix, before
    quantizing). Returns out (out_dtype, bf16 by default) in q's layout, and with return_lse the
    fp32 logsumexp (B, Hq, Sq). Works under torch.compile(fullgraph=True).
    """
    key = None
    if not torch.compiler.is_compiling():
        try:  # the fast path: a warm call is this lookup, the descales' views, the allocations and launches
            key = (q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype, k.dtype, v.dtype,
                   q.device, k.device, v.device, fp8.descale_key(q_descale), fp8.descale_key(k_descale),
                   fp8.descale_key(v_descale), layout, causal, window_size, softcap, scale, causal_alignment,
                   out_dtype, dispatch.override(), fp8.bases_aligned(q, k))
            hit = fp8._FAST_QUANT.get(key)
        except (AttributeError, TypeError):  # not tensors, unhashable options: the full path says
            key = hit = None
        if hit is not None:
            plan, dims = hit
            fp8.no_grad_check(q, k, v)
            out, lse = plan.run(q, k, v, descales=fp8.descales_of(dims, q_descale, k_descale, v_descale, q.device),
                                want_lse=bool(return_lse))
            return (out, lse) if return_lse else out
    fp8.check_quantized(q, k, v, layout)
    if out_dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"out_dtype: must be torch.bfloat16 or torch.float16, got {out_dtype!r}")
    qv, kv, _ = validate.dense_views(q, k, v, layout)
    dims = (qv.shape[0], qv.shape[1], kv.shape[1], qv.shape[2], kv.shape[2])  # B, Hq, Hkv, Sq, Sk
    descales = fp8.descales_of(dims, q_descale, k_descale, v_descale, q.device)
    if descales[1].stride() != descales[2].stride() or descales[1].shape != descales[2].shape:
        raise ValueError(f"v_descale: of shape {tuple(descales[2].shape)} / strides {descales[2].stride()}, "
                         f"k_descale's view is {tuple(descales[1].shape)} / {descales[1].stride()}: give both "
                         "in the same form (contiguous)")
    return _fp8_call(q, k, v, causal, window_size, softcap, scale, causal_alignment, layout, return_lse, False,
                     descales=descales, out_dtype=out_dtype, fast=(fp8._FAST_QUANT, key, dims))

