"""Simplifying constructors of expression trees (attngen.spec.expr) and their symbolic
derivatives: `diff` gives the backward's dS factor of a score modification and the gradients of
learnable parameters. Pure Python."""

from __future__ import annotations

from typing import Callable

from attngen.spec.expr import BOOL, FLOAT, INT, Bin, BoolOp, Call, Cmp, Const, IfExp, Neg, Node, Not, Sub, Var, const


def _is(n: Node, v) -> bool:
    return isinstance(n, Const) and not isinstance(n.value, bool) and n.value == v


def _arith(op: str, a: Node, b: Node) -> Bin:
    """a op b, a float when either side is one."""
    return Bin(FLOAT if FLOAT in (a.ty, b.ty) else INT, op, a, b)


def add(a: Node, b: Node) -> Node:
    if _is(a, 0):
        return b
    if _is(b, 0):
        return a
    return _arith("+", a, b)


def sub(a: Node, b: Node) -> Node:
    if _is(b, 0):
        return a
    if _is(a, 0):
        return neg(b)
    return _arith("-", a, b)


def mul(a: Node, b: Node) -> Node:
    if _is(a, 0) or _is(b, 0):
        return const(0.0)
    if _is(a, 1):
        return b
    if _is(b, 1):
        return a
    return _arith("*", a, b)


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
