"""The spec language's expressions: masks and score modifications.

A mask is a boolean expression and a score modification a float expression over the index names
``b, h, q_idx, kv_idx, seqlen_q, seqlen_k`` (all int; ``score``, float, in a score modification)
and declared parameters. The grammar is a whitelist of Python's expression syntax, parsed with
``ast`` and never evaluated by Python:

  literals (int, float, True, False), names, ``+ - * / // %`` (Python semantics: ``//`` floors,
  ``%`` takes the divisor's sign), unary ``-``, comparisons ``< <= > >= == !=`` (chains allowed:
  ``a < b < c`` is ``a < b and b < c``), ``and or not``, ``x if c else y``, the functions
  ``abs min max exp log tanh sqrt floor`` (floor gives an int), and parameter subscripts ``p[h]``, ``bias[h, i]``
  (one index per declared axis; a parameter of shape ``[]`` is a bare name).

q_idx is a query's position on the key axis: its row plus (seqlen_k - seqlen_q) under bottom-right
alignment (the default), its row under top-left alignment; with equal lengths both are the row.

This module turns a checked expression tree into: canonical text (a kernel's identity), Triton
statements evaluated on a tile (``Emitter``), interval bounds over an index box (tile
classification and key / query loop ranges, ``Bounds``), symbolic derivatives (``diff``: the
backward's dS and the gradients of learnable parameters), and a PyTorch evaluation (``eval_torch``:
the float64 references). Pure Python; torch is imported lazily by eval_torch only.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass, field
from typing import Callable

INT, FLOAT, BOOL = "int", "float", "bool"
INDEX_NAMES = ("b", "h", "q_idx", "kv_idx", "seqlen_q", "seqlen_k")
FUNCS = {"abs": 1, "min": 2, "max": 2, "exp": 1, "log": 1, "tanh": 1, "sqrt": 1, "floor": 1}
PARAM_DTYPES = {"fp32": FLOAT, "fp16": FLOAT, "bf16": FLOAT, "int32": INT}
AXES = ("b", "h")  # symbolic axis sizes a parameter's shape may name (batch, query heads)
LOG2E = 1.4426950408889634


class ExprError(ValueError):
    """Problems found in one expression, each naming the offending part."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


@dataclass(frozen=True)
class ParamDecl:
    """A declared parameter: shape over the axes (``"b"``, ``"h"`` or an int size), dtype, and
    whether the backward produces its gradient."""

    name: str
    shape: tuple = ()
    dtype: str = "fp32"
    learnable: bool = False

    @property
    def kind(self) -> str:
        return PARAM_DTYPES[self.dtype]

    def text(self) -> str:
        dims = ", ".join(str(s) for s in self.shape)
        return f"{self.name}[{dims}]:{self.dtype}{':learnable' if self.learnable else ''}"


# ---------------------------------------------------------------------------------------------
# the tree


@dataclass(frozen=True)
class Node:
    ty: str


@dataclass(frozen=True)
class Const(Node):
    value: object


@dataclass(frozen=True)
class Var(Node):
    name: str


@dataclass(frozen=True)
class Sub(Node):  # parameter subscript (idx == () for a scalar parameter)
    param: str
    idx: tuple


@dataclass(frozen=True)
class Bin(Node):
    op: str  # + - * / // %
    a: Node
    b: Node


@dataclass(frozen=True)
class Neg(Node):
    a: Node


@dataclass(frozen=True)
class Not(Node):
    a: Node


@dataclass(frozen=True)
class Cmp(Node):
    op: str  # < <= > >= == !=
    a: Node
    b: Node


@dataclass(frozen=True)
class BoolOp(Node):
    op: str  # and / or
    a: Node
    b: Node


@dataclass(frozen=True)
class IfExp(Node):
    c: Node
    a: Node
    b: Node


@dataclass(frozen=True)
class Call(Node):
    fn: str
    args: tuple


def children(n: Node) -> tuple:
    if isinstance(n, Sub):
        return n.idx
    if isinstance(n, (Bin, Cmp, BoolOp)):
        return (n.a, n.b)
    if isinstance(n, (Neg, Not)):
        return (n.a,)
    if isinstance(n, IfExp):
        return (n.c, n.a, n.b)
    if isinstance(n, Call):
        return n.args
    return ()


