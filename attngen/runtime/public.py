"""The public entry points, `attngen.attention` / `attention_varlen`, over the runtime's plans
(attngen.runtime.api) and, inside torch.compile, its custom ops (attngen.runtime.ops).

* eager, no gradient wanted: a warm call is one dict lookup (api._FAST), the output allocations
  and the launches;
* eager, a gradient wanted: an autograd Function around the same plans (_EagerAttention);
* inside torch.compile: the `attngen::attention_fwd` / `attention_bwd` custom ops, whose
  implementations use the same plans.
"""

from __future__ import annotations

import torch

from attngen.runtime import api, dispatch, ops


def _wants_grad(q, k, v) -> bool:
    return torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)


def attention(q, k, v, *, causal=False, window_size=(-1, -1), softcap=0.0, scale=None,
              layout="bhsd", return_lse=False, deterministic=False, causal_alignment="bottom_right"):
    """Scaled dot-product attention through attngen's generated Triton kernels; differentiable.

    q (B, Hq, Sq, D), k/v (B, Hkv, Sk, D) with layout="bhsd" (as SDPA); (B, S, H, D) with
    layout="bshd" (as flash-attn). Head dims 8..256, any value. Returns out in q's layout, and with
    return_lse also the fp32 logsumexp (B, Hq, Sq) (not differentiable). window_size=(left, right)
    as flash-attn, -1 = unbounded; causal_alignment "bottom_right" (flash-attn, default) or
    "top_left" (SDPA) places the diagonal when Sq != Sk. deterministic=True makes the backward
    bitwise reproducible (dQ in its own pass instead of atomics). CPU tensors run through Triton's
    interpreter (slow; for tests). Works under torch.compile(fullgraph=True) and CUDA graphs.
    """
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
    api.check_dense(q, k, v, layout)
    opts = api.make_options(q.shape[-1], causal, window_size, softcap, scale, causal_alignment, layout)
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
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
        dq, dk, dv = api.backward_impl(dout, q, k, v, out, lse, ctx.opts, ctx.deterministic, cu_q, cu_k,
                                   *ctx.max_qk)
        return dq, dk, dv, None, None, None, None, None, None




def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                     causal=False, window_size=(-1, -1), softcap=0.0, scale=None,
                     return_lse=False, deterministic=False, causal_alignment="bottom_right"):
    """Attention over packed documents: q (total_q, Hq, D), k/v (total_k, Hkv, D), cu_seqlens int32
    (num_docs + 1) as flash-attn. No token attends across a document boundary, and key blocks of
    other documents are never scheduled. Returns out (total_q, Hq, Dv), with return_lse also the
    fp32 logsumexp (Hq, total_q). Differentiable."""
    api.check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    opts = api.make_options(q.shape[-1], causal, window_size, softcap, scale, causal_alignment, "packed")
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
