"""The golden bound catches real kernel changes: generated kernels with small deliberate
perturbations must fail the golden check that the unperturbed kernels pass (tests/kernels/test_fwd.py
and test_bwd.py run those with the same inputs)."""

from __future__ import annotations

import pytest

from attngen.runtime.loader import load_path
from tests.kernels import golden
from tests.kernels.cases import built_kernels, cases_for
from tests.kernels.test_bwd import KERNELS as BWD_KERNELS
from tests.kernels.test_bwd import run_bwd
from tests.kernels.test_fwd import run_case

FWD_KERNELS = built_kernels("fwd", varlen=False)


def _pick(kernels, uri_part):
    return next((s, p) for s, p in kernels if uri_part in s.uri)


def _perturbed(path, tmp_path, old, new):
    src = path.read_text()
    assert src.count(old) >= 1, f"{path.name}: {old!r} not found (the template changed: update this test)"
    out = tmp_path / f"{path.stem}_perturbed.py"
    out.write_text(src.replace(old, new))
    return out


@pytest.mark.parametrize("old,new", [
    # a softmax scale 0.2 % off
    ("p = tl.math.exp2(qk * qk_scale - m_use", "p = tl.math.exp2(qk * (qk_scale * 1.002) - m_use"),
    # the diagonal key dropped from the causal mask
    ("(diag_offset + window_right)", "(diag_offset + window_right - 1)"),
], ids=["scale", "diagonal"])
def test_perturbed_forward_fails_golden(old, new, tmp_path):
    spec, path = _pick(FWD_KERNELS, "fwd_fp16_hd128_gqa4_causal")
    case = cases_for(spec)[0]
    bad = _perturbed(path, tmp_path, old, new)
    *_, out, lse, _ = run_case(spec, bad, case, seed=1000)  # test_fwd's seed for case 0
    with pytest.raises(AssertionError, match="differs from the golden output"):
        golden.check("fwd", spec.uri, case.name, {"out": out, "lse": lse}, {"out": 0.0, "lse": 0.0})


def test_perturbed_backward_fails_golden(tmp_path):
    spec, path = _pick(BWD_KERNELS, "bwd_fp16_hd128_gqa4_causal")
    case = cases_for(spec)[0]
    bad = _perturbed(path, tmp_path, "dk = dk * ds_scale", "dk = dk * (ds_scale * 1.002)")
    load_path(bad)
    *_, grads = run_bwd(spec, bad, case, 2000, deterministic=False)  # test_bwd's seed for case 0
    with pytest.raises(AssertionError, match="dk: differs from the golden output"):
        golden.check("bwd", spec.uri, case.name, dict(zip(("dq", "dk", "dv"), grads)),
                     {"dq": 0.0, "dk": 0.0, "dv": 0.0})
