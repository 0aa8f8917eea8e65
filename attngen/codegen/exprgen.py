"""Expression kernels' code fragments: what the templates place where a mask, a score modification,
their parameters, learned sinks and the loop ranges go (attngen.spec.expr compiles, the templates
substitute; the fragments are statements in the kernels' own names).

Kernel-side names the fragments use: x_b, x_h (the batch or document and the query head; x_h a
column vector in the decode kernel, whose tile packs a KV head's query heads), rows / cols (query
rows and key indices of the tile), diag_offset, seqlen_q, seqlen_k, qk_scale, and per parameter p:
XP_p (the tensor), xp_p_s<i> / xp_p_n<i> (stride and extent of axis i), and XR_p for a parameter
the mask compares along both indices (p[q_idx] == p[kv_idx]: its runs, which bound the loops;
attngen.kernels.expr_buffers.run_bounds); learned sinks: Sinks (fp32, one per query head).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from attngen.codegen import exprcode as XC
from attngen.codegen import exprranges as XR
from attngen.spec import expr as X
from attngen.spec import exprdiff as XD
from attngen.spec.expr_terms import GradTerm, exact_d, grad_terms, mask_node, run_params, score_node  # noqa: F401
from attngen.spec.model import KernelSpec


def param_names(spec: KernelSpec) -> list[str]:
    return [p.name for p in spec.params]


def _load(spec: KernelSpec):
    decls = {p.name: p for p in spec.params}

    def load(name: str, idx: list[str]) -> str:
        p = decls[name]
        off = []
        for i, code in enumerate(idx):
            try:
                lit = int(code)
            except ValueError:
                off.append(f"tl.minimum(tl.maximum({code}, 0), xp_{name}_n{i} - 1) * xp_{name}_s{i}")
            else:
                off.append(f"tl.minimum({max(lit, 0)}, xp_{name}_n{i} - 1) * xp_{name}_s{i}")
        ptr = f"XP_{name}" + "".join(f" + {o}" for o in off)
        code = f"tl.load({ptr})"
        return code + ".to(tl.float32)" if p.kind == X.FLOAT else code

    return load


@dataclass
class Fragments:
    """What one kernel spec's templates need (all "" / False for a kernel without expressions)."""

    on: bool = False
    score: bool = False
    sinks: bool = False
    tensors: str = ""  # ", XP_a, XP_b" for the entry's tensor line
    sizes: str = ""  # "xp_a_s0, xp_a_n0, ..." (an entry line of lengths)
    args: str = ""  # ", x_b, x_h, XP_a, xp_a_s0, ..." for inner functions' signatures and calls
    skip_kv: bool = False  # the forward's key loop: its masked stages test each tile
    skip_kv_bwd: bool = False  # the dQ pass's key loop: the same, for gathered parameters only
    skip_q: bool = False  # the dK/dV pass's query loop: the same, for gathered parameters only
    grads: str = ""  # ", XG0, XG1[, XD]": learnable parameters' partial sums, sinks' exact D (dQ pass)


def fragments(spec: KernelSpec) -> Fragments:
    if not (spec.mask_expr or spec.score_expr or spec.sinks):
        return Fragments()
    names = param_names(spec)
    mask = mask_node(spec)
    runs = "".join(f", XR_{n}" for n in run_params(mask))  # run bounds of P[q_idx] == P[kv_idx] terms
    tensors = "".join(f", XP_{n}" for n in names) + runs + (", Sinks" if spec.sinks else "")
    sizes = ", ".join(f"xp_{p.name}_s{i}, xp_{p.name}_n{i}" for p in spec.params for i in range(len(p.shape)))
    args = ", x_b, x_h" + "".join(f", XP_{n}" for n in names) + runs + (", Sinks" if spec.sinks else "")
    if sizes:
        args += ", " + sizes
    grads = "".join(f", XG{t.index}" for t in grad_terms(spec)) + (", XD" if spec.sinks else "")
    return Fragments(True, bool(spec.score_expr), spec.sinks, tensors, sizes, args,
                     skip_kv=mask is not None and XR.needs_tile_skip(mask, "kv_idx"),
                     skip_kv_bwd=mask is not None and XR.gathers_along(mask, "kv_idx"),
                     skip_q=mask is not None and XR.gathers_along(mask, "q_idx"), grads=grads)


