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

This module parses and checks expressions into trees and gives their canonical text (a kernel's
identity). Their simplifying constructors and symbolic derivatives (`diff`: the backward's dS and
the gradients of learnable parameters) are attngen.spec.exprdiff, their PyTorch evaluation (the
float64 references) attngen.spec.expr_eval, their Triton code (tile statements, interval bounds)
attngen.codegen.exprcode, loop ranges attngen.codegen.exprranges. Pure Python.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass

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