def walk(n: Node):
    yield n
    for c in children(n):
        yield from walk(c)


def uses(n: Node, name: str) -> bool:
    return any(isinstance(m, Var) and m.name == name for m in walk(n))


def params_used(n: Node) -> list[str]:
    out = []
    for m in walk(n):
        if isinstance(m, Sub) and m.param not in out:
            out.append(m.param)
    return out


def axis_shape(nodes, param: str, shape: tuple) -> tuple:
    """A parameter's shape as a kernel's identity records it: "b" / "h" where every subscript of
    the parameter at that position is `b` / `h` (its extent follows the call), the size elsewhere
    (a runtime call's concrete shape and a spec's symbolic one then name the same kernel)."""
    subs = [m for n in nodes if n is not None for m in walk(n) if isinstance(m, Sub) and m.param == param]
    out = []
    for d, size in enumerate(shape):
        names = {s.idx[d].name if isinstance(s.idx[d], Var) else None for s in subs if len(s.idx) > d}
        out.append(names.pop() if len(names) == 1 and names <= {"b", "h"} else size)
    return tuple(out)


def const(v) -> Const:
    if isinstance(v, bool):
        return Const(BOOL, v)
    return Const(INT if isinstance(v, int) else FLOAT, v)


# ---------------------------------------------------------------------------------------------
# canonical text

_PREC_OPS = {"+", "-", "*", "/", "//", "%"}


def to_text(n: Node) -> str:
    """Canonical, fully parenthesised text (parses back to the same tree)."""
    if isinstance(n, Const):
        return repr(n.value) if not isinstance(n.value, float) else repr(float(n.value))
    if isinstance(n, Var):
        return n.name
    if isinstance(n, Sub):
        return n.param if not n.idx else f"{n.param}[{', '.join(to_text(i) for i in n.idx)}]"
    if isinstance(n, (Bin, Cmp)):
        return f"({to_text(n.a)} {n.op} {to_text(n.b)})"
    if isinstance(n, BoolOp):
        return f"({to_text(n.a)} {n.op} {to_text(n.b)})"
    if isinstance(n, Neg):
        return f"(-{to_text(n.a)})"
    if isinstance(n, Not):
        return f"(not {to_text(n.a)})"
    if isinstance(n, IfExp):
        return f"({to_text(n.a)} if {to_text(n.c)} else {to_text(n.b)})"
    if isinstance(n, Call):
        return f"{n.fn}({', '.join(to_text(a) for a in n.args)})"
    raise TypeError(n)


# ---------------------------------------------------------------------------------------------
# parsing

_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%"}
_CMPOPS = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}


