"""The loop ranges a spec-language mask allows (attngen.spec.expr's trees), as scalar Triton code:
where along one index (kv_idx for the forward and the dQ pass, q_idx for the dK/dV pass) the mask
may hold / holds everywhere, for the box of the other indices (Ranges over exprcode.Bounds;
linear); and whether a loop must test each tile (needs_tile_skip, gathers_along)."""

from __future__ import annotations

from attngen.codegen.exprcode import Bounds
from attngen.spec.expr import INT, Bin, BoolOp, Cmp, Const, IfExp, Neg, Node, Not, Sub, Var, const, uses, walk
from attngen.spec.exprdiff import add, mul, neg, sub
from attngen.spec.expr_terms import key_reach, run_pattern


def linear(n: Node, var: str):
    """(c, rest) with n == c * var + rest (rest free of var; None for 0), or None."""
    if isinstance(n, Var) and n.name == var:
        return 1, None
    if not uses(n, var):
        return 0, n
    if isinstance(n, Neg):
        r = linear(n.a, var)
        return None if r is None else (-r[0], None if r[1] is None else neg(r[1]))
    if isinstance(n, Bin) and n.op in ("+", "-"):
        a, b = linear(n.a, var), linear(n.b, var)
        if a is None or b is None:
            return None
        s = 1 if n.op == "+" else -1
        rest = a[1] if b[1] is None else (b[1] if n.op == "+" else neg(b[1])) if a[1] is None else (
            add(a[1], b[1]) if n.op == "+" else sub(a[1], b[1]))
        return a[0] + s * b[0], rest
    if isinstance(n, Bin) and n.op == "*" and isinstance(n.b, Const) and isinstance(n.b.value, int):
        a = linear(n.a, var)
        return None if a is None else (a[0] * n.b.value, None if a[1] is None else mul(a[1], n.b))
    return None


_FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}


