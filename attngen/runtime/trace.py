"""Trace a FlexAttention-style mask_mod / score_mod into attngen expression text, without torch.compile.

    trace_mask_mod(fn)  fn(b, h, q_idx, kv_idx) -> bool           -> Traced(expr, params)
    trace_score_mod(fn) fn(score, b, h, q_idx, kv_idx) -> number  -> Traced(expr, params)
    traced_key(t)       (expr, ((name, dtype, shape), ...)): a plan-cache key, no tensor values

fn runs once on proxies, which record an expression tree through Python operators and, by
__torch_function__, torch functions, Tensor methods and the indexing of captured tensors
(`bias[h, i]`); the tree is rendered fully parenthesized in the grammar of attngen.spec.expr.
Tensors are captured by reference, deduplicated by identity, named p0, p1, ... in text order.
Types (int / float / bool) follow torch's promotion; a boolean in arithmetic is `(1 if c else 0)`.
Where torch and the grammar differ:
* Casts to a float dtype are dropped (the kernel computes in fp32; an int product past 2**31 that
  `.float()` would have kept is the one difference). A float cast to an integer dtype truncates
  toward zero, as torch does: `(floor(x) if (x >= 0.0) else (-floor((-x))))`; `.bool()` is `(x != 0)`.
* `floor(x)` of a float is an int (Python's math.floor), so it can subscript a parameter;
  floor / ceil / trunc of an int are the int itself.
* `&`, `|`, `^`, `~` exist only on booleans (and, or, !=, not): on integers they are bitwise,
  which the grammar lacks (TraceError). torch.logical_* compare numbers with 0, as torch does.
* `x ** 2` is `(x * x)`, `x ** 0.5` is `sqrt(x)`; other powers: TraceError.
* Pure-literal subtrees fold where Python computes exactly what torch does.
* seqlen_q / seqlen_k (below) are proxies a callable may close over.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from attngen.runtime import trace_ops
from attngen.runtime.trace_ops import _A, BOOL, FLOAT, INT, TraceError, _lift, _name, _render


@dataclass(frozen=True, eq=False)
class Traced:
    """Expression text plus the tensors it names. eq=False: compare traces by traced_key."""

    expr: str
    params: tuple[tuple[str, torch.Tensor], ...] = ()

    def __repr__(self) -> str:
        ps = ", ".join(f"{n}: {str(t.dtype).removeprefix('torch.')}{list(t.shape)}" for n, t in self.params)
        return f"Traced({self.expr!r}, {{{ps}}})"


def traced_key(t: Traced) -> tuple:
    """What a kernel built from `t` depends on: the text and each parameter's dtype and shape."""
    return (t.expr, tuple((name, p.dtype, tuple(p.shape)) for name, p in t.params))


seqlen_q = _name("seqlen_q", INT)
seqlen_k = _name("seqlen_k", INT)
_MASK_ARGS = tuple(_name(n, INT) for n in ("b", "h", "q_idx", "kv_idx"))
_SCORE_ARGS = (_name("score", FLOAT), *_MASK_ARGS)


# ------------------------------------------------------------------------------------------- tracing

def trace_mask_mod(fn) -> Traced:
    """fn(b, h, q_idx, kv_idx) -> boolean (True: the score is kept) as expression text."""
    return _trace(fn, "mask_mod", _MASK_ARGS, want_bool=True)


def trace_score_mod(fn) -> Traced:
    """fn(score, b, h, q_idx, kv_idx) -> the modified score as expression text."""
    return _trace(fn, "score_mod", _SCORE_ARGS, want_bool=False)


def _trace(fn, role: str, args: tuple, want_bool: bool) -> Traced:
    label = f"{role} {getattr(fn, '__name__', None) or type(fn).__name__!r}"
    try:
        out = fn(*args)
        if out is None:
            raise TraceError("it returns None (a missing return?)")
        node = _lift(out)
    except TraceError as e:
        raise TraceError(f"{label}{_location(e)}: {e}") from None
    if want_bool and node.type != BOOL:
        raise TraceError(f"{label} returns {_A[node.type]}; a mask_mod returns a boolean "
                         "(comparisons combined with &, |, ~)")
    if not want_bool and node.type == BOOL:
        raise TraceError(f"{label} returns a boolean; a score_mod returns the modified score (mask "
                         "with a mask_mod)")
    params: list = []
    expr = _render(node, {}, params)
    return Traced(expr, tuple(params))


def _location(e: BaseException) -> str:
    """' (file.py:12)': the deepest frame of the error outside this module and torch."""
    where, tb = "", e.__traceback__
    while tb is not None:
        path = tb.tb_frame.f_code.co_filename
        if path not in (__file__, trace_ops.__file__) and not path.startswith(trace_ops._TORCH_DIR):
            where = f" ({os.path.basename(path)}:{tb.tb_lineno})"
        tb = tb.tb_next
    return where