def _tile_names(rows: str, cols: str, transposed: bool, decode: bool) -> dict:
    r = f"({rows} + diag_offset)" + ("[None, :]" if transposed else "[:, None]")
    c = cols + ("[:, None]" if transposed else "[None, :]")
    return {"q_idx": r, "kv_idx": c, "b": "x_b", "h": "x_h", "seqlen_q": "seqlen_q", "seqlen_k": "seqlen_k",
            "score": "x_score"}


def _tile_vecs(rows: str, cols: str, transposed: bool, decode: bool) -> dict:
    """The index vectors of a tile (exprcode.Emitter.vecs); none in the decode kernel, whose rows
    pack several query heads."""
    if decode:
        return {}
    return {"q_idx": (f"({rows} + diag_offset)", "[None, :]" if transposed else "[:, None]"),
            "kv_idx": (cols, "[:, None]" if transposed else "[None, :]")}


def mask_tile(spec: KernelSpec, rows: str, cols: str, transposed: bool = False, decode: bool = False) -> str:
    """Statements leaving the mask expression's tile in `x_keep` (nothing without one)."""
    node = mask_node(spec)
    if node is None:
        return ""
    em = XC.Emitter(_tile_names(rows, cols, transposed, decode), _load(spec), "xm_",
                    vecs=_tile_vecs(rows, cols, transposed, decode))
    out = em.emit(node)
    return "\n".join(em.lines + [f"x_keep = {out}"])


def score_tile(spec: KernelSpec, out: str, qk: str, rows: str = "rows", cols: str = "cols",
               transposed: bool = False, derivative: bool = False, ref: str = "", minus: str = "") -> str:
    """Statements computing `out` = score_mod(scale * qk) in the log2 domain; with derivative,
    also `<out>_dmod` = d score_mod / d score (none when the modification adds to the score).
    minus: code of a vector along the query rows (the backward's log2 logsumexp) that `out` then
    has subtracted. ref: code of an integer key index near the tile (a block's first key or row): where
    the added term is a factor the same across the tile times a sum of a query-only and a key-only
    integer term, those two are taken apart as vectors around ref and the tile costs an add and
    an FMA a score (see _separated)."""
    node = under_mask(score_node(spec), mask_node(spec))
    vecs = _tile_vecs(rows, cols, transposed, False)
    em = XC.Emitter(_tile_names(rows, cols, transposed, False), _load(spec), f"xs_{out}_", vecs=vecs)
    q_sfx = vecs["q_idx"][1] if vecs else ("[None, :]" if transposed else "[:, None]")
    add = _additive(node)
    if add is not None:
        # score + g: qk * qk_scale + g * log2(e), the constant folded into g's factor that is
        # the same across the tile (ALiBi's slope[h])
        sep = _separated(add[1], add[0] * _LOG2E) if ref and vecs and SEPARATE else None
        if sep is not None:
            return "\n".join(_separated_code(spec, em, sep, out, qk, rows, cols, transposed, ref, minus, q_sfx))
        res = em.emit(_scaled(add[1], add[0] * _LOG2E))
        tail = f" - ({minus}){q_sfx}" if minus else ""
        return "\n".join(em.lines + [f"{out} = {qk} * qk_scale + {res}{tail}"])
    lines = [f"x_score = {qk} * (qk_scale * 0.6931471805599453)"]
    res = em.emit(node)
    tail = [f"{out} = {res} * 1.4426950408889634" + (f" - ({minus}){q_sfx}" if minus else "")]
    if derivative and not XD.is_identity_in_score(node):
        d = XD.diff(node, lambda m: isinstance(m, X.Var) and m.name == "score")
        tail.append(f"{out}_dmod = {em.emit(d)}")
    return "\n".join(lines + em.lines + tail)


