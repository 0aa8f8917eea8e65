"""The documented interpreter patch: Triton 3.6's interpreter gets bf16 dots wrong and has no
tensor-descriptor reduce; the patch (attngen/interp.py) makes the dots right and adds the reduce.
If Triton fixes the dot bug, the first test tells us to drop that part."""

import dataclasses

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
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(16, 16, generator=g).bfloat16(), torch.randn(16, 16, generator=g).bfloat16()
    want = a.float() @ b.float()
    assert not torch.allclose(_run(a, b), want, atol=1e-2), \
        "Triton's interpreter now computes bf16 dots right: drop attngen.interp's patch"


def test_patched_bf16_dot_is_right():
    interp.patch_interpreter()
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(16, 16, generator=g).bfloat16(), torch.randn(16, 16, generator=g).bfloat16()
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
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(3))
    _reduce_add[(3,)](TensorDescriptor(acc, [20, 32], [32, 1], [16, 32]), x, 16, 32)
    torch.testing.assert_close(acc[12:], 1.0 + 3 * x[:8])
    assert (acc[:12] == 1.0).all()


@triton.jit
def _to_e4m3_kernel(X, Y, N: tl.constexpr):
    r = tl.arange(0, N)
    tl.store(Y + r, tl.load(X + r).to(tl.float8e4nv))


def _e4m3(x):
    y = torch.empty(x.numel(), dtype=torch.float8_e4m3fn)
    _to_e4m3_kernel[(1,)](x, y, N=x.numel())
    return y.float()


# 1.95 and 100 round up past their mantissa's last value (carry into the exponent); 1.0625 and
# 1.1875 are ties (nearest even: 1.0 and 1.25); 500 and -1e4 saturate at 448; 0.0013 is subnormal
E4M3_CASES = torch.tensor([1.95, 100.0, 1.0625, 1.1875, 500.0, -1e4, 0.0013, -3.3, 0.0, 448.0, 240.0,
                           17.0, -0.3, 2.0 ** -10, 1e-3, 7.5])


def test_unpatched_fp8_downcast_is_wrong(monkeypatch):
    from triton.runtime import interpreter as ti

    interp.patch_interpreter()
    monkeypatch.setattr(ti.InterpreterBuilder, "create_fp_to_fp", interp.ORIGINAL_FP_TO_FP)
    got = _e4m3(E4M3_CASES)
    assert got[0] == 1.0 and got[1] == 104.0, \
        f"Triton's interpreter now rounds fp32 -> e4m3 differently ({got[:2].tolist()}): recheck attngen.interp's patch"


def test_patched_fp8_downcast_rounds_to_nearest_even_and_saturates():
    interp.patch_interpreter()
    got = _e4m3(E4M3_CASES)
    want = E4M3_CASES.clamp(-448, 448).to(torch.float8_e4m3fn).float()
    assert torch.equal(got, want), (got, want)
    assert got[:6].tolist() == [2.0, 96.0, 1.0, 1.25, 448.0, -448.0]
    x = torch.randn(4096, generator=torch.Generator().manual_seed(2)) * torch.logspace(-3, 3, 4096)  # every exponent
    assert torch.equal(_e4m3(x), x.clamp(-448, 448).to(torch.float8_e4m3fn).float())
    xh = x.clamp(-60000, 60000).half()  # an fp16 source takes the same path
    assert torch.equal(_e4m3(xh), xh.float().clamp(-448, 448).to(torch.float8_e4m3fn).float())


@triton.jit
def _scaled(x, s):
    return x * s


@triton.jit
def _helper_kernel(X, Y, N: tl.constexpr):
    r = tl.arange(0, N)
    x = tl.load(X + r)
    for i in range(4):  # a helper called on every iteration of every program
        x = _scaled(x, 2.0)
    tl.store(Y + r, tl.maximum(x, 0.0) + tl.sum(x, axis=0))  # tl.sum: a helper of Triton's own


def test_helpers_inside_a_launch_do_not_repatch_the_language(monkeypatch):
    """The speed change of attngen.interp: a helper called inside a launch skips the interpreter's
    re-patching of triton.language once the launch has patched what the helper sees (a launch:
    one patch of the kernel's modules, one for Triton's standard library, not one per helper
    call); the values are the unpatched interpreter's, and the launch leaves the language as it
    found it."""
    from triton.runtime import interpreter as ti

    interp.patch_interpreter()
    calls = []
    real = ti._patch_lang
    monkeypatch.setattr(ti, "_patch_lang", lambda fn: calls.append(fn.__name__) or real(fn))
    arange = tl.arange
    x = torch.randn(16, generator=torch.Generator().manual_seed(3))
    y = torch.full((16,), float("nan"))
    _helper_kernel[(3,)](x, y, N=16)
    z = x * 16
    torch.testing.assert_close(y, z.clamp(min=0) + z.sum(), rtol=1e-6, atol=1e-5)
    assert calls.count("_scaled") == 0 and calls.count("_helper_kernel") == 1, calls
    assert len(calls) <= 2, calls  # the kernel's, and at most one for the standard library's modules
    assert tl.arange is arange  # restored after the launch
    calls.clear()
    monkeypatch.setattr(ti.InterpretedFunction, "__call__", interp.ORIGINAL_HELPER_CALL)
    y2 = torch.full((16,), float("nan"))
    _helper_kernel[(3,)](x, y2, N=16)
    assert torch.equal(y, y2)  # the interpreter's own path: the same values
    assert calls.count("_scaled") == 12, calls  # 4 calls x 3 programs, each one re-patching


