"""The recording side of attngen.runtime.trace: the expression tree a traced mask_mod / score_mod
builds, the handlers that build it for torch functions, Tensor methods and Python operators, and
the Proxy objects the callable runs on (the module docstring of attngen.runtime.trace says what
is traced and how torch and the expression grammar differ)."""

from __future__ import annotations

import math
import numbers
import os
import operator

import torch

INT, FLOAT, BOOL = "int", "float", "bool"
MAX_EXPR_CHARS = 65536
SUPPORTED = ("supported: + - * / // % ** (literal 1, 2, 0.5), comparisons, & | ^ ~ on booleans, abs, min, "
             "max, minimum, maximum, clamp, exp, log, tanh, sqrt, floor, ceil, trunc, where, "
             "logical_and/or/xor/not, dtype casts, full_like, indexing a captured tensor")
_A = {INT: "an int", FLOAT: "a float", BOOL: "a boolean"}
_DTYPE = {INT: torch.int64, FLOAT: torch.float32, BOOL: torch.bool}
_TORCH_DIR = os.path.dirname(torch.__file__)


class TraceError(ValueError):
    """The callable does something the expression language cannot say; the message names what."""


# ---------------------------------------------------------------------------------------------- tree

class _Node:
    """op: name | const | param (value: 0-d tensor) | index (value: tensor, args: subscripts) | neg |
    not | + - * / // % | < <= > >= == != | and | or | if (args: then, cond, else) | call (value: fn)."""

    __slots__ = ("op", "args", "type", "value", "size")

    def __init__(self, op: str, args: tuple, type_: str, value=None):
        self.op, self.args, self.type, self.value = op, args, type_, value
        self.size = 8 + sum(a.size for a in args) + (len(str(value)) if op in ("name", "const") else 0)
        if self.size > MAX_EXPR_CHARS:
            raise TraceError(f"the expression grows past {MAX_EXPR_CHARS} characters (a value reused "
                             "many times renders once per use)")


def _const(v) -> _Node:
    if isinstance(v, bool):
        return _Node("const", (), BOOL, v)
    if isinstance(v, numbers.Integral):
        return _Node("const", (), INT, int(v))
    if isinstance(v, numbers.Real):
        if not math.isfinite(v):
            raise TraceError(f"the literal {float(v)} is not allowed (no inf/nan in expressions; mask "
                             "with a mask_mod instead of a -inf score)")
        return _Node("const", (), FLOAT, float(v))
    raise TraceError(f"a value of type {type(v).__name__} cannot appear in an expression")


_FOLD = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
         "//": operator.floordiv, "%": operator.mod, "<": operator.lt, "<=": operator.le,
         ">": operator.gt, ">=": operator.ge, "==": operator.eq, "!=": operator.ne,
         "and": lambda a, b: a and b, "or": lambda a, b: a or b, "neg": operator.neg,
         "not": operator.not_, "if": lambda x, c, y: x if c else y,
         "abs": abs, "min": min, "max": max, "floor": math.floor}
_CAST = {INT: int, FLOAT: float, BOOL: bool}


def _make(op: str, args: tuple, type_: str, value=None) -> _Node:
    """A node, or the literal it folds to (exact ops on literals only; never to inf/nan)."""
    fold = _FOLD.get(value if op == "call" else op)
    if fold is not None and all(a.op == "const" for a in args):
        try:
            v = fold(*(a.value for a in args))
        except (ArithmeticError, ValueError):
            v = None
        if v is not None and not (isinstance(v, float) and not math.isfinite(v)):
            return _const(_CAST[type_](v))
    return _Node(op, args, type_, value)


def _literal(v) -> str:
    s = repr(v) if isinstance(v, (bool, int)) else repr(float(v))
    return f"({s})" if s.startswith("-") else s


_FORMS = {"neg": "(-{0})", "not": "(not {0})", "if": "({0} if {1} else {2})"}


