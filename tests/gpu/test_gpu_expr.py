"""Expression kernels on the GPU: every case of tests/kernels/test_expr.py (masks, score
modifications, sinks; odd lengths, GQA, Sq != Sk) against float64 by the flash-attn rule, forward and
backward, with each target's family forced (sm80's pointer kernels, sm90's module), bitwise
reproducible gradients, and the decode kernels' expressions on dense and paged caches."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.test_expr import CASES, DECODE_CASES, _run, decode_case

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]


@pytest.mark.parametrize("target", ["sm80", "sm90"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu_expression_kernels(name, target):
    _run(name, torch.bfloat16 if target == "sm90" else torch.float16, 2, 6, 2, 203, 1023, 64, seed=11,
         target=target, device="cuda")


@pytest.mark.parametrize("name", ["alibi_causal", "t5_bias"])
def test_gpu_expression_gradients_deterministic(name):
    a = _run(name, torch.float16, 1, 4, 2, 1023, 1023, 128, seed=12, target="sm90", device="cuda")
    b = _run(name, torch.float16, 1, 4, 2, 1023, 1023, 128, seed=12, target="sm90", device="cuda")
    for x, y in zip(a[1], b[1]):
        assert torch.equal(x, y), f"{name}: gradients differ between two runs"


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("name", DECODE_CASES)
def test_gpu_expression_decode(name, paged):
    decode_case(name, paged, device="cuda")
