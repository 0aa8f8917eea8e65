"""The score modification's code (attngen/codegen/exprgen.py: score_tile): a modification that
adds to the score is one FMA on the scaled scores with log2(e) folded into the factor that is the
same across the tile; a division by a constant is a multiply. Kernel results: tests/kernels/test_expr.py."""
import pytest

from attngen.codegen import exprgen
from attngen.spec import KernelSpec
from attngen.spec import expr as X

SLOPE = (X.ParamDecl("slope", ("h",), "fp32", False),)
BIAS = (X.ParamDecl("bias", ("h", 8), "fp32", False),)


def _code(score_expr, params=()):
    spec = KernelSpec(family="bwd", dtype="bf16", target="sm90", head_dim_qk=64, head_dim_v=64, gqa_ratio=1,
                      mask="none", score_expr=score_expr, params=params)
    return exprgen.score_tile(spec, "qk2", "qk", derivative=True).splitlines()


@pytest.mark.parametrize("text, params, scaled", [
    ("score - slope[h] * abs(q_idx - kv_idx)", SLOPE, "XP_slope"),   # ALiBi: the slope scaled once
    ("abs(q_idx - kv_idx) * (-slope[h]) + score", SLOPE, "XP_slope"),
    ("score + bias[h, kv_idx % 8]", BIAS, None),                      # a gather: scaled per score
])
def test_an_added_term_is_one_fma(text, params, scaled):
    lines = _code(text, params)
    assert lines[-1].startswith("qk2 = qk * qk_scale + "), lines
    assert not any(ln.startswith("x_score") or "_dmod" in ln for ln in lines), lines
    folded = [ln for ln in lines if "1.4426950408889634" in ln]
    assert len(folded) == 1, lines
    if scaled:  # log2(e) multiplies the loaded slope (a scalar), before any tile is formed
        first_tile = min(i for i, ln in enumerate(lines) if "rows" in ln or "cols" in ln)
        assert lines.index(folded[0]) < first_tile, lines


def test_other_modifications_keep_the_general_form():
    lines = _code("30.0 * tanh(score / 30.0)")
    assert lines[0].startswith("x_score = qk * (qk_scale")
    assert lines[-2].startswith("qk2 = ") and lines[-1].startswith("qk2_dmod = ")
    assert not any(" / 30.0" in ln for ln in lines), lines  # the division by a constant is a multiply
    assert any("* 0.03333333333333333" in ln for ln in lines), lines
