"""What an expression kernel's trees say, without generating code: the parsed mask and score
expressions of a kernel spec, and the learnable occurrences whose gradients the backward's dQ pass
accumulates (attngen.codegen.exprgen generates their code; the runtime and the tuner size their
buffers)."""

from __future__ import annotations

from dataclasses import dataclass

from attngen.spec import expr as X


def _params(spec) -> dict:
    return {p.name: p for p in spec.params}


def mask_node(spec):
    return X.parse(spec.mask_expr, "mask", _params(spec)) if spec.mask_expr else None


def score_node(spec):
    return X.parse(spec.score_expr, "score", _params(spec)) if spec.score_expr else None


@dataclass(frozen=True)
class GradTerm:
    """One learnable occurrence: the parameter, its subscripts' kinds ("b", "h" or "g": a general
    index), the general index's extent (1 when none) and the accumulator's width (a power of two)."""

    index: int
    param: str
    kinds: tuple
    extent: int
    width: int
    node: object


def grad_terms(spec) -> list[GradTerm]:
    node = score_node(spec)
    if node is None:
        return []
    learn = {p.name: p for p in spec.params if p.learnable}
    seen, out = [], []
    for m in X.walk(node):
        if isinstance(m, X.Sub) and m.param in learn and m not in seen:
            seen.append(m)
            kinds = tuple(i.name if isinstance(i, X.Var) and i.name in ("b", "h") else "g" for i in m.idx)
            general = [d for d, k in enumerate(kinds) if k == "g"]
            if len(general) > 1:
                raise ValueError(f"learnable parameter '{m.param}': at most one subscript may be an "
                                 f"expression other than b or h, got {X.to_text(m)}")
            extent = int(learn[m.param].shape[general[0]]) if general else 1
            width = 1 << max(extent - 1, 0).bit_length()
            out.append(GradTerm(len(out), m.param, kinds, extent, width, m))
    return out


def exact_d(spec) -> bool:
    """Whether the dQ pass sums each row's exact D = sum_j P dP (x_da): for sinks (their gradient,
    written to XD) and for learnable occurrences without a general index (their gradient as
    sum P dP w - sum_i D_i sum_j P w, not through the D of the rounded output)."""
    return bool(getattr(spec, "sinks", False)) or any("g" not in t.kinds for t in grad_terms(spec))


def _offset(n) -> dict | None:
    """n as {"q_idx": a, "kv_idx": c, "": k} (a * q_idx + c * kv_idx + k, integer coefficients),
    or None when it is not of that form."""
    if isinstance(n, X.Const) and isinstance(n.value, int) and not isinstance(n.value, bool):
        return {"": n.value}
    if isinstance(n, X.Var) and n.name in ("q_idx", "kv_idx"):
        return {n.name: 1}
    if isinstance(n, X.Neg):
        a = _offset(n.a)
        return None if a is None else {k: -v for k, v in a.items()}
    if isinstance(n, X.Bin) and n.op in ("+", "-"):
        a, b = _offset(n.a), _offset(n.b)
        if a is None or b is None:
            return None
        sign = 1 if n.op == "+" else -1
        return {k: a.get(k, 0) + sign * b.get(k, 0) for k in set(a) | set(b)}
    return None


def _key_bound(n) -> tuple | None:
    """A comparison of kv_idx - q_idx with a constant, as ("le", r) (kv_idx - q_idx <= r) or
    ("ge", r) (kv_idx - q_idx >= r); None for any other node."""
    if not isinstance(n, X.Cmp) or n.op not in ("<", "<=", ">", ">="):
        return None
    a, b = _offset(n.a), _offset(n.b)
    if a is None or b is None:
        return None
    d = {k: a.get(k, 0) - b.get(k, 0) for k in set(a) | set(b)}  # d op 0
    c = d.get("", 0)
    if (d.get("kv_idx", 0), d.get("q_idx", 0)) == (1, -1):  # kv - q + c op 0
        op = n.op
    elif (d.get("kv_idx", 0), d.get("q_idx", 0)) == (-1, 1):  # q - kv + c op 0 -> kv - q - c op' 0
        op, c = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}[n.op], -c
    else:
        return None
    # kv - q op -c, integers: < r is <= r - 1, > r is >= r + 1
    return {"<": ("le", -c - 1), "<=": ("le", -c), ">": ("ge", -c + 1), ">=": ("ge", -c)}[op]