class _Parser:
    def __init__(self, text: str, names: dict, params: dict, lets: dict):
        self.text, self.names, self.params, self.lets = text, names, params, lets
        self.problems: list[str] = []

    def part(self, node) -> str:
        seg = ast.get_source_segment(self.text, node)
        return seg if seg is not None else ast.unparse(node)

    def fail(self, node, msg: str) -> Node:
        self.problems.append(f"'{self.part(node)}': {msg}")
        return Const("error", 0)

    def num(self, node, n: Node, what: str) -> bool:
        if n.ty == "error":
            return False
        if n.ty not in (INT, FLOAT):
            self.fail(node, f"{what} must be a number, got a {n.ty}")
            return False
        return True

    def visit(self, node) -> Node:
        if isinstance(node, ast.Constant):
            v = node.value
            if isinstance(v, bool):
                return const(v)
            if isinstance(v, int):
                if abs(v) >= 1 << 31:
                    return self.fail(node, "integer literal outside int32")
                return const(v)
            if isinstance(v, float):
                if not math.isfinite(v):
                    return self.fail(node, "literal must be finite")
                return const(v)
            return self.fail(node, f"literal of type {type(v).__name__} is not allowed")
        if isinstance(node, ast.Name):
            if node.id in self.lets:
                return self.lets[node.id]
            if node.id in self.names:
                return Var(FLOAT if node.id == "score" else INT, node.id)
            if node.id in self.params:
                p = self.params[node.id]
                if p.shape:
                    return self.fail(node, f"parameter '{node.id}' has shape {list(p.shape)}: index it "
                                           f"({node.id}[{', '.join(str(s) for s in p.shape)}])")
                return Sub(p.kind, node.id, ())
            known = sorted(set(self.names) | set(self.params) | set(self.lets))
            return self.fail(node, f"unknown name '{node.id}' (known: {', '.join(known)})")
        if isinstance(node, ast.BinOp):
            op = _BINOPS.get(type(node.op))
            if op is None:
                return self.fail(node, f"operator {type(node.op).__name__} is not allowed "
                                       "(+ - * / // % only)")
            a, b = self.visit(node.left), self.visit(node.right)
            if not (self.num(node.left, a, "operand") & self.num(node.right, b, "operand")):
                return Const("error", 0)
            if op == "/":
                ty = FLOAT
            else:
                ty = INT if a.ty == b.ty == INT else FLOAT
            if op in ("//", "%") and isinstance(b, Const) and b.value == 0:
                return self.fail(node, "division by zero")
            return Bin(ty, op, a, b)
        if isinstance(node, ast.UnaryOp):
            a = self.visit(node.operand)
            if isinstance(node.op, ast.Not):
                if a.ty not in (BOOL, "error"):
                    return self.fail(node, f"'not' needs a boolean, got a {a.ty}")
                return Not(BOOL, a)
            if isinstance(node.op, (ast.USub, ast.UAdd)):
                if not self.num(node.operand, a, "operand"):
                    return Const("error", 0)
                if isinstance(node.op, ast.UAdd):
                    return a
                if isinstance(a, Const):
                    return const(-a.value)
                return Neg(a.ty, a)
            return self.fail(node, "operator ~ is not allowed (use 'not')")
        if isinstance(node, ast.Compare):
            left = self.visit(node.left)
            out = None
            for op, right_node in zip(node.ops, node.comparators):
                name = _CMPOPS.get(type(op))
                right = self.visit(right_node)
                if name is None:
                    return self.fail(node, f"comparison {type(op).__name__} is not allowed")
                if left.ty == "error" or right.ty == "error":
                    return Const("error", 0)
                if (left.ty == BOOL) != (right.ty == BOOL) or (left.ty == BOOL and name not in ("==", "!=")):
                    return self.fail(node, f"cannot compare a {left.ty} with a {right.ty} by {name}")
                c = Cmp(BOOL, name, left, right)
                out = c if out is None else BoolOp(BOOL, "and", out, c)
                left = right
            return out
        if isinstance(node, ast.BoolOp):
            op = "and" if isinstance(node.op, ast.And) else "or"
            vals = [self.visit(v) for v in node.values]
            for v_node, v in zip(node.values, vals):
                if v.ty not in (BOOL, "error"):
                    self.fail(v_node, f"'{op}' needs booleans, got a {v.ty}")
                    return Const("error", 0)
            out = vals[0]
            for v in vals[1:]:
                out = BoolOp(BOOL, op, out, v)
            return out
        if isinstance(node, ast.IfExp):
            c, a, b = self.visit(node.test), self.visit(node.body), self.visit(node.orelse)
            if "error" in (c.ty, a.ty, b.ty):
                return Const("error", 0)
            if c.ty != BOOL:
                return self.fail(node.test, f"condition must be a boolean, got a {c.ty}")
            if (a.ty == BOOL) != (b.ty == BOOL):
                return self.fail(node, f"branches differ in kind ({a.ty} / {b.ty})")
            ty = BOOL if a.ty == BOOL else (INT if a.ty == b.ty == INT else FLOAT)
            return IfExp(ty, c, a, b)
        if isinstance(node, ast.Call):
            fn = node.func.id if isinstance(node.func, ast.Name) else None
            if fn not in FUNCS or node.keywords:
                return self.fail(node, f"call of '{self.part(node.func)}' is not allowed "
                                       f"(functions: {', '.join(FUNCS)})")
            if len(node.args) != FUNCS[fn]:
                return self.fail(node, f"{fn}() takes {FUNCS[fn]} argument(s), got {len(node.args)}")
            args = [self.visit(a) for a in node.args]
            if not all([self.num(an, a, f"{fn}()'s argument") for an, a in zip(node.args, args)]):
                return Const("error", 0)
            if fn in ("abs", "min", "max"):
                ty = INT if all(a.ty == INT for a in args) else FLOAT
            elif fn == "floor":
                ty = INT  # floor is the conversion to int
            else:
                ty = FLOAT
            return Call(ty, fn, tuple(args))
        if isinstance(node, ast.Subscript):
            if not isinstance(node.value, ast.Name) or node.value.id not in self.params:
                return self.fail(node, "only declared parameters can be subscripted")
            p = self.params[node.value.id]
            idx_nodes = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            if len(idx_nodes) != len(p.shape):
                return self.fail(node, f"parameter '{p.name}' has {len(p.shape)} axes {list(p.shape)}, "
                                       f"got {len(idx_nodes)} indices")
            idx = []
            for i_node in idx_nodes:
                if isinstance(i_node, ast.Slice):
                    return self.fail(node, "slices are not allowed in subscripts")
                i = self.visit(i_node)
                if i.ty == "error":
                    return i
                if i.ty != INT:
                    return self.fail(i_node, f"index must be an int, got a {i.ty}")
                idx.append(i)
            return Sub(p.kind, p.name, tuple(idx))
        return self.fail(node, f"{type(node).__name__} is not allowed in an expression")


