"""Spec-language expressions as Triton code (attngen.spec.expr's trees): tile statements
(Emitter) and interval bounds over an index box (Bounds: tile classification). The loop ranges a
mask allows are attngen.codegen.exprranges; the fragments' builder is attngen.codegen.exprgen."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from attngen.spec.expr import BOOL, FLOAT, INT, Bin, BoolOp, Call, Cmp, Const, IfExp, Neg, Node, Not, Sub, Var, walk
from attngen.spec.exprdiff import sub


def _uses_any(n: Node, names) -> bool:
    return any(isinstance(m, Var) and m.name in names for m in walk(n))


@dataclass
class Emitter:
    """Triton statements that evaluate expressions on a tile. names: index name -> code (already
    broadcast to the tile, e.g. q_idx -> "(rows + diag_offset)[:, None]"); load(param, [codes]) ->
    code of the parameter's value at those indices. Shared sub-trees are computed once."""

    names: dict
    load: Callable
    prefix: str = "x_"
    lines: list = field(default_factory=list)
    memo: dict = field(default_factory=dict)
    # index name -> (code of its vector along the tile's one axis, the broadcast suffix), e.g.
    # q_idx -> ("(rows + diag_offset)", "[:, None]"): a parameter gathered along one index is
    # loaded as that vector and then broadcast, and integer index arithmetic that meets a float
    # (ALiBi's slope * |q - k|) is done in float from the vectors converted once (exact below
    # 2^24: every index, and the differences of two, of sequences up to 8M tokens), instead of
    # one integer-to-float conversion per score
    vecs: dict = field(default_factory=dict)
    fmemo: dict = field(default_factory=dict)

    def tmp(self, code: str) -> str:
        name = f"{self.prefix}{len(self.lines)}"
        self.lines.append(f"{name} = {code}")
        return name

    def emit(self, n: Node) -> str:
        if n in self.memo:
            return self.memo[n]
        code = self._emit(n)
        if not isinstance(n, (Const, Var)):
            code = self.tmp(code)
        self.memo[n] = code
        return code

    def _gathered(self, n: Sub) -> str | None:
        """A parameter whose subscripts are one tile index (and constants / scalars): loaded along
        that index's vector, then broadcast."""
        along = [i for i in n.idx if isinstance(i, Var) and i.name in self.vecs]
        if len(along) != 1 or any(_uses_any(i, self.vecs) for i in n.idx if i is not along[0]):
            return None
        vec, bcast = self.vecs[along[0].name]
        codes = [vec if i is along[0] else self.emit(i) for i in n.idx]
        return f"{self.tmp(self.load(n.param, codes))}{bcast}"

    def _affine(self, n: Node) -> bool:
        """Integer arithmetic of tile indices that float arithmetic reproduces exactly."""
        if isinstance(n, Const):
            return isinstance(n.value, int) and abs(n.value) < 1 << 22
        if isinstance(n, Var):
            return n.name in self.vecs
        if isinstance(n, Bin):
            return n.op in ("+", "-") and self._affine(n.a) and self._affine(n.b)
        if isinstance(n, Neg):
            return self._affine(n.a)
        if isinstance(n, Call):
            return n.fn in ("abs", "min", "max") and all(self._affine(a) for a in n.args)
        return False

    def emit_float(self, n: Node) -> str:
        """n's value as fp32 code: where n is integer index arithmetic, computed in float from the
        index vectors (see vecs); else the code of n (Triton converts it where it meets a float)."""
        if getattr(n, "ty", None) != INT or not self.vecs or not self._affine(n) or isinstance(n, Const):
            return self.emit(n)
        if not _uses_any(n, self.vecs):
            return self.emit(n)
        if n in self.fmemo:
            return self.fmemo[n]
        code = self._emit_f(n)
        if not isinstance(n, Var):
            code = self.tmp(code)
        self.fmemo[n] = code
        return code

    def _emit_f(self, n: Node) -> str:
        if isinstance(n, Const):
            return repr(float(n.value))
        if isinstance(n, Var):
            key = ("vec", n.name)
            if key not in self.fmemo:
                vec, _ = self.vecs[n.name]
                self.fmemo[key] = self.tmp(f"({vec}).to(tl.float32)")
            return f"{self.fmemo[key]}{self.vecs[n.name][1]}"
        sub = [self.emit_float(a) for a in ((n.a, n.b) if isinstance(n, Bin) else (n.a,) if isinstance(n, Neg) else n.args)]
        if isinstance(n, Bin):
            return f"{sub[0]} {n.op} {sub[1]}"
        if isinstance(n, Neg):
            return f"-{sub[0]}"
        if n.fn == "abs":
            return f"tl.abs({sub[0]})"
        a, b = sub
        if isinstance(n.args[0], Const):  # Triton's minimum wants a tensor first
            a, b = b, a
        return f"tl.{'minimum' if n.fn == 'min' else 'maximum'}({a}, {b})"

    def _emit(self, n: Node) -> str:
        if isinstance(n, Const):
            return repr(n.value)
        if isinstance(n, Var):
            return self.names[n.name]
        if isinstance(n, Sub):
            gathered = self._gathered(n) if self.vecs else None
            return gathered if gathered is not None else self.load(n.param, [self.emit(i) for i in n.idx])
        if isinstance(n, Bin) and getattr(n, "ty", None) == FLOAT and n.op in ("+", "-", "*"):
            return f"{self.emit_float(n.a)} {n.op} {self.emit_float(n.b)}"
        if isinstance(n, Bin):
            a, b = self.emit(n.a), self.emit(n.b)
            if n.op == "/":
                if isinstance(n.b, Const) and n.b.value not in (0, 0.0):
                    # by a constant: a multiply by its reciprocal (within an ulp of the quotient)
                    # instead of an fp32 division a score
                    return f"{a} * {float(1.0 / n.b.value)!r}"
                return f"({a} * 1.0) / {b}"
            if n.op in ("//", "%") and n.ty == INT:
                # truncating division fixed to Python's floor, whichever way the backend rounds
                q = self.tmp(f"{a} // {b}")
                r = self.tmp(f"{a} - {q} * {b}")
                fix = self.tmp(f"({r} != 0) & (({r} < 0) != ({b} < 0))")
                return f"tl.where({fix}, {q} - 1, {q})" if n.op == "//" else f"tl.where({fix}, {r} + {b}, {r})"
            if n.op in ("//", "%"):
                fq = self.tmp(f"tl.floor({a} / {b})")
                return fq if n.op == "//" else f"{a} - {fq} * {b}"
            return f"{a} {n.op} {b}"
        if isinstance(n, Neg):
            return f"-{self.emit(n.a)}"
        if isinstance(n, Not):
            return f"({self.emit(n.a)} == 0)"
        if isinstance(n, Cmp):
            return f"{self.emit(n.a)} {n.op} {self.emit(n.b)}"
        if isinstance(n, BoolOp):
            return f"{self.emit(n.a)} {'&' if n.op == 'and' else '|'} {self.emit(n.b)}"
        if isinstance(n, IfExp):
            return f"tl.where({self.emit(n.c)}, {self.emit(n.a)}, {self.emit(n.b)})"
        if isinstance(n, Call):
            args = [self.emit(a) for a in n.args]
            if n.fn == "abs":
                return f"tl.abs({args[0]})" if not isinstance(n.args[0], Const) else repr(abs(n.args[0].value))
            if n.fn in ("min", "max"):
                if all(isinstance(a, Const) for a in n.args):
                    return repr((min if n.fn == "min" else max)(a.value for a in n.args))
                a, b = args
                if isinstance(n.args[0], Const):  # Triton's minimum wants a tensor first
                    a, b = b, a
                return f"tl.{'minimum' if n.fn == 'min' else 'maximum'}({a}, {b})"
            if n.fn == "floor":
                return f"tl.floor({args[0]}).to(tl.int32)" if n.args[0].ty == FLOAT else args[0]
            x = f"({args[0]} * 1.0)"
            if n.fn == "tanh":
                e = self.tmp(f"tl.math.exp2(-2.8853900817779268 * tl.abs({x}))")
                t = self.tmp(f"(1.0 - {e}) / (1.0 + {e})")
                return f"tl.where({x} < 0, -{t}, {t})"
            return f"tl.{n.fn}({x})"
        raise TypeError(n)


