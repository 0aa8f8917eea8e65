"""attngen.flash_attn_interface (flash-attn 2's functions) through the interpreter, in the manner of
flash-attn's own tests: odd lengths with Sq != Sk, several head dims, MHA / GQA / MQA, causal,
sliding windows, softcap, ALiBi with both slope shapes (against a float64 reference with flash-attn's
bias -slope * |i + Sk - Sq - j| written out), the packed functions against the unpacked ones, packed
documents, the KV cache (new tokens appended, an int cache_seqlens, flash-attn's causal=False
default), deterministic gradients, FlashAttention-3's fp8 descales and every argument that is an
error. Each output is checked by the flash-attn rule (2x a same-precision PyTorch implementation's
error against float64; gradients 3x); the LSE against float64. The case functions take a device and
shapes so tests/gpu/test_gpu_flash_attn_interface.py runs them on a GPU."""

from __future__ import annotations

import pytest
import torch

import attngen
from attngen import flash_attn_interface as fa
from attngen.problem import attention_ref, random_inputs
from attngen.runtime import public
from attngen.testing import assert_flash_rule, assert_lse_close, check_grads

F16, BF16, E4M3 = torch.float16, torch.bfloat16, torch.float8_e4m3fn


def alibi_bias(slopes, sq: int, sk: int, batch: int):
    """flash-attn's ALiBi bias (B, H, Sq, Sk) in float64: -slope * |i + Sk - Sq - j|."""
    i = torch.arange(sq, dtype=torch.float64, device=slopes.device)[:, None]
    j = torch.arange(sk, dtype=torch.float64, device=slopes.device)[None, :]
    s = slopes.double().expand(batch, slopes.shape[-1]) if slopes.dim() == 2 else slopes.double()[None]
    return -s[:, :, None, None] * (i + sk - sq - j).abs()


def ref_bshd(q, k, v, upcast=True, bias=None, **kw):
    """attngen.problem.attention_ref on (B, S, H, D) tensors: (out (B, Sq, H, D), lse (B, H, Sq))."""
    out, lse = attention_ref(*(t.transpose(1, 2) for t in (q, k, v)), upcast=upcast, bias=bias, **kw)
    return out.transpose(1, 2), lse


def ref_varlen(q, k, v, cu_q, cu_k, upcast=True, slopes=None, **kw):
    """Each packed document through attention_ref (its own lengths, its own ALiBi row)."""
    outs, lses = [], []
    bq, bk = cu_q.tolist(), cu_k.tolist()
    for d in range(len(bq) - 1):
        doc = [t[a:e].transpose(0, 1)[None] for t, a, e in ((q, bq[d], bq[d + 1]), (k, bk[d], bk[d + 1]),
                                                            (v, bk[d], bk[d + 1]))]
        sq, sk = bq[d + 1] - bq[d], bk[d + 1] - bk[d]
        bias = None
        if slopes is not None:
            bias = alibi_bias(slopes[d] if slopes.dim() == 2 else slopes, sq, sk, 1)
        o, lse = attention_ref(*doc, upcast=upcast, bias=bias, **kw)
        outs.append(o[0].transpose(0, 1))
        lses.append(lse[0])
    return torch.cat(outs), torch.cat(lses, dim=1)


def check_dense(B, Sq, Sk, Hq, Hkv, D, dtype, causal=False, window=(-1, -1), softcap=0.0, slopes=None, seed=0,
                device="cpu", grads=True):
    """flash_attn_func against float64: out, softmax_lse (B, H, Sq), S_dmask empty, and the gradients."""
    mults = (3.0, 1.0, 1.0, 1.0) if softcap else None  # softcapped scores reach tanh's bend
    q, k, v, dout = random_inputs((B, Sq, Hq, D), (B, Sk, Hkv, D), (B, Sk, Hkv, D), (B, Sq, Hq, D), dtype=dtype,
                                  device=device, seed=seed, mults=mults)
    leaves = [t.clone().requires_grad_(grads) for t in (q, k, v)]
    out, lse, s_dmask = fa.flash_attn_func(*leaves, causal=causal, window_size=window, softcap=softcap,
                                           alibi_slopes=slopes, return_attn_probs=True)
    assert out.shape == (B, Sq, Hq, D) and lse.shape == (B, Hq, Sq) and lse.dtype == torch.float32
    assert s_dmask.numel() == 0, "S_dmask: flash-attn returns an empty tensor without dropout"
    kw = dict(causal=causal, window_size=window, softcap=softcap)
    bias = None if slopes is None else alibi_bias(slopes, Sq, Sk, B)
    ref, ref_lse = ref_bshd(q, k, v, bias=bias, **kw)
    pt, _ = ref_bshd(q, k, v, upcast=False, bias=bias, **kw)
    assert_flash_rule("out", out, ref, pt, 2.0)
    assert_lse_close("lse", lse, ref_lse)
    if grads:
        got = torch.autograd.grad(out, leaves, dout)
        check_grads("flash_attn_func", lambda q_, k_, v_, upcast: ref_bshd(q_, k_, v_, upcast, bias, **kw)[0],
                    [q, k, v], dout, got)


