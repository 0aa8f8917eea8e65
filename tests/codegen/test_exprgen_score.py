"""The score modification's code (attngen/codegen/exprgen.py: score_tile): a modification that
adds to the score is one FMA on the scaled scores with log2(e) folded into the factor that is the
same across the tile; a division by a constant is a multiply. Kernel results: tests/kernels/test_expr.py."""
import pytest
import torch

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


# ---------------------------------------------------------------------------------------------
# an added term of a query part and a key part (ALiBi under causal): the two taken apart as
# vectors around a key index near the tile, so that the tile costs an add and an FMA a score


class _Ptr:
    def __init__(self, t, off=0):
        self.t, self.off = t, off

    def __add__(self, o):
        return _Ptr(self.t, self.off + int(o))


class _TL:
    """The few tl calls the fragments make, on torch tensors (the statements run eagerly)."""
    float32 = torch.float32
    load = staticmethod(lambda p: p.t[p.off])
    abs = staticmethod(torch.abs)
    minimum = staticmethod(lambda a, b: a if a < b else b)
    maximum = staticmethod(lambda a, b: a if a > b else b)


def _alibi(mask_expr="kv_idx <= q_idx", score="score - slope[h] * abs(q_idx - kv_idx)"):
    return KernelSpec(family="bwd", dtype="bf16", target="sm90", head_dim_qk=64, head_dim_v=64, gqa_ratio=1,
                      mask="none", mask_expr=mask_expr, score_expr=score, params=SLOPE)


def _run(code, rows, cols, slope, lse=None, out="s"):
    env = {"tl": _TL, "rows": rows, "cols": cols, "diag_offset": 0, "x_h": 1, "qk_scale": 0.125 * 1.4426950408889634,
           "qk": torch.zeros(len(rows), len(cols)), "XP_slope": _Ptr(slope), "xp_slope_n0": len(slope),
           "xp_slope_s0": 1, "lse": lse}
    exec(code, env)
    return env[out]


@pytest.mark.parametrize("base", [0, 40_000, 1_000_000])
def test_the_separated_term_is_as_exact_as_the_tile_form_far_from_the_start(base):
    """qk = 0, so the result is the log2-scaled ALiBi term alone; against float64 on kept pairs
    (kv <= q) of a diagonal tile and of a tile far below it, at positions up to 1M: within a few
    ulps of the larger of the term and the slope over the block, as the tile form."""
    spec = _alibi()
    slope = torch.tensor([0.5, 0.70710678], dtype=torch.float32)
    k = float(slope[1]) * 1.4426950408889634
    for q0, k0 in ((base, base), (base + 5000, base)):
        rows = torch.arange(q0, q0 + 128, dtype=torch.int32)
        cols = torch.arange(k0, k0 + 64, dtype=torch.int32)
        want = -k * (rows[:, None].double() - cols[None, :].double())
        kept = cols[None, :] <= rows[:, None]
        new = _run(exprgen.score_tile(spec, "s", "qk", ref=str(k0)), rows, cols, slope)
        err = ((new.double() - want).abs() / (want.abs() + k * 64))[kept].max().item()
        assert err < 4 * 2.0 ** -24, (q0, k0, err)


def test_the_separation_folds_the_logsumexp_and_takes_the_transposed_tile():
    spec = _alibi()
    slope = torch.tensor([0.25, 0.125], dtype=torch.float32)
    rows = torch.arange(300, 364, dtype=torch.int32)
    cols = torch.arange(256, 320, dtype=torch.int32)
    lse = torch.randn(64)
    code = exprgen.score_tile(spec, "sT", "qkT", transposed=True, ref="256", minus="lse")
    assert "tl.abs" not in code
    assert code.splitlines()[-1] == "sT = (qkT * qk_scale + x_sT_qv[None, :]) + x_sT_kv[:, None]", code
    got = _run(code.replace("qkT", "qk"), rows, cols, slope, lse=lse, out="sT")
    want = -0.125 * 1.4426950408889634 * (rows[None, :].double() - cols[:, None].double()) - lse.double()[None, :]
    kept = cols[:, None] <= rows[None, :]
    assert torch.allclose(got.double()[kept], want[kept], rtol=0, atol=1e-4)


@pytest.mark.parametrize("mask, score, sep", [
    ("kv_idx <= q_idx", "score - slope[h] * abs(q_idx - kv_idx)", True),
    ("q_idx <= kv_idx", "score - slope[h] * abs(q_idx - kv_idx)", True),      # anti-causal: kv - q
    ("q_idx - kv_idx < 64", "score - slope[h] * abs(q_idx - kv_idx)", False),  # no order: |.| stays
    ("kv_idx <= q_idx", "score - slope[h] * abs(q_idx - kv_idx) * abs(q_idx - kv_idx)", False),  # a product
])
def test_abs_goes_only_where_the_mask_orders_its_operands(mask, score, sep):
    """Every kept pair evaluates as the expression does in float64; the absolute value is dropped
    only where the mask's conjunction orders q_idx and kv_idx, and only a sum of a query part and a
    key part is taken apart."""
    spec = _alibi(mask, score)
    code = exprgen.score_tile(spec, "s", "qk", ref="96")
    assert ("x_s_kv" in code) == sep and ("tl.abs" not in code) == (sep or "q_idx <= kv_idx" in mask or
                                                                   "kv_idx <= q_idx" in mask), code
    slope = torch.tensor([0.5, 0.3], dtype=torch.float32)
    rows = torch.arange(64, 192, dtype=torch.int32)
    cols = torch.arange(96, 160, dtype=torch.int32)
    got = _run(code, rows, cols, slope).double()
    q, c = rows[:, None].double(), cols[None, :].double()
    d = (q - c).abs()
    want = -0.3 * 1.4426950408889634 * (d * d if score.count("abs") == 2 else d)
    kept = {"kv_idx <= q_idx": c <= q, "q_idx <= kv_idx": q <= c, "q_idx - kv_idx < 64": q - c < 64}[mask]
    assert torch.allclose(got[kept], want[kept], rtol=1e-6, atol=1e-5)
