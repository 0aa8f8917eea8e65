"""Expression kernels (mask_mod / score_mod / sinks) through the interpreter, against a float64
reference that evaluates the same callables in PyTorch: the flash-attn rule on the output (2x a
same-precision PyTorch implementation's error) and the gradients (3x), sinks included; both
kernel targets forced; odd shapes, GQA, Sq != Sk; determinism; errors."""

from __future__ import annotations

import math

import pytest
import torch

import attngen
from attngen.runtime import api, dispatch
from attngen.testing import assert_flash_rule, check_grads


def reference(q, k, v, mask_mod=None, score_mod=None, sinks=None, causal=False, upcast=True, scale=None):
    """Attention with the same callables applied to broadcast index tensors; q_idx bottom-right.
    upcast: float64 (the reference); else the inputs' precision for the scores and P.V (the
    yardstick of the flash-attn rule; softmax in fp32 as PyTorch's kernels). scale: 1/sqrt(D)."""
    dt = torch.float64 if upcast else q.dtype
    B, Hq, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    q, k, v = q.to(dt), k.to(dt).repeat_interleave(Hq // Hkv, 1), v.to(dt).repeat_interleave(Hq // Hkv, 1)
    s = (q @ k.transpose(-1, -2)).to(torch.float64 if upcast else torch.float32) * (scale if scale is not None else 1.0 / math.sqrt(D))
    dev = q.device
    b = torch.arange(B, device=dev)[:, None, None, None]
    h = torch.arange(Hq, device=dev)[None, :, None, None]
    qi = torch.arange(Sq, device=dev)[None, None, :, None] + (Sk - Sq)
    ki = torch.arange(Sk, device=dev)[None, None, None, :]
    if score_mod is not None:
        s = score_mod(s, b, h, qi, ki)
    keep = torch.ones_like(s, dtype=torch.bool)
    if mask_mod is not None:
        keep = keep & mask_mod(b, h, qi, ki)
    if causal:
        keep = keep & (ki <= qi)
    s = s.masked_fill(~keep, float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.to(s.dtype)[None, :, None, None].expand(B, Hq, Sq, 1)], -1)
    p = torch.softmax(s, -1)
    if sinks is not None:
        p = p[..., :-1]
    p = torch.nan_to_num(p)  # rows the mask leaves empty: zero output, as the kernels
    return p.to(dt) @ v


def _inputs(B, Hq, Hkv, Sq, Sk, D, dtype, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g).to(dtype).to(device)  # noqa: E731
    return mk(B, Hq, Sq, D), mk(B, Hkv, Sk, D), mk(B, Hkv, Sk, D), mk(B, Hq, Sq, D)


SLOPES = torch.tensor([0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625])
PREFIX = torch.tensor([40, 7], dtype=torch.int32)
SINKS = torch.tensor([0.5, -1.0, 2.0, 0.0, 1.5, -0.5])
T5_BIAS = torch.linspace(-1.0, 1.0, 6 * 32).reshape(6, 32)
# an id per position, not sorted, one id in two runs, as two tensors (query-side and key-side ids,
# as in packed cross-attention): not a run pattern, so each loop tests its tiles and skips those
# whose rows' and keys' ids cannot meet (tile bounds of a gathered parameter)
# sorted ids (documents packed in order): the runs bound the key / query loops and make full tiles
DOC_SORTED = torch.cat([torch.full((n,), i, dtype=torch.int32) for n, i in ((30, 0), (50, 1), (9, 2), (200, 3),
                                                                              (735, 4))])
DOC_IDS = torch.cat([torch.full((n,), i, dtype=torch.int32) for n, i in ((70, 3), (20, 1), (210, 2), (400, 1),
                                                                           (324, 0))])


