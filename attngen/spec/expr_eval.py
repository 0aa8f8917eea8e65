"""PyTorch evaluation of spec-language expressions (attngen.spec.expr): the float64 references of
the tests and the tools evaluate the same tree the kernels are generated from."""

from __future__ import annotations

from attngen.spec.expr import BoolOp, Bin, Call, Cmp, Const, IfExp, Neg, Not, Sub, Var




def eval_torch(n: Node, env: dict, params: dict):
    """Evaluate on broadcast tensors: env maps index names (and `score`) to int64 / float64
    tensors, params maps names to tensors (indices clamped to the parameter's extent, as the
    kernels do). Python semantics for // and %."""
    import torch

    def ev(m):
        if isinstance(m, Const):
            return m.value
        if isinstance(m, Var):
            return env[m.name]
        if isinstance(m, Sub):
            t = params[m.param]
            t = t.double() if t.is_floating_point() else t.long()
            if not m.idx:
                return t.reshape(())
            idx = [torch.as_tensor(ev(i)).long().clamp(0, t.shape[d] - 1) for d, i in enumerate(m.idx)]
            idx = torch.broadcast_tensors(*idx)
            return t[tuple(idx)]
        if isinstance(m, Bin):
            a, b = ev(m.a), ev(m.b)
            if m.op == "+":
                return a + b
            if m.op == "-":
                return a - b
            if m.op == "*":
                return a * b
            if m.op == "/":
                return torch.as_tensor(a, dtype=torch.float64) / b
            if m.op == "//":
                return torch.div(torch.as_tensor(a), b, rounding_mode="floor")
            return torch.remainder(torch.as_tensor(a), b)
        if isinstance(m, Neg):
            return -ev(m.a)
        if isinstance(m, Not):
            return ~torch.as_tensor(ev(m.a), dtype=torch.bool)
        if isinstance(m, Cmp):
            a, b = torch.as_tensor(ev(m.a)), ev(m.b)
            return {"<": a.lt, "<=": a.le, ">": a.gt, ">=": a.ge, "==": a.eq, "!=": a.ne}[m.op](b)
        if isinstance(m, BoolOp):
            a, b = torch.as_tensor(ev(m.a), dtype=torch.bool), torch.as_tensor(ev(m.b), dtype=torch.bool)
            return a & b if m.op == "and" else a | b
        if isinstance(m, IfExp):
            return torch.where(torch.as_tensor(ev(m.c), dtype=torch.bool), torch.as_tensor(ev(m.a)),
                               torch.as_tensor(ev(m.b)))
        if isinstance(m, Call):
            args = [torch.as_tensor(ev(a)) for a in m.args]
            if m.fn == "abs":
                return args[0].abs()
            if m.fn == "min":
                return torch.minimum(*torch.broadcast_tensors(*args))
            if m.fn == "max":
                return torch.maximum(*torch.broadcast_tensors(*args))
            if m.fn == "floor":
                return args[0].floor().long() if args[0].is_floating_point() else args[0]
            return getattr(torch, m.fn)(args[0].double())
        raise TypeError(m)

    return ev(n)