# the query-only / key-only split of an added term (score_tile's ref); module-level so that an
# A/B run can switch it off in one process
SEPARATE = True


def under_mask(node, mask):
    """node with abs(a - b) written a - b (or b - a) where the mask's conjunction says b <= a (or
    a <= b) for every pair it keeps: the pairs it drops never reach the softmax, so the value there
    does not matter (ALiBi under causal: |q - k| = q - k)."""
    if node is None or mask is None:
        return node
    facts = set()
    todo = [mask]
    while todo:
        m = todo.pop()
        if isinstance(m, X.BoolOp) and m.op == "and":
            todo += [m.a, m.b]
        elif isinstance(m, X.Cmp) and m.op in ("<", "<="):
            facts.add((m.a, m.b))
        elif isinstance(m, X.Cmp) and m.op in (">", ">="):
            facts.add((m.b, m.a))

    def go(n):
        if isinstance(n, X.Call) and n.fn == "abs" and isinstance(n.args[0], X.Bin) and n.args[0].op == "-":
            a, b = n.args[0].a, n.args[0].b
            if (b, a) in facts:
                return go(n.args[0])
            if (a, b) in facts:
                return X.Bin(n.args[0].ty, "-", go(b), go(a))
        if isinstance(n, X.Bin):
            return X.Bin(n.ty, n.op, go(n.a), go(n.b))
        if isinstance(n, (X.Neg, X.Not)):
            return type(n)(n.ty, go(n.a))
        if isinstance(n, (X.Cmp, X.BoolOp)):
            return type(n)(n.ty, n.op, go(n.a), go(n.b))
        if isinstance(n, X.IfExp):
            return X.IfExp(n.ty, go(n.c), go(n.a), go(n.b))
        if isinstance(n, X.Call):
            return X.Call(n.ty, n.fn, tuple(go(a) for a in n.args))
        return n

    return go(node)


def _separated(g: X.Node, c: float):
    """(k, query terms, key terms) where g * c == k * (sum of the query terms + sum of the key
    terms), k free of tile indices, the terms (sign, integer node) each free of one index; else
    None."""
    u, c, w = _factor(g, c)
    k = X.const(c) if u is None else X.Bin(X.FLOAT, "*", u, X.const(c))
    if w.ty != X.INT or XC._uses_any(k, _TILE_INDICES):
        return None
    terms = []
    todo = [(1, w)]
    while todo:
        sign, n = todo.pop()
        if isinstance(n, X.Bin) and n.op in ("+", "-"):
            todo += [(sign, n.a), (sign if n.op == "+" else -sign, n.b)]
        elif isinstance(n, X.Neg):
            todo.append((-sign, n.a))
        elif XC._uses_any(n, ("q_idx",)) and XC._uses_any(n, ("kv_idx",)):
            return None
        else:
            terms.append((sign, n))
    keys = [t for t in terms if XC._uses_any(t[1], ("kv_idx",))]
    if not keys:
        return None
    return k, [t for t in terms if t not in keys], keys