@triton.jit
def _int_kernel(X, Y, N: tl.constexpr):
    r = tl.arange(0, N)
    x = tl.load(X + r)
    tl.store(Y + r, x * 65536 + r * 3 - 7)  # int32 operands: the overflow check's operations


def test_overflow_check_runs_only_in_debug_mode(monkeypatch):
    """The third speed change of attngen.interp: outside debug mode the interpreter's int32
    overflow check (an int64 recomputation whose condition device_assert drops) is skipped, with
    the same values as the interpreter's own path, which does that work (its int64 casts counted);
    in debug mode the check still runs and catches an overflow."""
    from triton.runtime import interpreter as ti

    interp.patch_interpreter()
    casts = []
    real_cast = ti.InterpreterBuilder.create_int_cast
    monkeypatch.setattr(ti.InterpreterBuilder, "create_int_cast",
                        lambda self, *a: casts.append(1) or real_cast(self, *a))
    x = torch.randint(-30000, 30000, (16,), dtype=torch.int32, generator=torch.Generator().manual_seed(5))
    x[0] = 40000  # 40000 * 65536 passes 2**31: wraps, as the GPU's int32 multiply does
    y = torch.full((16,), -1, dtype=torch.int32)
    _int_kernel[(2,)](x, y, N=16)
    assert casts == [], "the overflow check ran outside debug mode"
    want = (x.long() * 65536 + torch.arange(16) * 3 - 7 + 2**31) % 2**32 - 2**31
    assert torch.equal(y.long(), want)
    semantic = type(ti.interpreter_semantic)
    monkeypatch.setattr(semantic, "binary_op_sanitize_overflow_impl", interp.ORIGINAL_OVERFLOW_CHECK)
    y2 = torch.full((16,), -1, dtype=torch.int32)
    _int_kernel[(2,)](x, y2, N=16)
    assert torch.equal(y, y2) and casts, "the interpreter's own path: the same values, its casts done"
    monkeypatch.undo()
    interp.patch_interpreter()
    monkeypatch.setattr(ti.interpreter_builder, "options", dataclasses.replace(ti.interpreter_builder.options,
                                                                              debug=True))
    with pytest.raises(Exception, match="overflow"):
        _int_kernel[(2,)](x, torch.full((16,), -1, dtype=torch.int32), N=16)


def _attrs(obj, names):
    out = {}
    for n in names:
        v = getattr(obj, n)
        if isinstance(v, tl.tuple):
            v = (type(v), [(type(x), getattr(x, "value", x)) for x in v.values], v.type.types, v.type.fields,
                 v.type.name, str(v))
        elif isinstance(v, tl.constexpr):
            v = (type(v), v.value)
        out[n] = v
    return out


def test_shape_cache_builds_what_triton_builds(monkeypatch):
    """The fourth speed change of attngen.interp: block types and tensors of an integer shape seen
    before come from a cache. Every attribute (shape values and their types, the shape tuple's type
    and name, numel, name) equals what Triton's own constructors give, on the first construction
    and on cached ones; each object gets its own shape list; shapes Triton refuses raise Triton's
    errors every time; other shapes (constexpr entries, a triton tuple) take the same values."""
    core = tl.core
    interp.patch_interpreter()
    assert core.block_type.__init__ is not interp.ORIGINAL_BLOCK_TYPE_INIT
    shapes = [[16, 32], [tl.constexpr(16), 32], [1], [64, 1, 8], tl.tuple([16, 32]),
              tl.tuple([tl.constexpr(2), tl.constexpr(128)]), [True, 2]]
    elts = [tl.float32, tl.bfloat16, tl.pointer_type(tl.float16), tl.int1]

    def build():
        out = []
        for shape in shapes:
            for elt in elts:
                for _ in range(2):  # the second one comes from the cache
                    bt = core.block_type(elt, shape)
                    t = core.tensor(None, bt)
                    out.append((_attrs(bt, ("element_ty", "shape", "numel", "name")),
                                _attrs(t, ("shape", "numel", "type", "dtype")), str(bt), str(t)))
        scalar = core.tensor(None, tl.float32)
        out.append(_attrs(scalar, ("shape", "numel", "dtype")))
        return out

    fast = build()
    a, b = core.block_type(tl.float32, [16, 32]), core.block_type(tl.float32, [16, 32])
    assert a.shape is not b.shape and a.shape.values is not b.shape.values and a == b
    for bad, err in (([], TypeError), ([3, 16], ValueError), ([1 << 21], ValueError),
                     ((16, 32), AssertionError)):
        for _ in range(2):
            with pytest.raises(err):
                core.block_type(tl.float32, bad)
    monkeypatch.setattr(core.block_type, "__init__", interp.ORIGINAL_BLOCK_TYPE_INIT)
    monkeypatch.setattr(core.tensor, "__init__", interp.ORIGINAL_TENSOR_INIT)
    assert build() == fast
