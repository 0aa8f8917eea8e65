"""The buffers an expression kernel's backward writes besides dQ / dK / dV: each learnable
occurrence's per-program partial sums (XG<i>), sized for any config's grid. The runtime
(attngen.runtime.exprs) and the tuner's hooks make them the same way."""

from __future__ import annotations

import torch

from attngen.spec.expr_terms import grad_terms


def extent(q, layout: str, cu_q, max_q: int) -> tuple[int, int, int]:
    """(Z, Hq, rows): batch (or documents), query heads, query rows of the dQ pass's programs."""
    if layout == "packed":
        return cu_q.numel() - 1, q.shape[1], max_q
    if layout == "bshd":
        return q.shape[0], q.shape[2], q.shape[1]
    return q.shape[0], q.shape[1], q.shape[2]


def grad_buffers(x, q, layout: str, cu_q=None, max_q: int = 0) -> dict:
    """The dQ pass's per-program partial sums of each learnable occurrence of `x` (a kernel spec
    or the runtime's ExprSpec; zeroed: programs of packed documents past their document's end
    store nothing). Slots for the smallest dQ block (16 rows), so any config's grid fits."""
    z, hq, rows = extent(q, layout, cu_q, max_q)
    slots = z * hq * max(1, -(-rows // 16))
    return {f"XG{t.index}": torch.zeros(slots * t.width, dtype=torch.float32, device=q.device)
            for t in grad_terms(x)}
