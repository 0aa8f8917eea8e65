"""GPU: the fp8 family (fwd_fp8) against float64 with the flash-attn rule (error <= 2x that of the
same computation in PyTorch, fwd_fp8_tuning.emulate): odd and long shapes, masks, softcap, GQA, head dims
that are not a power of two, packed documents, every tile config of the search space forced, the
pre-quantized entry point with FlashAttention-3's descales, torch.compile and a CUDA graph."""

from __future__ import annotations

import itertools

import pytest
import torch

import attngen
from attngen.families import fwd_fp8 as f8
from attngen.families import fwd_fp8_tuning as f8t
from attngen.problem import attention_ref, random_inputs
from attngen.runtime import dispatch
from attngen.spec import KernelSpec
from attngen.testing import assert_flash_rule
from tests.kernels.test_fp8 import _cid

pytestmark = pytest.mark.gpu
DEV = "cuda"

# (B, Hq, Hkv, Sq, Sk, D, Dv, causal, window, softcap)
CASES = [
    (1, 8, 2, 1023, 1023, 128, 128, True, (-1, -1), 0.0),
    (2, 4, 4, 113, 203, 64, 64, False, (-1, -1), 0.0),
    (1, 4, 1, 4096, 4096, 128, 128, False, (-1, -1), 0.0),
    (1, 2, 2, 2048, 2048, 256, 256, True, (-1, -1), 0.0),
    (1, 4, 2, 1500, 777, 80, 80, True, (300, -1), 0.0),
    (1, 4, 4, 1000, 1000, 64, 64, False, (-1, -1), 30.0),
    (2, 6, 2, 203, 1023, 96, 40, True, (-1, -1), 0.0),
    (1, 4, 2, 1023, 1023, 120, 128, True, (-1, -1), 0.0),  # Q / K padded to 128: the Gluon kernel's path
]


def _refs(q, k, v, **kw):
    o64, l64 = attention_ref(q, k, v, **kw)
    oe, le = f8t.emulate(q, k, v, **kw)
    return {"out64": o64, "lse64": l64, "out_pt": oe, "lse_pt": le}


@pytest.mark.parametrize("case", CASES, ids=_cid)
def test_gpu_fp8_against_float64(case, gpu_records):
    B, hq, hkv, sq, sk, d, dv, causal, window, softcap = case
    q, k, v = random_inputs((B, hq, sq, d), (B, hkv, sk, d), (B, hkv, sk, dv), dtype=torch.bfloat16, device=DEV,
                            seed=21, mults=(4.0 if softcap else 1.0, 1.0, 1.0))
    kw = dict(causal=causal, window_size=window, softcap=softcap)
    with torch.no_grad():
        out, lse = attngen.attention(q, k, v, precision="fp8", return_lse=True, **kw)
    ref = _refs(q, k, v, **kw)
    f8t.check_outputs(_cid(case), out, lse, ref)
    gpu_records.append({"test": "fp8", "case": _cid(case),
                        "err": (out.double() - ref["out64"]).abs().max().item(),
                        "emulation_err": (ref["out_pt"].double() - ref["out64"]).abs().max().item()})


# every tile / warp pair at 3 stages, every stage count and precise_acc on a few: each knob value once
SPACE = ([f8.Fp8Config(m, n, w, 3) for m, n, w in itertools.product(f8.SPACE["block_m"], f8.SPACE["block_n"],
                                                                      f8.SPACE["num_warps"])]
         + [f8.Fp8Config(128, 64, 8, s) for s in f8.SPACE["num_stages"] if s != 3]
         + [f8.Fp8Config(128, 64, 8, 3, True), f8.Fp8Config(64, 128, 4, 2, True)])


@pytest.mark.parametrize("hd, causal", [(128, True), (256, False)])
def test_gpu_fp8_every_config(hd, causal):
    """Configs of the search space (each knob's every value) that the validity filter passes, forced."""
    spec = KernelSpec("fwd_fp8", "fp8_e4m3", "sm90", hd, hd, 2, "causal" if causal else "none")
    q, k, v = random_inputs((1, 4, 1023, hd), (1, 2, 777, hd), (1, 2, 777, hd), dtype=torch.bfloat16, device=DEV,
                            seed=3)
    ref = _refs(q, k, v, causal=causal)
    ran = 0
    for cfg in SPACE:
        if f8.check_fp8(spec, cfg) is not None:
            continue
        with dispatch.forced_config(fwd_fp8=cfg), torch.no_grad():
            out, lse = attngen.attention(q, k, v, causal=causal, precision="fp8", return_lse=True)
        f8t.check_outputs(f"{cfg}", out, lse, ref)
        ran += 1
    assert ran >= 8


