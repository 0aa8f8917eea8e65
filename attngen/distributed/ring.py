"""attngen as the per-step attention of PyTorch's ring.

PyTorch's context parallelism (torch.distributed.tensor.experimental, module
_context_parallel/_attention.py, the same in torch 2.11 and 2.13) runs SDPA through
`_templated_ring_attention(group, seq_dim, op, query, key, value, is_causal, **kwargs)` and
`_templated_ring_attention_backward(group, seq_dim, op, grad_out, grad_out_name, query, key,
value, out, logsumexp, is_causal, **kwargs)`: they move the K/V shards around the group (one
all-gather, or an all-to-all a step: torch's `set_rotate_method`), merge each step's (out, lse) in
fp32, and in the backward send dK/dV (fp32) on to their owners. `op` is any attention returning
(out, lse) / (dq, dk, dv). attngen passes its own op, called once a step in step order with all
of the local queries and all of the step's keys (is_causal=False, torch's own load-balance
switch off for the call); the op knows the step from its count and runs the calls of
attngen.distributed.plan, which know the global positions and so the exact mask.

The backward of each call takes the FINAL out and lse (the ring's merged ones), as ring attention
does: P = exp(S - lse) is then the global softmax and D = rowsum(dO * O) the global one, so each
step's dQ / dK / dV is its exact share of the gradient.
"""

from __future__ import annotations

import contextlib
import inspect
import math

import torch

import attngen
from attngen.distributed.expr import Offsets
from attngen.distributed.plan import Mask, step_calls
from attngen.runtime import api, validate
from attngen.runtime import exprs as rexprs

# the merge of torch's ring turns a running lse of -inf (a row that saw nothing on the first
# step, possible only under a mask expression) into NaN; such rows get this lse instead
# (exp(-200) is 0 in fp32 next to any real row) and -inf again at the end
EMPTY_LSE = -200.0

_NEED = {
    "_templated_ring_attention": ("group", "seq_dim", "op", "query", "key", "value", "is_causal"),
    "_templated_ring_attention_backward": ("group", "seq_dim", "op", "grad_out", "grad_out_name", "query",
                                           "key", "value", "out", "logsumexp", "is_causal"),
}
_ENGINE = None


def engine():
    """torch's context-parallel module, its ring functions checked by signature."""
    global _ENGINE
    if _ENGINE is not None:
        return _ENGINE
    try:
        from torch.distributed.tensor.experimental._context_parallel import _attention as cp
    except ImportError as e:
        raise RuntimeError(f"attngen.distributed runs on torch's context parallelism (torch 2.11 to 2.13), which "
                           f"torch {torch.__version__} lacks: {e}") from None
    for name, params in _NEED.items():
        fn = getattr(cp, name, None)
        got = tuple(inspect.signature(fn).parameters)[:len(params)] if fn is not None else ()
        if got != params:
            raise RuntimeError(f"attngen.distributed: torch {torch.__version__}'s {name} is not the one it was written "
                               f"for (parameters {params}, found {got or 'no such function'})")
    for field in ("enable_load_balance", "convert_to_f32", "rotate_method"):
        if not hasattr(cp._cp_options, field):
            raise RuntimeError(f"attngen.distributed: torch {torch.__version__}'s _cp_options has no {field}")
    _ENGINE = cp
    return cp


@contextlib.contextmanager
def _torch_options(cp, rotate):
    """torch's global CP options for one call of its ring (restored after)."""
    o = cp._cp_options
    saved = (o.enable_load_balance, o.convert_to_f32, o.rotate_method)
    o.enable_load_balance, o.convert_to_f32 = False, True
    if rotate is not None:
        o.rotate_method = {"allgather": cp._RotateMethod.ALL_GATHER, "alltoall": cp._RotateMethod.ALL_TO_ALL}[rotate]
    try:
        yield
    finally:
        o.enable_load_balance, o.convert_to_f32, o.rotate_method = saved


def _merge(out, lse, rows, o, l):
    """LSE-merge the partial (o, l) into the fp32 out / lse at `rows`, in place (rows empty in
    both stay 0 / -inf)."""
    r0, r1 = rows
    lo = lse[:, :, r0:r1]
    m = torch.maximum(lo, l)
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    w1, w2 = torch.exp(lo - m), torch.exp(l - m)
    s = w1 + w2
    denom = torch.where(s > 0, s, 1.0)[..., None]
    out[:, :, r0:r1] = (out[:, :, r0:r1] * w1[..., None] + o.float() * w2[..., None]) / denom
    lse[:, :, r0:r1] = torch.where(s > 0, m + torch.log(s), float("-inf"))


def _disjoint(ranges) -> bool:
    spans = sorted(ranges)
    return all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))


def _gaps(ranges, n: int):
    """The parts of [0, n) no range covers."""
    out, at = [], 0
    for a, b in sorted(ranges):
        if a > at:
            out.append((at, a))
        at = max(at, b)
    return out + ([(at, n)] if at < n else [])