def _separated_code(spec, em, sep, out, qk, rows, cols, transposed, ref, minus, q_sfx) -> list[str]:
    """k * (w_q - ref) as a query vector (less `minus`) and k * (w_k + ref) as a key vector, both
    integers before the conversion (exact), their sum the added term to within an ulp of the
    larger, and ref near the tile keeps both small next to the diagonal."""
    k, qs, ks = sep
    ref_var = X.Var(X.INT, "x_ref")

    def total(terms, last):
        acc = None
        for sign, n in terms + [last]:
            if acc is None:
                acc = n if sign > 0 else X.Neg(X.INT, n)
            else:
                acc = X.Bin(X.INT, "+" if sign > 0 else "-", acc, n)
        return acc

    names = dict(_tile_names(rows, cols, transposed, False), x_ref=f"({ref})")
    vecs = _tile_vecs(rows, cols, transposed, False)
    names["q_idx"], names["kv_idx"] = vecs["q_idx"][0], vecs["kv_idx"][0]
    vem = XC.Emitter(names, _load(spec), f"xv_{out}_")
    kc = em.emit(k)
    wq = vem.emit(total(qs, (-1, ref_var)))
    wk = vem.emit(total(ks, (1, ref_var)))
    lines = em.lines + vem.lines
    qv = f"{kc} * ({wq}).to(tl.float32)" + (f" - ({minus})" if minus else "")
    q_vec = bool(minus) or any(XC._uses_any(n, ("q_idx",)) for _, n in qs)
    lines.append(f"x_{out}_qv = {qv}")
    lines.append(f"x_{out}_kv = {kc} * ({wk}).to(tl.float32)")
    # the FMA first, the key vector added after it: in the Gluon dQ pass (hd128, ptxas) the sum
    # of the two vectors first put 19 spill stores and 23 loads inside the main loop
    lines.append(f"{out} = ({qk} * qk_scale + x_{out}_qv{q_sfx if q_vec else ''}) + x_{out}_kv{vecs['kv_idx'][1]}")
    return lines


_LOG2E = 1.4426950408889634
_TILE_INDICES = ("q_idx", "kv_idx", "score")


def _additive(node: X.Node):
    """(sign, g) where node is score + g, g + score or score - g with g free of score; else None."""
    if isinstance(node, X.Bin) and node.op in ("+", "-"):
        is_score = lambda m: isinstance(m, X.Var) and m.name == "score"  # noqa: E731
        if is_score(node.a) and not X.uses(node.b, "score"):
            return (1.0 if node.op == "+" else -1.0), node.b
        if node.op == "+" and is_score(node.b) and not X.uses(node.a, "score"):
            return 1.0, node.a
    return None


def _scaled(g: X.Node, c: float) -> X.Node:
    """g * c, c multiplied into a factor of g that is the same across the tile (no tile index in
    it) where g is such a product, so that it costs one multiply a program."""
    u, c, w = _factor(g, c)
    if u is None:
        return X.Bin(X.FLOAT, "*", w, X.const(c))
    return X.Bin(X.FLOAT, "*", X.Bin(X.FLOAT, "*", u, X.const(c)), w)


def _factor(g: X.Node, c: float):
    """(u, c', w) with g * c == u * c' * w, u a factor of g free of tile indices (None: no such
    factor, g * c == c' * w), negations moved into c'."""
    if isinstance(g, X.Neg):
        return _factor(g.a, -c)
    if isinstance(g, X.Bin) and g.op == "*" and g.ty == X.FLOAT:
        for u, w in ((g.a, g.b), (g.b, g.a)):
            if not XC._uses_any(u, _TILE_INDICES):
                return u, c, w
    return None, c, g


def gluon(code: str, on: bool = True) -> str:
    """A fragment's statements for a Gluon kernel: the same calls from Gluon's language module
    (its elementwise ops, loads and reductions take the layouts of their operands); on=False
    leaves the code as it is (a built-in mask's scalar range arithmetic)."""
    if not on:
        return code
    return re.sub(r"\btl\.", "gl.", re.sub(r"\btl\.math\.", "gl.", str(code)))


def has_dmod(spec: KernelSpec) -> bool:
    node = score_node(spec)
    return node is not None and not XD.is_identity_in_score(node)


def _box(row_lo: str, row_hi: str, heads: bool, var: str, col_lo: str = "", col_hi: str = "") -> dict:
    """heads: h spans x_h_lo .. x_h_hi (the query heads a program serves: a decode tile's, or the
    GQA group the dK/dV pass loops over); else the one head x_h."""
    box = {"b": ("x_b", "x_b"), "seqlen_q": ("seqlen_q", "seqlen_q"), "seqlen_k": ("seqlen_k", "seqlen_k")}
    box["h"] = ("x_h_lo", "x_h_hi") if heads else ("x_h", "x_h")
    # bounds are code that the Bounds builder negates and combines: each one parenthesized (a
    # caller's "kc + CN - 1" negated bare was -kc + CN - 1)
    if var == "kv_idx":
        box["q_idx"] = (f"({row_lo} + diag_offset)", f"({row_hi} + diag_offset)")
        if col_lo:
            box["kv_idx"] = (_paren(col_lo), _paren(col_hi))
    else:
        box["kv_idx"] = (_paren(col_lo), _paren(col_hi))
    return box