DENSE = {  # B, Sq, Sk, Hq, Hkv, D, dtype, causal, window, softcap
    "mha_d64_fp16": (2, 113, 203, 4, 4, 64, F16, False, (-1, -1), 0.0),
    "gqa_d128_bf16_causal_sq_gt_sk": (1, 203, 113, 4, 2, 128, BF16, True, (-1, -1), 0.0),
    "mqa_d40_fp16_window": (2, 113, 113, 3, 1, 40, F16, False, (20, 7), 0.0),
    "gqa_d96_bf16_causal_window_softcap": (1, 77, 203, 4, 2, 96, BF16, True, (31, 0), 30.0),
}


@pytest.mark.parametrize("name", sorted(DENSE))
def test_flash_attn_func_against_float64(name):
    B, Sq, Sk, Hq, Hkv, D, dtype, causal, window, softcap = DENSE[name]
    check_dense(B, Sq, Sk, Hq, Hkv, D, dtype, causal, window, softcap, seed=1)


ALIBI = {  # slope shape, causal, window, softcap, Sq, Sk
    "heads": ("h", False, (-1, -1), 0.0, 77, 113),
    "batch_heads_causal": ("bh", True, (-1, -1), 0.0, 113, 77),
    "heads_causal_sq_lt_sk": ("h", True, (-1, -1), 0.0, 45, 113),
    "batch_heads_window_softcap": ("bh", False, (24, 8), 20.0, 113, 113),
}


def slopes_of(shape: str, B: int, H: int, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand((H,) if shape == "h" else (B, H), generator=g) * 0.3 + 0.02).to(device)


@pytest.mark.parametrize("name", sorted(ALIBI))
def test_alibi_against_float64(name):
    shape, causal, window, softcap, sq, sk = ALIBI[name]
    check_dense(2, sq, sk, 4, 2, 32, F16, causal, window, softcap, slopes=slopes_of(shape, 2, 4), seed=2)


def check_varlen(lens_q, lens_k, Hq, Hkv, D, dtype, causal=False, window=(-1, -1), slopes=None, seed=3,
                 device="cpu", grads=True):
    """flash_attn_varlen_func against each document in float64: out, softmax_lse (H, total_q),
    gradients."""
    import itertools

    cu_q, cu_k = (torch.tensor([0, *itertools.accumulate(n)], dtype=torch.int32, device=device)
                  for n in (lens_q, lens_k))
    tq, tk = sum(lens_q), sum(lens_k)
    q, k, v, dout = random_inputs((tq, Hq, D), (tk, Hkv, D), (tk, Hkv, D), (tq, Hq, D), dtype=dtype,
                                  device=device, seed=seed)
    leaves = [t.clone().requires_grad_(grads) for t in (q, k, v)]
    out, lse, _ = fa.flash_attn_varlen_func(*leaves, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                                            window_size=window, alibi_slopes=slopes, return_attn_probs=True)
    assert lse.shape == (Hq, tq) and lse.dtype == torch.float32
    kw = dict(causal=causal, window_size=window, slopes=slopes)
    ref, ref_lse = ref_varlen(q, k, v, cu_q, cu_k, **kw)
    pt, _ = ref_varlen(q, k, v, cu_q, cu_k, upcast=False, **kw)
    assert_flash_rule("varlen/out", out, ref, pt, 2.0)
    assert_lse_close("varlen/lse", lse, ref_lse)
    if grads:
        got = torch.autograd.grad(out, leaves, dout)
        check_grads("varlen", lambda q_, k_, v_, upcast: ref_varlen(q_, k_, v_, cu_q, cu_k, upcast, **kw)[0],
                    [q, k, v], dout, got)