def _assemble(like, ranges, parts):
    """A tensor like `like` holding each part at its range of dim 2, zeros elsewhere."""
    full = torch.empty_like(like)
    for a, b in _gaps(ranges, like.shape[2]):
        full[:, :, a:b] = 0
    for (a, b), x in zip(ranges, parts):
        full[:, :, a:b] = x
    return full


def _pack(x, rows):
    """(B, H, S, D)[:, :, rows] as packed documents (B * n, H, D)."""
    part = x[:, :, rows[0]:rows[1]]
    return part.permute(0, 2, 1, 3).reshape(-1, x.shape[1], x.shape[3])


def _unpack(x, batch):
    return x.reshape(batch, -1, x.shape[1], x.shape[2]).permute(0, 2, 1, 3)


class Ring:
    """One context-parallel attention: the group, the global geometry and the per-call options."""

    def __init__(self, group, rank: int, world: int, seqlen: int, load_balance, mask: Mask, softcap: float,
                 scale, deterministic: bool, rotate, mask_text=None, score_text=None, params=None, used=()):
        self.group, self.rank, self.world, self.seqlen = group, rank, world, seqlen
        self.load_balance, self.mask, self.rotate = load_balance, mask, rotate
        self.softcap, self.scale, self.deterministic = softcap, scale, deterministic
        self.mask_text, self.score_text, self.params, self.used = mask_text, score_text, params or {}, set(used)
        self.has_expr = mask_text is not None or score_text is not None
        self.offsets = Offsets()
        self._cu: dict = {}

    def calls(self, step: int):
        return step_calls(self.seqlen, self.world, self.rank, step, self.load_balance, self.mask)

    # ------------------------------------------------------------------ one call
    def _expr_kw(self, call, device) -> dict:
        if not self.has_expr:
            return {}
        params = {**self.params, **self.offsets.params(self.used, call.origin, self.seqlen, device)}
        return {"mask_mod": self.mask_text, "score_mod": self.score_text, "params": params}

    def _cu_of(self, call, batch: int, device):
        key = (call.cu, batch, device)
        if key not in self._cu:
            n = call.rows[1] - call.rows[0]
            bounds = [0] + [b * n + x for b in range(batch) for x in call.cu[1:]]
            self._cu[key] = (torch.tensor(bounds, dtype=torch.int32, device=device),
                             max(y - x for x, y in zip(call.cu, call.cu[1:])))
        return self._cu[key]

    def call_forward(self, call, q, k, v):
        kw = dict(causal=call.causal, window_size=call.window, softcap=self.softcap, scale=self.scale,
                  causal_alignment="top_left", return_lse=True)
        if call.cu is not None:
            cu, mx = self._cu_of(call, q.shape[0], q.device)
            o, l = attngen.attention_varlen(_pack(q, call.rows), _pack(k, call.cols), _pack(v, call.cols), cu, cu,
                                            mx, mx, **kw)
            return _unpack(o, q.shape[0]), l.reshape(l.shape[0], q.shape[0], -1).permute(1, 0, 2)
        r, c = slice(*call.rows), slice(*call.cols)
        return attngen.attention(q[:, :, r], k[:, :, c], v[:, :, c], **kw, **self._expr_kw(call, q.device))

    def call_backward(self, call, q, k, v, out, dout, lse):
        r, c = slice(*call.rows), slice(*call.cols)
        layout = "packed" if call.cu is not None else "bhsd"
        opts = validate.make_options(q.shape[-1], call.causal, call.window, self.softcap, self.scale, "top_left",
                                     layout)
        if call.cu is not None:
            cu, mx = self._cu_of(call, q.shape[0], q.device)
            lse_p = lse[:, :, r].permute(1, 0, 2).reshape(lse.shape[1], -1).contiguous()
            g = api.backward_impl(_pack(dout, call.rows), _pack(q, call.rows), _pack(k, call.cols),
                                  _pack(v, call.cols), _pack(out, call.rows), lse_p, opts, self.deterministic,
                                  cu, cu, mx, mx)
            return tuple(_unpack(x, q.shape[0]) for x in g)
        qs, ks, vs = q[:, :, r], k[:, :, c], v[:, :, c]
        os_, ds, ls = out[:, :, r], dout[:, :, r], lse[:, :, r].contiguous()
        if not self.has_expr:
            return api.backward_impl(ds, qs, ks, vs, os_, ls, opts, self.deterministic)
        kw = self._expr_kw(call, q.device)
        opts, extra, _ = rexprs.expr_options(qs, qs.shape[1], opts, kw["mask_mod"], kw["score_mod"], None,
                                            kw["params"], learnable=())
        dq, dk, dv, _, _ = rexprs.expr_backward(ds, qs, ks, vs, os_, ls, None, None, (0, 0), opts,
                                                self.deterministic, extra, {}, None, False)
        return dq, dk, dv

    # ------------------------------------------------------------------ one step (torch's op protocol)
    def forward_op(self, steps: list):
        """torch's op for the forward; each call appends its step to `steps`."""

        def op(query, key, value, is_causal=False, **_):
            step = len(steps)
            steps.append(step)
            calls = self.calls(step)
            B, H, n = query.shape[:3]
            if len(calls) == 1 and calls[0].rows == (0, n):
                out, lse = self.call_forward(calls[0], query, key, value)
            elif _disjoint([c.rows for c in calls]):  # each row from one call: copies, gaps filled
                out = query.new_empty(B, H, n, value.shape[-1])
                lse = torch.empty((B, H, n), dtype=torch.float32, device=query.device)
                for a, b in _gaps([c.rows for c in calls], n):
                    out[:, :, a:b] = 0
                    lse[:, :, a:b] = float("-inf")
                for call in calls:
                    out[:, :, call.rows[0]:call.rows[1]], lse[:, :, call.rows[0]:call.rows[1]] = self.call_forward(
                        call, query, key, value)
            else:  # calls share rows: LSE-merged in fp32
                acc = torch.zeros(B, H, n, value.shape[-1], dtype=torch.float32, device=query.device)
                lse = torch.full((B, H, n), float("-inf"), dtype=torch.float32, device=query.device)
                for call in calls:
                    o, l = self.call_forward(call, query, key, value)
                    _merge(acc, lse, call.rows, o, l)
                out = acc.to(query.dtype)
            if step == 0 and self.mask_text is not None:
                lse = torch.where(torch.isneginf(lse), torch.full_like(lse, EMPTY_LSE), lse)
            return out, lse

        return op

    def backward_op(self, steps: list):
        """torch's op for the backward; each call appends its step to `steps`."""

        def op(query, key, value, out, logsumexp, is_causal=False, grad_out=None, **_):
            steps.append(len(steps))
            calls = self.calls(steps[-1])
            n, m = query.shape[2], key.shape[2]
            if len(calls) == 1 and calls[0].rows == (0, n) and calls[0].cols == (0, m):
                return self.call_backward(calls[0], query, key, value, out, grad_out, logsumexp)
            rows, cols = [c.rows for c in calls], [c.cols for c in calls]
            grads = [self.call_backward(c, query, key, value, out, grad_out, logsumexp) for c in calls]
            if _disjoint(rows) and _disjoint(cols):  # each row from one call: copies, gaps zero
                return (_assemble(query, rows, [g[0] for g in grads]), _assemble(key, cols, [g[1] for g in grads]),
                        _assemble(value, cols, [g[2] for g in grads]))
            dq = torch.zeros_like(query, dtype=torch.float32)
            dk = torch.zeros_like(key, dtype=torch.float32)
            dv = torch.zeros_like(value, dtype=torch.float32)
            for call, (gq, gk, gv) in zip(calls, grads):
                dq[:, :, call.rows[0]:call.rows[1]] += gq
                dk[:, :, call.cols[0]:call.cols[1]] += gk
                dv[:, :, call.cols[0]:call.cols[1]] += gv
            return dq, dk, dv

        return op

    # ------------------------------------------------------------------ the ring
    def forward(self, q, k, v):
        cp = engine()
        with _torch_options(cp, self.rotate):
            steps = []
            out, lse = cp._templated_ring_attention(self.group, 2, self.forward_op(steps), q, k, v, is_causal=False)
        self._check_steps(steps, "_templated_ring_attention")
        if self.mask_text is not None:  # rows that never saw a key
            lse = torch.where(lse <= EMPTY_LSE + math.log(self.world) + 1.0, float("-inf"), lse)
        return out, lse

    def backward(self, dout, q, k, v, out, lse):
        cp = engine()
        with _torch_options(cp, self.rotate):
            steps = []
            dq, dk, dv = cp._templated_ring_attention_backward(self.group, 2, self.backward_op(steps),
                                                               dout.contiguous(), "grad_out", q, k, v, out, lse,
                                                               is_causal=False)
        self._check_steps(steps, "_templated_ring_attention_backward")
        return dq, dk, dv

    def _check_steps(self, steps: list, name: str) -> None:
        """The op knows its step by counting: torch must have called it once per rank, in order
        (it does with is_causal=False; a torch that skipped a step would be caught here)."""
        if len(steps) != self.world:
            raise RuntimeError(f"attngen.distributed: torch {torch.__version__}'s {name} called the attention op "
                               f"{len(steps)} times for {self.world} ranks; its step order is not the one "
                               "attngen.distributed was written for")


class RingAttention(torch.autograd.Function):
    """Differentiable in q, k, v; lse is not."""

    @staticmethod
    def forward(ctx, q, k, v, ring: Ring):
        out, lse = ring.forward(q, k, v)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring = ring
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        if dout is None:
            return None, None, None, None
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ctx.ring.backward(dout, q, k, v, out, lse)
        return dq, dk, dv, None