def test_gpu_fp8_packed_documents():
    docs_q, docs_k = [1023, 1, 0, 300, 2048], [1023, 700, 5, 301, 2048]
    cu_q = torch.tensor([0] + list(itertools.accumulate(docs_q)), dtype=torch.int32, device=DEV)
    cu_k = torch.tensor([0] + list(itertools.accumulate(docs_k)), dtype=torch.int32, device=DEV)
    q, k, v = random_inputs((sum(docs_q), 8, 128), (sum(docs_k), 2, 128), (sum(docs_k), 2, 128),
                            dtype=torch.bfloat16, device=DEV, seed=5)
    with torch.no_grad():
        out, lse = attngen.attention_varlen(q, k, v, cu_q, cu_k, max(docs_q), max(docs_k), causal=True,
                                            precision="fp8", return_lse=True)
    for i, (nq, nk) in enumerate(zip(docs_q, docs_k)):
        if nq == 0:
            continue
        a = slice(int(cu_q[i]), int(cu_q[i + 1]))
        b = slice(int(cu_k[i]), int(cu_k[i + 1]))
        qd, kd, vd = (x[r].transpose(0, 1)[None] for x, r in ((q, a), (k, b), (v, b)))
        f8t.check_outputs(f"doc {i}", out[a].transpose(0, 1)[None], lse[:, a][None], _refs(qd, kd, vd, causal=True))


def test_gpu_attention_fp8_descales_compile_and_graph():
    q, k, v = random_inputs((2, 8, 1500, 128), (2, 2, 1500, 128), (2, 2, 1500, 128), dtype=torch.bfloat16,
                            device=DEV, seed=8)
    per_kv = [x.float().abs().reshape(2, 2, -1).amax(-1) / 448 for x in (q, k, v)]
    q8 = (q.float() / per_kv[0].repeat_interleave(4, 1)[:, :, None, None]).to(torch.float8_e4m3fn)
    k8, v8 = ((x.float() / d[:, :, None, None]).to(torch.float8_e4m3fn) for x, d in zip((k, v), per_kv[1:]))
    out = attngen.attention_fp8(q8, k8, v8, *per_kv, causal=True)
    deq = [q8.double() * per_kv[0].double().repeat_interleave(4, 1)[:, :, None, None],
           k8.double() * per_kv[1].double()[:, :, None, None], v8.double() * per_kv[2].double()[:, :, None, None]]
    o64, _ = attention_ref(*deq, causal=True)
    oe, _ = f8t.emulate(*(x.float() for x in deq), rotate=False, causal=True)
    assert_flash_rule("attention_fp8", out, o64, oe.to(torch.bfloat16), 2.0, 1e-3)
    # (B, S, H, D) views: V reaches the copy kernel with other strides, the same bytes come out
    bshd = [x.transpose(1, 2).contiguous() for x in (q8, k8, v8)]
    out2 = attngen.attention_fp8(*bshd, *per_kv, causal=True, layout="bshd")
    torch.testing.assert_close(out2.transpose(1, 2), out, atol=0, rtol=0)

    def fn(q, k, v):
        return attngen.attention(q, k, v, causal=True, precision="fp8")

    with torch.no_grad():
        eager = fn(q, k, v)
        compiled = torch.compile(fn, fullgraph=True)(q, k, v)
        torch.testing.assert_close(compiled, eager, atol=0, rtol=0)
        g = torch.cuda.CUDAGraph()
        fn(q, k, v)
        with torch.cuda.graph(g):
            graphed = fn(q, k, v)
        q.copy_(torch.randn_like(q))
        g.replay()
        torch.testing.assert_close(graphed, fn(q, k, v), atol=0, rtol=0)


def test_gpu_fp8_q_inside_takes_bshd_views_and_says_so():
    """attention(precision="fp8") on dense calls: the Gluon kernel quantizes Q itself (explain()
    says so, with and without rotation), also from a (B, S, H, D) view (its TMA descriptor over
    the strided view), with the same output bit for bit as the (B, H, S, D) call; against float64
    within the budget of the same computation with one descale per row of Q."""
    q, k, v = random_inputs((1, 8, 1531, 128), (1, 2, 1531, 128), (1, 2, 1531, 128), dtype=torch.bfloat16,
                            device=DEV, seed=44)
    qs, ks, vs = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    for rotate in (True, False):
        for args, layout in (((q, k, v), "bhsd"), ((qs, ks, vs), "bshd")):
            info = attngen.explain(*args, causal=True, precision="fp8", rotate=rotate, layout=layout)
            assert info["q_in_kernel"] is True, (rotate, layout, info)
            assert [la["entry"] for la in info["launches"]] == ["_fp8_quant_qkv", "_attn_fwd_fp8_ws"], info
    with torch.no_grad():
        out = attngen.attention(q, k, v, causal=True, precision="fp8")
        out_s = attngen.attention(qs, ks, vs, causal=True, precision="fp8", layout="bshd")
    torch.testing.assert_close(out_s.transpose(1, 2), out, atol=0, rtol=0)
    o64, _ = attention_ref(q, k, v, causal=True)
    oe, _ = f8t.emulate(q, k, v, causal=True, q_rows=True)
    assert_flash_rule("q inside", out, o64, oe, 2.0, 1e-3)


