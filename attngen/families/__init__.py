"""Kernel families: each is one module of this package (its launch-config dataclass, validity
filter, search space, default tables, the optional kernels a spec's module gets, and a Family
record naming its template, launcher and tuning hooks) plus its templates. Codegen, the runtime,
the tuner and the database look a family up here; docs/adding-a-family.md says how to add one.
No jinja2, optuna or SQLAlchemy: the runtime plans calls through these modules."""

from __future__ import annotations

from attngen import env as _env

_env.setup_interpreter()  # before fwd / bwd import triton

from attngen import spec as _spec  # noqa: E402
from attngen.families import bwd, decode, fwd, fwd_fp8, prefill_paged  # noqa: E402
from attngen.families.base import Family  # noqa: E402

FAMILIES: dict[str, Family] = {m.FAMILY.name: m.FAMILY for m in (fwd, bwd, decode, fwd_fp8, prefill_paged)}
assert set(FAMILIES) == set(_spec.FAMILIES), "spec.FAMILIES and attngen.families disagree"


def family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown kernel family {name!r} (known: {', '.join(FAMILIES)})") from None