def _render(n: _Node, names: dict, params: list) -> str:
    """Text of n; parameters are named as the text reaches them (args are stored in text order)."""
    if n.op == "name":
        return n.value
    if n.op == "const":
        return _literal(n.value)
    if n.op in ("param", "index"):
        name = names.get(id(n.value))
        if name is None:
            name = names[id(n.value)] = f"p{len(params)}"
            params.append((name, n.value))
        if n.op == "param":
            return name
    parts = [_render(a, names, params) for a in n.args]
    if n.op == "index":
        return f"{name}[{', '.join(parts)}]"
    if n.op == "call":
        return f"{n.value}({', '.join(parts)})"
    return _FORMS.get(n.op, "({0} " + n.op + " {1})").format(*parts)


# ------------------------------------------------------------------------------------------ builders

def _lift(x) -> _Node:
    if isinstance(x, _Node):
        return x
    if isinstance(x, Proxy):
        return x._node
    if isinstance(x, torch.Tensor):
        if x.dim() == 0:
            return _param("param", (), x)
        hint = " (it has one element: make it 0-d or index it)" if x.numel() == 1 else ""
        raise TraceError(f"a captured tensor of shape {tuple(x.shape)} is used as a value{hint}; index "
                         "it with the index arguments, e.g. t[h] or t[b, h]")
    return _const(x)


