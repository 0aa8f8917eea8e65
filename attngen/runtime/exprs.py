"""attention() with expressions: mask_mod / score_mod (Python callables traced once into the spec
language, or expression text), their parameters, and learned sinks.

A call's expressions become an ExprSpec (part of Options, hence of every plan key and of the
kernel's identity); its tensors (parameters, sinks) are passed to the kernels by name at each call
(XP_<name>, Sinks). Gradients: q / k / v through the family's backward with dS = P (dP - D)
d score_mod / d score; sinks from the saved log-sum-exp and D (dsink_h = -sum_rows exp(sink_h -
lse) D, a PyTorch reduction: deterministic); learnable parameters from the dQ pass's per-program
partial sums reduced in PyTorch (no float atomics: deterministic).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from attngen.kernels.expr_buffers import extent, grad_buffers, run_bounds
from attngen.runtime import api, trace, validate
from attngen.spec import expr as X
from attngen.spec.expr_terms import builtin_mask, run_params


@dataclass(frozen=True)
class ExprSpec:
    mask_expr: str = ""
    score_expr: str = ""
    params: tuple = ()  # ParamDecl
    sinks: bool = False


_DTYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.int32: "int32"}


def _decl(name: str, t, learnable: bool) -> X.ParamDecl:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"params: '{name}' must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _DTYPES:
        if t.dtype == torch.int64:
            raise ValueError(f"params: '{name}' is int64; pass it as int32")
        raise ValueError(f"params: '{name}' has dtype {t.dtype} (fp32, fp16, bf16 or int32)")
    return X.ParamDecl(name, tuple(t.shape), _DTYPES[t.dtype], learnable)


def resolve(q, mask_mod, score_mod, sinks, params, learnable=None) -> tuple[ExprSpec, dict, list]:
    """(ExprSpec, kernel tensors by name, [(name, tensor) of parameters that want a gradient]).
    learnable: the names of the parameters that want one (None: those that require grad).

    A callable is traced at every call (tens of microseconds: a closure's tensors and numbers may
    have changed since the last one); the parsing and checking of the resulting text is cached on
    the text and the parameters' names, dtypes, shapes and learnable flags (_SPECS)."""
    tensors = dict(params or {})
    sources = []
    for kind, fn in (("mask", mask_mod), ("score", score_mod)):
        if fn is None:
            sources.append("")
        elif isinstance(fn, str):
            sources.append(("text", fn))
        elif callable(fn):
            traced = trace.trace_mask_mod(fn) if kind == "mask" else trace.trace_score_mod(fn)
            names = []
            for name, t in traced.params:  # traced names p0, p1, ...: prefixed by kind below
                tensors[f"{kind[0]}{name}"] = t
                names.append(name)
            sources.append(("traced", traced.expr, tuple(names)))
        else:
            raise ValueError(f"{kind}_mod: expected a callable or an expression string, got {type(fn).__name__}")
    decls = {n: _decl(n, t, False) for n, t in tensors.items()}  # checks each tensor's type and dtype
    wants = (lambda n: tensors[n].requires_grad) if learnable is None else (lambda n: n in learnable)
    key = (tuple(sources), tuple(decls.values()), tuple(n for n in tensors if wants(n)))
    hit = _SPECS.get(key)
    if hit is None:
        hit = _resolve_text(sources, decls, key[2])
        if len(_SPECS) >= 256:
            _SPECS.pop(next(iter(_SPECS)))
        _SPECS[key] = hit
    texts, used, decl_out, runs = hit
    for name in used:
        if tensors[name].device != q.device:
            raise ValueError(f"params: '{name}' is on {tensors[name].device}, but q is on {q.device}")
    learn = [(n, tensors[n]) for n in key[2]]
    if sinks is not None:
        if not isinstance(sinks, torch.Tensor) or not sinks.is_floating_point():
            raise ValueError("sinks: expected a float torch.Tensor (num_q_heads,)")
        if sinks.device != q.device:
            raise ValueError(f"sinks: on {sinks.device}, but q is on {q.device}")
    extra = {f"XP_{n}": tensors[n].detach() for n in used}
    for n in runs:  # P[q_idx] == P[kv_idx]: the runs of P bound the loops (where P never decreases)
        extra[f"XR_{n}"] = _runs_of(tensors[n])
    if sinks is not None:
        extra["Sinks"] = sinks.detach().float().contiguous()
    return ExprSpec(texts[0], texts[1], decl_out, sinks is not None), extra, learn