def t5_bucket(rel):
    """T5's bidirectional relative-position bucket (32 buckets, max distance 128)."""
    ret = torch.where(rel > 0, 16, 0)
    n = rel.abs()
    large = torch.clamp(8 + (torch.log(torch.clamp(n, min=1) / 8.0) / math.log(128 / 8) * 8).floor().long(), max=15)
    return ret + torch.where(n < 8, n, large)


def cases(device="cpu") -> dict:
    """name: (mask_mod, score_mod, sinks, causal), the captured tensors on `device`."""
    slopes, prefix, t5, doc = SLOPES.to(device), PREFIX.to(device), T5_BIAS.to(device), DOC_IDS.to(device)
    srt, kdoc = DOC_SORTED.to(device), DOC_IDS.clone().to(device)
    return {
        "documents_sorted": (lambda b, h, q, k: (srt[q] == srt[k]) & (k <= q), None, None, False),
        "document_ids": (lambda b, h, q, k: (doc[q] == kdoc[k]) & (k <= q), None, None, False),
        # one unsorted tensor compared along both indices: a run pattern whose runs bound nothing
        # (XR_'s flag 0: whole ranges, no full tiles)
        "documents_unsorted": (lambda b, h, q, k: (doc[q] == doc[k]) & (k <= q), None, None, False),
        "chunked": (lambda b, h, q, k: (k <= q) & (q // 32 == k // 32), None, None, False),
        "prefix_lm": (lambda b, h, q, k: (k <= q) | (k < prefix[b]), None, None, False),
        "alibi_causal": (None, lambda s, b, h, q, k: s - slopes[h] * (q - k).abs(), None, True),
        "gpt_oss_swa_sinks": (lambda b, h, q, k: (k <= q) & (q - k < 16), None, SINKS, False),
        "sink_window": (lambda b, h, q, k: (k <= q) & ((k < 4) | (q - k < 24)), None, None, False),
        "t5_bias": (None, lambda s, b, h, q, k: s + t5[h, t5_bucket(k - q)], None, False),
        "softcap_expr": (None, lambda s, b, h, q, k: 30.0 * torch.tanh(s / 30.0), None, True),
        "sinks_causal": (None, None, SINKS, True),
        # a mask that differs between the query heads of one KV head's group (GQA 3:1 here): the
        # dK/dV pass's query range holds for every head it loops over
        "head_mask": (lambda b, h, q, k: (k <= q) | (h == 1), None, None, False),
    }


CASES = cases()


def _run(name, dtype, B, Hq, Hkv, Sq, Sk, D, seed, target, device="cpu"):
    mask_mod, score_mod, sinks, causal = cases(device)[name]
    q, k, v, dout = _inputs(B, Hq, Hkv, Sq, Sk, D, dtype, seed, device)
    sinks = None if sinks is None else sinks.to(device)
    sinks_t = None if sinks is None else sinks[:Hq].clone().requires_grad_(True)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    with dispatch.forced_target(target):  # the forward and the backward of the target's family
        out = attngen.attention(*leaves, causal=causal, mask_mod=mask_mod, score_mod=score_mod, sinks=sinks_t)
        grads = torch.autograd.grad(out, leaves + ([sinks_t] if sinks_t is not None else []), dout)
    ref = reference(q, k, v, mask_mod, score_mod, None if sinks is None else sinks[:Hq], causal)
    ref_pt = reference(q, k, v, mask_mod, score_mod, None if sinks is None else sinks[:Hq], causal, upcast=False)
    assert_flash_rule(f"{name}/out", out, ref, ref_pt, 2.0)

    def fn(q_, k_, v_, *s_, upcast):
        return reference(q_, k_, v_, mask_mod, score_mod, s_[0] if s_ else None, causal, upcast)

    inputs = [q, k, v] + ([sinks[:Hq].to(dtype)] if sinks is not None else [])
    check_grads(name, fn, inputs, dout, grads[:3])
    if sinks is not None:
        # dsinks = -sum_rows exp(sink - lse) D with D = sum_j P dP as the dQ pass sums it (with D
        # from the rounded output, rowsum(dO * O), bf16 measured 3.9x the yardstick here)
        check_grads(name, fn, inputs, dout, (None, None, None, grads[3]), names=(None, None, None, "dsinks"))
    return out, grads


@pytest.mark.parametrize("name", sorted(CASES))
def test_expression_kernels(name):
    # odd lengths, GQA 3:1, Sq != Sk (bottom-right), head dim 40 (a padded tile)
    _run(name, torch.float16, 2, 6, 2, 77, 113, 40, seed=1, target="sm80")


@pytest.mark.parametrize("name", ["chunked", "gpt_oss_swa_sinks", "t5_bias"])
def test_expression_kernels_sm90_bf16(name):
    # the sm90 family's module (its expression kernels are the pointer kernels), bf16, Sq == Sk
    _run(name, torch.bfloat16, 1, 4, 4, 113, 113, 64, seed=2, target="sm90")


def test_expression_gradients_deterministic():
    a = _run("alibi_causal", torch.float16, 1, 2, 1, 65, 65, 32, seed=3, target="sm80")
    b = _run("alibi_causal", torch.float16, 1, 2, 1, 65, 65, 32, seed=3, target="sm80")
    for x, y in zip(a[1], b[1]):
        assert torch.equal(x, y), "expression backward is not bitwise reproducible"


def test_expression_text_and_params():
    q, k, v, _ = _inputs(1, 2, 2, 33, 33, 32, torch.float16, 4)
    slope = torch.tensor([0.3, 0.1])
    out = attngen.attention(q, k, v, mask_mod="kv_idx <= q_idx", score_mod="score - slope[h] * abs(q_idx - kv_idx)",
                            params={"slope": slope})
    ref = reference(q, k, v, lambda b, h, qi, ki: ki <= qi, lambda s, b, h, qi, ki: s - slope[h] * (qi - ki).abs())
    ref_pt = reference(q, k, v, lambda b, h, qi, ki: ki <= qi, lambda s, b, h, qi, ki: s - slope[h] * (qi - ki).abs(),
                       upcast=False)
    assert_flash_rule("text", out, ref, ref_pt, 2.0)


def test_empty_rows_and_all_masked():
    # a mask that keeps nothing for some rows: zero output there, no NaN; with sinks: lse = sink
    q, k, v, _ = _inputs(1, 2, 2, 40, 40, 32, torch.float16, 5)
    out, lse = attngen.attention(q, k, v, mask_mod=lambda b, h, qi, ki: (qi >= 20) & (ki < qi - 19), return_lse=True)
    assert torch.isfinite(out).all()
    assert (out[:, :, :20] == 0).all() and torch.isneginf(lse[:, :, :20]).all()
    s = torch.tensor([1.0, -2.0])
    out, lse = attngen.attention(q, k, v, mask_mod=lambda b, h, qi, ki: ki > 1000, sinks=s, return_lse=True)
    assert (out == 0).all()
    torch.testing.assert_close(lse, s[None, :, None].expand_as(lse), msg="lse of a row that saw only the sink")


@pytest.mark.parametrize("kw, match", [
    ({"mask_mod": "kv_idx <= q_idx and foo"}, "unknown name 'foo'"),
    ({"mask_mod": "kv_idx + 1"}, "must be a boolean"),
    ({"score_mod": "score + bias[h]", "params": {"bias": torch.zeros(2, 3)}}, "2 axes"),
    ({"mask_mod": lambda b, h, q, k: torch.sin(q) > 0}, "sin"),
    ({"sinks": torch.zeros(3)}, r"sinks: expected shape \(2,\)"),
    ({"mask_mod": "kv_idx < n", "params": {"n": torch.ones((), requires_grad=True)}}, "used in the mask"),
    ({"score_mod": "score", "params": {"unused": torch.ones(2)}}, "not used"),
])
def test_expression_errors(kw, match):
    q, k, v, _ = _inputs(1, 2, 2, 16, 16, 32, torch.float16, 6)
    with pytest.raises(ValueError, match=match):
        attngen.attention(q, k, v, **kw)


def test_poisoned_output_overwritten():
    # every output row is written (rows fully masked get zeros, never stale memory)
    q, k, v, _ = _inputs(1, 2, 1, 50, 50, 32, torch.float16, 7)
    torch.manual_seed(0)
    a = attngen.attention(q, k, v, mask_mod=lambda b, h, qi, ki: (ki <= qi) & (qi // 16 == ki // 16))
    ref = reference(q, k, v, lambda b, h, qi, ki: (ki <= qi) & (qi // 16 == ki // 16))
    ref_pt = reference(q, k, v, lambda b, h, qi, ki: (ki <= qi) & (qi // 16 == ki // 16), upcast=False)
    assert_flash_rule("chunk16", a, ref, ref_pt, 2.0)


def test_learnable_parameter_gradients():
    # T5's learned bias table (a general index: the bucket) and per-head ALiBi slopes, learned:
    # gradients against float64, the flash-attn rule; bitwise equal on a second run
    q, k, v, dout = _inputs(2, 4, 2, 45, 61, 32, torch.float16, 8)
    g = torch.Generator().manual_seed(9)
    bias0, slope0 = torch.randn(4, 32, generator=g) * 0.5, torch.rand(4, generator=g) * 0.2

    def grads(bias, slope, upcast=None):
        mod = lambda s, b, h, qi, ki: s + bias[h, t5_bucket(ki - qi)] - slope[h] * (qi - ki).abs()  # noqa: E731
        if upcast is None:
            out = attngen.attention(q, k, v, score_mod=mod, causal=True)
        else:
            out = reference(q, k, v, None, mod, None, True, upcast=upcast)
        return torch.autograd.grad(out, (bias, slope), dout.double() if upcast else dout)

    leaf = lambda t, dt=torch.float32: t.clone().to(dt).requires_grad_(True)  # noqa: E731
    got = grads(leaf(bias0), leaf(slope0))
    ref = grads(leaf(bias0, torch.float64), leaf(slope0, torch.float64), upcast=True)
    pt = grads(leaf(bias0), leaf(slope0), upcast=False)
    assert_flash_rule("t5_bias/dbias", got[0], ref[0], pt[0], 3.0)
    # the slopes' gradient weighs each pair's dS by |q - k| (up to 60 here): it is summed as
    # sum P dP w - sum_i D_i sum_j P w with each row's exact D (with the D of the rounded output,
    # rowsum(dO * O), it measured 4.0x the yardstick)
    assert_flash_rule("alibi/dslope", got[1], ref[1], pt[1], 3.0)
    again = grads(leaf(bias0), leaf(slope0))
    assert torch.equal(got[0], again[0]) and torch.equal(got[1], again[1]), "parameter gradients not reproducible"


TMA_PATHS = {
    # the sm90 family's TMA kernels, each knob the dispatcher can choose for them
    "tma": (dict(tma=True), dict(tma=True)),
    "tma_ws_qregs": (dict(tma=True, warp_specialize=True, q_regs=True), dict(tma=True, dq_regs=True)),
    "tma_persistent_split": (dict(tma=True, persistent=2, lazy_rescale=True), dict(tma=True, split_dkdv=True)),
}


@pytest.mark.parametrize("name, path", [(n, p) for n in ["prefix_lm", "gpt_oss_swa_sinks", "t5_bias"] for p in sorted(TMA_PATHS)]
                         + [("document_ids", "tma"), ("documents_sorted", "tma_persistent_split")])
def test_expression_tma_kernels(name, path):
    # document_ids: the TMA passes' per-tile tests of a gathered parameter (split dK / dV too)
    from attngen.families.bwd import BwdConfig
    from attngen.families.fwd import FwdConfig

    f, b = TMA_PATHS[path]
    api.clear_plans()
    warps = 8 if f.get("warp_specialize") else 4
    with dispatch.forced_config(fwd=FwdConfig(32, 32, warps, 2, **f), bwd=BwdConfig(32, 32, 4, 2, 32, 32, 4, 2, **b)):
        _run(name, torch.bfloat16, 2, 4, 2, 77, 113, 64, seed=13, target="sm90")
    launched = {n for kind in api.launched().values() for n, _ in kind}
    assert {"_attn_fwd_tma", "_attn_bwd_dkdv_tma", "_attn_bwd_dq_tma"} <= launched, launched


DECODE_CASES = ["gpt_oss_swa_sinks", "chunked", "alibi_causal", "t5_bias", "documents_sorted"]


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("name", DECODE_CASES)
def test_expression_decode(name, paged):
    decode_case(name, paged)


def decode_case(name, paged, device="cpu"):
    """attention_with_kvcache with expressions: rows of different lengths, 2 new tokens appended,
    GQA 3 (the tile packs a KV head's query heads: h varies by row), split over the key axis; the
    inputs made on the CPU, the call on `device`, the reference in float64 on the CPU."""
    mask_mod, score_mod, sinks, causal = cases()[name]
    dev_mask = None if mask_mod is None or device == "cpu" else cases(device)[name][0]
    dev_score = None if score_mod is None or device == "cpu" else cases(device)[name][1]
    g = torch.Generator().manual_seed(14)
    B, Hq, Hkv, D, Sq, page = 3, 6, 2, 64, 2, 16
    lens = [37, 100, 5]
    cap = 112
    mk = lambda *s: torch.randn(*s, generator=g).to(torch.float16)  # noqa: E731
    q, kn, vn = mk(B, Sq, Hq, D), mk(B, Sq, Hkv, D), mk(B, Sq, Hkv, D)
    kc, vc = mk(B, cap, Hkv, D), mk(B, cap, Hkv, D)
    seqlens = torch.tensor(lens, dtype=torch.int32)
    if paged:
        perm = torch.randperm(B * cap // page, generator=g)
        table = perm.reshape(B, cap // page).to(torch.int32)
        kp, vp = torch.empty(B * cap // page, page, Hkv, D, dtype=kc.dtype), torch.empty(B * cap // page, page, Hkv, D,
                                                                                          dtype=vc.dtype)
        kp[table.flatten().long()] = kc.reshape(-1, page, Hkv, D)
        vp[table.flatten().long()] = vc.reshape(-1, page, Hkv, D)
        caches, kw = (kp, vp), {"block_table": table}
    else:
        caches, kw = (kc.clone(), vc.clone()), {}
    s = None if sinks is None else sinks[:Hq]
    if device == "cpu":
        out = attngen.attention_with_kvcache(q, *caches, seqlens, k=kn, v=vn, causal=causal, mask_mod=mask_mod,
                                             score_mod=score_mod, sinks=s, num_splits=3, **kw)
    else:
        to = lambda t: None if t is None else t.to(device)  # noqa: E731
        dev_kw = {key: to(t) for key, t in kw.items()}
        out = attngen.attention_with_kvcache(to(q), *[to(c) for c in caches], to(seqlens), k=to(kn), v=to(vn),
                                             causal=causal, mask_mod=dev_mask or mask_mod,
                                             score_mod=dev_score or score_mod, sinks=to(s), num_splits=3,
                                             **dev_kw).cpu()
    for b, n in enumerate(lens):
        keys = torch.cat([kc[b, :n], kn[b]]).transpose(0, 1)[None]
        vals = torch.cat([vc[b, :n], vn[b]]).transpose(0, 1)[None]
        qb = q[b].transpose(0, 1)[None]
        mm = None if mask_mod is None else (lambda bb, h, qi, ki, b=b: mask_mod(bb * 0 + b, h, qi, ki))
        sm = None if score_mod is None else (lambda sc, bb, h, qi, ki, b=b: score_mod(sc, bb * 0 + b, h, qi, ki))
        ref = reference(qb, keys, vals, mm, sm, s, causal)
        ref_pt = reference(qb, keys, vals, mm, sm, s, causal, upcast=False)
        assert_flash_rule(f"{name}/decode/row{b}", out[b].transpose(0, 1)[None], ref, ref_pt, 2.0)


def test_expression_varlen_sinks():
    # packed documents with a mask expression and sinks: each document on its own against float64
    g = torch.Generator().manual_seed(15)
    lens = [37, 5, 66]
    Hq, Hkv, D = 4, 2, 32
    T = sum(lens)
    mk = lambda *s: torch.randn(*s, generator=g).to(torch.float16)  # noqa: E731
    q, k, v, dout = mk(T, Hq, D), mk(T, Hkv, D), mk(T, Hkv, D), mk(T, Hq, D)
    cu = torch.tensor([0, 37, 42, 108], dtype=torch.int32)
    sinks = torch.randn(Hq, generator=g).requires_grad_(True)
    mask_mod = lambda b, h, qi, ki: (ki <= qi) & ((qi - ki < 9) | (ki < 2))  # noqa: E731
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = attngen.attention_varlen(*leaves, cu, cu, 66, 66, mask_mod=mask_mod, sinks=sinks)
    grads = torch.autograd.grad(out, leaves + [sinks], dout)
    dsinks_ref = torch.zeros(Hq, dtype=torch.float64)
    for a, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
        doc = [t[a:e].transpose(0, 1)[None] for t in (q, k, v)]
        ref = reference(*doc, mask_mod, None, sinks.detach())
        ref_pt = reference(*doc, mask_mod, None, sinks.detach(), upcast=False)
        assert_flash_rule(f"doc{a}", out[a:e].transpose(0, 1)[None], ref, ref_pt, 2.0)
        s64 = sinks.detach().double().requires_grad_(True)
        r = reference(*doc, mask_mod, None, s64)
        dsinks_ref += torch.autograd.grad(r, s64, dout[a:e].transpose(0, 1)[None].double())[0]
    torch.testing.assert_close(grads[3].double(), dsinks_ref, atol=2e-3, rtol=1e-2, msg="packed sinks' gradient")


def test_expressions_under_torch_compile():
    # torch.compile(fullgraph=True): expressions as text, a learnable parameter and sinks through
    # the custom ops; the same outputs and gradients as the eager call, bitwise
    q, k, v, dout = _inputs(1, 4, 2, 45, 61, 32, torch.float16, 16)
    slope0, sinks0 = torch.rand(4) * 0.2, torch.randn(4)

    def fn(q, k, v, slope, sinks):
        return attngen.attention(q, k, v, mask_mod="kv_idx <= q_idx and (q_idx - kv_idx < 24 or kv_idx < 3)",
                                 score_mod="score - slope[h] * abs(q_idx - kv_idx)", params={"slope": slope},
                                 sinks=sinks)

    def run(f):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v, slope0, sinks0)]
        out = f(*leaves)
        return out, torch.autograd.grad(out, leaves, dout)

    out_c, grads_c = run(torch.compile(fn, fullgraph=True, backend="aot_eager"))
    out_e, grads_e = run(fn)
    assert torch.equal(out_c, out_e)
    for a, b in zip(grads_c, grads_e):
        assert torch.equal(a, b)
    # an int32 parameter (prefix lengths): no gradient, the same output
    pl = torch.tensor([10], dtype=torch.int32)
    pfx = lambda q, k, v: attngen.attention(q, k, v, mask_mod="kv_idx <= q_idx or kv_idx < pl[b]",  # noqa: E731
                                            params={"pl": pl})
    assert torch.equal(torch.compile(pfx, fullgraph=True, backend="aot_eager")(q, k, v), pfx(q, k, v))
    with pytest.raises(Exception, match="as text"):
        torch.compile(lambda q, k, v: attngen.attention(q, k, v, mask_mod=lambda b, h, i, j: j <= i),
                      fullgraph=True, backend="aot_eager")(q, k, v)


def test_variant_by_name():
    # a shipped spec entry by name: its mask, window, scale and expressions, the call's tensors;
    # the same as spelling them out, and the entry's generated kernel runs
    from attngen.runtime import loader

    q, k, v, _ = _inputs(2, 8, 1, 40, 40, 64, torch.float16, 17)
    sinks = torch.randn(8)
    api.clear_plans()
    out = attngen.attention(q, k, v, variant="gpt_oss_20b_sliding", sinks=sinks)
    assert loader.built_module_path(list(api._FWD.values())[0].spec) is not None
    ref = attngen.attention(q, k, v, causal=True, window_size=(127, 0), sinks=sinks)
    assert torch.equal(out, ref)
    slope = torch.rand(1)
    out = attngen.attention(q[:, :1], k, v, variant="bloom_560m", params={"slope": slope})
    ref = attngen.attention(q[:, :1], k, v, causal=True, score_mod="score - slope[h] * abs(q_idx - kv_idx)",
                            params={"slope": slope})
    assert torch.equal(out, ref)
    for kw, match in [({"variant": "nope"}, "unknown name"), ({"variant": "gpt_oss_20b_sliding"}, "sinks"),
                      ({"variant": "gpt_oss_20b_sliding", "sinks": sinks, "causal": True}, "causal: variant"),
                      ({"variant": "bloom_560m"}, "needs 'slope'")]:
        with pytest.raises(ValueError, match=match):
            attngen.attention(q, k, v, **kw)


def test_kvcache_expressions_under_torch_compile():
    # attention_with_kvcache under torch.compile(fullgraph=True) with expressions as text, a
    # parameter and sinks: one custom op; the same output as the eager call, bitwise, and the same
    # append into the cache
    g = torch.Generator().manual_seed(17)
    B, Hq, Hkv, D, cap = 2, 4, 2, 32, 64
    mk = lambda *s: torch.randn(*s, generator=g).to(torch.float16)  # noqa: E731
    q, kn, vn = mk(B, 1, Hq, D), mk(B, 1, Hkv, D), mk(B, 1, Hkv, D)
    kc, vc = mk(B, cap, Hkv, D), mk(B, cap, Hkv, D)
    lens = torch.tensor([21, 50], dtype=torch.int32)
    slope, sinks = torch.rand(Hq) * 0.2, torch.randn(Hq)
    kw = dict(mask_mod="(kv_idx <= q_idx) and (q_idx - kv_idx < 24 or kv_idx < 3)",
              score_mod="score - s[h] * abs(q_idx - kv_idx)", params={"s": slope}, sinks=sinks)

    def fn(q, kc, vc, lens, kn, vn):
        return attngen.attention_with_kvcache(q, kc, vc, lens, k=kn, v=vn, causal=False, **kw)

    caches = [(kc.clone(), vc.clone()) for _ in range(2)]
    with torch.no_grad():
        eager = fn(q, *caches[0], lens, kn, vn)
        compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")(q, *caches[1], lens, kn, vn)
    assert torch.equal(eager, compiled)
    assert torch.equal(caches[0][0], caches[1][0]) and torch.equal(caches[0][1], caches[1][1])
    with pytest.raises(Exception, match="mask_mod: inside torch.compile attngen takes expressions as text"):
        with torch.no_grad():
            torch.compile(lambda q: attngen.attention_with_kvcache(
                q, kc, vc, lens, mask_mod=lambda b, h, qi, ki: ki <= qi), fullgraph=True, backend="aot_eager")(q)