def _type_of(dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return BOOL
    if dtype.is_complex:
        raise TraceError(f"complex tensors ({dtype}) are not supported")
    return FLOAT if dtype.is_floating_point else INT


def _num(n: _Node) -> _Node:
    """A boolean used as a number is 0 or 1 (torch's promotion)."""
    return _make("if", (_const(1), n, _const(0)), INT) if n.type == BOOL else n


def _truth(n: _Node) -> _Node:
    return n if n.type == BOOL else _make("!=", (n, _const(0)), BOOL)


def _promote(a: _Node, b: _Node) -> str:
    return FLOAT if FLOAT in (a.type, b.type) else INT


def _arith(op, a, b) -> _Node:
    a, b = _lift(a), _lift(b)
    if a.type == b.type == BOOL:
        raise TraceError(f"'{op}' of two booleans is not supported; combine masks with &, |, ~ or "
                         "torch.where")
    a, b = _num(a), _num(b)
    return _make(op, (a, b), FLOAT if op == "/" else _promote(a, b))


def _compare(op, a, b) -> _Node:
    a, b = _lift(a), _lift(b)
    if not (a.type == b.type == BOOL and op in ("==", "!=")):
        a, b = _num(a), _num(b)
    return _make(op, (a, b), BOOL)


def _logic(op, sym, *xs, truthy=False) -> _Node:
    """and / or / != (xor) / not of booleans; logical_* (truthy) first compare numbers with 0."""
    xs = tuple(_truth(x) if truthy else x for x in map(_lift, xs))
    if any(x.type != BOOL for x in xs):
        raise TraceError(f"'{sym}' of {' and '.join(_A[x.type] for x in xs)} is a bitwise operation, "
                         "which the expression language lacks; & | ^ ~ work on booleans (masks)")
    return _make(op, xs, BOOL)


def _neg(x) -> _Node:
    x = _lift(x)
    if x.type == BOOL:
        raise TraceError("unary minus of a boolean is not supported; use ~ to negate a mask")
    return _make("neg", (x,), x.type)


def _call(fn, *args) -> _Node:
    args = tuple(_lift(a) for a in args)
    if any(a.type == BOOL for a in args):
        raise TraceError(f"{fn}() of a boolean is not supported; convert it with torch.where first")
    if fn in ("abs", "floor"):
        return _make("call", args, args[0].type if fn == "abs" else INT, fn)
    if fn in ("min", "max"):
        return _make("call", args, _promote(*args), fn)
    return _make("call", args, FLOAT, fn)  # exp log tanh sqrt


def _floor(x) -> _Node:
    x = _lift(x)
    return x if x.type == INT else _call("floor", x)


def _ceil(x) -> _Node:
    x = _lift(x)
    return x if x.type == INT else _neg(_call("floor", _neg(x)))


def _trunc(x) -> _Node:
    x = _lift(x)
    if x.type == INT:
        return x
    return _make("if", (_call("floor", x), _compare(">=", x, 0.0), _ceil(x)), INT)


def _where(condition, input=None, other=None) -> _Node:
    if input is None or other is None:
        raise TraceError("torch.where(condition) (the nonzero form) is not supported; give "
                         "torch.where(condition, x, y)")
    c, x, y = _lift(condition), _lift(input), _lift(other)
    if c.type != BOOL:
        raise TraceError(f"torch.where needs a boolean condition, got {_A[c.type]}")
    if (x.type == BOOL) != (y.type == BOOL):
        x, y = _num(x), _num(y)
    return _make("if", (x, c, y), x.type if x.type == y.type else FLOAT)


def _clamp(input, min=None, max=None) -> _Node:
    if min is None and max is None:
        raise TraceError("clamp needs min or max")
    x = _lift(input) if min is None else _call("max", input, min)
    return x if max is None else _call("min", x, max)


def _cast(x, dtype) -> _Node:
    x = _lift(x)
    if dtype is None:
        return x
    if dtype == torch.bool:
        return _truth(x)
    _type_of(dtype)  # complex: TraceError
    return _num(x) if dtype.is_floating_point else _trunc(_num(x))


def _pow(x, e) -> _Node:
    x, e = _lift(x), _lift(e)
    if e.op == "const" and e.type != BOOL and x.type != BOOL and e.value in (1, 2, 0.5):
        return x if e.value == 1 else _arith("*", x, x) if e.value == 2 else _call("sqrt", x)
    raise TraceError("'**' is supported only with a literal exponent 1, 2 or 0.5 (the expression "
                     "language has no pow; write exp(y * log(x)))")


def _index(tensor: torch.Tensor, index) -> _Node:
    subs = index if isinstance(index, tuple) else (index,)
    if any(s is None or s is Ellipsis or isinstance(s, slice) for s in subs):
        raise TraceError("slicing a captured tensor (:, ..., None) is not supported; index every "
                         "dimension with an integer expression")
    if len(subs) != tensor.dim():
        raise TraceError(f"a captured tensor of shape {tuple(tensor.shape)} is indexed with {len(subs)} "
                         f"subscript(s); give exactly {tensor.dim()}, one per dimension, in one "
                         "subscript (t[h, i], not t[h][i])")
    nodes = []
    for d, s in enumerate(subs):
        n = _lift(s)
        if n.type != INT:
            raise TraceError(f"subscript {d} of a captured tensor is {n.type}-valued; subscripts are "
                             "integer expressions")
        if n.op == "const":
            size = tensor.shape[d]
            if not -size <= n.value < size:
                raise TraceError(f"subscript {d} is {n.value}, out of range for a dimension of {size}")
            n = _const(n.value % size)
        nodes.append(n)
    return _param("index", tuple(nodes), tensor)


def _param(op: str, subs: tuple, tensor: torch.Tensor) -> _Node:
    """The grammar has no boolean parameters: a bool tensor's entry reads as `(p[i] != 0)` (the
    runtime passes the tensor as integers)."""
    ty = _type_of(tensor.dtype)
    n = _Node(op, subs, INT if ty == BOOL else ty, tensor)
    return _make("!=", (n, _const(0)), BOOL) if ty == BOOL else n


def _minmax(fn):
    def handler(input, other=None, *rest, **kwargs):
        if other is None or rest or kwargs or isinstance(other, numbers.Integral):
            raise TraceError(f"torch.{fn}(x) / torch.{fn}(x, dim) reduces a tensor; use "
                             f"torch.{fn}imum(x, y) or torch.clamp")
        return _call(fn, input, other)
    return handler


def _to(input, *args, dtype=None, **kwargs):
    """x.to(dtype), x.to(other), x.to(device, dtype): the dtype, if any, is cast to."""
    dtypes = [a.dtype if isinstance(a, (torch.Tensor, Proxy)) else a for a in args]
    return _cast(input, next((d for d in dtypes if isinstance(d, torch.dtype)), dtype))


def _full_like(input, fill_value, *, dtype=None, **kwargs):
    v = _lift(fill_value)
    if v.op != "const":
        raise TraceError("full_like needs a Python number as the fill value")
    return _cast(v, dtype or _DTYPE[_lift(input).type])


def _handlers() -> dict:
    """torch function / Tensor method name (self or input first) -> builder."""
    h = {}

    def reg(names: str, fn):
        h.update(dict.fromkeys(names.split(), fn))

    for op, names, reflected in (("+", "add __add__", "__radd__"),
                                 ("-", "sub subtract __sub__", "__rsub__ rsub"),
                                 ("*", "mul multiply __mul__", "__rmul__"),
                                 ("/", "div divide true_divide __truediv__ __div__", "__rtruediv__ __rdiv__"),
                                 ("//", "floor_divide __floordiv__", "__rfloordiv__"),
                                 ("%", "remainder __mod__", "__rmod__")):
        reg(names, lambda a, b, op=op, rounding_mode=None: (
            _arith(op, a, b) if rounding_mode is None or op != "/" else
            _arith("//", a, b) if rounding_mode == "floor" else _trunc(_arith("/", a, b))))
        reg(reflected, lambda a, b, op=op: _arith(op, b, a))
    for op, names in (("<", "lt less __lt__"), ("<=", "le less_equal __le__"),
                      (">", "gt greater __gt__"), (">=", "ge greater_equal __ge__"),
                      ("==", "eq __eq__"), ("!=", "ne not_equal __ne__")):
        reg(names, lambda a, b, op=op: _compare(op, a, b))
    for op, sym, name in (("and", "&", "and"), ("or", "|", "or"), ("!=", "^", "xor")):
        reg(f"__{name}__ bitwise_{name}", lambda a, b, op=op, sym=sym: _logic(op, sym, a, b))
        reg(f"__r{name}__", lambda a, b, op=op, sym=sym: _logic(op, sym, b, a))
        reg(f"logical_{name}", lambda a, b, op=op, sym=sym: _logic(op, sym, a, b, truthy=True))
    reg("__invert__ bitwise_not", lambda x: _logic("not", "~", x))
    reg("logical_not", lambda x: _logic("not", "not", x, truthy=True))
    reg("neg negative __neg__", _neg)
    reg("positive __pos__", _lift)
    reg("abs absolute __abs__", lambda x: _call("abs", x))
    for fn in ("exp", "log", "tanh", "sqrt"):
        reg(fn, lambda x, fn=fn: _call(fn, x))
    reg("floor __floor__", _floor)
    reg("ceil __ceil__", _ceil)
    reg("trunc fix __trunc__", _trunc)
    reg("pow __pow__", _pow)
    reg("__rpow__", lambda a, b: _pow(b, a))
    reg("square", lambda x: _pow(x, 2))
    reg("minimum", lambda a, b: _call("min", a, b))
    reg("maximum", lambda a, b: _call("max", a, b))
    reg("min", _minmax("min"))
    reg("max", _minmax("max"))
    reg("clamp clip", _clamp)
    reg("clamp_min", lambda x, min: _clamp(x, min=min))
    reg("clamp_max", lambda x, max: _clamp(x, max=max))
    reg("where", _where)
    for dtype, names in ((torch.float32, "float double half bfloat16"),
                         (torch.int64, "int long short char byte"), (torch.bool, "bool")):
        reg(names, lambda x, dtype=dtype, **kw: _cast(x, dtype))
    reg("to", _to)
    reg("full_like", _full_like)
    reg("zeros_like", lambda x, **kw: _full_like(x, 0, **kw))
    reg("ones_like", lambda x, **kw: _full_like(x, 1, **kw))
    reg("__getitem__", _index)
    return h


_HANDLERS = _handlers()


def _display(func) -> str:
    """torch.sin, Tensor.abs, torch.nn.functional.gelu, ..."""
    qual = getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)
    head, _, name = qual.rpartition(".")
    if head in ("TensorBase", "Tensor"):
        return f"Tensor.{name}"
    if head == "_VariableFunctionsClass":
        return f"torch.{name}"
    mod = getattr(func, "__module__", None)
    return f"{mod}.{qual}" if mod else qual


