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
import types
import weakref
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
    """fn's trace, kept for the next call where everything it can read is the same (_fingerprint):
    a call with a mask_mod traces it every time otherwise, the larger part of the host path of a
    call whose kernel takes a few hundred microseconds (a document mask's call on the CPU here:
    115 -> 51 us before the launch)."""
    keep: list = []
    try:
        key = _fingerprint(fn, keep)
    except Exception:  # noqa: BLE001 -- an empty cell, an odd object: traced every call
        key = None
    if key is not None:
        key = (role, key)
        hit = _TRACES.get(key)
        if hit is not None:
            expr, names, refs, held = hit
            tensors = [r() for r in refs]
            if all(t is not None for t in tensors) and all(r() is not None for r in held):
                return Traced(expr, tuple(zip(names, tensors)))
    out = _trace_now(fn, role, args, want_bool)
    if key is not None:
        if len(_TRACES) >= 128:
            _TRACES.pop(next(iter(_TRACES)))
        _TRACES[key] = (out.expr, tuple(n for n, _ in out.params),
                        tuple(weakref.ref(t) for _, t in out.params),
                        tuple(weakref.ref(x) for x in keep if isinstance(x, torch.Tensor)))
    return out


# (role, fingerprint) -> (expression text, parameter names, weak references to the parameters'
# tensors, weak references to the tensors the fingerprint names by id). Weak, so that a kept trace
# keeps no tensor of a model alive; a hit needs them all alive: the id of a tensor that died can
# be reused by another, but not while the first lives. (Other objects keyed by id -- builtin
# functions, seqlen_q / seqlen_k -- live as long as their modules.)
_TRACES: dict = {}

# modules whose attributes a callable may read (torch.where, math.log) without them being part of
# its fingerprint: their functions do not change between calls. Any other module read by a callable
# (a config module's constant) makes it traced at every call
_STABLE_MODULES = ("torch", "math", "operator", "numpy")


def _fingerprint(fn, keep: list, depth: int = 0):
    """A hashable key of everything fn's trace can depend on -- its code, the contents of its
    closure cells, its defaults, the globals its code (nested code included) names, recursively
    through the plain functions among them -- or None where something cannot be keyed (a bound
    method, a callable object, a dict, an object of another type in a cell or global): such a
    callable is traced at every call. A tensor is keyed by identity, version counter, storage,
    dtype, shape, strides and device: the trace names it as a parameter (its values are passed at
    each call), but a callable may read a value from it (`.item()`), which an in-place write
    changes. Objects keyed by identity are appended to keep."""
    if type(fn) is not types.FunctionType or depth > 4:
        return None
    code = fn.__code__
    parts = [code]
    for group in (tuple(c.cell_contents for c in fn.__closure__ or ()), fn.__defaults__ or (),
                  tuple(sorted((fn.__kwdefaults__ or {}).items()))):
        for v in group:
            k = _value_key(v, keep, depth)
            if k is None:
                return None
            parts.append(k)
    g = fn.__globals__
    for name in _names(code):
        if name in g:
            k = _value_key(g[name], keep, depth)
            if k is None:
                return None
            parts.append((name, k))
    return tuple(parts)


def _names(code) -> tuple:
    """The names code and the code objects nested in it read (globals and attributes alike)."""
    out = _NAMES.get(code)
    if out is None:
        out = tuple(code.co_names) + tuple(n for c in code.co_consts if isinstance(c, types.CodeType)
                                           for n in _names(c))
        _NAMES[code] = out
    return out


_NAMES: dict = {}  # code object -> _names (a code object is immutable)


def _value_key(v, keep: list, depth: int):
    if v is None or isinstance(v, (bool, int, float, str, complex)):
        return (type(v), v)
    if isinstance(v, (tuple, list)):
        keys = [_value_key(x, keep, depth) for x in v]
        return None if any(k is None for k in keys) else (type(v), tuple(keys))
    if isinstance(v, types.FunctionType):
        return _fingerprint(v, keep, depth + 1)
    if isinstance(v, types.ModuleType):
        return ("module", v.__name__) if v.__name__.split(".")[0] in _STABLE_MODULES else None
    if isinstance(v, torch.dtype):
        return ("dtype", str(v))
    if isinstance(v, torch.Tensor):
        keep.append(v)
        strided = v.layout == torch.strided
        return ("tensor", id(v), v._version, v.data_ptr() if strided else 0, v.dtype, tuple(v.shape),
                tuple(v.stride()) if strided else (), str(v.device))
    if isinstance(v, (types.BuiltinFunctionType, trace_ops.Proxy)):  # abs, torch.where; seqlen_q
        return ("object", id(v))
    return None


def _trace_now(fn, role: str, args: tuple, want_bool: bool) -> Traced:
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