def _e4m3_ulp(x: torch.Tensor) -> torch.Tensor:
    """The spacing of e4m3 values at |x| (3 mantissa bits; subnormals 2^-9 apart)."""
    e = torch.floor(torch.log2(x.abs().clamp_min(2.0 ** -6)))
    return torch.exp2(e - 3)


def _close_e4m3(name: str, got: torch.Tensor, ref: torch.Tensor) -> None:
    """got (e4m3 as float64) equals ref except for roundings of ties the other way: at most one
    e4m3 step apart, on at most 1 in 1000 entries (the kernel's fp32 rotation sums and x * (1 / d)
    against float64 and x / d)."""
    assert torch.isfinite(got).all(), f"{name}: non-finite values (poison left)"
    diff = (got - ref).abs()
    step = _e4m3_ulp(torch.maximum(got.abs(), ref.abs()))
    assert bool((diff <= step * 1.0001).all()), f"{name}: off by more than one e4m3 step: max {diff.max().item()}"
    off = int((diff > 0).sum())
    assert off <= max(4, ref.numel() // 1000), f"{name}: {off} of {ref.numel()} entries differ"


@pytest.mark.parametrize("width, dv", [(w, w) for w in range(16, 257, 16)] + [(96, 40), (120, 128)])
def test_gpu_fp8_prologue_every_width(width, dv):
    """The prologue as the runtime launches it (one launch, Q, K and V programs, the warps of
    fwd_fp8.quant_warps) on every qk width from 16 to 256 columns, against PyTorch: Q and K
    rotated by rotation_matrix in float64 and quantized per block of 128 rows, V quantized and
    transposed (keys in the Gluon kernel's order where the module uses it), V^T's padding zero.
    Outputs poisoned before the launch. (At 4 warps the fused launch faulted at 96 and 112
    columns on the H200.)"""
    from attngen.runtime import loader

    spec = KernelSpec("fwd_fp8", "fp8_e4m3", "sm90", width, dv, 3, "causal")
    mod = loader.load(spec)
    B, hq, hkv, sq, sk = 2, 6, 2, 203, 1023
    q, k, v = random_inputs((B, hq, sq, width), (B, hkv, sk, width), (B, hkv, sk, dv), dtype=torch.bfloat16,
                            device=DEV, seed=width + dv)
    w = f8.qk_width(spec)
    perm16 = bool(mod.WS_KEY_ORDER16)
    bufs = f8.alloc(f8.buffers(spec, q, k, v, False), DEV)
    for t in bufs.values():
        (t.view(torch.uint8).fill_(0x7F) if t.dtype == torch.float8_e4m3fn else t.fill_(float("nan")))
    la = f8.prologue_launch(mod, spec, q, k, v, bufs, f8.rotation(w, f8.ROTATION_SEED, q.dtype, DEV), perm16=perm16,
                            use_pdl=False)
    la.run()
    torch.cuda.synchronize()
    m = f8t.rotation_matrix(width).to(DEV)
    for name, x, s in (("Q", q, sq), ("K", k, sk)):
        x8, d = f8t.quantize_ref((x.double() @ m).float())
        _close_e4m3(f"{name}8 w{width}", bufs[name + "8"][..., :s, :].double(), x8)
        torch.testing.assert_close(bufs[name + "Scale"][..., :d.shape[-1]], d, rtol=1e-5, atol=0)
    _, vd = f8t.quantize_ref(v.float())
    torch.testing.assert_close(bufs["VScale"][..., :vd.shape[-1]], vd, rtol=1e-5, atol=0)
    vt = bufs["Vt"].double()  # (B, Hkv, Dv, S_pad), keys contiguous (in the Gluon kernel's order: perm16)
    v8, _ = f8t.quantize_ref(v.float())
    want = torch.zeros_like(vt)
    want[..., :sk] = v8.transpose(-1, -2)
    padding = torch.arange(vt.shape[-1], device=DEV) >= sk
    if perm16:
        want, padding = f8.permute_keys16(want), f8.permute_keys16(padding[None])[0]
    _close_e4m3(f"V8 w{width}", vt, want)
    assert bool((vt[..., padding] == 0).all()), "V^T's padding past the keys is not zero"


def test_gpu_fp8_q_base_off_16_bytes_keeps_the_prologues_q8():
    """A 16-bit q whose base is 2 bytes past a multiple of 16 (the copy engine refuses it) on the
    same shapes and strides as an aligned one: the aligned call quantizes Q inside the Gluon
    kernel, the misaligned one keeps the prologue's Q8 (explain() says which), the two calls in
    either order do not share a plan, and each is within the flash rule of float64 against its
    own emulation (one descale per row of Q inside, per block of 128 rows in the prologue)."""
    from attngen.runtime import fp8 as rt_fp8

    g = torch.Generator(device=DEV).manual_seed(45)
    big = torch.randn(1, 8, 1531, 136, generator=g, device=DEV).to(torch.bfloat16)  # rows of 272 bytes
    _, k, v = random_inputs((1, 8, 1531, 128), (1, 2, 1531, 128), (1, 2, 1531, 128), dtype=torch.bfloat16,
                            device=DEV, seed=45)
    qa, qm = big[..., :128], big[..., 1:129]
    assert qa.data_ptr() % 16 == 0 and qm.data_ptr() % 16 == 2 and qa.stride() == qm.stride()
    assert attngen.explain(qa, k, v, causal=True, precision="fp8")["q_in_kernel"] is True
    assert attngen.explain(qm, k, v, causal=True, precision="fp8")["q_in_kernel"] is False
    for order in ((qa, qm), (qm, qa)):
        rt_fp8._PLANS.clear(), rt_fp8._FAST.clear()
        with torch.no_grad():
            outs = [attngen.attention(q, k, v, causal=True, precision="fp8") for q in order + order]
        for q, o, again in zip(order, outs[:2], outs[2:]):
            assert torch.equal(o, again)
            o64, _ = attention_ref(q, k, v, causal=True)
            oe, _ = f8t.emulate(q, k, v, causal=True, q_rows=q is qa)
            assert_flash_rule(f"q base {q.data_ptr() % 16}", o, o64, oe, 2.0, 1e-3)


@pytest.mark.parametrize("consumers", [0, 1, 2])
def test_gpu_fp8_programmatic_dependent_launch(monkeypatch, consumers):
    """On sm90 the attention launch follows the prologue with programmatic dependent launch (its
    programs may start while the prologue's last ones run, and wait inside for its outputs): the
    compiled attention kernel carries the launch attribute, and its outputs are bit for bit those
    of the same plan built without it, over repeated calls whose prologue is long (B2 H8 S4096:
    a wait placed after a read would read the previous call's or unwritten e4m3 tensors)."""
    from attngen.runtime import fp8 as rt_fp8

    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("programmatic dependent launch needs sm90")
    cfg = {0: f8.Fp8Config(128, 64, 8, 3), 1: f8.WS_FP8_ONE, 2: f8.WS_FP8_DEFAULT}[consumers]
    q, k, v = random_inputs((2, 8, 4096, 128), (2, 4, 4096, 128), (2, 4, 4096, 128), dtype=torch.bfloat16,
                            device=DEV, seed=43)
    got = {}
    for on in (True, False):
        monkeypatch.setattr(f8, "pdl", lambda t, on=on: on)
        rt_fp8._FAST.clear(), rt_fp8._PLANS.clear()
        outs = []
        with torch.no_grad(), dispatch.forced_config(fwd_fp8=cfg):
            for i in range(4):  # fresh inputs between calls: each call's prologue rewrites its buffers
                qi, ki, vi = (x * (1 + i / 8) for x in (q, k, v))
                outs.append(attngen.attention(qi, ki, vi, causal=True, precision="fp8", return_lse=True))
        plan = list(rt_fp8._PLANS.values())[-1]
        attn = plan.launches[-1]
        assert attn.fn.__name__ == ("_attn_fwd_fp8_ws" if consumers else "_attn_fwd_fp8")
        assert bool(attn.kernel.metadata.launch_pdl) is on and not plan.launches[0].kernel.metadata.launch_pdl
        got[on] = outs
    for (o1, l1), (o0, l0) in zip(got[True], got[False]):
        assert torch.equal(o1, o0) and torch.equal(l1, l0)
    ref = _refs(q, k, v, causal=True)
    f8t.check_outputs("pdl", *got[True][0], ref)