def _runs_of(p: torch.Tensor) -> torch.Tensor:
    """run_bounds(p), kept for the next call while p is the same tensor, unchanged: a model's
    layers pass one document-id tensor to every call, and the dozen device ops of run_bounds cost
    more host time than a short document's attention. Unchanged means the same object (a weak
    reference), storage, offset and shape, and the same version counter (which every in-place
    write to p or to a view of its storage bumps), on the same stream. Not kept while a CUDA graph
    is captured (the graph's replays must recompute from whatever p then holds) or traced."""
    if torch.compiler.is_compiling() or (p.is_cuda and torch.cuda.is_current_stream_capturing()):
        return run_bounds(p.detach())
    stream = torch.cuda.current_stream(p.device).cuda_stream if p.is_cuda else 0
    state = (p.data_ptr(), p.storage_offset(), tuple(p.shape), tuple(p.stride()), p._version, stream)
    kept = _RUNS.get(id(p))
    if kept is not None and kept[0]() is p and kept[1] == state:
        return kept[2]
    xr = run_bounds(p.detach())
    if len(_RUNS) >= 64:
        _RUNS.pop(next(iter(_RUNS)))
    key = id(p)
    _RUNS[key] = (weakref.ref(p, lambda _ref: _RUNS.pop(key, None)), state, xr)
    return xr


# id(tensor) -> (weak reference, (data_ptr, offset, shape, stride, version, stream), XR)
_RUNS: dict = {}

# (sources, parameter declarations, learnable names) -> (texts, used names sorted, ParamDecls,
# names of the mask's run patterns)
_SPECS: dict = {}


def _resolve_text(sources, decls: dict, learn_names: tuple):
    """The canonical mask / score texts of a call's expressions, the parameters they use (sorted),
    their declarations and the mask's run-pattern parameters (P[q_idx] == P[kv_idx]); raises ValueError on an unused parameter or a learnable one in the
    mask. Depends only on its arguments (resolve caches it)."""
    texts = []
    for kind, src in zip(("mask", "score"), sources):
        if not src:
            texts.append("")
            continue
        expr = src[1]
        if src[0] == "traced":
            for name in src[2]:
                expr = _rename(expr, name, f"{kind[0]}{name}")
        try:
            texts.append(X.to_text(X.parse(expr, kind, decls)))
        except X.ExprError as e:
            raise ValueError(f"{'mask_mod' if kind == 'mask' else 'score_mod'}: " + "; ".join(e.problems)) from None
    nodes = {kind: X.parse(t, kind, decls) for kind, t in zip(("mask", "score"), texts) if t}
    used = set()
    for node in nodes.values():
        used |= set(X.params_used(node))
    for name in decls:
        if name not in used:
            raise ValueError(f"params: '{name}' is not used by the expressions")
    mask_params = set(X.params_used(nodes["mask"])) if "mask" in nodes else set()
    for n in learn_names:
        if n in mask_params:
            raise ValueError(f"params: '{n}' requires grad but is used in the mask (a mask is not differentiable)")
    out = tuple(X.ParamDecl(n, X.axis_shape(list(nodes.values()), n, decls[n].shape), decls[n].dtype,
                            n in learn_names) for n in sorted(used))
    return tuple(texts), tuple(sorted(used)), out, tuple(run_params(nodes.get("mask")))


def _rename(text: str, old: str, new: str) -> str:
    import ast

    tree = ast.parse(text, mode="eval")
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == old:
            node.id = new
    return ast.unparse(tree)


