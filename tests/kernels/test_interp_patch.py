"""The documented interpreter patch: Triton 3.6's interpreter gets bf16 dots wrong; the patch
(attngen/interp.py) makes them right. If Triton fixes the bug, the first test tells us to drop it."""

import pytest
import torch
import triton
import triton.language as tl

from attngen import env, interp

pytestmark = pytest.mark.skipif(not env.interpreting(), reason="interpreter only")


@triton.jit
def _dot_kernel(A, B, C, N: tl.constexpr):
    r = tl.arange(0, N)
    a = tl.load(A + r[:, None] * N + r[None, :])
    b = tl.load(B + r[:, None] * N + r[None, :])
    tl.store(C + r[:, None] * N + r[None, :], tl.dot(a, b))


def _run(a, b):
    c = torch.full((16, 16), float("nan"))
    _dot_kernel[(1,)](a, b, c, N=16)
    return c


def test_unpatched_bf16_dot_is_wrong(monkeypatch):
    from triton.runtime import interpreter as ti

    monkeypatch.setattr(ti.InterpreterBuilder, "create_dot", interp.ORIGINAL_CREATE_DOT)
    a, b = torch.randn(16, 16).bfloat16(), torch.randn(16, 16).bfloat16()
    want = a.float() @ b.float()
    assert not torch.allclose(_run(a, b), want, atol=1e-2), \
        "Triton's interpreter now computes bf16 dots right: drop attngen.interp's patch"


def test_patched_bf16_dot_is_right():
    interp.patch_bf16_dot()
    a, b = torch.randn(16, 16).bfloat16(), torch.randn(16, 16).bfloat16()
    torch.testing.assert_close(_run(a, b), a.float() @ b.float(), atol=1e-5, rtol=1e-5)
    a16, b16 = a.half(), b.half()  # the patch leaves other dtypes alone
    torch.testing.assert_close(_run(a16, b16), a16.float() @ b16.float(), atol=1e-2, rtol=1e-3)