def _paren(code: str) -> str:
    return code if code.isidentifier() else f"({code})"


def key_range(spec: KernelSpec, row_lo: str, row_hi: str, decode: bool = False) -> str:
    """lo, full_lo, full_hi, hi of the key loop for query rows [row_lo, row_hi] (the stages:
    [lo, full_lo) masked, [full_lo, full_hi) unmasked, [full_hi, hi) masked)."""
    node = mask_node(spec)
    if node is None:
        return "lo = 0\nfull_lo = 0\nfull_hi = (seqlen_k // BLOCK_N) * BLOCK_N\nhi = seqlen_k"
    b = XC.Bounds(_box(row_lo, row_hi, decode, "kv_idx"), _load(spec), "xr_")
    r = XR.Ranges(b, "kv_idx", "seqlen_k")
    may, must = r.both(node)
    lo, hi = r.resolve(may)
    flo, fhi = r.resolve(must)
    return "\n".join(b.lines + _stages(lo, hi, flo, fhi, "BLOCK_N", "seqlen_k"))


def _stages(lo, hi, flo, fhi, block, extent) -> list[str]:
    return [f"lo = ({lo} // {block}) * {block}",
            f"hi = tl.maximum({hi}, lo)",
            f"full_lo = tl.cdiv(tl.maximum({flo}, lo), {block}) * {block}",
            f"full_hi = (tl.minimum(tl.minimum({fhi}, hi), {extent}) // {block}) * {block}",
            "x_no_full = full_hi <= full_lo",
            "full_lo = tl.where(x_no_full, lo, full_lo)",
            "full_hi = tl.where(x_no_full, lo, full_hi)"]


def query_range(spec: KernelSpec, col_lo: str, col_hi: str) -> str:
    """lo, full_lo, full_hi, hi of the dK/dV pass's query-row loop for keys [col_lo, col_hi], for
    every query head of the GQA group x_h_lo .. x_h_hi (the pass loops over them with one range)."""
    node = mask_node(spec)
    if node is None:
        return "lo = 0\nfull_lo = 0\nfull_hi = (seqlen_q // BLOCK_M) * BLOCK_M\nhi = seqlen_q"
    b = XC.Bounds(_box("", "", True, "q_idx", col_lo, col_hi), _load(spec), "xr_")
    r = XR.Ranges(b, "q_idx", "(seqlen_q + diag_offset)", "diag_offset")
    may, must = r.both(node)
    lo, hi = r.resolve(may)
    flo, fhi = r.resolve(must)
    rows = [f"x_qlo = tl.maximum({lo} - diag_offset, 0)", f"x_qhi = tl.maximum({hi} - diag_offset, 0)",
            f"x_qflo = tl.maximum({flo} - diag_offset, 0)", f"x_qfhi = tl.maximum({fhi} - diag_offset, 0)"]
    return "\n".join(b.lines + rows + _stages("x_qlo", "x_qhi", "x_qflo", "x_qfhi", "BLOCK_M", "seqlen_q"))


def tile_live(spec: KernelSpec, row_lo: str, row_hi: str, col_lo: str, col_hi: str) -> str:
    """Statements leaving in `x_live` whether the mask may keep some pair of the tile (the
    forward's inner loops, where `rows` and `cols` are the tile's query rows and keys)."""
    node = mask_node(spec)
    b = XC.Bounds(_box(row_lo, row_hi, False, "kv_idx", col_lo, col_hi), _load(spec), "xt_",
                  {"q_idx": "(rows + diag_offset)", "kv_idx": "cols"})  # the tile's index vectors
    may, _ = b.boolean(node)
    return "\n".join(b.lines + [f"x_live = {may if may is not None else True}"])


