"""The fp8 family (fwd_fp8) in Triton's interpreter: the prologue (the rotation is orthogonal and
leaves Q.K^T unchanged, the kernel's e4m3 bytes and descales are PyTorch's, a round trip stays
within e4m3's rounding) and the attention kernel against float64 with the flash-attn rule (error
<= 2x that of the same computation in PyTorch, fwd_fp8_tuning.emulate) on odd shapes: masks, softcap,
GQA, head dims that are not a power of two, packed documents; the generated kernel's golden
output; the API (attention(precision="fp8"), attention_fp8 with FlashAttention-3's descales,
torch.compile) and its errors. Outputs and fp8 buffers are poisoned before each launch."""

from __future__ import annotations

import math

import pytest
import torch

import attngen
from attngen import env
from attngen.families import fwd_fp8 as f8
from attngen.families import fwd_fp8_tuning as f8t
from attngen.kernels.common import MaskArgs, mask_kind
from attngen.problem import attention_ref, random_inputs
from attngen.runtime import dispatch, loader
from attngen.spec import KernelSpec
from tests.kernels import golden
from tests.kernels.cases import built_kernels

pytestmark = pytest.mark.skipif(not env.interpreting(), reason="interpreter only")
E4M3 = torch.float8_e4m3fn


def _spec(d, dv, g, mask, softcap=False, varlen=False):
    return KernelSpec("fwd_fp8", "fp8_e4m3", "sm90", d, dv, g, mask, softcap, varlen)


def _poisoned(bufs):
    for t in bufs.values():
        (t.view(torch.uint8).fill_(0x7F) if t.dtype == E4M3 else t.fill_(float("nan")))  # e4m3 NaN
    return bufs


def run_dense(spec, mod, q, k, v, causal, window, softcap, cfg, rotate=True):
    """The prologue and the attention kernel launched directly: (out, lse, buffers)."""
    bufs = _poisoned(f8.alloc(f8.buffers(spec, q, k, v, False), "cpu"))
    rot = f8.rotation(f8.qk_width(spec), f8.ROTATION_SEED, q.dtype, "cpu") if rotate else None
    for la in f8.quant_launches(mod, spec, q, k, v, bufs, rot):
        la.run()
    B, hq, sq, _ = q.shape
    out = torch.full((B, hq, sq, v.shape[3]), float("nan"), dtype=q.dtype)
    lse = torch.full((B, hq, sq), float("nan"))
    _, wl, wr = mask_kind(causal, window)
    ma = MaskArgs(1 / math.sqrt(q.shape[3]), softcap, wl, wr, False)
    for la in f8.fp8_launches(mod, spec, bufs["Q8"], bufs["K8"], bufs["Vt"], bufs["QScale"], bufs["KScale"],
                              bufs["VScale"], out, lse, ma, cfg):
        la.run()
    return out, lse, bufs


def refs(q, k, v, causal, window, softcap, rotate=True):
    kw = dict(causal=causal, window_size=window, softcap=softcap)
    o64, l64 = attention_ref(q, k, v, **kw)
    oe, le = f8t.emulate(q, k, v, rotate=rotate, **kw)
    return {"out64": o64, "lse64": l64, "out_pt": oe, "lse_pt": le}


# ------------------------------------------------------------------------------------------------
# the prologue


@pytest.mark.parametrize("d", [128, 80, 72, 112, 40, 8, 256])
def test_rotation_is_orthogonal_and_keeps_scores(d):
    m = f8t.rotation_matrix(d)
    w = f8.qk_width(_spec(d, d, 1, "none"))
    assert m.shape == (d, w)
    torch.testing.assert_close(m @ m.T, torch.eye(d, dtype=torch.float64), atol=1e-12, rtol=0)
    assert sum(bw for _, bw in f8.rotation_blocks(w)) == w
    g = torch.Generator().manual_seed(d)
    q, k = torch.randn(5, d, dtype=torch.float64, generator=g), torch.randn(7, d, dtype=torch.float64, generator=g)
    torch.testing.assert_close((q @ m) @ (k @ m).T, q @ k.T, atol=1e-10, rtol=0)
    # the rotation mixes features: an outlier in one column is spread over its whole block
    x = torch.zeros(1, d, dtype=torch.float64)
    x[0, 0] = 100.0
    off, bw = f8.rotation_blocks(w)[0]
    assert torch.allclose((x @ m)[0, :bw].abs(), torch.full((bw,), 100.0 / bw ** 0.5, dtype=torch.float64))