def parse(text: str, kind: str, params: dict | None = None, lets: dict | None = None) -> Node:
    """Parse and check `text`: kind "mask" (boolean), "score" (float, may use `score`) or "let"
    (anything). params: name -> ParamDecl; lets: name -> Node (earlier lets, inlined). Raises
    ExprError with every problem found."""
    if not isinstance(text, str) or not text.strip():
        raise ExprError(["expression must be a non-empty string"])
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        raise ExprError([f"'{text.strip()}': syntax error: {e.msg}"]) from None
    names = set(INDEX_NAMES) | ({"score"} if kind in ("score", "let") else set())
    p = _Parser(text.strip(), names, params or {}, lets or {})
    node = p.visit(tree.body)
    if not p.problems:
        if kind == "mask" and node.ty != BOOL:
            p.problems.append(f"'{text.strip()}': a mask must be a boolean expression, got a {node.ty}")
        if kind == "score" and node.ty not in (INT, FLOAT):
            p.problems.append(f"'{text.strip()}': a score modification must be a number, got a {node.ty}")
    if p.problems:
        raise ExprError(p.problems)
    return node


def parse_lets(lets: dict, params: dict) -> tuple[dict, list[str]]:
    """`let:` entries in order (each may use earlier ones): name -> Node, and the problems."""
    out, problems = {}, []
    for name, text in lets.items():
        if not isinstance(name, str) or not name.isidentifier():
            problems.append(f"let name {name!r} is not an identifier")
            continue
        if name in INDEX_NAMES or name == "score" or name in params or name in FUNCS:
            problems.append(f"let '{name}' shadows a built-in name or a parameter")
            continue
        try:
            out[name] = parse(text, "let", params, out)
        except ExprError as e:
            problems.extend(f"let '{name}': {p}" for p in e.problems)
    return out, problems


# ---------------------------------------------------------------------------------------------
# simplification and derivatives


def _is(n: Node, v) -> bool:
    return isinstance(n, Const) and not isinstance(n.value, bool) and n.value == v


def add(a: Node, b: Node) -> Node:
    if _is(a, 0):
        return b
    if _is(b, 0):
        return a
    return Bin(FLOAT if FLOAT in (a.ty, b.ty) else INT, "+", a, b)


def sub(a: Node, b: Node) -> Node:
    if _is(b, 0):
        return a
    if _is(a, 0):
        return neg(b)
    return Bin(FLOAT if FLOAT in (a.ty, b.ty) else INT, "-", a, b)


