"""GPU: bitwise reproducibility (deterministic backward over 20 runs, forward + LSE over 100 runs:
a race shows up as a moving bit) and packed documents at larger sizes."""

from __future__ import annotations

import math

import pytest
import torch

import attngen
from attngen.problem import attention_ref, random_inputs
from attngen.testing import assert_flash_rule, assert_lse_close, check_grads

pytestmark = pytest.mark.gpu


def _inputs(shape_q, shape_kv, dtype, seed, dout=False):
    """q, k, v (and with dout=True an output gradient shaped like q), seeded."""
    shapes = (shape_q, shape_kv, shape_kv) + ((shape_q,) if dout else ())
    return random_inputs(*shapes, dtype=dtype, device="cuda", seed=seed)


@pytest.mark.parametrize("kw", [dict(causal=True), dict(causal=True, window_size=(255, 0))],
                         ids=["causal", "swa"])
def test_deterministic_backward_is_bitwise_stable(kw):
    q, k, v, dout = _inputs((2, 16, 2048, 128), (2, 4, 2048, 128), torch.bfloat16, 1, dout=True)
    first = None
    for _ in range(20):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = attngen.attention(*leaves, deterministic=True, **kw)
        grads = torch.autograd.grad(out, leaves, dout)
        if first is None:
            first = grads
            continue
        for name, a, b in zip(("dq", "dk", "dv"), grads, first):
            assert torch.equal(a, b), f"{name} changed between deterministic runs"


@pytest.mark.parametrize("kw", [dict(causal=True), dict(causal=False), dict(causal=True, window_size=(511, 0))],
                         ids=["causal", "full", "swa"])
def test_forward_and_lse_are_bitwise_stable(kw):
    q, k, v = _inputs((2, 16, 1023, 128), (2, 4, 1023, 128), torch.float16, 2)
    out0, lse0 = attngen.attention(q, k, v, return_lse=True, **kw)
    for _ in range(100):
        out, lse = attngen.attention(q, k, v, return_lse=True, **kw)
        assert torch.equal(out, out0) and torch.equal(lse, lse0), "forward output moved: a race"


def _check_documents(lens, cu, qkv, out, lse, dout=None, grads=None, causal=True) -> None:
    """Each packed document (causal, or no mask) against the float64 reference: O by the
    flash-attn rule, the LSE, and with dout the gradients by the gradient rule."""
    d = qkv[0].shape[-1]
    for i, n in enumerate(lens):
        sl = slice(int(cu[i]), int(cu[i + 1]))
        bh = lambda t: t[sl].transpose(0, 1).unsqueeze(0)  # noqa: E731
        ref, ref_lse = attention_ref(*(bh(t) for t in qkv), causal=causal, scale=1 / math.sqrt(d))
        pt, _ = attention_ref(*(bh(t) for t in qkv), causal=causal, upcast=False, scale=1 / math.sqrt(d))
        assert_flash_rule(f"doc{i}/out", bh(out), ref, pt, 2.0)
        assert_lse_close(f"doc{i}/lse", lse[:, sl].unsqueeze(0), ref_lse)
        if dout is not None:
            check_grads(f"doc{i}", lambda *t, upcast: attention_ref(*t, causal=causal, upcast=upcast,
                                                                    scale=1 / math.sqrt(d))[0],
                        [bh(t) for t in qkv], bh(dout), [bh(g) for g in grads])


EVEN_LENS = [1100, 1111, 1123, 1031, 1099, 1077, 1087, 1029]  # the persistent Gluon forward's (WS_DOCS)


@pytest.mark.parametrize("dtype, lens", [(torch.float16, None), (torch.bfloat16, None), (torch.bfloat16, EVEN_LENS)],
                         ids=["fp16", "bf16", "bf16-even"])
def test_varlen_documents(dtype, lens):
    """attention_varlen forward and backward through the runtime's defaults: uneven documents (the
    Triton forward) and documents of about equal length over 1024 tokens (the persistent Gluon
    forward on hd128), every document by the flash-attn rules; with the even ones the forward
    is also bitwise stable over 20 runs."""
    lens = lens or [1, 17, 113, 1023, 300, 2048, 64, 511]
    hq, hkv, d = 8, 2, 128
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device="cuda")
    q, k, v, dout = _inputs((sum(lens), hq, d), (sum(lens), hkv, d), dtype, 3, dout=True)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out, lse = attngen.attention_varlen(*leaves, cu, cu, max(lens), max(lens), causal=True,
                                        return_lse=True)
    grads = torch.autograd.grad(out, leaves, dout)
    _check_documents(lens, cu, (q, k, v), out, lse, dout, grads)
    if lens == EVEN_LENS:
        for _ in range(20):
            o2, l2 = attngen.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=True, return_lse=True)
            assert torch.equal(o2, out.detach()) and torch.equal(l2, lse), "forward output moved: a race"