@pytest.mark.parametrize("d, dv, sq, sk, rotate", [(128, 128, 203, 113, True), (80, 48, 113, 300, True),
                                                   (24, 8, 129, 1, True), (80, 48, 113, 300, False),
                                                   (256, 32, 70, 131, True)])
def test_prologue_matches_pytorch_quantization(d, dv, sq, sk, rotate):
    """Q and K rotated (or, rotate=False, left as they are) and quantized per block, V quantized
    and transposed: PyTorch's values, within e4m3's rounding."""
    spec = _spec(d, dv, 2, "none")
    mod = loader.load(spec)
    q, k, v = random_inputs((2, 4, sq, d), (2, 2, sk, d), (2, 2, sk, dv), dtype=torch.bfloat16, seed=3,
                            mults=(3.0, 0.5, 2.0))
    q[0, 1, 7, 3] = 60.0  # an outlier
    bufs = _poisoned(f8.alloc(f8.buffers(spec, q, k, v, False), "cpu"))
    w = f8.qk_width(spec)
    for la in f8.quant_launches(mod, spec, q, k, v, bufs, f8.rotation(w, 0, q.dtype, "cpu") if rotate else None):
        la.run()
    m = f8t.rotation_matrix(d) if rotate else torch.eye(d, w, dtype=torch.float64)
    for name, x, rot in (("Q", q, True), ("K", k, True), ("V", v, False)):
        want8, want_d = f8t.quantize_ref(x.double() @ m if rot else x)
        got8 = bufs["Vt"][..., :sk].transpose(-1, -2) if name == "V" else bufs[name + "8"]
        torch.testing.assert_close(bufs[name + "Scale"], want_d.float(), rtol=1e-6, atol=0)
        same = (got8.double() == want8).float().mean().item()
        assert same > 0.999, f"{name}: {same:.4%} of the e4m3 values are PyTorch's"  # fp32 rounding of the FWHT
        # round trip: rotated back, within e4m3's rounding (half an ulp: 2^-4 relative, plus subnormals)
        deq = f8t.dequantize_ref(got8.double(), bufs[name + "Scale"])
        back = deq @ m.T if rot else deq
        tol = bufs[name + "Scale"].double().repeat_interleave(f8.SCALE_BLOCK, -1)[..., :x.shape[2], None]
        bound = 2.0 ** -4 * (x.double() @ m if rot else x.double()).abs() + tol * 2.0 ** -9 * 448
        err = (deq - (x.double() @ m if rot else x.double())).abs()
        assert (err <= bound * 1.0001).all(), f"{name}: quantization error past e4m3's rounding"
        assert (back - x.double()).abs().max() < 0.1 * x.double().abs().max()
    if bufs["Vt"].shape[-1] > sk:  # V^T's padding keys are zeros (the copy engine reads them)
        assert bufs["Vt"][..., sk:].float().abs().max() == 0


@pytest.mark.parametrize("sk", [113, 16, 1])
def test_prologue_writes_the_warp_specialized_kernels_key_order(sk):
    """PERM16 (the Gluon kernel's V^T): within each 16 keys, position 4t + 2h + b holds key
    8h + 2t + b -- the order in which the accumulator's columns reach P.V's A operand
    (_fp8_ws.py.jinja, _attn_fwd_fp8_ws_p8); the same bytes as the natural order otherwise, the
    padding keys zero. permute_keys16 (a caller's e4m3 V) makes the same order."""
    spec = _spec(128, 64, 1, "none")
    mod = loader.load(spec)
    q, k, v = random_inputs((1, 2, 20, 128), (1, 2, sk, 128), (1, 2, sk, 64), dtype=torch.bfloat16, seed=5)
    outs = []
    for perm in (False, True):
        bufs = _poisoned(f8.alloc(f8.buffers(spec, q, k, v, False), "cpu"))
        for la in f8.quant_launches(mod, spec, q, k, v, bufs, f8.rotation(f8.qk_width(spec), 0, q.dtype, "cpu"),
                                    perm16=perm):
            la.run()
        outs.append(bufs["Vt"].view(torch.uint8).clone())
    natural, perm = outs
    pad = natural.shape[-1]
    key = torch.arange(pad)
    pos = key - key % 16 + 4 * ((key % 16 >> 1) & 3) + 2 * (key % 16 >> 3) + (key % 2)
    assert sorted(pos.tolist()) == list(range(pad)) and not torch.equal(pos, key)
    assert torch.equal(perm[..., pos], natural)
    assert torch.equal(f8.permute_keys16(natural), perm)
    assert (natural[..., sk:] == 0).all()
    # a caller's e4m3 V (attention_fp8) transposed into either order, padding zeroed
    v8 = (v * 8).to(torch.float8_e4m3fn)
    want = torch.zeros_like(natural)
    want[..., :sk] = v8.view(torch.uint8).transpose(2, 3)
    for order, expect in ((False, want), (True, f8.permute_keys16(want))):
        vt = torch.full_like(natural, 0x7F).view(torch.float8_e4m3fn)  # poisoned (e4m3 NaN)
        f8.transpose_v(v8, vt, order)
        assert torch.equal(vt.view(torch.uint8), expect), order
        # the module's copy kernel (attention_fp8's dense V), from a bshd view as well
        for src in (v8, v8.transpose(1, 2).contiguous().transpose(1, 2)):
            vt = torch.full_like(natural, 0x7F).view(torch.float8_e4m3fn)
            f8.copy_v_launch(mod, src, vt, order).run()
            assert torch.equal(vt.view(torch.uint8), expect), (order, src.stride())