def expr_options(q, hq: int, opts: validate.Options, mask_mod, score_mod, sinks, params, learnable=None):
    """(opts carrying the call's ExprSpec, kernel tensors, learnable parameters). A mask expression
    that is a built-in mask (attngen.spec.expr_terms.builtin_mask) becomes that mask; a built-in
    mask given with another mask expression joins it (both must keep a pair: one expression)."""
    x, extra, learn = resolve(q, mask_mod, score_mod, sinks, params, learnable)
    check_sinks(sinks, hq)
    key = (x, opts)
    out = _OPTIONS.get(key)
    if out is None:
        out = _options(x, opts)
        if len(_OPTIONS) >= 256:
            _OPTIONS.pop(next(iter(_OPTIONS)))
        _OPTIONS[key] = out
    return out, extra, learn


_OPTIONS: dict = {}  # (ExprSpec, Options) -> Options


def _options(x: ExprSpec, opts: validate.Options) -> validate.Options:
    import dataclasses

    if x.mask_expr and opts.mask == "none":
        # a mask that is a built-in one (causal, a causal window) runs the built-in mask's kernels:
        # the shipped and tuned ones, no mask expression in the loop
        wl = builtin_mask(X.parse(x.mask_expr, "mask", {d.name: d for d in x.params}))
        if wl is not None:
            mask, left, right = validate.mask_kind(True, (wl, 0) if wl >= 0 else (-1, -1))
            opts = dataclasses.replace(opts, mask=mask, window_left=left, window_right=right)
            x = dataclasses.replace(x, mask_expr="")
    if x.mask_expr and opts.mask != "none":
        builtin = {"causal": "(kv_idx <= q_idx)",
                   "sliding_window": f"((kv_idx <= (q_idx + {opts.window_right})) and "
                                     f"(kv_idx >= (q_idx - {opts.window_left})))"}[opts.mask]
        x = dataclasses.replace(x, mask_expr=f"({builtin} and {x.mask_expr})")
        opts = dataclasses.replace(opts, mask="none")
    if x.score_expr and opts.softcap > 0:
        raise ValueError("softcap: a score_mod replaces softcapping; write it in the expression "
                         "(tanh(score / cap) * cap)")
    return dataclasses.replace(opts, expr=x)


def check_sinks(sinks, hq: int) -> None:
    if sinks is not None and tuple(sinks.shape) != (hq,):
        raise ValueError(f"sinks: expected shape ({hq},) (one logit per query head), got {tuple(sinks.shape)}")


class ExprAttention(torch.autograd.Function):
    """Attention with expressions, differentiable in q, k, v, sinks and learnable parameters."""

    @staticmethod
    def forward(ctx, q, k, v, sinks, plan, deterministic, cu_q, cu_k, max_q, max_k, extra, learn_names,
                *learn_tensors):
        out, lse = plan.run(q, k, v, cu_q, cu_k, extra=extra)
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, sinks)
        ctx.opts, ctx.det, ctx.max_qk, ctx.extra, ctx.learn = plan.opts, deterministic, (max_q, max_k), extra, learn_names
        ctx.learn_tensors = dict(zip(learn_names, learn_tensors))
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse, cu_q, cu_k, sinks = ctx.saved_tensors
        dq, dk, dv, dsinks, dparams = expr_backward(dout, q, k, v, out, lse, cu_q, cu_k, ctx.max_qk, ctx.opts,
                                                    ctx.det, ctx.extra, ctx.learn_tensors, sinks,
                                                    sinks is not None and ctx.needs_input_grad[3])
        return (dq, dk, dv, dsinks) + (None,) * 8 + tuple(dparams.get(n) for n in ctx.learn)


def expr_backward(dout, q, k, v, out, lse, cu_q, cu_k, max_qk, opts, deterministic, extra, learn_tensors: dict,
                  sinks, want_dsinks: bool):
    """(dq, dk, dv, dsinks or None, {name: gradient}) of an expression call (the autograd Function's
    and the custom op's backward)."""
    x, layout = opts.expr, opts.layout
    bufs = grad_buffers(x, q, layout, cu_q, max_qk[0]) if learn_tensors else {}
    if x.sinks:  # the dQ pass writes each row's exact D there (the sinks' gradient)
        bufs["XD"] = torch.empty_like(lse)
    dq, dk, dv, block_m = api.backward_impl(dout, q, k, v, out, lse, opts, deterministic, cu_q, cu_k, *max_qk,
                                            extra={**extra, **bufs}, want_params=True)
    dparams = param_grads(x, bufs, learn_tensors, q, layout, cu_q, max_qk[0], block_m) if learn_tensors else {}
    dsinks = sink_grad(bufs["XD"], lse, sinks, layout) if want_dsinks else None
    return dq, dk, dv, dsinks, dparams