@pytest.mark.parametrize("deterministic", [True, False], ids=["dq_pass", "atomic_dq"])
def test_varlen_documents_are_isolated(deterministic):
    """A NaN / inf in one document's Q, K, V or dO leaves its neighbours' outputs and gradients bit
    for bit as in the clean run (the sm90 kernels read past a document's end through the
    descriptor; 0 * inf is NaN unless those rows are zeroed)."""
    lens = [113, 300, 1023, 64]
    hq, hkv, d = 8, 2, 128
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device="cuda")
    clean = list(_inputs((sum(lens), hq, d), (sum(lens), hkv, d), torch.bfloat16, 4, dout=True))
    bad = [t.clone() for t in clean]
    lo, hi = lens[0], lens[0] + lens[1]  # document 1 poisoned
    for t in bad:
        t[lo:hi:3] = float("nan")
        t[lo + 1:hi:3] = float("inf")

    def run(q, k, v, dout):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out, lse = attngen.attention_varlen(*leaves, cu, cu, max(lens), max(lens), causal=True,
                                            return_lse=True, deterministic=deterministic)
        return [out, lse.transpose(0, 1)] + list(torch.autograd.grad(out, leaves, dout))

    keep = torch.cat([torch.arange(0, lo), torch.arange(hi, sum(lens))]).cuda()
    for name, w, g in zip(("out", "lse", "dq", "dk", "dv"), run(*clean), run(*bad)):
        w, g = w[keep], g[keep]
        assert torch.isfinite(w).all(), f"{name}: the clean run is not finite"
        if deterministic:
            assert torch.equal(g, w), f"{name}: a poisoned document changed its neighbours"
        else:  # atomic dQ: the order of the fp32 adds varies run to run
            assert torch.isfinite(g).all(), f"{name}: a poisoned document made its neighbours non-finite"
            assert (g.float() - w.float()).abs().max() <= 1e-2 * w.float().abs().max(), name


@pytest.mark.parametrize("consumers, pair, persistent, block_n, causal",
                         [(2, False, 0, 128, True), (2, True, 0, 128, True), (1, False, 0, 64, True),
                          (1, True, 0, 64, True), (2, False, 1, 128, True), (2, True, 1, 64, True),
                          (1, True, 1, 64, True), (2, False, 1, 64, False), (2, False, 0, 128, False)],
                         ids=["one-tile", "pair-tiles", "one-consumer", "one-consumer-pair", "persistent",
                              "persistent-pair-64", "one-consumer-persistent-pair", "persistent-no-mask",
                              "one-tile-no-mask"])