# ------------------------------------------------------------------------------------------------
# the attention kernel

# (B, Hq, Hkv, Sq, Sk, D, Dv, causal, window, softcap)
CASES = [
    (2, 4, 2, 113, 203, 128, 128, True, (-1, -1), 0.0),
    (1, 4, 1, 203, 113, 64, 64, False, (-1, -1), 0.0),
    (1, 2, 2, 157, 157, 80, 80, False, (37, 5), 0.0),
    (2, 3, 3, 61, 190, 72, 40, True, (-1, -1), 0.0),
    (1, 4, 2, 100, 129, 64, 64, False, (-1, -1), 25.0),
    (1, 2, 1, 70, 70, 256, 256, True, (-1, -1), 0.0),
    (1, 2, 2, 33, 1, 16, 8, False, (-1, -1), 0.0),
]


def _cid(c):
    B, hq, hkv, sq, sk, d, dv, causal, window, softcap = c
    return (f"b{B}_h{hq}x{hkv}_q{sq}_k{sk}_hd{d}" + (f"x{dv}" if dv != d else "") + ("_causal" if causal else "")
            + (f"_w{window[0]}x{window[1]}" if window != (-1, -1) else "") + (f"_cap{softcap:g}" if softcap else ""))


@pytest.mark.parametrize("case", CASES, ids=_cid)
def test_fp8_kernel_against_float64(case):
    B, hq, hkv, sq, sk, d, dv, causal, window, softcap = case
    mask, _, _ = mask_kind(causal, window)
    spec = _spec(d, dv, hq // hkv, mask, softcap > 0)
    q, k, v = random_inputs((B, hq, sq, d), (B, hkv, sk, d), (B, hkv, sk, dv), dtype=torch.bfloat16, seed=11,
                            mults=(4.0 if softcap else 1.0, 1.0, 1.0))
    cfg = f8.default_fp8_config(spec, "cpu")
    out, lse, _ = run_dense(spec, loader.load(spec), q, k, v, causal, window, softcap, cfg)
    f8t.check_outputs(_cid(case), out, lse, refs(q, k, v, causal, window, softcap))


@pytest.mark.parametrize("cfg", [f8.Fp8Config(16, 16, 2, 1), f8.Fp8Config(64, 32, 4, 2), f8.Fp8Config(128, 128, 8, 1),
                                 f8.Fp8Config(32, 64, 4, 1, precise_acc=True)],
                         ids=lambda c: f"m{c.block_m}_n{c.block_n}" + ("_precise" if c.precise_acc else ""))
def test_fp8_kernel_tiles(cfg):
    """Every tile size the search space and the defaults use (a tile reads one descale per block)."""
    spec = _spec(64, 64, 2, "causal")
    q, k, v = random_inputs((1, 4, 300, 64), (1, 2, 259, 64), (1, 2, 259, 64), dtype=torch.float16, seed=5)
    out, lse, _ = run_dense(spec, loader.load(spec), q, k, v, True, (-1, -1), 0.0, cfg)
    f8t.check_outputs(f"tiles {cfg}", out, lse, refs(q, k, v, True, (-1, -1), 0.0))


def test_no_rotation_and_outliers():
    """On outlier inputs (N(0, 1) plus N(0, 100) on 0.1 % of the entries) rotation cuts the error."""
    g = torch.Generator().manual_seed(7)
    shape = (1, 2, 256, 128)
    q, k, v = (torch.randn(shape, generator=g) + 10 * torch.randn(shape, generator=g)
               * (torch.rand(shape, generator=g) < 0.001) for _ in range(3))
    q, k, v = q.bfloat16(), k.bfloat16(), v.bfloat16()
    spec = _spec(128, 128, 1, "none")
    mod = loader.load(spec)
    errs = {}
    for rotate in (True, False):
        out, lse, _ = run_dense(spec, mod, q, k, v, False, (-1, -1), 0.0, f8.default_fp8_config(spec, "cpu"),
                                rotate=rotate)
        ref = refs(q, k, v, False, (-1, -1), 0.0, rotate=rotate)
        f8t.check_outputs(f"rotate={rotate}", out, lse, ref)
        errs[rotate] = (out.double() - ref["out64"]).pow(2).mean().sqrt().item()
    assert errs[True] < errs[False], errs


def test_fp8_packed_documents():
    docs_q, docs_k = [37, 0, 130, 1], [90, 5, 130, 17]
    cu_q = torch.tensor([0] + list(torch.tensor(docs_q).cumsum(0)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(torch.tensor(docs_k).cumsum(0)), dtype=torch.int32)
    q, k, v = random_inputs((int(cu_q[-1]), 4, 64), (int(cu_k[-1]), 2, 64), (int(cu_k[-1]), 2, 64),
                            dtype=torch.bfloat16, seed=9)
    with torch.no_grad():
        out, lse = attngen.attention_varlen(q, k, v, cu_q, cu_k, max(docs_q), max(docs_k), causal=True,
                                            precision="fp8", return_lse=True)
    for i in range(len(docs_q)):
        a, b = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
        if docs_q[i] == 0:
            continue
        qd, kd, vd = (x[r].transpose(0, 1)[None] for x, r in ((q, a), (k, b), (v, b)))
        ref = refs(qd, kd, vd, True, (-1, -1), 0.0)
        f8t.check_outputs(f"doc {i}", out[a].transpose(0, 1)[None], lse[:, a][None], ref)


# the generated fp8 kernels (specs/), their golden outputs
FP8_KERNELS = built_kernels("fwd_fp8")


@pytest.mark.parametrize("spec,path", FP8_KERNELS, ids=[s.uri for s, _ in FP8_KERNELS])
def test_generated_fp8_kernel_golden(spec, path):
    mod = loader.load_path(path)
    g = spec.gqa_ratio
    q, k, v = random_inputs((1, 2 * g, 113, spec.head_dim_qk), (1, 2, 203, spec.head_dim_qk),
                            (1, 2, 203, spec.head_dim_v), dtype=torch.bfloat16, seed=1000)
    causal = spec.mask == "causal"
    window = (40, 0) if spec.mask == "sliding_window" else (-1, -1)
    out, lse, _ = run_dense(spec, mod, q, k, v, causal, window, 0.0, f8.default_fp8_config(spec, "cpu"))
    ref = refs(q, k, v, causal, window, 0.0)
    f8t.check_outputs(spec.uri, out, lse, ref)
    fin = torch.isfinite(ref["lse64"])
    golden.check("fwd_fp8", spec.uri, "q113_k203", {"out": out, "lse": lse},
                 {"out": (out.double() - ref["out64"]).abs().max().item(),
                  "lse": (lse.double() - ref["lse64"])[fin].abs().max().item()})


# ------------------------------------------------------------------------------------------------
# the API


def test_attention_precision_fp8_is_the_family():
    q, k, v = random_inputs((1, 4, 113, 64), (1, 2, 150, 64), (1, 2, 150, 64), dtype=torch.bfloat16, seed=2)
    spec = _spec(64, 64, 2, "causal")
    want, want_lse, _ = run_dense(spec, loader.load(spec), q, k, v, True, (-1, -1), 0.0,
                                  f8.default_fp8_config(spec, "cpu"))
    out, lse = attngen.attention(q, k, v, causal=True, precision="fp8", return_lse=True)
    assert out.dtype == torch.bfloat16 and torch.equal(out, want) and torch.equal(lse, want_lse)
    bshd = attngen.attention(*(x.transpose(1, 2) for x in (q, k, v)), causal=True, precision="fp8",
                             layout="bshd")
    assert torch.equal(bshd.transpose(1, 2), want)
    info = attngen.explain(q, k, v, causal=True, precision="fp8")
    assert info["kernel"] == spec.uri and info["precision"] == "fp8" and info["backward"] is None
    assert [r["entry"] for r in info["launches"]] == ["_fp8_quant_qkv", "_attn_fwd_fp8"]  # the prologue: one launch
    assert info["q_in_kernel"] is False  # the Triton kernel reads the prologue's Q8 (the GPU's Gluon kernel: True)
    assert attngen.explain(q, k, v)["precision"] == "bf16"


def _quantize_per_kv_head(x, hkv):
    """FlashAttention-3's convention: one descale per (batch, KV head); x (B, H, S, D)."""
    B, H = x.shape[:2]
    d = x.float().abs().reshape(B, hkv, -1).amax(-1) / 448
    full = d.repeat_interleave(H // hkv, 1)[:, :, None, None]
    return (x.float() / full).to(E4M3), d


@pytest.mark.parametrize("form", ["kv_head", "head", "block", "none"])
def test_attention_fp8_descales(form):
    q, k, v = random_inputs((2, 4, 203, 64), (2, 2, 300, 64), (2, 2, 300, 32), dtype=torch.bfloat16, seed=4)
    if form == "kv_head":
        (q8, qd), (k8, kd), (v8, vd) = (_quantize_per_kv_head(x, 2) for x in (q, k, v))
    elif form == "head":
        (q8, qd), (k8, kd), (v8, vd) = (_quantize_per_kv_head(x, x.shape[1]) for x in (q, k, v))
    elif form == "block":
        (q8, qd), (k8, kd), (v8, vd) = (f8t.quantize_ref(x) for x in (q, k, v))
        q8, k8, v8 = (x.to(E4M3) for x in (q8, k8, v8))
        qd, kd, vd = (d.float().contiguous() for d in (qd, kd, vd))
    else:
        q8, k8, v8 = (x.clamp(-448, 448).to(E4M3) for x in (q, k, v))
        qd = kd = vd = None
    out = attngen.attention_fp8(q8, k8, v8, qd, kd, vd, causal=True)
    assert out.dtype == torch.bfloat16 and out.shape == (2, 4, 203, 32)
    deq = [x.double() * (1 if d is None else (d.double().repeat_interleave(x.shape[1] // d.shape[1], 1)[:, :, None, None]
                                              if d.dim() == 2 else d.double().repeat_interleave(128, -1)[..., :x.shape[2], None]))
           for x, d in ((q8, qd), (k8, kd), (v8, vd))]
    o64, _ = attention_ref(*deq, causal=True)
    oe, _ = f8t.emulate(*(x.float() for x in deq), rotate=False, causal=True)
    from attngen.testing import assert_flash_rule

    assert_flash_rule(form, out, o64, oe.to(torch.bfloat16), 2.0, 1e-3)


def test_attention_fp8_warm_calls_take_the_fast_path(monkeypatch):
    """A warm attention_fp8 call is one lookup in fp8._FAST_QUANT (no validation, no plan key):
    the same outputs as the cold call on new values; another descale form, dtype or device is
    another key (its call goes through the checks again)."""
    from attngen.runtime import fp8 as rt_fp8

    def inputs(seed):
        q, k, v = random_inputs((1, 4, 150, 64), (1, 2, 150, 64), (1, 2, 150, 64), dtype=torch.bfloat16, seed=seed)
        return [_quantize_per_kv_head(x, 2) for x in (q, k, v)]

    (q8, qd), (k8, kd), (v8, vd) = inputs(31)
    rt_fp8._FAST_QUANT.clear()
    first = attngen.attention_fp8(q8, k8, v8, qd, kd, vd, causal=True)
    assert len(rt_fp8._FAST_QUANT) == 1
    (q8, qd), (k8, kd), (v8, vd) = inputs(32)
    cold = attngen.attention_fp8(q8.clone(), k8, v8, qd, kd, vd, causal=True, out_dtype=torch.float16)  # new key
    assert len(rt_fp8._FAST_QUANT) == 2
    monkeypatch.setattr(rt_fp8, "check_quantized", lambda *a: pytest.fail("the warm call validated again"))
    monkeypatch.setattr(rt_fp8, "fp8_plan", lambda *a, **kw: pytest.fail("the warm call built a plan key"))
    warm = attngen.attention_fp8(q8, k8, v8, qd, kd, vd, causal=True, out_dtype=torch.float16)
    assert torch.equal(warm, cold) and not torch.equal(warm.to(first.dtype), first)
    monkeypatch.undo()
    with pytest.raises(ValueError, match="k_descale: must be torch.float32"):
        attngen.attention_fp8(q8, k8, v8, qd, kd.double(), vd, causal=True, out_dtype=torch.float16)


def test_fp8_under_torch_compile():
    q, k, v = random_inputs((1, 2, 70, 64), (1, 2, 90, 64), (1, 2, 90, 64), dtype=torch.bfloat16, seed=6)
    q8, k8, v8 = (x.to(E4M3) for x in (q, k, v))

    def fn(q, k, v, q8, k8, v8):
        return attngen.attention(q, k, v, precision="fp8") + attngen.attention_fp8(q8, k8, v8)

    eager = fn(q, k, v, q8, k8, v8)
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")(q, k, v, q8, k8, v8)
    assert torch.equal(compiled, eager)


@pytest.mark.parametrize("call, match", [
    (lambda q, k, v: attngen.attention(q.requires_grad_(), k, v, precision="fp8"), "inference only"),
    (lambda q, k, v: attngen.attention(q, k, v, precision="fp4"), "precision: must be"),
    (lambda q, k, v: attngen.attention(q, k, v, precision="fp8", rotate=1), "rotate: must be"),
    (lambda q, k, v: attngen.attention_fp8(q, k, v), r"q: unsupported dtype .*float8_e4m3fn"),
    (lambda q, k, v: attngen.attention_fp8(q[..., :24].to(E4M3), k[..., :24].to(E4M3), v.to(E4M3)),
     "multiple of 16"),
    (lambda q, k, v: attngen.attention_fp8(q.to(E4M3), k.to(E4M3), v.to(E4M3), torch.ones(1, 3)),
     r"q_descale: shape \(1, 3\)"),
    (lambda q, k, v: attngen.attention_fp8(q.to(E4M3), k.to(E4M3), v.to(E4M3), None, torch.ones(1, 2),
                                           torch.ones(1, 2, 1)), "v_descale"),
    (lambda q, k, v: attngen.attention_fp8(q.to(E4M3), k.to(E4M3), v.to(E4M3), torch.ones(1, 2).double()),
     "q_descale: must be torch.float32"),
    (lambda q, k, v: attngen.attention_fp8(q.to(E4M3), k.to(E4M3), v.to(E4M3), out_dtype=torch.float32),
     "out_dtype"),
])
def test_fp8_errors_name_the_argument(call, match):
    q, k, v = random_inputs((1, 4, 20, 32), (1, 2, 20, 32), (1, 2, 20, 32), dtype=torch.bfloat16, seed=1)
    with pytest.raises(ValueError, match=match):
        call(q, k, v)


def test_fp8_forced_config_and_filter():
    spec = _spec(128, 128, 1, "none")
    assert f8.check_fp8(spec, f8.Fp8Config(256, 64, 4, 2)) is not None  # a tile spans two descales
    assert "shared memory" in f8.check_fp8(_spec(256, 256, 1, "none"), f8.Fp8Config(128, 128, 8, 6))
    assert f8.check_fp8(spec, f8.default_fp8_config(spec)) is None
    assert "block_n must be at least 32" in f8.check_fp8(spec, f8.Fp8Config(64, 16, 4, 2, precise_acc=True))
    q, k, v = random_inputs((1, 2, 80, 128), (1, 2, 80, 128), (1, 2, 80, 128), dtype=torch.bfloat16, seed=8)
    with dispatch.forced_config(fwd_fp8=f8.Fp8Config(16, 64, 2, 1)):
        info = attngen.explain(q, k, v, precision="fp8")
        out = attngen.attention(q, k, v, precision="fp8")
    assert info["config_source"] == "forced" and info["launches"][-1]["block_m"] == 16
    from attngen.testing import assert_flash_rule

    ref = refs(q, k, v, False, (-1, -1), 0.0)
    assert_flash_rule("forced", out, ref["out64"], ref["out_pt"], 2.0, 1e-4)


def test_forced_config_is_part_of_the_plan_key():
    """A forced config after a default call of the same shape builds its own plan (and a config
    the filter rejects is refused), as the bf16 plans do."""
    q, k, v = random_inputs((1, 2, 70, 64), (1, 2, 70, 64), (1, 2, 70, 64), dtype=torch.bfloat16, seed=12)
    attngen.attention(q, k, v, precision="fp8")
    with dispatch.forced_config(fwd_fp8=f8.Fp8Config(16, 16, 2, 1)):
        assert attngen.explain(q, k, v, precision="fp8")["config"]["block_m"] == 16
        from attngen.runtime import fp8 as rt_fp8

        before = len(rt_fp8._PLANS)
        attngen.attention(q, k, v, precision="fp8")
        assert len(rt_fp8._PLANS) == before + 1
    with pytest.raises(ValueError, match="cannot launch"):
        with dispatch.forced_config(fwd_fp8=f8.Fp8Config(128, 128, 4, 3, consumers=2)):  # no Gluon kernel at hd64 x 2
            attngen.attention(q, k, v, precision="fp8", causal=True, softcap=5.0)


# ------------------------------------------------------------------------------------------------
# the plan's per-call host work: one allocation for the fp8 buffers, one dict for the launches,
# a warm attention(precision="fp8") without validation


def test_fp8_buffers_are_views_of_one_allocation():
    spec = _spec(80, 48, 2, "none")
    q, k, v = (torch.empty(2, h, 70, d) for h, d in ((4, 80), (2, 80), (2, 48)))
    shapes = {**f8.buffers(spec, q, k, v, False), "Lse": ((2, 4, 70), "fp32")}
    bufs = f8.alloc(shapes, "cpu")
    base = bufs["Q8"].untyped_storage().data_ptr()
    spans = []
    for name, (shape, kind) in shapes.items():
        t = bufs[name]
        assert t.dtype == (E4M3 if kind == "fp8" else torch.float32) and tuple(t.shape) == shape, name
        assert t.is_contiguous() and t.untyped_storage().data_ptr() == base, name
        assert (t.data_ptr() - base) % f8.ALLOC_ALIGN == 0, name
        spans.append((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()))
    spans.sort()
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), "overlapping buffers"
    assert spans[-1][1] <= base + bufs["Q8"].untyped_storage().nbytes()


def _count_empty(monkeypatch):
    calls = []
    empty = torch.empty

    def counting(*a, **kw):
        calls.append(a)
        return empty(*a, **kw)

    monkeypatch.setattr(torch, "empty", counting)
    return calls


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_warm_fp8_call_skips_validation_and_allocates_twice(monkeypatch, layout):
    """A warm attention(precision="fp8") is the fast key's lookup: no validation, and the same
    bytes; the output and the fp8 buffers are its two allocations (the LSE, when returned, a
    third; when not, a view of the buffers' allocation)."""
    from attngen.runtime import validate

    shapes = [(1, 4, 90, 64), (1, 2, 90, 64), (1, 2, 90, 64)]
    if layout == "bshd":
        shapes = [(s[0], s[2], s[1], s[3]) for s in shapes]
    q, k, v = random_inputs(*shapes, dtype=torch.bfloat16, seed=21)
    want, want_lse = attngen.attention(q, k, v, causal=True, precision="fp8", layout=layout, return_lse=True)

    def refuse(*a, **kw):
        raise AssertionError("a warm call validated its arguments")

    monkeypatch.setattr(validate, "check_dense", refuse)
    monkeypatch.setattr(validate, "make_options", refuse)
    calls = _count_empty(monkeypatch)
    out = attngen.attention(q, k, v, causal=True, precision="fp8", layout=layout)
    assert len(calls) == 2 and torch.equal(out, want)
    assert out.is_contiguous() and out.shape == q.shape and out.untyped_storage().nbytes() == out.numel() * 2
    calls.clear()
    out, lse = attngen.attention(q, k, v, causal=True, precision="fp8", layout=layout, return_lse=True)
    assert len(calls) == 3 and torch.equal(out, want) and torch.equal(lse, want_lse)
    assert lse.is_contiguous() and lse.untyped_storage().nbytes() == lse.numel() * 4


def test_fp8_launches_take_the_calls_tensors(monkeypatch):
    """The prologue (one launch) and the attention kernel take their tensors from one dict a call:
    the caller's tensors, the fp8 buffers and descales the attention kernel reads."""
    from attngen.kernels.launch import CompiledLaunch

    q, k, v = random_inputs((1, 2, 40, 32), (1, 2, 40, 32), (1, 2, 40, 16), dtype=torch.bfloat16, seed=22)
    attngen.attention(q, k, v, precision="fp8")
    seen = []
    monkeypatch.setattr(CompiledLaunch, "__call__",
                        lambda self, tensors, ok: seen.append(dict(zip(self.tensor_names, self.pick(tensors)))))
    out, lse = attngen.attention(q, k, v, precision="fp8", return_lse=True)
    pro, attn = seen
    for x, name, buf, scale in ((q, "q", "Q", "QScale"), (k, "k", "K", "KScale"), (v, "v", "Vt", "VScale")):
        assert pro[name] is x and pro[buf if name == "v" else buf + "8"] is attn[buf] and pro[scale] is attn[scale]
    assert pro["cu_seqlens_q"] is None and pro["cu_seqlens_k"] is None
    assert attn["Out"] is out and attn["Lse"] is lse and attn["Q"].dtype == E4M3
    assert pro["Rot"].dtype == torch.bfloat16  # the plan's rotation


def test_none_descale_is_one_tensor_per_device():
    from attngen.runtime import fp8 as rt_fp8

    a = rt_fp8.descale_views("q_descale", None, 2, 4, 2, 300, torch.device("cpu"))
    b = rt_fp8.descale_views("k_descale", None, 1, 2, 2, 90, torch.device("cpu"))
    assert a.shape == (2, 4, 1) and a.stride() == (0, 0, 0) and torch.all(a == 1)
    assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def test_fp8_plans_are_keyed_by_the_alignment_of_q():
    """On a GPU the Gluon kernel reads a 16-bit q by TMA when it quantizes Q itself, and
    attention_fp8's e4m3 q always: a call whose q base is not 16-byte aligned must not reuse the
    plan (or the fast path) of an aligned call with the same shapes and strides (its descriptors
    would be made around a base the copy engine refuses). Here: separate plans and fast-path
    entries, and the same outputs as on contiguous copies."""
    from attngen.runtime import fp8 as rt

    g = torch.Generator().manual_seed(7)
    big = torch.randn(1, 2, 64, 136, generator=g).to(torch.bfloat16)  # rows of 272 bytes
    k, v = (torch.randn(1, 2, 64, 128, generator=g).to(torch.bfloat16) for _ in range(2))
    qa, qm = big[..., :128], big[..., 1:129]  # the same strides, bases 0 and 2 bytes past 16
    assert qa.data_ptr() % 16 == 0 and qm.data_ptr() % 16 == 2 and qa.stride() == qm.stride()
    rt._PLANS.clear(), rt._FAST.clear(), rt._FAST_QUANT.clear()
    with torch.no_grad():
        outs = [attngen.attention(q, k, v, causal=True, precision="fp8") for q in (qa, qm, qa, qm)]
        assert len(rt._PLANS) == 2 and len(rt._FAST) == 2
        for q, o in zip((qa, qm), outs[2:]):
            assert torch.equal(o, attngen.attention(q.contiguous(), k, v, causal=True, precision="fp8"))
        # attention_fp8: e4m3 q at a base 1 byte past 16
        big8 = big.to(torch.float8_e4m3fn)
        k8, v8 = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
        q8a, q8m = big8[..., :128], big8[..., 1:129]
        ones = torch.ones(1, 2)
        outs8 = [attngen.attention_fp8(q, k8, v8, ones, ones, ones) for q in (q8a, q8m, q8a, q8m)]
        assert len(rt._FAST_QUANT) == 2
        for q, o in zip((q8a, q8m), outs8[2:]):
            assert torch.equal(o, attngen.attention_fp8(q.contiguous(), k8, v8, ones, ones, ones))


def test_the_prologue_runs_at_4_warps_only_on_one_hadamard_block_up_to_128_columns():
    """The fused prologue at 4 warps read or wrote out of bounds on the H200 at 96 and 112
    columns (64 + 32 (+ 16): tests/gpu/test_gpu_fp8.py::test_gpu_fp8_prologue_every_width);
    4 warps stay where they were measured faster (one block: 64, 128 columns), 8 elsewhere."""
    assert [f8.quant_warps(w) for w in (16, 32, 64, 128)] == [4, 4, 4, 4]
    assert [f8.quant_warps(w) for w in (40, 80, 96, 112, 192, 256)] == [8] * 6
    spec = KernelSpec("fwd_fp8", "fp8_e4m3", "sm90", 96, 40, 3, "causal")
    q, k, v = (torch.randn(1, h, 64, d).to(torch.bfloat16) for h, d in ((6, 96), (2, 96), (2, 40)))
    bufs = f8.alloc(f8.buffers(spec, q, k, v, False), "cpu")
    la = f8.prologue_launch(loader.load(spec), spec, q, k, v, bufs, None, use_pdl=False)
    assert la.num_warps == 8
