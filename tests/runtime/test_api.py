"""attngen.attention / attention_varlen: argument errors, layouts, strides, LSE, on-demand
rendering, and the built-kernel path without jinja2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import attngen
from attngen.kernels.common import MAX_SEQLEN, UNBOUNDED, mask_kind
from attngen.runtime import validate
from attngen.problem import attention_ref, random_inputs
from attngen.testing import assert_flash_rule, check_grads

ROOT = Path(__file__).resolve().parents[2]


def qkv(b=2, hq=4, hkv=2, sq=33, sk=47, d=64, dtype=torch.float16, seed=0):
    return random_inputs((b, hq, sq, d), (b, hkv, sk, d), (b, hkv, sk, d), dtype=dtype, seed=seed)


@pytest.mark.parametrize("mutate,arg,text", [
    (lambda q, k, v: (q.float(), k, v), "q", "unsupported dtype"),
    (lambda q, k, v: (q, k.bfloat16(), v), "k", "dtype"),
    (lambda q, k, v: (q, k, v[:, :, :5]), "v", "sequence length"),
    (lambda q, k, v: (q[:, :3], k, v), "q", "not a multiple"),
    (lambda q, k, v: (q, k[..., :32], v), "k", "head dim"),
    (lambda q, k, v: (q[0], k, v), "q", "expected 4 dims"),
    (lambda q, k, v: (q, k[:1], v[:1]), "k, v", "batch"),
    (lambda q, k, v: (torch.randn(2, 4, 33, 264).half(), torch.randn(2, 2, 47, 264).half(),
                      torch.randn(2, 2, 47, 264).half()), "q", "above the supported maximum 256"),
    (lambda q, k, v: (q, k, "v"), "v", "expected a torch.Tensor"),
    (lambda q, k, v: (q, k, v.to("meta")), "v", "on meta"),
])
def test_bad_tensors_name_the_argument(mutate, arg, text):
    q, k, v = mutate(*qkv())
    with pytest.raises(ValueError) as exc:
        attngen.attention(q, k, v)
    msg = str(exc.value)
    assert msg.startswith(f"{arg}:") and text in msg, msg


@pytest.mark.parametrize("kw,arg", [
    (dict(window_size=(3,)), "window_size"), (dict(window_size=(-2, 0)), "window_size"),
    (dict(softcap=-1.0), "softcap"), (dict(scale=0.0), "scale"), (dict(layout="sbhd"), "layout"),
    (dict(causal_alignment="middle"), "causal_alignment"),
])
def test_bad_options_name_the_argument(kw, arg):
    with pytest.raises(ValueError, match=f"^{arg}:"):
        attngen.attention(*qkv(), **kw)


def test_bshd_layout_strides_and_lse():
    q, k, v = qkv(sq=45, sk=45, dtype=torch.bfloat16)
    out, lse = attngen.attention(q, k, v, causal=True, return_lse=True)
    assert out.shape == q.shape and lse.shape == q.shape[:3] and lse.dtype == torch.float32
    ref, ref_lse = attention_ref(q, k, v, causal=True)
    pt, _ = attention_ref(q, k, v, causal=True, upcast=False)
    assert_flash_rule("bhsd", out, ref, pt, 2.0)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-4, rtol=1e-4)
    # bshd: (B, S, H, D) tensors, non-contiguous views included
    out2 = attngen.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True,
                             layout="bshd")
    assert out2.shape == (2, 45, 4, 64)
    torch.testing.assert_close(out2.transpose(1, 2), out, atol=0, rtol=0)
    # a strided (every other row) query tensor
    big = torch.randn(2, 4, 90, 64).to(q.dtype)
    big[:, :, ::2] = q
    qs = big[:, :, ::2]
    assert not qs.is_contiguous()
    out3 = attngen.attention(qs, k, v, causal=True)
    torch.testing.assert_close(out3, out, atol=0, rtol=0)


def test_top_left_alignment_and_scale():
    q, k, v = qkv(sq=20, sk=50)
    out = attngen.attention(q, k, v, causal=True, causal_alignment="top_left", scale=0.3)
    ref, _ = attention_ref(q, k, v, causal=True, top_left=True, scale=0.3)
    pt, _ = attention_ref(q, k, v, causal=True, top_left=True, scale=0.3, upcast=False)
    assert_flash_rule("top_left", out, ref, pt, 2.0)
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        q.double(), k.double().repeat_interleave(2, 1), v.double().repeat_interleave(2, 1),
        is_causal=True, scale=0.3)
    assert (out.double() - sdpa).abs().max() < 5e-3, "top_left differs from SDPA's is_causal"


def test_on_demand_render_into_cache(tmp_path, monkeypatch):
    """A kernel nobody built (hd 48, GQA 3) renders into the cache and runs."""
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path))
    q, k, v = qkv(hq=3, hkv=1, d=48, sq=17, sk=30)
    out = attngen.attention(q, k, v)
    files = list((tmp_path / "kernels").glob("attn_fwd_fp16_hd48_gqa3_full_sm80_*.py"))
    assert len(files) == 1, list(tmp_path.rglob("*"))
    ref, _ = attention_ref(q, k, v)
    pt, _ = attention_ref(q, k, v, upcast=False)
    assert_flash_rule("cache", out, ref, pt, 2.0)


def test_built_kernel_needs_no_jinja2():
    """The shipped llama kernel loads and runs with jinja2 made unimportable."""
    code = (
        "import sys; sys.modules['jinja2'] = None\n"
        "import torch, attngen\n"
        "q = torch.randn(1, 4, 9, 128).half(); k = torch.randn(1, 1, 9, 128).half()\n"
        "o = attngen.attention(q, k, k, causal=True)\n"
        "assert torch.isfinite(o).all()\n"
        "assert 'attngen.codegen.render' not in sys.modules\n"
        "print('ok')\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT), ATTNGEN_CACHE_DIR="/nonexistent/attngen-cache")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-2000:]


def test_backward_gqa_through_api():
    q, k, v = qkv(hq=4, hkv=1, sq=21, sk=37)
    for t in (q, k, v):
        t.requires_grad_(True)
    out = attngen.attention(q, k, v, causal=True, deterministic=True)
    dout, = random_inputs(out.shape, dtype=out.dtype, seed=9)
    g = torch.autograd.grad(out, (q, k, v), dout)
    for t, r in zip(g, (q, k, v)):
        assert t.shape == r.shape
    check_grads("gqa", lambda *t, upcast: attention_ref(*t, causal=True, upcast=upcast)[0],
                (q, k, v), dout, g)


def test_backward_gets_no_zero_filled_gradient_of_lse():
    """lse is not differentiable: the eager Function asks the engine not to materialize its
    gradient (a zero-filled (B, H, Sq) tensor and a fill each backward, 15-20 us of host time on
    the H200, benchmarks/ab/h200_ab_bwd_host_2026-12-04.json); an undefined dout gives no gradient."""
    from torch.profiler import ProfilerActivity, profile

    from attngen.runtime.public import _EagerAttention

    q, k, v = qkv(hq=2, hkv=2, sq=17, sk=17)
    for t in (q, k, v):
        t.requires_grad_(True)
    out, lse = attngen.attention(q, k, v, return_lse=True)
    dout, = random_inputs(out.shape, dtype=out.dtype, seed=3)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        torch.autograd.grad(out, (q, k, v), dout)
    fills = [e.name for e in prof.events()
             if e.name in ("aten::zero_", "aten::fill_", "aten::zeros", "aten::zeros_like")
             and list(lse.shape) in (e.input_shapes or [])]
    assert fills == [], fills
    assert _EagerAttention.backward(object(), None, None) == (None,) * 9


@pytest.mark.parametrize("cu_q,arg,text", [
    (torch.tensor([0, 5, 10], dtype=torch.int64), "cu_seqlens_q", "int32"),
    (torch.tensor([1, 5, 10], dtype=torch.int32), "cu_seqlens_q", "start at 0"),
    (torch.tensor([0, 5, 9], dtype=torch.int32), "cu_seqlens_q", "end at the packed length 10"),
    (torch.tensor([0, 11, 10], dtype=torch.int32), "cu_seqlens_q", "non-decreasing"),
    (torch.tensor([[0, 10]], dtype=torch.int32), "cu_seqlens_q", "1-D"),
    (torch.tensor([0, 2, 4, 10], dtype=torch.int32), "cu_seqlens_k", "documents"),
])
def test_varlen_bad_cu_seqlens(cu_q, arg, text):
    q = torch.randn(10, 2, 32).half()
    k = torch.randn(10, 2, 32).half()
    cu_k = torch.tensor([0, 4, 10], dtype=torch.int32)
    with pytest.raises(ValueError) as exc:
        attngen.attention_varlen(q, k, k, cu_q, cu_k, 10, 10)
    assert str(exc.value).startswith(f"{arg}:") and text in str(exc.value), str(exc.value)


def test_varlen_max_seqlen_checked():
    q = torch.randn(10, 2, 32).half()
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    with pytest.raises(ValueError, match="^max_seqlen_q: 5 is below the longest document"):
        attngen.attention_varlen(q, q, q, cu, cu, 5, 6)


def test_varlen_check_repeats_after_in_place_change():
    """Validated cu_seqlens are not re-read on every call, but an in-place edit is caught."""
    q = torch.randn(10, 2, 32).half()
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    attngen.attention_varlen(q, q, q, cu, cu, 6, 6)
    attngen.attention_varlen(q, q, q, cu, cu, 6, 6)
    cu[1] = 11
    with pytest.raises(ValueError, match="^cu_seqlens_q: must be non-decreasing"):
        attngen.attention_varlen(q, q, q, cu, cu, 6, 6)


@pytest.mark.parametrize("arg, shapes", [
    ("q", [(1, 1, MAX_SEQLEN + 1, 8), (1, 1, 16, 8), (1, 1, 16, 8)]),
    ("k", [(1, 1, 16, 8), (1, 1, MAX_SEQLEN + 1, 8), (1, 1, MAX_SEQLEN + 1, 8)]),
])
def test_sequence_past_the_int32_mask_bounds_is_a_clear_error(arg, shapes):
    """Longer than 2^30 - 1024 tokens, the kernels' int32 mask bounds (row + diagonal + window)
    could wrap: the call stops before any allocation or launch (meta tensors: no memory)."""
    q, k, v = (torch.empty(s, dtype=torch.float16, device="meta") for s in shapes)
    with pytest.raises(ValueError, match=rf"^{arg}: sequence length {MAX_SEQLEN + 1} is above"):
        attngen.attention(q, k, v, causal=True)
    ok = [(1, 1, min(s[2], MAX_SEQLEN), 8) for s in shapes]
    validate.check_dense(*(torch.empty(s, dtype=torch.float16, device="meta") for s in ok), "bhsd")


def test_varlen_document_past_the_int32_mask_bounds_is_a_clear_error():
    q, k, v = (torch.empty(16, 1, 8, dtype=torch.float16) for _ in range(3))
    cu = torch.tensor([0, 16], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^max_seqlen_k: \d+ is above the kernels' longest document"):
        attngen.attention_varlen(q, k, v, cu, cu, 16, MAX_SEQLEN + 1)


def test_window_wider_than_any_sequence_is_unbounded():
    """A window side past 2^30 keys means no limit there (int32-safe mask bounds)."""
    assert mask_kind(False, (1 << 40, 5)) == ("sliding_window", UNBOUNDED, 5)
    q, k, v = random_inputs((1, 2, 37, 16), (1, 2, 37, 16), (1, 2, 37, 16), dtype=torch.float16, seed=3)
    wide = attngen.attention(q, k, v, window_size=(1 << 40, 4))
    assert torch.equal(wide, attngen.attention(q, k, v, window_size=(-1, 4)))