def mul(a: Node, b: Node) -> Node:
    if _is(a, 0) or _is(b, 0):
        return const(0.0)
    if _is(a, 1):
        return b
    if _is(b, 1):
        return a
    return Bin(FLOAT if FLOAT in (a.ty, b.ty) else INT, "*", a, b)


def div(a: Node, b: Node) -> Node:
    if _is(a, 0):
        return const(0.0)
    if _is(b, 1):
        return a
    return Bin(FLOAT, "/", a, b)


def neg(a: Node) -> Node:
    if isinstance(a, Const):
        return const(-a.value)
    if isinstance(a, Neg):
        return a.a
    return Neg(a.ty, a)


def ifexp(c: Node, a: Node, b: Node) -> Node:
    if a == b:
        return a
    return IfExp(FLOAT if FLOAT in (a.ty, b.ty) else a.ty, c, a, b)


def diff(n: Node, wrt: Callable[[Node], bool]) -> Node:
    """d n / d x, x the leaves for which wrt(leaf) holds (Var("score") or one Sub occurrence).
    Piecewise-constant parts (floor, //, comparisons) have derivative 0."""
    if wrt(n):
        return const(1.0)
    if isinstance(n, (Const, Var, Sub, Cmp, BoolOp, Not)):
        return const(0.0)
    if isinstance(n, Bin):
        da, db = diff(n.a, wrt), diff(n.b, wrt)
        if n.op == "+":
            return add(da, db)
        if n.op == "-":
            return sub(da, db)
        if n.op == "*":
            return add(mul(da, n.b), mul(n.a, db))
        if n.op == "/":
            return sub(div(da, n.b), div(mul(n.a, db), mul(n.b, n.b)))
        if n.op == "%":  # a - b * floor(a / b)
            return da
        return const(0.0)  # //
    if isinstance(n, Neg):
        return neg(diff(n.a, wrt))
    if isinstance(n, IfExp):
        return ifexp(n.c, diff(n.a, wrt), diff(n.b, wrt))
    if isinstance(n, Call):
        a = n.args[0]
        da = diff(a, wrt)
        if n.fn == "abs":
            return ifexp(Cmp(BOOL, "<", a, const(0)), neg(da), da) if not _is(da, 0) else da
        if n.fn in ("min", "max"):
            db = diff(n.args[1], wrt)
            op = "<=" if n.fn == "min" else ">="
            return ifexp(Cmp(BOOL, op, a, n.args[1]), da, db)
        if n.fn == "exp":
            return mul(da, n)
        if n.fn == "log":
            return div(da, a)
        if n.fn == "tanh":
            return mul(da, sub(const(1.0), mul(n, n)))
        if n.fn == "sqrt":
            return div(da, mul(const(2.0), n))
        return const(0.0)  # floor
    raise TypeError(n)


def is_identity_in_score(n: Node) -> bool:
    """Whether n is `score + g` (g free of score): then dS needs no derivative factor."""
    d = diff(n, lambda m: isinstance(m, Var) and m.name == "score")
    return _is(d, 1)


# ---------------------------------------------------------------------------------------------
# PyTorch evaluation (references)


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


# ---------------------------------------------------------------------------------------------
# Triton code


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

    def _emit(self, n: Node) -> str:
        if isinstance(n, Const):
            return repr(n.value)
        if isinstance(n, Var):
            return self.names[n.name]
        if isinstance(n, Sub):
            return self.load(n.param, [self.emit(i) for i in n.idx])
        if isinstance(n, Bin):
            a, b = self.emit(n.a), self.emit(n.b)
            if n.op == "/":
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

    def __init__(self, box: dict, load: Callable, prefix: str = "xb_"):
        self.box, self.load, self.prefix = box, load, prefix
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


# ---------------------------------------------------------------------------------------------
# loop ranges: where along one index (kv_idx for the forward and the dQ pass, q_idx for the dK/dV
# pass) the mask may hold / holds everywhere, for the box of the other indices


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
    or a condition over var): the masked stages then test each tile before loading it."""
    for m in walk(n):
        if isinstance(m, (BoolOp,)) and m.op == "or" and uses(m, var):
            return True
        if isinstance(m, (IfExp, Not)) and uses(m, var):
            return True
    return False
