"""`attngen::attention_expr_fwd` / `attention_expr_bwd`: attention with expressions and sinks as
torch.library custom ops, so that torch.compile(fullgraph=True) traces such a call as one opaque
node, forward and backward (learnable parameters and sinks included). The expressions travel as
text (parsed inside the op, never while tracing); Python callables are traced into text before
(attngen.runtime.trace), which torch.compile cannot follow: under compile only text is taken."""

from __future__ import annotations

from typing import List, Optional

import torch

from attngen.runtime import api, exprs, validate


def _setup(q, sinks, params, names, learn, mask_expr, score_expr, scale, softcap, window_left, window_right, mask,
           top_left, layout):
    opts = validate.Options(mask, scale, softcap, window_left, window_right, top_left, layout)
    hq = q.shape[2] if layout == "bshd" else q.shape[1]
    names = names.split(",") if names else []  # one string: custom ops take no list of strings
    learnable = {n for n, flag in zip(names, learn) if flag}
    return exprs.expr_options(q, hq, opts, mask_expr or None, score_expr or None, sinks, dict(zip(names, params)),
                              learnable)


@torch.library.custom_op("attngen::attention_expr_fwd", mutates_args=())
def _fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: Optional[torch.Tensor], params: List[torch.Tensor],
         names: str, learn: List[bool], mask_expr: str, score_expr: str, scale: float, softcap: float,
         window_left: int, window_right: int, mask: str, top_left: bool, layout: str,
         cu_seqlens_q: Optional[torch.Tensor], cu_seqlens_k: Optional[torch.Tensor], max_seqlen_q: int,
         max_seqlen_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    opts, extra, _ = _setup(q, sinks, params, names, learn, mask_expr, score_expr, scale, softcap, window_left,
                            window_right, mask, top_left, layout)
    plan = api.checked_plan(q, k, v, opts, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, extra)
    return plan.run(q, k, v, cu_seqlens_q, cu_seqlens_k, extra=extra)


@_fwd.register_fake
def _fwd_fake(q, k, v, sinks, params, names, learn, mask_expr, score_expr, scale, softcap, window_left,
              window_right, mask, top_left, layout, *rest):
    out_shape, lse_shape = validate.output_shapes(q, v, layout)
    return q.new_empty(out_shape), q.new_empty(lse_shape, dtype=torch.float32)


@torch.library.custom_op("attngen::attention_expr_bwd", mutates_args=())
def _bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
         sinks: Optional[torch.Tensor], params: List[torch.Tensor], names: str, learn: List[bool],
         mask_expr: str, score_expr: str, scale: float, softcap: float, window_left: int, window_right: int,
         mask: str, top_left: bool, layout: str, cu_seqlens_q: Optional[torch.Tensor],
         cu_seqlens_k: Optional[torch.Tensor], max_seqlen_q: int, max_seqlen_k: int,
         deterministic: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, List[torch.Tensor]]:
    opts, extra, learned = _setup(q, sinks, params, names, learn, mask_expr, score_expr, scale, softcap,
                                  window_left, window_right, mask, top_left, layout)
    dq, dk, dv, dsinks, dparams = exprs.expr_backward(
        dout.contiguous() if dout.stride() != out.stride() else dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
        (max_seqlen_q, max_seqlen_k), opts, deterministic, extra, dict(learned), sinks, sinks is not None)
    grads = [dparams[n] if flag else torch.zeros_like(p)
             for n, p, flag in zip(names.split(",") if names else [], params, learn)]
    return dq, dk, dv, (dsinks if dsinks is not None else q.new_zeros(0, dtype=torch.float32)), grads


@_bwd.register_fake
def _bwd_fake(dout, q, k, v, out, lse, sinks, params, *rest):
    ds = torch.empty_like(sinks) if sinks is not None else q.new_empty(0, dtype=torch.float32)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), ds, [torch.empty_like(p) for p in params]


def _setup_context(ctx, inputs, output):
    (q, k, v, sinks, params, names, learn, mask_expr, score_expr, scale, softcap, wl, wr, mask, top_left, layout,
     cu_q, cu_k, max_q, max_k) = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, sinks, cu_q, cu_k, *params)
    ctx.args = (names, learn, mask_expr, score_expr, scale, softcap, wl, wr, mask, top_left, layout)
    ctx.max_qk = (max_q, max_k)
    ctx.mark_non_differentiable(lse)


def _backward(ctx, dout, _dlse):
    q, k, v, out, lse, sinks, cu_q, cu_k, *params = ctx.saved_tensors
    dq, dk, dv, dsinks, dparams = _bwd(dout, q, k, v, out, lse, sinks, list(params), *ctx.args, cu_q, cu_k,
                                       *ctx.max_qk, False)
    return (dq, dk, dv, dsinks if sinks is not None else None, list(dparams)) + (None,) * 15


torch.library.register_autograd("attngen::attention_expr_fwd", _backward, setup_context=_setup_context)


def attention_expr(q, k, v, opts: validate.Options, sinks, params: dict, mask_text, score_text,
                   cu_q=None, cu_k=None, max_q: int = 0, max_k: int = 0):
    """The custom op's call (inside torch.compile): expressions as text, their parameters, sinks."""
    for name, fn in (("mask_mod", mask_text), ("score_mod", score_text)):
        if fn is not None and not isinstance(fn, str):
            raise ValueError(f"{name}: inside torch.compile attngen takes expressions as text (a Python "
                             "callable is traced outside the compiled region: attngen.trace_mask_mod / "
                             "trace_score_mod give its text and tensors)")
    names = sorted(params or {})
    tensors = [params[n] for n in names]
    learn = [t.requires_grad for t in tensors]
    return _fwd(q, k, v, sinks, tensors, ",".join(names), learn, mask_text or "", score_text or "", opts.scale, opts.softcap,
                opts.window_left, opts.window_right, opts.mask, opts.top_left, opts.layout, cu_q, cu_k, max_q, max_k)