def test_varlen_gqa_causal_window_against_float64():
    check_varlen([37, 5, 66], [50, 5, 80], 4, 2, 64, BF16, causal=True, window=(15, 0))


def test_varlen_alibi_per_document_slopes():
    # (documents, H) slopes: each document its own row, bottom-right distance in its own lengths
    check_varlen([37, 1, 66], [50, 9, 66], 4, 1, 32, F16, causal=True, slopes=slopes_of("bh", 3, 4, seed=5),
                 grads=False)


def _same(a, b, what):
    assert torch.equal(a, b), f"{what}: the two calls differ"


def test_packed_functions_equal_the_unpacked_ones():
    """qkvpacked / kvpacked (dense and varlen) run the unpacked function on views of the packed
    tensor: the same outputs and gradients, bitwise."""
    B, S, H, D = 2, 77, 2, 32
    qkv, dout = random_inputs((B, S, 3, H, D), (B, S, H, D), dtype=F16, seed=6)
    a = qkv.clone().requires_grad_(True)
    out_p = fa.flash_attn_qkvpacked_func(a, causal=True)
    (ga,) = torch.autograd.grad(out_p, a, dout)
    parts = [t.clone().requires_grad_(True) for t in qkv.unbind(2)]
    out = fa.flash_attn_func(*parts, causal=True)
    _same(out_p, out, "qkvpacked")
    _same(ga, torch.stack(torch.autograd.grad(out, parts, dout), 2), "qkvpacked grads")
    kv = qkv[:, :, 1:].clone().requires_grad_(True)
    out_kv = fa.flash_attn_kvpacked_func(parts[0], kv, causal=True)
    _same(out_kv, out, "kvpacked")
    # packed documents: (total, 3, H, D) and (total, 2, H, D)
    cu = torch.tensor([0, 30, 31, 77], dtype=torch.int32)
    flat = qkv[0]
    out_v = fa.flash_attn_varlen_func(*flat.unbind(1), cu, cu, 46, 46, causal=True)
    _same(fa.flash_attn_varlen_qkvpacked_func(flat, cu, 46, causal=True), out_v, "varlen qkvpacked")
    _same(fa.flash_attn_varlen_kvpacked_func(flat[:, 0], flat[:, 1:], cu, cu, 46, 46, causal=True), out_v,
          "varlen kvpacked")


def check_deterministic(alibi: bool, B=1, S=65, Hq=4, Hkv=2, D=32, dtype=F16, device="cpu", seed=7):
    """deterministic=True: two backward runs give the same bits (causal, GQA, ALiBi or not)."""
    q, k, v, dout = random_inputs((B, S, Hq, D), (B, S, Hkv, D), (B, S, Hkv, D), (B, S, Hq, D), dtype=dtype,
                                  device=device, seed=seed)
    slopes = slopes_of("h", B, Hq, device) if alibi else None

    def grads():
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = fa.flash_attn_func(*leaves, causal=True, alibi_slopes=slopes, deterministic=True)
        return torch.autograd.grad(out, leaves, dout)

    for a, b in zip(grads(), grads()):
        assert torch.equal(a, b), "deterministic=True: gradients differ between two runs"


@pytest.mark.parametrize("alibi", [False, True])
def test_deterministic_backward_is_bitwise_reproducible(alibi):
    check_deterministic(alibi)