def builtin_mask(node) -> int | None:
    """The built-in mask a mask tree is, as window_left: -1 for causal (kv_idx <= q_idx), w >= 0 for
    a causal sliding window of w + 1 keys (kv_idx <= q_idx and q_idx - kv_idx <= w); None when
    the tree is anything else (a conjunction of other terms, a parameter, b or h, ...)."""
    terms, stack = [], [node]
    while stack:
        n = stack.pop()
        if isinstance(n, X.BoolOp) and n.op == "and":
            stack += [n.a, n.b]
        else:
            terms.append(n)
    upper, lower = None, None
    for t in terms:
        bound = _key_bound(t)
        if bound is None:
            return None
        kind, r = bound
        if kind == "le":
            upper = r if upper is None else min(upper, r)
        else:
            lower = r if lower is None else max(lower, r)
    if upper != 0 or (lower is not None and lower > 0):
        return None
    return -1 if lower is None else -lower


def key_reach(node) -> int | None:
    """An upper bound on q_idx - kv_idx over the pairs mask `node` keeps, from its top-level
    conjuncts: a window (q_idx - kv_idx < C, kv_idx >= q_idx - C, ...) or chunks (q_idx // C ==
    kv_idx // C); None when no conjunct bounds it. The backward picks its tiles by it."""
    terms, stack = [], [node]
    while stack:
        n = stack.pop()
        if isinstance(n, X.BoolOp) and n.op == "and":
            stack += [n.a, n.b]
        else:
            terms.append(n)
    reach = None
    for t in terms:
        r = None
        bound = _key_bound(t)
        if bound is not None and bound[0] == "ge":  # kv - q >= r: q - kv <= -r
            r = -bound[1]
        elif _same_chunk(t):
            r = t.a.b.value - 1  # the same chunk of C: |q - kv| < C
        if r is not None:
            reach = r if reach is None else min(reach, r)
    return reach


def _same_chunk(t) -> bool:
    """t is q_idx // C == kv_idx // C (either side first), C a positive integer constant."""
    if not (isinstance(t, X.Cmp) and t.op == "==" and all(isinstance(x, X.Bin) and x.op == "//" for x in (t.a, t.b))):
        return False
    c = t.a.b
    if not (isinstance(c, X.Const) and c == t.b.b and isinstance(c.value, int) and c.value > 0):
        return False
    return sorted(map(str, (_offset(t.a.a), _offset(t.b.a)))) == sorted(map(str, ({"q_idx": 1}, {"kv_idx": 1})))


def run_pattern(t) -> tuple | None:
    """(param, var a, var b) when t is `P[a] == P[b]` with a, b the two index names (q_idx and
    kv_idx, either order) and P one parameter of one axis (a document id per position); else None.
    Such a term's key range is the run of equal values around the query block's ids where P is
    sorted (the runtime's XR_<P> buffer, attngen.kernels.expr_buffers.run_bounds)."""
    if not (isinstance(t, X.Cmp) and t.op == "==" and isinstance(t.a, X.Sub) and isinstance(t.b, X.Sub)):
        return None
    if t.a.param != t.b.param or len(t.a.idx) != 1 or len(t.b.idx) != 1:
        return None
    a, b = t.a.idx[0], t.b.idx[0]
    if not (isinstance(a, X.Var) and isinstance(b, X.Var)) or {a.name, b.name} != {"q_idx", "kv_idx"}:
        return None
    return t.a.param, a.name, b.name


def run_params(node) -> list[str]:
    """The parameters of node's run patterns (sorted names; none for None)."""
    if node is None:
        return []
    return sorted({r[0] for r in map(run_pattern, X.walk(node)) if r is not None})

