"""Expressions under context parallelism: a mask_mod / score_mod sees global positions.

Each call of a ring step covers one query chunk and one key chunk (attngen.distributed.plan with
exact offsets), so a call's global positions are its rows plus an offset: the expression's
`q_idx` becomes `(q_idx + cp_q0)`, `kv_idx` becomes `(kv_idx + cp_k0)` and `seqlen_q` /
`seqlen_k` become `cp_seqlen` (the global length), where cp_q0, cp_k0 and cp_seqlen are int32
scalar parameters of the call (under top-left alignment a call's own q_idx is its row). The
parameters are tensors, so new offsets never make a new kernel. A callable is traced once into
expression text first (attngen.runtime.trace), its captured tensors becoming parameters.
"""

from __future__ import annotations

import ast

import torch

from attngen.runtime import trace

OFFSETS = ("cp_q0", "cp_k0", "cp_seqlen")
_GLOBAL = {"q_idx": ("q_idx", "cp_q0"), "kv_idx": ("kv_idx", "cp_k0"), "seqlen_q": (None, "cp_seqlen"),
           "seqlen_k": (None, "cp_seqlen")}


class _ToGlobal(ast.NodeTransformer):
    def __init__(self, rename: dict):
        self.rename, self.used = rename, set()

    def visit_Name(self, node):
        if node.id in _GLOBAL:
            local, offset = _GLOBAL[node.id]
            self.used.add(offset)
            if local is None:
                return ast.copy_location(ast.Name(offset, ast.Load()), node)
            return ast.copy_location(ast.BinOp(ast.Name(local, ast.Load()), ast.Add(), ast.Name(offset, ast.Load())),
                                     node)
        if node.id in self.rename:
            return ast.copy_location(ast.Name(self.rename[node.id], ast.Load()), node)
        return node


def _text(fn, kind: str, params: dict) -> tuple[str, dict]:
    """(expression text, the tensors it names) of a callable or text."""
    if isinstance(fn, str):
        return fn, {}
    if not callable(fn):
        raise ValueError(f"{kind}_mod: expected a callable or an expression string, got {type(fn).__name__}")
    traced = trace.trace_mask_mod(fn) if kind == "mask" else trace.trace_score_mod(fn)
    return traced.expr, {name: t for name, t in traced.params}


def global_exprs(mask_mod, score_mod, params: dict | None) -> tuple[str | None, str | None, dict, set]:
    """(mask text, score text, parameters, offsets used): the expressions over global positions."""
    params = dict(params or {})
    for name in params:
        if name in OFFSETS:
            raise ValueError(f"params: '{name}' is a name attngen.distributed uses; rename the parameter")
    for name, t in params.items():
        if isinstance(t, torch.Tensor) and t.requires_grad:
            raise ValueError(f"params: '{name}' requires grad; learnable expression parameters are not supported "
                             "under context parallelism yet (pass it detached)")
    texts, used = {}, set()
    for kind, fn in (("mask", mask_mod), ("score", score_mod)):
        if fn is None:
            texts[kind] = None
            continue
        text, traced = _text(fn, kind, params)
        rename = {}
        for name, t in traced.items():  # traced names p0, p1, ...: one prefix per expression
            rename[name] = f"cp{kind[0]}_{name}"
            params[rename[name]] = t
        try:
            tree = ast.parse(text, mode="eval")
        except SyntaxError as e:
            raise ValueError(f"{kind}_mod: not an expression ({e.msg}): {text!r}") from None
        walker = _ToGlobal(rename)
        texts[kind] = ast.unparse(walker.visit(tree))
        used |= walker.used
    return texts["mask"], texts["score"], params, used


class Offsets:
    """The int32 scalars (cp_q0, cp_k0, cp_seqlen) of each call, one small device tensor per
    distinct call origin, kept (a step's calls reuse them every layer and every iteration)."""

    def __init__(self):
        self._kept: dict = {}

    def params(self, used: set, origin: tuple, seqlen: int, device) -> dict:
        key = (origin, seqlen, device)
        t = self._kept.get(key)
        if t is None:
            if len(self._kept) > 4096:
                self._kept.clear()
            t = self._kept[key] = torch.tensor([origin[0], origin[1], seqlen], dtype=torch.int32, device=device)
        views = {"cp_q0": t[0], "cp_k0": t[1], "cp_seqlen": t[2]}
        return {n: views[n] for n in used}
