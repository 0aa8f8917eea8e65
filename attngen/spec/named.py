"""Named masks and score modifications: the built-ins and the common variants, each defined once as
expressions of the spec language (attngen.spec.expr), and `resolve`, which turns a ``kernels:``
entry's expression fields into what a KernelSpec carries.

A variant is a mask (boolean expression) and/or a score modification (number expression, may use
``score``: the scaled q.k), with its ``let:`` sub-expressions, its parameters (ParamDecl; a shape
element may name one of its constants), whether it has learned sinks, and the integer constants a
spec entry supplies as fields of its own (``chunk: 8192``). Constants become literals of the
expression (they are structure: a different value is a different kernel).

Variants with ``builtin`` set are built into the templates: a spec naming them gets the KernelSpec
``mask`` (or ``softcap``) it always got, so the kernels and their uris do not change; their
expressions here document them and are what the tests check the built-ins against. ``document``
(packed sequences through cu_seqlens) is addressing, not an expression, and is not in the table.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass
from typing import Callable

from attngen.spec import expr as X

AXES_HINT = "'b' (batch), 'h' (query heads) or a positive integer"


@dataclass(frozen=True)
class Constant:
    """An integer a spec entry gives as a field of its own (default None: required)."""

    name: str
    meaning: str
    default: int | None = None
    lo: int = 1


@dataclass(frozen=True)
class Named:
    name: str
    kind: str  # "mask" (named in `mask:`) | "score" (named in `score_mod:`)
    summary: str
    mask: str = ""  # expression text over the index names, the lets, params and constants
    score: str = ""
    lets: tuple = ()  # ((name, text), ...) in order
    params: tuple = ()  # ParamDecl; a shape element may be a constant's name
    sinks: bool = False
    constants: tuple = ()  # Constant
    builtin: str = ""  # KernelSpec mask ("none" | "causal" | "sliding_window") or "softcap"
    builtin_window: int | None = None  # the window a built-in sliding window takes
    check: Callable | None = None  # constants -> problem text or None


def _t5_check(c: dict) -> str | None:
    if c["num_buckets"] % 4:
        return f"num_buckets must be a multiple of 4, got {c['num_buckets']}"
    if c["max_distance"] <= c["num_buckets"] // 4:
        return (f"max_distance must be greater than num_buckets / 4 = {c['num_buckets'] // 4}, "
                f"got {c['max_distance']}")
    return None


_T5_LETS = (
    ("rel", "kv_idx - q_idx"),  # memory position - query position (T5's sign)
    ("dist", "abs(rel)"),
    ("half", "num_buckets // 2"),  # buckets per direction
    ("exact", "num_buckets // 4"),  # distances below this get a bucket each
    # log-spaced buckets from `exact` up to max_distance (clamped to the last bucket); the max() keeps
    # the logarithm finite where the exact branch is taken
    ("far", "min(exact + floor(log(max(dist, exact) / exact) / log(max_distance / exact) * (half - exact)), "
            "half - 1)"),
    ("bucket", "(half if rel > 0 else 0) + (dist if dist < exact else far)"),
)

NAMED: dict[str, Named] = {n.name: n for n in (
    Named("none", "mask", "every key", mask="True", builtin="none"),
    Named("causal", "mask", "keys up to the query's position", mask="kv_idx <= q_idx", builtin="causal"),
    Named("sliding_window", "mask",
          "keys within `left` before and `right` after the query's position (the spec's `window: W` "
          "is left = W - 1, right = 0)",
          mask="q_idx - left <= kv_idx <= q_idx + right",
          constants=(Constant("left", "keys before the query", lo=0),
                     Constant("right", "keys after the query", lo=0)),
          builtin="sliding_window"),
    Named("softcap", "score", "tanh logit softcapping (the spec's `softcap: <cap>`)",
          score="tanh(score / cap) * cap", constants=(Constant("cap", "softcap value"),), builtin="softcap"),
    Named("gpt_oss_swa", "mask", "gpt-oss sliding layers: 128 keys up to the query, plus learned sinks",
          mask="kv_idx <= q_idx and q_idx - kv_idx < 128", sinks=True,
          builtin="sliding_window", builtin_window=128),
    Named("chunked", "mask", "Llama 4 chunked attention: causal inside fixed chunks of `chunk` positions",
          mask="kv_idx <= q_idx and q_idx // chunk == kv_idx // chunk",
          constants=(Constant("chunk", "chunk length in positions"),)),
    Named("prefix_lm", "mask", "causal, plus every key of the sequence's prefix (prefix_len[b] keys)",
          mask="kv_idx <= q_idx or kv_idx < prefix_len[b]",
          params=(X.ParamDecl("prefix_len", ("b",), "int32"),)),
    Named("sink_window", "mask",
          "StreamingLLM: the first `sink_tokens` keys and a causal window of `window` keys",
          mask="kv_idx <= q_idx and (kv_idx < sink_tokens or q_idx - kv_idx < window)",
          constants=(Constant("sink_tokens", "attention-sink keys at the start"),
                     Constant("window", "window width in keys, the query itself included"))),
    Named("alibi", "score", "ALiBi: a per-head linear distance penalty (used with mask: causal)",
          mask="kv_idx <= q_idx", score="score - slope[h] * abs(q_idx - kv_idx)",
          params=(X.ParamDecl("slope", ("h",), "fp32"),)),
    Named("t5_bias", "score",
          "T5 relative position bias: bidirectional log-spaced buckets, a learned bias per head and bucket",
          score="score + bias[h, bucket]", lets=_T5_LETS,
          params=(X.ParamDecl("bias", ("h", "num_buckets"), "fp32", learnable=True),),
          constants=(Constant("num_buckets", "relative position buckets (both directions)", 32, lo=4),
                     Constant("max_distance", "distance of the last bucket", 128)),
          check=_t5_check),
)}

MASK_NAMES = tuple(n for n, v in NAMED.items() if v.kind == "mask")
SCORE_NAMES = tuple(n for n, v in NAMED.items() if v.kind == "score")
# the fields constants are given in, and which variants take each
CONSTANT_FIELDS: dict[str, tuple[str, ...]] = {}
for _v in NAMED.values():
    if not _v.builtin:
        for _c in _v.constants:
            CONSTANT_FIELDS[_c.name] = CONSTANT_FIELDS.get(_c.name, ()) + (_v.name,)


@dataclass(frozen=True)
class Expr:
    """An expression the user wrote (`{expr: "..."}`)."""

    text: str


@dataclass(frozen=True)
class Resolved:
    """What a KernelSpec carries for one entry: the built-in mask ("none" under a mask expression),
    the window of a built-in sliding window a named variant fixes, the canonical expression texts,
    the parameters (sorted by name) and sinks."""

    mask: str
    window: int | None = None
    mask_expr: str = ""
    score_expr: str = ""
    params: tuple = ()
    sinks: bool = False


_FOLD = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "/": lambda a, b: a / b,
         "//": lambda a, b: a // b, "%": lambda a, b: a % b}
_FOLD_CALLS = {"abs": abs, "min": min, "max": max, "exp": math.exp, "log": math.log, "tanh": math.tanh,
               "sqrt": math.sqrt, "floor": math.floor}


def fold(n: X.Node) -> X.Node:
    """n with its arithmetic on literals computed (a variant's constants make `num_buckets // 2` a
    literal 16), Python's semantics as in the expressions. Only numbers fold."""
    kids = X.children(n)
    if not kids:
        return n
    new = tuple(fold(k) for k in kids)
    if all(isinstance(k, X.Const) and n.ty in (X.INT, X.FLOAT) for k in new):
        vals = [k.value for k in new]
        try:
            if isinstance(n, X.Bin):
                v = _FOLD[n.op](*vals)
                return X.const(float(v) if n.ty == X.FLOAT else int(v))
            if isinstance(n, X.Neg):
                return X.const(-vals[0])
            if isinstance(n, X.Call):
                v = _FOLD_CALLS[n.fn](*vals)
                return X.const(float(v) if n.ty == X.FLOAT else int(v))
        except (ArithmeticError, ValueError):
            pass  # left to the kernel (and its error checks)
    if new == kids:
        return n
    if isinstance(n, X.Sub):
        return X.Sub(n.ty, n.param, new)
    if isinstance(n, (X.Neg, X.Not)):
        return type(n)(n.ty, new[0])
    if isinstance(n, X.IfExp):
        return X.IfExp(n.ty, *new)
    if isinstance(n, X.Call):
        return X.Call(n.ty, n.fn, new)
    return type(n)(n.ty, n.op, *new)


