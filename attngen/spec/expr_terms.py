"""What an expression kernel's trees say, without generating code: the parsed mask and score
expressions of a kernel spec, and the learnable occurrences whose gradients the backward's dQ pass
accumulates (attngen.codegen.exprgen generates their code; the runtime and the tuner size their
buffers)."""

from __future__ import annotations

from dataclasses import dataclass

from attngen.spec import expr as X


def _params(spec) -> dict:
    return {p.name: p for p in spec.params}


def mask_node(spec):
    return X.parse(spec.mask_expr, "mask", _params(spec)) if spec.mask_expr else None


def score_node(spec):
    return X.parse(spec.score_expr, "score", _params(spec)) if spec.score_expr else None


@dataclass(frozen=True)
class GradTerm:
    """One learnable occurrence: the parameter, its subscripts' kinds ("b", "h" or "g": a general
    index), the general index's extent (1 when none) and the accumulator's width (a power of two)."""

    index: int
    param: str
    kinds: tuple
    extent: int
    width: int
    node: object


def grad_terms(spec) -> list[GradTerm]:
    node = score_node(spec)
    if node is None:
        return []
    learn = {p.name: p for p in spec.params if p.learnable}
    seen, out = [], []
    for m in X.walk(node):
        if isinstance(m, X.Sub) and m.param in learn and m not in seen:
            seen.append(m)
            kinds = tuple(i.name if isinstance(i, X.Var) and i.name in ("b", "h") else "g" for i in m.idx)
            general = [d for d, k in enumerate(kinds) if k == "g"]
            if len(general) > 1:
                raise ValueError(f"learnable parameter '{m.param}': at most one subscript may be an "
                                 f"expression other than b or h, got {X.to_text(m)}")
            extent = int(learn[m.param].shape[general[0]]) if general else 1
            width = 1 << max(extent - 1, 0).bit_length()
            out.append(GradTerm(len(out), m.param, kinds, extent, width, m))
    return out


def exact_d(spec) -> bool:
    """Whether the dQ pass sums each row's exact D = sum_j P dP (x_da): for sinks (their gradient,
    written to XD) and for learnable occurrences without a general index (their gradient as
    sum P dP w - sum_i D_i sum_j P w, not through the D of the rounded output)."""
    return bool(getattr(spec, "sinks", False)) or any("g" not in t.kinds for t in grad_terms(spec))