class Ranges:
    """Half-open ranges [lo, hi) of one index (`var`, extent code `extent`) as scalar code: `may`
    (outside it the mask is false everywhere on the box) and `must` (inside it true everywhere).
    A range is a (lo, hi) pair of codes, "U" standing for an unbounded side; lo >= hi is empty."""

    def __init__(self, bounds: Bounds, var: str, extent: str, start: str = "0"):
        self.b, self.var, self.extent, self.start = bounds, var, extent, start

    def tmp(self, code):
        return self.b.tmp(code)

    def _mm(self, f, x, y, unbounded_wins):
        if x == "U" or y == "U":
            return "U" if unbounded_wins else (y if x == "U" else x)
        return self.b._mm(f, x, y)

    def inter(self, r, s):
        return self._mm("maximum", r[0], s[0], False), self._mm("minimum", r[1], s[1], False)

    def hull(self, r, s):
        return self._mm("minimum", r[0], s[0], True), self._mm("maximum", r[1], s[1], True)

    def cond(self, c):
        """The whole axis where the box-wide condition c holds, else empty."""
        if c is None or c == "True":
            return FULL
        if c == "False":
            return EMPTY
        return self.start, self.tmp(f"tl.where({c}, {self.extent}, {self.start})")

    def longer(self, r, s):
        r, s = self.concrete(r), self.concrete(s)
        take = self.tmp(f"({r[1]} - {r[0]}) >= ({s[1]} - {s[0]})")
        return self.tmp(f"tl.where({take}, {r[0]}, {s[0]})"), self.tmp(f"tl.where({take}, {r[1]}, {s[1]})")

    def concrete(self, r):
        return (self.start if r[0] == "U" else r[0]), (self.extent if r[1] == "U" else r[1])

    def both(self, n: Node):
        """(may, must) ranges of mask n."""
        if isinstance(n, Const):
            return (FULL, FULL) if n.value else (EMPTY, EMPTY)
        if not uses(n, self.var):
            may, must = self.b.boolean(n)
            return self.cond(may), (EMPTY if must is None else self.cond(must))
        if isinstance(n, BoolOp):
            (am, aM), (bm, bM) = self.both(n.a), self.both(n.b)
            if n.op == "and":
                return self.inter(am, bm), self.inter(aM, bM)
            return self.hull(am, bm), self.longer(aM, bM)
        if isinstance(n, Cmp):
            return self.cmp(n)
        return FULL, EMPTY

    def cmp(self, n: Cmp):
        run = run_pattern(n)
        if run is not None:
            return self.runs(*run)
        # a // c == var // c (chunks)
        if n.op == "==" and isinstance(n.a, Bin) and isinstance(n.b, Bin) and n.a.op == n.b.op == "//":
            for x, y in ((n.a, n.b), (n.b, n.a)):
                if (isinstance(y.a, Var) and y.a.name == self.var and isinstance(y.b, Const)
                        and isinstance(x.b, Const) and x.b.value == y.b.value and isinstance(y.b.value, int)
                        and y.b.value > 0 and not uses(x.a, self.var)):
                    c = y.b.value
                    lo, hi = self.b.num(Bin(INT, "//", x.a, y.b))
                    if lo is None or hi is None:
                        return FULL, EMPTY
                    return ((self.tmp(f"{lo} * {c}"), self.tmp(f"({hi} + 1) * {c}")),
                            (self.tmp(f"{hi} * {c}"), self.tmp(f"({lo} + 1) * {c}")))
        la, lb = linear(n.a, self.var), linear(n.b, self.var)
        if la is None or lb is None or n.a.ty != INT or n.b.ty != INT or la[0] - lb[0] not in (1, -1):
            return FULL, EMPTY
        c = la[0] - lb[0]
        # c * var + (ra - rb) op 0  ->  var op' e
        ra, rb = la[1] or const(0), lb[1] or const(0)
        e = sub(rb, ra) if c == 1 else sub(ra, rb)
        op = n.op if c == 1 else _FLIP[n.op]
        lo, hi = self.b.num(e)
        one = lambda x: self.tmp(f"{x} + 1")
        if op in ("<", "<="):
            up = (lambda x: x) if op == "<" else one
            return ("U", "U" if hi is None else up(hi)), (EMPTY if lo is None else ("U", up(lo)))
        if op in (">", ">="):
            dn = (lambda x: x) if op == ">=" else one
            return ("U" if lo is None else dn(lo), "U"), (EMPTY if hi is None else (dn(hi), "U"))
        if op == "==" and lo is not None and hi is not None:
            return (lo, one(hi)), EMPTY
        return FULL, EMPTY

    def runs(self, param: str, a: str, b: str):
        """P[q_idx] == P[kv_idx]: the keys (queries) whose value is one of the box's values of the
        other index, a run of positions where P never decreases (XR_<P>: run starts, ends, the
        sortedness flag); the whole axis, and no full range, where it does."""
        other = a if b == self.var else b
        lo, hi = self.b.box.get(other, (None, None))
        if lo is None or hi is None:
            return FULL, EMPTY
        n = f"xp_{param}_n0"
        at = lambda i, off="": self.tmp(  # noqa: E731
            f"tl.load(XR_{param}{off} + tl.minimum(tl.maximum({i}, 0), {n} - 1))")
        first_lo, first_hi = at(lo), at(hi)
        end_lo, end_hi = at(lo, f" + {n}"), at(hi, f" + {n}")
        ok = self.tmp(f"tl.load(XR_{param} + 2 * {n}) != 0")
        # full: the run of the box's last value up to the end of its first value's run, empty
        # unless both are one run (sorted: a later run starts after an earlier one ends)
        return ((first_lo, end_hi),
                (self.tmp(f"tl.where({ok}, {first_hi}, 0)"), self.tmp(f"tl.where({ok}, {end_lo}, 0)")))

    def resolve(self, r):
        """(lo, hi) code of a range clipped to [start, extent]."""
        if r == EMPTY:
            return self.start, self.start
        lo = self.start if r[0] == "U" else self.tmp(f"tl.maximum({r[0]}, {self.start})")
        hi = self.extent if r[1] == "U" else self.tmp(f"tl.minimum({r[1]}, {self.extent})")
        return lo, hi


EMPTY = ("0", "0")
FULL = ("U", "U")


def needs_tile_skip(n: Node, var: str) -> bool:
    """Whether the range hull of `var` can hold tiles where the mask is false everywhere (an `or`
    or a condition over var): the forward's masked stages then test each tile before loading it."""
    for m in walk(n):
        if isinstance(m, (BoolOp,)) and m.op == "or" and uses(m, var):
            return True
        if isinstance(m, (IfExp, Not)) and uses(m, var):
            return True
    return gathers_along(n, var)


def gathers_along(n: Node, var: str) -> bool:
    """Whether mask n reads a parameter gathered along var (`doc[kv_idx]`), which bounds no range:
    the loops over var then test each tile, bounding the parameter by its values along the tile.
    Not under a window that keeps the range short already: H100, documents + a 512-key window,
    the forward's test costs more than it skips (0.378 vs 0.284 ms); documents over the causal
    range, 2.6x faster with it (benchmarks/ab/h100_ab_expr_tile_skip_2026-12-06.jsonl)."""
    if _short_reach(n):
        return False
    ranged = {id(t.a) for t in walk(n) if run_pattern(t)} | {id(t.b) for t in walk(n) if run_pattern(t)}
    return any(isinstance(m, Sub) and id(m) not in ranged and any(isinstance(i, Var) and i.name == var for i in m.idx)
               for m in walk(n))


SHORT_REACH = 2048  # keys a query sees at most (attngen.spec.expr_terms.key_reach) below which
# the forward's key range is short enough that a gathered parameter's per-tile test does not pay


def _short_reach(mask: Node) -> bool:
    reach = key_reach(mask)
    return reach is not None and reach < SHORT_REACH