def check_kvcache(paged: bool, device="cpu", seed=8, slopes_shape=None):
    """flash_attn_with_kvcache: 2 new tokens appended in place; paged: per-row cache_seqlens, a
    shuffled block table and flash-attn's default causal=False; dense: an int cache_seqlens, causal.
    Each row against float64 over its keys (cache prefix + new tokens)."""
    B, Hq, Hkv, D, Sq, cap, page = 3, 4, 2, 64, 2, 112, 16
    q, kn, vn, kc, vc = random_inputs((B, Sq, Hq, D), (B, Sq, Hkv, D), (B, Sq, Hkv, D), (B, cap, Hkv, D),
                                      (B, cap, Hkv, D), dtype=F16, device=device, seed=seed)
    lens = [37, 100, 5] if paged else [37] * B
    slopes = None if slopes_shape is None else slopes_of(slopes_shape, B, Hq, device, seed)
    kw = {} if paged else {"causal": True}
    if paged:
        g = torch.Generator().manual_seed(seed)
        table = torch.randperm(B * cap // page, generator=g).reshape(B, cap // page).to(torch.int32).to(device)
        k_cache, v_cache = (torch.empty(B * cap // page, page, Hkv, D, dtype=F16, device=device) for _ in range(2))
        k_cache[table.flatten().long()] = kc.reshape(-1, page, Hkv, D)
        v_cache[table.flatten().long()] = vc.reshape(-1, page, Hkv, D)
        seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
        kw["block_table"] = table
    else:
        k_cache, v_cache, seqlens = kc.clone(), vc.clone(), lens[0]  # an int, as flash-attn allows
    with torch.no_grad():
        out, lse = fa.flash_attn_with_kvcache(q, k_cache, v_cache, kn, vn, cache_seqlens=seqlens,
                                              alibi_slopes=slopes, return_softmax_lse=True, **kw)
    assert out.shape == (B, Sq, Hq, D) and lse.shape == (B, Hq, Sq)
    for b, n in enumerate(lens):
        keys = torch.cat([kc[b, :n], kn[b]])[None]
        vals = torch.cat([vc[b, :n], vn[b]])[None]
        if not paged:  # appended in place at cache_seqlens
            assert torch.equal(k_cache[b, n:n + Sq], kn[b]) and torch.equal(v_cache[b, n:n + Sq], vn[b])
        bias = None if slopes is None else alibi_bias(slopes[b] if slopes.dim() == 2 else slopes, Sq, n + Sq, 1)
        rkw = dict(causal=not paged, bias=bias)
        ref, ref_lse = ref_bshd(q[b:b + 1], keys, vals, **rkw)
        pt, _ = ref_bshd(q[b:b + 1], keys, vals, upcast=False, **rkw)
        assert_flash_rule(f"kvcache/row{b}", out[b:b + 1], ref, pt, 2.0)
        assert_lse_close(f"kvcache/lse{b}", lse[b:b + 1], ref_lse)


def test_kvcache_int_seqlens_appends_causal():
    check_kvcache(paged=False)


def test_kvcache_paged_default_not_causal_with_alibi():
    check_kvcache(paged=True, slopes_shape="bh")


def check_fp8(device="cpu", B=2, Sq=113, Sk=203, Hq=4, Hkv=2, D=64, seed=9):
    """e4m3 q, k, v with FlashAttention-3's (B, Hkv) descales: bf16 out against float64 on the
    dequantized values (the yardstick: the fp8 computation emulated in PyTorch)."""
    from attngen.families import fwd_fp8_tuning as f8t

    q, k, v = random_inputs((B, Sq, Hq, D), (B, Sk, Hkv, D), (B, Sk, Hkv, D), dtype=BF16, device=device, seed=seed)
    q8s, ds = [], []
    for x in (q, k, v):  # one descale per (batch, KV head)
        d = x.float().unflatten(2, (Hkv, -1)).abs().amax((1, 3, 4)) / 448
        full = d.repeat_interleave(x.shape[2] // Hkv, 1)[:, None, :, None]
        q8s.append((x.float() / full).to(E4M3))
        ds.append(d)
    out, lse, _ = fa.flash_attn_func(*q8s, causal=True, q_descale=ds[0], k_descale=ds[1], v_descale=ds[2],
                                     return_attn_probs=True)
    assert out.dtype == BF16 and out.shape == (B, Sq, Hq, D) and lse.shape == (B, Hq, Sq)
    deq = [(x.double() * d.double().repeat_interleave(x.shape[2] // Hkv, 1)[:, None, :, None]).transpose(1, 2)
           for x, d in zip(q8s, ds)]
    o64, l64 = attention_ref(*deq, causal=True)
    oe, _ = f8t.emulate(*(x.float() for x in deq), rotate=False, causal=True)
    assert_flash_rule("fp8/out", out, o64.transpose(1, 2), oe.to(BF16).transpose(1, 2), 2.0, 1e-3)
    assert_lse_close("fp8/lse", lse, l64, rtol=1e-2, atol=1e-2)


def test_fp8_descales_against_float64():
    check_fp8()


def _inputs(dtype=F16):
    return random_inputs((1, 16, 2, 32), (1, 16, 2, 32), (1, 16, 2, 32), dtype=dtype, seed=10)


def _varlen_inputs():
    q, k, v = (t[0] for t in _inputs())
    return q, k, v, torch.tensor([0, 16], dtype=torch.int32), torch.tensor([0, 16], dtype=torch.int32), 16, 16


ERRORS = [
    (lambda: fa.flash_attn_func(*_inputs(), dropout_p=0.1), NotImplementedError, "dropout_p"),
    (lambda: fa.flash_attn_varlen_func(*_varlen_inputs(), dropout_p=0.1), NotImplementedError, "dropout_p"),
    (lambda: fa.flash_attn_qkvpacked_func(torch.stack(_inputs(), 2), dropout_p=0.5), NotImplementedError,
     "dropout_p"),
    (lambda: fa.flash_attn_func(*_inputs(), q_descale=torch.ones(1, 2)), ValueError, "q_descale"),
    (lambda: fa.flash_attn_varlen_func(*_varlen_inputs(), k_descale=torch.ones(1, 2)), ValueError, "k_descale"),
    (lambda: fa.flash_attn_varlen_func(*(t.to(E4M3) for t in _varlen_inputs()[:3]), *_varlen_inputs()[3:]),
     NotImplementedError, "q: float8_e4m3fn packed"),
    (lambda: fa.flash_attn_func(*(t.to(E4M3) for t in _inputs()), alibi_slopes=torch.ones(2)),
     NotImplementedError, "alibi_slopes"),
    (lambda: fa.flash_attn_func(*_inputs(), alibi_slopes=torch.ones(3)), ValueError, r"alibi_slopes: expected shape"),
    (lambda: fa.flash_attn_func(*_inputs(), alibi_slopes=torch.ones(2, dtype=F16)), ValueError,
     "alibi_slopes: must be torch.float32"),
    (lambda: fa.flash_attn_qkvpacked_func(torch.stack(_inputs(), 2)[:, :, :2]), ValueError, r"qkv: expected shape"),
    (lambda: fa.flash_attn_varlen_kvpacked_func(_varlen_inputs()[0], _varlen_inputs()[1], *_varlen_inputs()[3:]),
     ValueError, r"kv: expected shape"),
]


@pytest.mark.parametrize("i", range(len(ERRORS)))
def test_unsupported_arguments_name_the_argument(i):
    call, exc, match = ERRORS[i]
    with pytest.raises(exc, match=match):
        call()


def _kvcache_args():
    q = torch.zeros(1, 1, 2, 32, dtype=F16)
    cache = torch.zeros(1, 32, 2, 32, dtype=F16)
    return q, cache, cache.clone()


@pytest.mark.parametrize("name", ["rotary_cos", "rotary_sin", "cache_batch_idx", "cache_leftpad"])
def test_kvcache_keywords_pass_through_or_name_themselves(name, monkeypatch):
    """An attention_with_kvcache without the keyword: an error naming it; with it (another engine
    adds them): the value arrives, with rotary_interleaved beside the rotary tables."""
    seen = {}

    def without(q, k_cache, v_cache, cache_seqlens=None, **kw):
        raise AssertionError("must not be called")

    def with_it(q, k_cache, v_cache, cache_seqlens=None, *, rotary_cos=None, rotary_sin=None,
                rotary_interleaved=True, cache_batch_idx=None, cache_leftpad=None, **kw):
        seen.update(rotary_cos=rotary_cos, rotary_sin=rotary_sin, rotary_interleaved=rotary_interleaved,
                    cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad, causal=kw["causal"],
                    cache_seqlens=cache_seqlens)
        return "out"

    marker = torch.zeros(1, dtype=torch.int32)
    monkeypatch.setattr(public, "attention_with_kvcache", without)
    with pytest.raises(NotImplementedError, match=f"^{name}: "):
        fa.flash_attn_with_kvcache(*_kvcache_args(), cache_seqlens=3, **{name: marker})
    monkeypatch.setattr(public, "attention_with_kvcache", with_it)
    assert fa.flash_attn_with_kvcache(*_kvcache_args(), cache_seqlens=3, rotary_interleaved=False,
                                      **{name: marker}) == "out"
    assert seen[name] is marker and seen["causal"] is False
    assert seen["rotary_interleaved"] is (False if name.startswith("rotary") else True)
    assert seen["cache_seqlens"].dtype == torch.int32 and seen["cache_seqlens"].tolist() == [3]


@pytest.mark.parametrize("name", ["block_table", "seqused_k"])
def test_varlen_keywords_pass_through_or_name_themselves(name, monkeypatch):
    seen = {}

    def without(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, **kw):
        raise AssertionError("must not be called")

    def with_it(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, block_table=None,
                seqused_k=None, **kw):
        seen.update(block_table=block_table, seqused_k=seqused_k)
        return "out"

    marker = torch.zeros(1, dtype=torch.int32)
    monkeypatch.setattr(public, "attention_varlen", without)
    with pytest.raises(NotImplementedError, match=f"^{name}: "):
        fa.flash_attn_varlen_func(*_varlen_inputs(), **{name: marker})
    monkeypatch.setattr(public, "attention_varlen", with_it)
    assert fa.flash_attn_varlen_func(*_varlen_inputs(), **{name: marker}) == "out"
    assert seen[name] is marker


def test_module_is_a_submodule_of_attngen():
    import importlib

    assert importlib.import_module("attngen.flash_attn_interface") is fa
    assert set(fa.__all__) <= set(dir(fa)) and attngen.flash_attn_interface is fa


def test_kvcache_rotary_batch_idx_and_leftpad_reach_attngen():
    # flash_attn_with_kvcache's rotary / cache_batch_idx / cache_leftpad run attngen's KV-cache
    # kernels: the same output and cache, bitwise, as attention_with_kvcache called directly
    g = torch.Generator().manual_seed(23)
    B, Hq, Hkv, D, S = 2, 4, 2, 32, 48
    mk = lambda *s: torch.randn(*s, generator=g).to(F16)  # noqa: E731
    q, kn, vn = mk(B, 1, Hq, D), mk(B, 1, Hkv, D), mk(B, 1, Hkv, D)
    kc, vc = mk(3, S, Hkv, D), mk(3, S, Hkv, D)  # three cache rows, two used
    lens = torch.tensor([20, 31], dtype=torch.int32)
    idx = torch.tensor([2, 0], dtype=torch.int32)
    pad = torch.tensor([3, 0], dtype=torch.int32)
    angles = torch.rand(S, D // 4, generator=g) * 3.0
    cos, sin = angles.cos().to(F16), angles.sin().to(F16)
    caches = [(kc.clone(), vc.clone()) for _ in range(2)]
    with torch.no_grad():
        got, lse = fa.flash_attn_with_kvcache(q, *caches[0], kn, vn, rotary_cos=cos, rotary_sin=sin, cache_seqlens=lens,
                                              cache_batch_idx=idx, cache_leftpad=pad, causal=True,
                                              rotary_interleaved=False, return_softmax_lse=True)
        want, lse_w = attngen.attention_with_kvcache(q, *caches[1], lens, k=kn, v=vn, rotary_cos=cos, rotary_sin=sin,
                                                     rotary_interleaved=False, cache_batch_idx=idx,
                                                     cache_leftpad=pad, causal=True, return_lse=True)
    _same(got, want, "out")
    _same(lse, lse_w, "lse")
    _same(caches[0][0], caches[1][0], "k_cache")
    assert not torch.equal(caches[0][0], kc), "nothing appended"


def test_varlen_block_table_reaches_the_paged_prefill():
    # flash_attn_varlen_func with a block table and seqused_k: attngen's paged prefill, the same as
    # attention_varlen called directly
    g = torch.Generator().manual_seed(24)
    Hq, Hkv, D, page = 4, 2, 32, 16
    mk = lambda *s: torch.randn(*s, generator=g).to(F16)  # noqa: E731
    cu_q = torch.tensor([0, 7, 30], dtype=torch.int32)
    used = torch.tensor([40, 61], dtype=torch.int32)
    table = torch.randperm(10, generator=g)[:8].reshape(2, 4).to(torch.int32)
    q = mk(30, Hq, D)
    kp, vp = mk(10, page, Hkv, D), mk(10, page, Hkv, D)
    cu_k = torch.tensor([0, 40, 101], dtype=torch.int32)
    got = fa.flash_attn_varlen_func(q, kp, vp, cu_q, cu_k, 23, 64, causal=True, block_table=table, seqused_k=used)
    want = attngen.attention_varlen(q, kp, vp, cu_q, cu_k, 23, 64, causal=True, block_table=table, seqused_k=used)
    _same(got, want, "out")