def param_grads(x: ExprSpec, bufs: dict, tensors: dict, q, layout: str, cu_q=None, max_q: int = 0,
                block_m: int = 16) -> dict:
    """{name: gradient} from the dQ pass's partial sums: slots reduced over query blocks, then
    the b / h subscripts mapped onto the parameter's axes (one-hot products: deterministic)."""
    from attngen.spec.expr_terms import grad_terms

    z, hq, rows = extent(q, layout, cu_q, max_q)
    m = max(1, -(-rows // block_m))
    out = {}
    for t in grad_terms(x):
        g = bufs[f"XG{t.index}"][:z * hq * m * t.width].view(z, hq, m, t.width)[..., :t.extent].sum(2).double()
        p = tensors[t.param]
        axes = []  # g's axes (z, hq, general) as the parameter's subscripts take them
        for d, kind in enumerate(t.kinds):
            n = p.shape[d]
            if kind == "g":
                axes.append(("g", None))
                continue
            src = z if kind == "b" else hq
            hot = torch.zeros(n, src, dtype=torch.float64, device=g.device)
            hot[torch.arange(src, device=g.device).clamp(max=n - 1), torch.arange(src, device=g.device)] = 1.0
            axes.append((kind, hot))
        # contract: sum over z / hq unless a subscript keeps them, in the subscripts' order
        letters = {"b": "z", "h": "h", "g": "j"}
        spec_in = "zhj"
        operands, terms = [g], [spec_in]
        out_axes = ""
        for kind, hot in axes:
            letter = letters[kind]
            if hot is None:
                out_axes += letter
            else:
                new = letter.upper()
                operands.append(hot)
                terms.append(new + letter)
                out_axes += new
        if not t.kinds:  # a scalar parameter
            out_axes = ""
        if "g" not in t.kinds:
            operands[0] = g.sum(-1)
            terms[0] = "zh"
        val = torch.einsum(",".join(terms) + "->" + out_axes, *operands).reshape(p.shape)
        out[t.param] = val if t.param not in out else out[t.param] + val
    return {n: v.to(tensors[n].dtype) for n, v in out.items()}


def sink_grad(delta, lse, sinks, layout: str):
    """d loss / d sink_h = -sum over the head's rows of exp(sink_h - lse) * D, D = sum_j P dP per
    row as the dQ pass summed it (exact: not rowsum(dO * O) of the rounded output); delta and lse
    (B, Hq, Sq), or (Hq, T) for packed documents. A PyTorch reduction: deterministic."""
    s = sinks.float()
    if layout == "packed":
        return (-(torch.exp(s[:, None] - lse) * delta).sum(1)).to(sinks.dtype)
    return (-(torch.exp(s[None, :, None] - lse) * delta).sum((0, 2))).to(sinks.dtype)


def expr_attention(q, k, v, opts: validate.Options, extra: dict, learn: list, sinks, deterministic: bool,
                   cu_q=None, cu_k=None, max_q: int = 0, max_k: int = 0):
    """(out, lse) of a validated expression call (eager)."""
    plan = api.checked_plan(q, k, v, opts, cu_q, cu_k, max_q, max_k, extra=extra)
    wants = torch.is_grad_enabled() and (any(t.requires_grad for t in (q, k, v))
                                         or (sinks is not None and sinks.requires_grad) or bool(learn))
    if not wants:
        return plan.run(q, k, v, cu_q, cu_k, extra=extra)
    return ExprAttention.apply(q, k, v, sinks, plan, deterministic, cu_q, cu_k, max_q, max_k, extra,
                               tuple(n for n, _ in learn), *(t for _, t in learn))
