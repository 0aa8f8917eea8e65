"""The buffers an expression kernel takes besides its parameters: what its backward writes besides
dQ / dK / dV (each learnable occurrence's per-program partial sums, XG<i>, sized for any config's
grid), and the runs of a parameter compared along both indices (XR_<P>, run_bounds). The runtime
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


RUN_END = 1 << 30  # past the last run: keys beyond a parameter's extent read its last value


def run_bounds(p: torch.Tensor) -> torch.Tensor:
    """XR_<P> for a mask term `P[q_idx] == P[kv_idx]` (P one axis of N values): int32 (2N + 1,),
    [0, N) the first position of each position's run of equal values, [N, 2N) one past its last
    (RUN_END for the last run), [2N] 1 when P never decreases. Where it does decrease a value can
    come back in another run, so the runs bound nothing: then every start is 0 and every end
    RUN_END (and [2N] is 0), and the kernels' loops keep their whole ranges. Device ops only (no
    synchronization; under CUDA graphs it is captured with the call)."""
    n = p.numel()
    dev = p.device
    idx = torch.arange(n, device=dev, dtype=torch.int32)
    new = torch.ones(n, dtype=torch.bool, device=dev)
    last = torch.ones(n, dtype=torch.bool, device=dev)
    if n > 1:
        new[1:] = p[1:] != p[:-1]
        last[:-1] = new[1:]
    start = torch.where(new, idx, 0).cummax(0).values
    end = torch.where(last, idx + 1, RUN_END).flip(0).cummin(0).values.flip(0)
    end = torch.where(end == n, RUN_END, end)
    ok = (p[1:] >= p[:-1]).all() if n > 1 else torch.ones((), dtype=torch.bool, device=dev)
    return torch.cat([torch.where(ok, start, 0), torch.where(ok, end, RUN_END), ok.to(torch.int32).reshape(1)]).to(
        torch.int32)

