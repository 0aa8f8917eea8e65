"""Spec-declared attention by name: `attngen.attention(q, k, v, variant="gpt_oss_20b_sliding",
sinks=s)`. A variant is a `kernels:` entry of the shipped spec files (or of files given to
`attngen.load_variants`): its mask, window, softcap, scale and expressions come from the entry,
the call brings the tensors (`params=`, `sinks=`), which are checked against the entry's
declarations. The call then runs the entry's generated kernels (the runtime's identity of the
call is the spec's)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from attngen import env

_lock = threading.Lock()
_entries: dict = {}
_loaded: set = set()


@dataclass(frozen=True)
class Variant:
    """What a call takes from a spec entry."""

    name: str
    source: str
    causal: bool
    window_size: tuple
    softcap: float
    scale: float | None
    causal_alignment: str
    mask_expr: str
    score_expr: str
    params: tuple  # ParamDecl
    sinks: bool


def load_variants(path) -> list[str]:
    """Make the `kernels:` entries of spec file(s) `path` (a file or folder) callable by name;
    returns their names. A name already known from another file is an error."""
    from attngen.spec.loading import load_spec, spec_files

    names = []
    with _lock:
        for f in spec_files(Path(path)):
            if str(f) in _loaded:
                continue
            for e in load_spec(f).entries:
                known = _entries.get(e.name)
                if known is not None and known.source != str(f):
                    raise ValueError(f"variant: '{e.name}' is declared by {known.source} and {f}")
                _entries[e.name] = _variant(e, str(f))
                names.append(e.name)
            _loaded.add(str(f))
    return names


def _variant(e, source: str) -> Variant:
    causal = e.mask in ("causal", "sliding_window") or (e.mask == "document" and e.document_mask != "none")
    window = (e.window - 1, 0) if e.window else (-1, -1)
    return Variant(e.name, source, causal, window, float(e.softcap), e.softmax_scale, e.causal_alignment,
                   e.mask_expr, e.score_expr, tuple(e.params), bool(e.sinks))


def lookup(name: str) -> Variant:
    if not _entries:
        load_variants(env.specs_dir())
    v = _entries.get(name)
    if v is None:
        raise ValueError(f"variant: unknown name {name!r} (known: {', '.join(sorted(_entries))}; "
                         "attngen.load_variants(path) adds a spec file's entries)")
    return v


def call_options(name: str, given: dict, params, sinks, hq: int, batch: int) -> dict:
    """The keyword arguments a variant's call runs with. given: the call's own mask / score options
    (each must be left at its default: the variant sets them); params / sinks checked against the
    entry's declarations."""
    v = lookup(name)
    defaults = {"causal": False, "window_size": (-1, -1), "softcap": 0.0, "mask_mod": None, "score_mod": None}
    for key, value in given.items():
        if key in defaults and value != defaults[key] and not (key == "window_size" and tuple(value) == (-1, -1)):
            raise ValueError(f"{key}: variant {name!r} sets it ({v.source}); leave it out of the call")
    params = dict(params or {})
    for d in v.params:
        if d.name not in params:
            raise ValueError(f"params: variant {name!r} needs '{d.name}' (shape {list(d.shape)}, {d.dtype})")
        t = params[d.name]
        want = tuple(batch if s == "b" else hq if s == "h" else s for s in d.shape)
        if tuple(t.shape) != want:
            raise ValueError(f"params: '{d.name}' of variant {name!r} has shape {tuple(t.shape)}, expected {want} "
                             f"({list(d.shape)})")
    extra = sorted(set(params) - {d.name for d in v.params})
    if extra:
        raise ValueError(f"params: variant {name!r} declares no {', '.join(extra)}")
    if v.sinks and sinks is None:
        raise ValueError(f"sinks: variant {name!r} has learned sinks: pass sinks=(num_q_heads,)")
    if not v.sinks and sinks is not None:
        raise ValueError(f"sinks: variant {name!r} has no sinks")
    out = {"causal": v.causal, "window_size": v.window_size, "softcap": v.softcap,
           "mask_mod": v.mask_expr or None, "score_mod": v.score_expr or None}
    if v.scale is not None and given.get("scale") is None:
        out["scale"] = v.scale
    return out