def _dispatch(func, args, kwargs) -> "Proxy":
    shown = _display(func)
    ns, _, name = shown.partition(".")
    handler = _HANDLERS.get(name) if ns in ("torch", "Tensor") else None
    if handler is None:
        raise TraceError(f"{shown} is not supported ({SUPPORTED})")
    if shown == "Tensor.where":  # x.where(cond, y) is torch.where(cond, x, y)
        args = (args[1], args[0], *args[2:])
    try:
        return Proxy(handler(*args, **kwargs))
    except TypeError as e:  # arguments the builder does not take (alpha=, out=, dim=, ...)
        raise TraceError(f"{shown} with these arguments is not supported ({e})") from None


# --------------------------------------------------------------------------------------------- proxy

_CONTROL_FLOW = ("is data-dependent Python control flow, which is not traceable; use torch.where(cond, x, "
                 "y), & | ~ for and/or/not, and torch.minimum / torch.maximum for min()/max()")


def _refuse(what: str, why: str = f"is not supported ({SUPPORTED})"):
    def refuse(self, *args):
        raise TraceError(f"{what} of a traced value {why}")
    return refuse


class Proxy:
    """A traced value: one of the callable's arguments or an expression built from them."""

    __slots__ = ("_node",)
    __hash__ = None  # __eq__ builds an expression

    def __init__(self, node: _Node):
        self._node = node

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return _dispatch(func, args, kwargs or {})

    def __getattr__(self, name):
        """Tensor methods (x.abs(), x.clamp(0, 7), x.to(torch.long), x.sin() -> TraceError)."""
        attr = getattr(torch.Tensor, name, None) if not name.startswith("_") else None
        if attr is None:
            raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")
        if not callable(attr):
            raise TraceError(f"Tensor.{name} of a traced value is not available")
        return lambda *args, **kwargs: _dispatch(attr, (self, *args), kwargs)

    @property
    def dtype(self) -> torch.dtype:
        return _DTYPE[self._node.type]

    def __repr__(self) -> str:
        return f"<traced {self._node.type}: {_render(self._node, {}, [])}>"

    __bool__ = _refuse("bool() (an if, while, and, or, not, or a min()/max() builtin)", _CONTROL_FLOW)
    __int__ = __float__ = __complex__ = _refuse("int()/float() (or a math.* function)")
    __index__ = _refuse("use as a Python index (list[i], range(i))")
    __len__ = __iter__ = _refuse("len()/iteration")
    __getitem__ = _refuse("indexing (only captured tensors can be indexed)")
    __round__ = _refuse("round()")
    __lshift__ = __rlshift__ = __rshift__ = __rrshift__ = _refuse("a bit shift")
    __matmul__ = __rmatmul__ = _refuse("'@'")


def _operators():
    """Proxy's Python operators, through the handlers torch's Tensor operators use."""
    for name in ("add radd sub rsub mul rmul truediv rtruediv floordiv rfloordiv mod rmod pow rpow and "
                 "rand or ror xor rxor lt le gt ge eq ne invert neg pos abs floor ceil trunc").split():
        handler = _HANDLERS[f"__{name}__"]
        setattr(Proxy, f"__{name}__", lambda *args, handler=handler: Proxy(handler(*args)))


_operators()


def _name(name: str, type_: str) -> Proxy:
    return Proxy(_Node("name", (), type_, name))