# ---------------------------------------------------------------------------------------------
# gradients of learnable parameters (the dQ pass): per occurrence of a learnable parameter in the
# score modification, each program sums dS * d score_mod / d occurrence over its tiles into a
# vector over the occurrence's one general index (or a scalar), stores it in its own slot of
# XG<i> (slots x width, slot = off_zh * num_m_blocks + start_m), and the host reduces the slots
# (attngen.runtime.exprs.param_grads): no atomics, the same sums in the same order every run.
# The occurrences themselves: attngen.spec.expr_terms.grad_terms.


def grad_accs(spec: KernelSpec) -> str:
    """", x_da, xg0, xgb0, ...": the dQ pass's accumulators (carried through its inner loop)."""
    out = ", x_da" if exact_d(spec) else ""
    for t in grad_terms(spec):
        out += f", xg{t.index}" + ("" if "g" in t.kinds else f", xgb{t.index}")
    return out


def grad_init(spec: KernelSpec) -> str:
    lines = ["x_da = tl.zeros([BLOCK_M], dtype=tl.float32)"] if exact_d(spec) else []
    for t in grad_terms(spec):
        lines.append(f"xg{t.index} = tl.zeros([{t.width}], dtype=tl.float32)")
        if "g" not in t.kinds:
            lines.append(f"xgb{t.index} = tl.zeros([BLOCK_M], dtype=tl.float32)")
    return "\n".join(lines)


def grad_update(spec: KernelSpec, ds: str, p: str = "p", dp: str = "dp") -> str:
    """Statements adding the tile's contribution to each accumulator (ds: dL / d score_mod,
    unscaled; p, dp: the tile's probabilities, masked, and dO.V^T)."""
    terms = grad_terms(spec)
    lines = [f"x_da += tl.sum({p} * {dp}, 1)"] if exact_d(spec) else []
    if not terms:
        return "\n".join(lines)
    node = score_node(spec)
    em = XC.Emitter(_tile_names("rows", "cols", False, False), _load(spec), "xq_")
    for t in terms:
        d = em.emit(XD.diff(node, lambda m, o=t.node: m == o))
        lines += em.lines
        em.lines = []
        g = f"xgt{t.index}"
        if "g" not in t.kinds:
            lines.append(f"{g} = {p} * {d}")
            lines.append(f"xg{t.index} += tl.sum(tl.sum({g} * {dp}, 1), 0)")
            lines.append(f"xgb{t.index} += tl.sum({g}, 1)")
            continue
        lines.append(f"{g} = {ds} * {d}")
        pos = t.kinds.index("g")
        idx = em.emit(t.node.idx[pos])
        lines += em.lines
        em.lines = []
        lines.append(f"xgi{t.index} = tl.minimum(tl.maximum({idx}, 0), {t.extent - 1})")
        lines.append(f"xgo{t.index} = tl.arange(0, {t.width})")
        lines.append(f"for xgj in tl.static_range({t.extent}):")
        lines.append(f"    xgs = tl.sum(tl.sum(tl.where(xgi{t.index} == xgj, {g}, 0.0), 1), 0)")
        lines.append(f"    xg{t.index} = tl.where(xgo{t.index} == xgj, xg{t.index} + xgs, xg{t.index})")
    return "\n".join(lines)


def grad_store(spec: KernelSpec) -> str:
    lines = []
    for t in grad_terms(spec):
        if "g" not in t.kinds:  # sum P dP w - sum_i D_i sum_j P w, D exact
            lines.append(f"xg{t.index} = xg{t.index} - tl.sum(x_da * xgb{t.index}, 0)")
        lines.append(f"tl.store(XG{t.index} + (off_zh * num_m_blocks + start_m) * {t.width} + tl.arange(0, {t.width}), "
                     f"xg{t.index})")
    return "\n".join(lines)