def test_varlen_gluon_forward_matches_reference_and_isolates(consumers, pair, persistent, block_n, causal):
    """The warp-specialized Gluon forward on packed documents, forced (one query tile per program,
    or two mirrored ones of a document: FwdConfig.pair_tiles; two consumer warp groups or one; one
    program per work item or one per SM walking them: FwdConfig.persistent): every document within
    the flash-attn rule, and a poisoned document leaves its neighbours' O and LSE bit for bit as
    in the clean run. The documents' odd lengths put a key block past the end of most of them,
    whose V rows the kernel zeroes in shared memory."""
    import dataclasses

    from attngen.kernels.common import MaskArgs, mask_kind
    from attngen.families.fwd import attn_fwd_varlen, fwd_launches
    from attngen.runtime import loader
    from attngen.spec import KernelSpec
    from attngen.configs import WS_DEFAULT, check_fwd

    lens = [1, 17, 113, 1023, 300, 2048, 64, 511]
    if persistent:  # the launcher gives short or uneven documents to the Triton kernel
        lens = EVEN_LENS
    hq, hkv, d = 8, 2, 128
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device="cuda")
    q, k, v = _inputs((sum(lens), hq, d), (sum(lens), hkv, d), torch.bfloat16, 5)
    spec = KernelSpec("fwd", "bf16", "sm90", d, d, hq // hkv, "causal" if causal else "none", varlen=True)
    cfg = dataclasses.replace(WS_DEFAULT, pair_tiles=pair, consumers=consumers, block_m=64 * consumers,
                              block_n=block_n, persistent=persistent)
    assert check_fwd(spec, cfg) is None
    _, wl, wr = mask_kind(causal, (-1, -1))
    mod, args = loader.load(spec), MaskArgs(1 / math.sqrt(d), 0.0, wl, wr, False)

    def run(q, k, v):
        out, lse = torch.full_like(q, float("nan")), torch.full((hq, q.shape[0]), float("nan"), device="cuda")
        names = [la.fn.__name__ for la in fwd_launches(mod, spec, q, k, v, out, lse, args, cfg, cu, cu, max(lens))]
        assert names == ["_attn_fwd_ws"], names
        attn_fwd_varlen(mod, spec, q, k, v, out, lse, cu, cu, max(lens), args, cfg)
        return out, lse

    out, lse = run(q, k, v)
    _check_documents(lens, cu, (q, k, v), out, lse, causal=causal)
    bad = [t.clone() for t in (q, k, v)]
    lo, hi = int(cu[3]), int(cu[4])  # document 3 poisoned
    for t in bad:
        t[lo:hi:3] = float("nan")
        t[lo + 1:hi:3] = float("inf")
    out_bad, lse_bad = run(*bad)
    keep = torch.cat([torch.arange(0, lo), torch.arange(hi, sum(lens))]).cuda()
    assert torch.equal(out_bad[keep], out[keep]) and torch.equal(lse_bad[:, keep], lse[:, keep])


def test_varlen_gluon_backward_roles_matches_reference_and_isolates():
    """The Gluon dK/dV pass with split roles (BwdConfig.roles) on packed hd256 documents, forced:
    every document's gradients within the gradient rule, and a poisoned document leaves its
    neighbours' dK / dV bit for bit as in the clean run."""
    import dataclasses

    from attngen.families.bwd import attn_bwd_varlen, bwd_launches
    from attngen.kernels.common import MaskArgs, mask_kind
    from attngen.runtime import loader
    from attngen.spec import KernelSpec
    from attngen.configs import check_bwd, default_bwd_config

    lens = [1, 17, 113, 1023, 300, 64, 511]
    hq, hkv, d = 4, 2, 256
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device="cuda")
    q, k, v, dout = _inputs((sum(lens), hq, d), (sum(lens), hkv, d), torch.bfloat16, 6, dout=True)
    spec = KernelSpec("bwd", "bf16", "sm90", d, d, hq // hkv, "causal", varlen=True)
    cfg = dataclasses.replace(default_bwd_config(spec), tma=True, split_dkdv=False, block_m=64, block_n=64,
                              num_warps=4, num_stages=2, consumers=2, roles=True)
    assert check_bwd(spec, cfg) is None
    _, wl, wr = mask_kind(True, (-1, -1))
    mod, args = loader.load(spec), MaskArgs(1 / math.sqrt(d), 0.0, wl, wr, False)

    def run(q, k, v, dout):
        out, lse = attngen.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=True, return_lse=True)
        grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
        names = [la.fn.__name__ for la in bwd_launches(mod, spec, q, k, v, out, dout, lse, torch.empty_like(lse),
                                                       *grads, args, cfg, False, cu, cu, max(lens), max(lens))]
        assert "_attn_bwd_dkdv_ws" in names, names
        attn_bwd_varlen(mod, spec, q, k, v, out, dout, lse, *grads, cu, cu, max(lens), max(lens), args, cfg, True)
        torch.cuda.synchronize()
        return out, lse, grads

    out, lse, grads = run(q, k, v, dout)
    _check_documents(lens, cu, (q, k, v), out, lse, dout, grads)
    bad = [t.clone() for t in (q, k, v, dout)]
    lo, hi = int(cu[3]), int(cu[4])  # document 3 poisoned
    for t in bad:
        t[lo:hi:3] = float("nan")
        t[lo + 1:hi:3] = float("inf")
    _, _, grads_bad = run(*bad)
    keep = torch.cat([torch.arange(0, lo), torch.arange(hi, sum(lens))]).cuda()
    for name, g, w in zip(("dq", "dk", "dv"), grads_bad, grads):
        assert torch.equal(g[keep], w[keep]), f"{name}: a poisoned document changed its neighbours"
