"""What the forward and backward tuning hooks add for a kernel with expressions or learned sinks
(KernelSpec.has_expr): the kernel's parameter tensors and sinks as inputs, and a reference that
evaluates the kernel's own expression trees (attngen.spec.expr_eval) on the scores, in float64 and
in the inputs' precision. The tuner's objective (attngen.tuning.objective) sees only the hooks;
the runtime never loads this module."""

from __future__ import annotations

# parameter values the tuner measures with: floats uniform in [0, FLOAT_HIGH) (slopes and biases
# of the size models use; the scores stay finite), ints uniform in [0, seqlen_k / INT_FRACTION]
# (prefix lengths of a fraction of the sequence: tiles of every class, empty, partial and full)
FLOAT_HIGH = 0.1
INT_FRACTION = 4
# a parameter compared along both indices (P[q_idx] == P[kv_idx]: document ids) gets sorted ids
# of this many documents, so the runs bound the loops as in use
RUN_DOCS = 8


def _extent(axis, problem) -> int:
    if axis == "b":
        return problem.batch  # packed: the documents
    if axis == "h":
        return problem.heads_q
    if isinstance(axis, int):
        return axis
    raise ValueError(f"parameter axis {axis!r}: expected 'b', 'h' or a size")


def inputs(obj, seed: int) -> dict:
    """XP_<name> for each declared parameter (and XR_<name>, its runs, for a parameter the mask
    compares along both indices) and Sinks (Hq,) fp32 for learned sinks, seeded."""
    import torch

    p, s = obj.problem, obj.spec
    g = torch.Generator(device=obj.device).manual_seed(3000 + seed)
    out = {}
    from attngen.kernels.expr_buffers import run_bounds
    from attngen.spec.expr_terms import mask_node, run_params

    runs = run_params(mask_node(s))
    for decl in s.params:
        shape = tuple(_extent(a, p) for a in decl.shape)
        if decl.name in runs:  # a document id per position: RUN_DOCS sorted runs of random length
            ids = torch.randint(0, RUN_DOCS, shape, generator=g, device=obj.device).sort().values
            out[f"XP_{decl.name}"] = ids.to({"int32": torch.int32, "fp32": torch.float32, "fp16": torch.float16,
                                             "bf16": torch.bfloat16}[decl.dtype])
            out[f"XR_{decl.name}"] = run_bounds(out[f"XP_{decl.name}"])
        elif decl.kind == "int":
            hi = max(1, p.seqlen_k // INT_FRACTION)
            out[f"XP_{decl.name}"] = torch.randint(0, hi + 1, shape, generator=g, device=obj.device,
                                                   dtype=torch.int32)
        else:
            x = torch.rand(shape, generator=g, device=obj.device) * FLOAT_HIGH
            out[f"XP_{decl.name}"] = x.to({"fp32": torch.float32, "fp16": torch.float16,
                                           "bf16": torch.bfloat16}[decl.dtype])
    if s.sinks:
        out["Sinks"] = torch.randn(p.heads_q, generator=g, device=obj.device)
    return out


def extra(t: dict) -> dict:
    """The kernel's expression tensors of input set `t` (the launchers' `extra`)."""
    return {n: x for n, x in t.items() if n.startswith(("XP_", "XR_")) or n == "Sinks"}


def _attention(obj, t, unit: int, heads: slice, q, k, v, r0: int, upcast: bool):
    """(out, lse) of query rows r0.. of query heads `heads` (q (1, G, rows, D)) against one KV head
    (1, 1, Sk, D) of batch row (or document) `unit`: scores scaled, the score expression (or
    softcap), the mask expression and the built-in mask, the sinks in the denominator. upcast:
    float64; else the inputs' precision for the products and fp32 for the softmax, as a plain
    PyTorch implementation."""
    import torch

    from attngen.problem import keep_mask
    from attngen.spec.expr_eval import eval_torch
    from attngen.spec.expr_terms import mask_node, score_node

    p, spec = obj.problem, obj.spec
    dt = torch.float64 if upcast else q.dtype
    rows, sk = q.shape[2], k.shape[2]
    s = (q.to(dt) @ k.to(dt).transpose(-1, -2)).to(torch.float64 if upcast else torch.float32) * p.softmax_scale
    dev = q.device
    h = torch.arange(heads.start, heads.stop, device=dev)
    diag = 0 if p.top_left else p.seqlen_k - p.seqlen_q
    env = {"b": torch.tensor(unit, device=dev), "h": h[None, :, None, None],
           "q_idx": (torch.arange(r0, r0 + rows, device=dev) + diag)[None, None, :, None],
           "kv_idx": torch.arange(sk, device=dev)[None, None, None, :],
           "seqlen_q": p.seqlen_q, "seqlen_k": p.seqlen_k}
    params = {d.name: t[f"XP_{d.name}"] for d in spec.params}
    node = score_node(spec)
    if node is not None:
        s = eval_torch(node, {**env, "score": s}, params).to(s.dtype)
    elif p.softcap > 0:
        s = p.softcap * torch.tanh(s / p.softcap)
    keep = keep_mask(p.seqlen_q, p.seqlen_k, p.causal, p.window, p.top_left, device=dev)[r0:r0 + rows]
    node = mask_node(spec)
    if node is not None:
        keep = keep & eval_torch(node, env, params)
    s = s.masked_fill(~keep, float("-inf"))
    if spec.sinks:
        sink = t["Sinks"][h].to(s.dtype)[None, :, None, None].expand(*s.shape[:3], 1)
        s = torch.cat([s, sink], -1)
    lse = torch.logsumexp(s, -1)
    pr = torch.softmax(s, -1).nan_to_num(0.0)
    if spec.sinks:
        pr = pr[..., :-1]
    out = pr.to(dt) @ v.to(dt)
    return (out if upcast else out.to(q.dtype)), lse


def grouped_heads(obj, t: dict, unit: int, q, k, v, upcast: bool):
    """(out, lse) of every query head of batch row `unit` (q (1, Hq, Sq, D), k / v (1, Hkv, Sk, D)),
    one KV head's group at a time (the decode family's reference)."""
    import torch

    g = obj.spec.gqa_ratio
    parts = [_attention(obj, t, unit, slice(h * g, (h + 1) * g), q[:, h * g:(h + 1) * g], k[:, h:h + 1],
                        v[:, h:h + 1], 0, upcast) for h in range(k.shape[1])]
    return torch.cat([o for o, _ in parts], 1), torch.cat([lse for _, lse in parts], 1)


def reference(obj, t: dict, max_scores: int, grads: bool) -> dict:
    """The forward's out64 / lse64 / out_pt or, with grads, the backward's dq / dk / dv "64" and
    "_pt" (dO = t["dout"]) of input set `t`, in the input's layout (attngen.problem's
    grouped_reference and chunks, with this module's attention in place of the plain one)."""
    from attngen.problem import gradient_chunk, grouped_reference, output_chunk

    chunk = gradient_chunk if grads else output_chunk

    def one(v, hs, g, keep, rows, kw):
        return chunk(obj.problem, v, hs, g, keep, rows, kw,
                     attn=lambda q, k, vv, r0, upcast: _attention(obj, t, v["unit"], hs, q, k, vv, r0, upcast))

    return grouped_reference(obj.problem, obj.spec.gqa_ratio, t, one, max_scores, obj.device)


def backward_buffers(obj, t: dict) -> dict:
    """The backward's own expression tensors: the per-program partial sums of learnable
    parameters (XG<i>, zeroed) and, with sinks, each row's exact D (XD), as the runtime makes them
    (attngen.runtime.exprs.expr_backward)."""
    import torch

    from attngen.kernels.expr_buffers import grad_buffers

    p, s = obj.problem, obj.spec
    layout = "packed" if s.varlen else "bhsd"
    cu = t.get("cu_q")
    bufs = grad_buffers(s, t["q"], layout, cu, p.seqlen_q) if any(d.learnable for d in s.params) else {}
    if s.sinks:
        bufs["XD"] = torch.empty_like(t["lse"])
    return bufs
