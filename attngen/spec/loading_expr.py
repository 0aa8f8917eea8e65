"""The expression fields of a `kernels:` entry (mask / score_mod `{expr: ...}`, `let:`, `params:`,
`sinks:` and the named variants' constants), read for attngen.spec.loading: every problem is
reported on its field through the entry's `bad`, and attngen.spec.named.resolve makes the
expressions' canonical texts."""

from __future__ import annotations

from attngen.spec import expr as X
from attngen.spec import named as N
from attngen.spec.model import _is_int


def expr_mapping(e, field: str, v: dict):
    if set(v) != {"expr"}:
        e.bad(field, f"an expression is written {{expr: \"...\"}}, got the keys {', '.join(map(str, v))}")
        return None
    if not isinstance(v["expr"], str) or not v["expr"].strip():
        e.bad(field, f"expr must be a non-empty string, got {v['expr']!r}")
        return None
    return N.Expr(v["expr"])


def _param_problems(name, d) -> list[str]:
    if not isinstance(name, str) or not name.isidentifier():
        return ["a parameter name must be an identifier"]
    if name in X.INDEX_NAMES or name == "score" or name in X.FUNCS:
        return ["shadows a built-in name"]
    if not isinstance(d, dict):
        return [f"must be a mapping {{shape, dtype, learnable}}, got {d!r}"]
    out = [f"unknown key {key!r} (known: shape, dtype, learnable)" for key in d
           if key not in ("shape", "dtype", "learnable")]
    shape = d.get("shape")
    if not isinstance(shape, list):
        out.append(f"shape must be a list of axes ({N.AXES_HINT}; [] for a scalar), got {shape!r}")
    else:
        out += [f"unknown axis {ax!r} (an axis is {N.AXES_HINT})" for ax in shape
                if not (ax in X.AXES if isinstance(ax, str) else _is_int(ax) and ax >= 1)]
    dtype = d.get("dtype", "fp32")
    if not isinstance(dtype, str) or dtype not in X.PARAM_DTYPES:
        out.append(f"dtype must be one of {', '.join(X.PARAM_DTYPES)}, got {dtype!r}")
    if not isinstance(d.get("learnable", False), bool):
        out.append(f"learnable must be true or false, got {d['learnable']!r}")
    return out


def _param_decls(e) -> tuple[dict | None, set]:
    """`params:` -> (name -> ParamDecl of the good declarations, or None when `params` itself is
    bad; the names of the bad ones)."""
    raw = e.raw.get("params")
    if raw is None:
        return {}, set()
    if not isinstance(raw, dict):
        e.bad("params", f"must be a mapping of name -> {{shape, dtype, learnable}}, got {type(raw).__name__}")
        return None, set()
    out, bad = {}, set()
    for name, d in raw.items():
        msgs = _param_problems(name, d)
        for msg in msgs:
            e.bad("params", f"'{name}': {msg}")
        if msgs:
            bad.add(str(name))
        else:
            out[name] = X.ParamDecl(name, tuple(d["shape"]), d.get("dtype", "fp32"), d.get("learnable", False))
    return out, bad


def entry_expressions(e, mask, softcap: float, dtypes, window: int | None) -> N.Resolved | None:
    """The entry's expression fields through named.resolve, every problem reported on its field."""
    raw = e.raw
    score = raw.get("score_mod")
    if isinstance(score, dict):
        score = expr_mapping(e, "score_mod", score)
    elif score is not None and not isinstance(score, str):
        e.bad("score_mod", f"must be one of {', '.join(N.SCORE_NAMES)} or {{expr: \"...\"}}, got {score!r}")
        score = None
    lets = raw.get("let")
    if lets is not None:
        if not isinstance(lets, dict):
            e.bad("let", f"must be a mapping of name -> expression, got {type(lets).__name__}")
            lets = None
        else:
            bad = [k for k, t in lets.items() if not isinstance(t, (str, int, float)) or isinstance(t, bool)]
            for k in bad:
                e.bad("let", f"let {k!r}: must be an expression (a string), got {lets[k]!r}")
            lets = None if bad else {k: t if isinstance(t, str) else repr(t) for k, t in lets.items()}
            if lets is not None and not isinstance(raw.get("mask"), dict) and not isinstance(raw.get("score_mod"), dict):
                e.bad("let", "only applies to {expr: ...} masks and score_mods (the entry has none)")
    sinks = raw.get("sinks")
    if sinks is not None and sinks not in ("learned", "none"):
        e.bad("sinks", f"must be learned or none, got {sinks!r}")
    params, reported = _param_decls(e)
    constants = {} if window is None else {"window": window}
    for name in N.CONSTANT_FIELDS:
        if name == "window":
            val = window  # checked with the mask
        else:
            lo = min(c.lo for v in N.NAMED.values() for c in v.constants if c.name == name)
            val = e.int_field(name, lo)
        if val is not None:
            constants[name] = val
        elif name in raw and (name != "window" or mask == "sink_window"):
            reported.add(name)
    if dtypes and "fp8_e4m3" in dtypes and (isinstance(mask, N.Expr) or raw.get("score_mod") is not None
                                             or sinks == "learned" or mask in N.MASK_NAMES and not (
                                                 N.NAMED[mask].builtin and not N.NAMED[mask].sinks)):
        e.bad("dtypes", "fp8_e4m3 kernels take no expressions or sinks (mask, score_mod, sinks); give "
                        "fp8_e4m3 an entry of its own with a built-in mask")
    if softcap > 0 and score is not None:
        e.bad("score_mod", "a score modification replaces softcapping: leave softcap out and write it in the "
                           "expression (tanh(score / cap) * cap)")
    if raw.get("score_mod") is not None and score is None or params is None or lets is None and "let" in raw:
        return None  # (each reported)
    x, problems = N.resolve(mask, score, lets, params, None if sinks is None else sinks == "learned", constants,
                            frozenset(reported))
    for field, msg in problems:
        e.bad(field, msg)
    return x