# ---------------------------------------------------------------------------------------------
# interval bounds over an index box (scalar Triton code)


class Bounds:
    """Interval bounds of expressions over a box of index values, as scalar Triton code.

    box: name -> (lo, hi) code strings (equal strings: a single value, e.g. b -> ("off_z",
    "off_z")). Numeric bounds are (lo, hi) with None for unbounded; booleans are (may, must): code
    true where some point of the box satisfies the expression / where all do (None: unknown, i.e.
    may = True, must = False). A parameter is bounded only where all its indices are single
    values (it is then loaded once, through `load`)."""

    def __init__(self, box: dict, load: Callable, prefix: str = "xb_", vecs: dict | None = None):
        self.box, self.load, self.prefix = box, load, prefix
        self.vecs = vecs or {}  # name -> code of the index vector the box spans (a tile's rows / cols)
        self.lines: list[str] = []
        self.memo: dict = {}

    def tmp(self, code: str) -> str:
        name = f"{self.prefix}{len(self.lines)}"
        self.lines.append(f"{name} = {code}")
        return name

    def _mm(self, f: str, a, b):
        if a is None or b is None:
            return None
        if a == b:
            return a
        return self.tmp(f"tl.{f}({a}, {b})")

    def num(self, n: Node):
        key = ("num", n)
        if key not in self.memo:
            self.memo[key] = self._num(n)
        return self.memo[key]

    def _num(self, n: Node):
        if isinstance(n, Const):
            v = repr(n.value)
            return v, v
        if isinstance(n, Var):
            return self.box.get(n.name, (None, None))
        if isinstance(n, Sub):
            idx = [self.num(i) for i in n.idx]
            if all(lo is not None and lo == hi for lo, hi in idx):
                v = self.tmp(self.load(n.param, [lo for lo, _ in idx]))
                return v, v
            # one index runs over a tile's rows or columns, the others are single values (a
            # document id per position, `doc[kv_idx]`): the parameter's values along the tile,
            # loaded as a vector, bound it by their min and max
            spread = [j for j, (lo, hi) in enumerate(idx) if lo is None or lo != hi]
            j = spread[0]
            if len(spread) == 1 and isinstance(n.idx[j], Var) and n.idx[j].name in self.vecs:
                codes = [lo for lo, _ in idx]
                codes[j] = self.vecs[n.idx[j].name]
                v = self.tmp(self.load(n.param, codes))
                return self.tmp(f"tl.min({v}, 0)"), self.tmp(f"tl.max({v}, 0)")
            return None, None
        if isinstance(n, Neg):
            lo, hi = self.num(n.a)
            return (None if hi is None else self.tmp(f"-{hi}")), (None if lo is None else self.tmp(f"-{lo}"))
        if isinstance(n, Bin):
            (al, ah), (bl, bh) = self.num(n.a), self.num(n.b)
            if n.op == "+":
                return (None if None in (al, bl) else self.tmp(f"{al} + {bl}"),
                        None if None in (ah, bh) else self.tmp(f"{ah} + {bh}"))
            if n.op == "-":
                return (None if None in (al, bh) else self.tmp(f"{al} - {bh}"),
                        None if None in (ah, bl) else self.tmp(f"{ah} - {bl}"))
            if n.op == "*":
                if isinstance(n.b, Const) or isinstance(n.a, Const):
                    c, (xl, xh) = (n.b.value, (al, ah)) if isinstance(n.b, Const) else (n.a.value, (bl, bh))
                    if c >= 0:
                        return (None if xl is None else self.tmp(f"{xl} * {c!r}"),
                                None if xh is None else self.tmp(f"{xh} * {c!r}"))
                    return (None if xh is None else self.tmp(f"{xh} * {c!r}"),
                            None if xl is None else self.tmp(f"{xl} * {c!r}"))
                if None in (al, ah, bl, bh):
                    return None, None
                ps = [self.tmp(f"{x} * {y}") for x in (al, ah) for y in (bl, bh)]
                lo = self.tmp(f"tl.minimum(tl.minimum({ps[0]}, {ps[1]}), tl.minimum({ps[2]}, {ps[3]}))")
                hi = self.tmp(f"tl.maximum(tl.maximum({ps[0]}, {ps[1]}), tl.maximum({ps[2]}, {ps[3]}))")
                return lo, hi
            if n.op == "//" and isinstance(n.b, Const) and n.b.value > 0 and n.ty == INT:
                c = n.b.value
                f = lambda x: None if x is None else self.tmp(f"tl.where({x} < 0, -((-{x} + {c - 1}) // {c}), {x} // {c})")
                return f(al), f(ah)
            if n.op == "%" and isinstance(n.b, Const) and n.b.value > 0:
                return "0", repr(n.b.value - 1 if n.ty == INT else n.b.value)
            if n.op == "/" and isinstance(n.b, Const) and n.b.value > 0:
                c = float(n.b.value)
                return (None if al is None else self.tmp(f"{al} / {c!r}"),
                        None if ah is None else self.tmp(f"{ah} / {c!r}"))
            return None, None
        if isinstance(n, Call):
            if n.fn in ("min", "max"):
                (al, ah), (bl, bh) = self.num(n.args[0]), self.num(n.args[1])
                f = "minimum" if n.fn == "min" else "maximum"
                if n.fn == "min":
                    lo = self._mm(f, al, bl)
                    hi = ah if bh is None else bh if ah is None else self._mm(f, ah, bh)
                    return lo, hi
                lo = al if bl is None else bl if al is None else self._mm(f, al, bl)
                return lo, self._mm(f, ah, bh)
            lo, hi = self.num(n.args[0])
            if n.fn == "abs":
                if lo is None or hi is None:
                    return "0", None
                return (self.tmp(f"tl.where({lo} > 0, {lo}, tl.where({hi} < 0, -{hi}, 0))"),
                        self.tmp(f"tl.maximum(-{lo}, {hi})"))
            if n.fn == "floor":
                if n.args[0].ty == INT:
                    return lo, hi
                return (None if lo is None else self.tmp(f"tl.floor({lo}).to(tl.int32)"),
                        None if hi is None else self.tmp(f"tl.floor({hi}).to(tl.int32)"))
            if n.fn in ("exp",):
                return ("0.0" if lo is None else self.tmp(f"tl.exp({lo} * 1.0)"),
                        None if hi is None else self.tmp(f"tl.exp({hi} * 1.0)"))
            if n.fn == "tanh":
                return "-1.0", "1.0"
            return None, None
        if isinstance(n, IfExp) and n.ty != BOOL:
            may, must = self.boolean(n.c)
            (al, ah), (bl, bh) = self.num(n.a), self.num(n.b)
            lo, hi = self._mm("minimum", al, bl), self._mm("maximum", ah, bh)
            if must is not None:
                lo = None if lo is None or al is None else self.tmp(f"tl.where({must}, {al}, {lo})")
                hi = None if hi is None or ah is None else self.tmp(f"tl.where({must}, {ah}, {hi})")
            return lo, hi
        return None, None

    def boolean(self, n: Node):
        """(may, must) codes (None: unknown)."""
        key = ("bool", n)
        if key not in self.memo:
            self.memo[key] = self._boolean(n)
        return self.memo[key]

    def _boolean(self, n: Node):
        if isinstance(n, Const):
            return ("True", "True") if n.value else ("False", "False")
        if isinstance(n, Cmp):
            (al, ah), (bl, bh) = self.num(n.a), self.num(n.b)
            lt = lambda x, y, op: None if x is None or y is None else self.tmp(f"{x} {op} {y}")
            if n.op in ("<", "<="):
                return lt(al, bh, n.op), lt(ah, bl, n.op)
            if n.op in (">", ">="):
                return lt(ah, bl, n.op), lt(al, bh, n.op)
            if n.op == "==":
                may = None if None in (al, ah, bl, bh) else self.tmp(f"({al} <= {bh}) & ({bl} <= {ah})")
                must = None if None in (al, ah, bl, bh) else self.tmp(
                    f"({al} == {ah}) & ({bl} == {bh}) & ({al} == {bl})")
                return may, must
            may = None if None in (al, ah, bl, bh) else self.tmp(
                f"({al} != {ah}) | ({bl} != {bh}) | ({al} != {bl})")
            must = None if None in (al, ah, bl, bh) else self.tmp(f"({ah} < {bl}) | ({bh} < {al})")
            return may, must
        if isinstance(n, BoolOp):
            (am, aM), (bm, bM) = self.boolean(n.a), self.boolean(n.b)
            if n.op == "and":
                may = am if bm is None else bm if am is None else self.tmp(f"{am} & {bm}")
                must = None if aM is None or bM is None else self.tmp(f"{aM} & {bM}")
            else:
                may = None if am is None or bm is None else self.tmp(f"{am} | {bm}")
                must = aM if bM is None else bM if aM is None else self.tmp(f"{aM} | {bM}")
            return may, must
        if isinstance(n, Not):
            may, must = self.boolean(n.a)
            return (None if must is None else self.tmp(f"({must} == 0)"),
                    None if may is None else self.tmp(f"({may} == 0)"))
        if isinstance(n, IfExp):
            (cm, cM), (am, aM), (bm, bM) = self.boolean(n.c), self.boolean(n.a), self.boolean(n.b)
            may = None if am is None or bm is None else self.tmp(f"{am} | {bm}")
            must = None if aM is None or bM is None else self.tmp(f"{aM} & {bM}")
            if cM is not None and am is not None and aM is not None:  # the condition holds on the whole box
                may = self.tmp(f"tl.where({cM}, {am}, {may if may is not None else True})")
            return may, must
        return None, None