def _names(text: str) -> set:
    """The names an expression text mentions (none when it does not parse)."""
    try:
        return {n.id for n in ast.walk(ast.parse(text.strip(), mode="eval")) if isinstance(n, ast.Name)}
    except SyntaxError:
        return set()


def nodes(v: Named, constants: dict | None = None) -> tuple:
    """(mask node or None, score node or None, {name: ParamDecl}) of variant v, its constants taken
    from `constants` (else their defaults). Raises ExprError (only for a bad table row or a
    constant that breaks an expression)."""
    values = {c.name: c.default for c in v.constants}
    values.update(constants or {})
    env = {k: X.const(val) for k, val in values.items() if val is not None}
    params = {p.name: X.ParamDecl(p.name, tuple(values[s] if isinstance(s, str) and s in values else s
                                                for s in p.shape), p.dtype, p.learnable) for p in v.params}
    for name, text in v.lets:
        env[name] = fold(X.parse(text, "let", params, env))
    mask = fold(X.parse(v.mask, "mask", params, env)) if v.mask else None
    score = fold(X.parse(v.score, "score", params, env)) if v.score else None
    return mask, score, params


def resolve(mask, score_mod=None, lets: dict | None = None, params: dict | None = None,
            sinks: bool | None = None, constants: dict | None = None,
            reported: frozenset = frozenset()) -> tuple[Resolved | None, list]:
    """An entry's expression fields -> (Resolved or None, [(field, problem), ...]).

    mask: a built-in mask name (MASKS of attngen.spec.model), a name of MASK_NAMES, Expr, or None
    when the mask field had problems already reported (the other fields are still checked);
    score_mod: None, a name of SCORE_NAMES or Expr; lets: name -> text (the user's, in order; they
    serve the user's expressions); params: name -> ParamDecl (the user's; one named like a variant's
    parameter replaces it, same shape); sinks: True / False / None (left out); constants: field ->
    int for the CONSTANT_FIELDS the entry gives; reported: names of parameters and constants whose
    fields had problems already reported (a constant is then not "required" again, and a user
    expression or let naming one of them is not checked: its problems would only echo the first)."""
    problems: list = []
    skipped = bool(reported) or mask is None
    lets, params, constants = dict(lets or {}), dict(params or {}), dict(constants or {})
    out_mask, window, want_sinks = "none", None, False
    decls: dict = {}  # every parameter the kernels take: name -> ParamDecl
    origin: dict = {}  # parameter name -> the variant that declared it
    mask_node = score_node = None
    chosen = []  # (field, Named)
    if isinstance(mask, str) and mask in NAMED and NAMED[mask].kind == "mask":
        chosen.append(("mask", NAMED[mask]))
    elif isinstance(mask, str):
        out_mask = mask  # a built-in without a row (document): loading checks it
    if isinstance(score_mod, str):
        if score_mod not in SCORE_NAMES:
            problems.append(("score_mod", f"must be one of {', '.join(n for n in SCORE_NAMES if not NAMED[n].builtin)} "
                                          f"or {{expr: ...}}, got {score_mod!r}"))
        elif NAMED[score_mod].builtin == "softcap":
            problems.append(("score_mod", "softcapping is built in: write `softcap: <cap>` instead"))
        else:
            chosen.append(("score_mod", NAMED[score_mod]))

    # constants: the fields the chosen variants take
    takes = {c.name: (f, v) for f, v in chosen if not v.builtin for c in v.constants}
    for name in constants:
        if name not in takes:
            users = " / ".join(CONSTANT_FIELDS.get(name, ()))
            problems.append((name, f"only applies to {users} (not used by this entry)"))
    for field, v in chosen:
        if v.builtin:
            out_mask = v.builtin
            window = v.builtin_window
            want_sinks |= v.sinks
            continue
        values = {}
        for c in v.constants:
            val = constants.get(c.name, c.default)
            if val is None and c.name in reported:
                continue
            if val is None:
                problems.append((c.name, f"is required for {field}: {v.name} ({c.meaning})"))
            else:
                values[c.name] = val
        if len(values) < len(v.constants):
            continue
        if v.check and (msg := v.check(values)):
            problems.append((field, f"{v.name}: {msg}"))
            continue
        try:
            m, s, ps = nodes(v, values)
        except X.ExprError as e:  # a constant that breaks the expression (e.g. a division by zero)
            problems.extend((field, f"{v.name}: {p}") for p in e.problems)
            continue
        want_sinks |= v.sinks
        if field == "mask":
            mask_node = m
        else:
            score_node = s
        for name, d in ps.items():
            if name in decls:
                problems.append((field, f"{v.name}'s parameter '{name}' is also {origin[name]}'s"))
                continue
            user = params.get(name)
            if user is not None and user.shape != d.shape:
                problems.append(("params", f"'{name}': {v.name} declares it with shape {list(d.shape)}, "
                                           f"got {list(user.shape)} (only dtype and learnable may change)"))
                user = None
            decls[name], origin[name] = user or d, f"{field}: {v.name}"

    # the user's parameters, lets and expressions
    for name, d in params.items():
        if name not in decls:
            decls[name], origin[name] = d, "params"
    echoes = set(reported)  # lets that name a parameter with a bad declaration
    for name, text in lets.items():
        if _names(text) & echoes:
            echoes.add(name)
    user_lets, let_problems = X.parse_lets({k: t for k, t in lets.items() if k not in echoes}, decls)
    problems.extend(("let", p) for p in let_problems)
    echoes |= set(lets) - set(user_lets)
    for field, what, kind in (("mask", mask, "mask"), ("score_mod", score_mod, "score")):
        if not isinstance(what, Expr) or _names(what.text) & echoes:
            continue
        try:
            node = X.parse(what.text, kind, decls, user_lets)
        except X.ExprError as e:
            problems.extend((field, p) for p in e.problems)
            continue
        if kind == "mask":
            if X.uses(node, "score"):
                problems.append((field, f"'{what.text.strip()}': a mask cannot use score (through a let)"))
                continue
            mask_node = node
        else:
            score_node = node
    if sinks is False and want_sinks:
        problems.append(("sinks", f"{'/'.join(v.name for _, v in chosen if v.sinks)} has learned sinks; "
                                  "leave sinks out or write sinks: learned"))
    if problems or skipped:
        return None, problems

    # parameters: each used, learnable ones only where a gradient can be formed
    used_mask = set(X.params_used(mask_node)) if mask_node is not None else set()
    used_score = set(X.params_used(score_node)) if score_node is not None else set()
    for name, d in decls.items():
        if name not in used_mask | used_score:
            problems.append(("params", f"'{name}' is declared but used by no expression"))
            continue
        if not d.learnable:
            continue
        if d.kind != X.FLOAT:
            problems.append(("params", f"'{name}': a learnable parameter must be fp32, fp16 or bf16, got {d.dtype}"))
        if name in used_mask:
            problems.append(("params", f"'{name}' is learnable but the mask uses it (a mask is not "
                                       "differentiable: make it learnable: false)"))
        for sub in (m for m in X.walk(score_node) if isinstance(m, X.Sub) and m.param == name):
            general = [i for i in sub.idx if not (isinstance(i, X.Var) and i.name in ("b", "h"))]
            if len(general) > 1:
                problems.append(("params", f"'{X.to_text(sub)}': a learnable parameter's subscripts must each "
                                           "be b, h or one general int expression (at most one of them), "
                                           "for the backward's reduction of its gradient"))
    if problems:
        return None, problems
    return Resolved(mask=out_mask, window=window,
                    mask_expr=X.to_text(mask_node) if mask_node is not None else "",
                    score_expr=X.to_text(score_node) if score_node is not None else "",
                    params=tuple(decls[n] for n in sorted(decls)),
                    sinks=bool(sinks) or want_sinks), []
