"""The documented interpreter patch: Triton 3.6's interpreter gets bf16 dots wrong and has no
tensor-descriptor reduce; the patch (attngen/interp.py) makes the dots right and adds the reduce.
If Triton fixes the dot bug, the first test tells us to drop that part."""

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
    interp.patch_interpreter()
    a, b = torch.randn(16, 16).bfloat16(), torch.randn(16, 16).bfloat16()
    torch.testing.assert_close(_run(a, b), a.float() @ b.float(), atol=1e-5, rtol=1e-5)
    a16, b16 = a.half(), b.half()  # the patch leaves other dtypes alone
    torch.testing.assert_close(_run(a16, b16), a16.float() @ b16.float(), atol=1e-2, rtol=1e-3)


@triton.jit
def _reduce_add(desc, X, ROWS: tl.constexpr, COLS: tl.constexpr):
    x = tl.load(X + tl.arange(0, ROWS)[:, None] * COLS + tl.arange(0, COLS)[None, :])
    desc.atomic_add([tl.program_id(0) * 0 + 12, 0], x)  # rows 12..27 of a 20-row tensor


def test_patched_descriptor_reduce_adds_and_clips():
    """The added descriptor reduce: every program's block is added (three programs: 3x), and the
    rows past the tensor's end are clipped, as the copy engine does."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    interp.patch_interpreter()
    acc = torch.full((20, 32), 1.0)
    x = torch.randn(16, 32)
    _reduce_add[(3,)](TensorDescriptor(acc, [20, 32], [32, 1], [16, 32]), x, 16, 32)
    torch.testing.assert_close(acc[12:], 1.0 + 3 * x[:8])
    assert (acc[:12] == 1.0).all()
