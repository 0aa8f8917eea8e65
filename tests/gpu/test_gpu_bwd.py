"""Backward of `attngen.attention` at GPU sizes: dQ, dK, dV against float64 autograd of the
reference (float64 leaves, so the reference gradients are not rounded to the input dtype), with the
flash-attn gradient rule max|g - g64| <= 3 * max|g_torch - g64| + 1e-5, g_torch from plain PyTorch
in the inputs' precision."""

from __future__ import annotations

import time

import pytest
import torch

import attngen
from attngen.testing import attention_ref, check_grads

from .common import BF16, FP16, Shape, make_inputs

pytestmark = pytest.mark.gpu

FACTOR, ATOL = 3.0, 1e-5  # as the CPU backward tests (tests/kernels/test_bwd.py)
GRADS = ("dq", "dk", "dv")

# Sizes up to 4096 x 4096: the float64 autograd graph holds a few (B, Hq, Sq, Sk) tensors.
CASES = [
    Shape(BF16, 1, 8, 2, 4096, 4096, 128, causal=True),
    Shape(FP16, 1, 8, 8, 1023, 4096, 64),
    Shape(BF16, 1, 8, 2, 4096, 4096, 128, causal=True, window=(1023, 0)),
    Shape(FP16, 1, 8, 4, 4096, 1023, 256, causal=True, softcap=30.0, q_mult=4.0),
    Shape(BF16, 2, 8, 8, 1023, 1023, 80),
]


@pytest.mark.parametrize("c", CASES, ids=lambda c: c.id)
def test_backward_matches_float64_reference(c: Shape, gpu_records):
    t0 = time.perf_counter()
    q, k, v, dout = make_inputs(c, salt="bwd")
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = attngen.attention(*leaves, **c.mask_kwargs)
    assert out.requires_grad, "attngen.attention returned an output without a gradient"
    rec = c.record("bwd", passed=False, error=None)
    gpu_records.append(rec)
    try:
        grads = torch.autograd.grad(out, leaves, dout)
        torch.cuda.synchronize()
    except Exception as exc:
        rec.update(error=f"{type(exc).__name__}: {exc}"[:500],
                   seconds=round(time.perf_counter() - t0, 2))
        raise

    try:
        errs = check_grads(c.id, lambda *t, upcast: attention_ref(*t, upcast=upcast, **c.mask_kwargs)[0],
                           (q, k, v), dout, grads, FACTOR, ATOL)
    finally:
        rec.update(seconds=round(time.perf_counter() - t0, 2))
    rec.update(err={n: e for n, (e, _) in errs.items()},
               torch_err={n: pe for n, (_, pe) in errs.items()},
               ratio_to_torch=max((e / pe if pe > 0 else 0.0) for e, pe in errs.values()))
    rec["passed"] = True
