"""Packed documents (varlen): forward and backward against a per-document dense float64 reference,
for the generated document kernels and, through the runtime's on-demand rendering, other masks."""

from __future__ import annotations

import math

import pytest
import torch

import attngen
from attngen.kernels.bwd import attn_bwd_varlen
from attngen.kernels.common import UNBOUNDED, MaskArgs
from attngen.kernels.fwd import attn_fwd_varlen
from attngen.runtime.loader import load_path
from attngen.testing import assert_flash_rule, assert_lse_close, attention_ref
from attngen.tuning.space import BwdConfig, FwdConfig
from tests.kernels.cases import DTYPES, built_kernels, twin_kernels

DOC_KERNELS = built_kernels("fwd", varlen=True)


def packed(lens_q, lens_k, hq, hkv, d, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    tq, tk = sum(lens_q), sum(lens_k)
    q = torch.randn(tq, hq, d, generator=g).to(dtype).requires_grad_(True)
    k = torch.randn(tk, hkv, d, generator=g).to(dtype).requires_grad_(True)
    v = torch.randn(tk, hkv, d, generator=g).to(dtype).requires_grad_(True)
    dout = torch.randn(tq, hq, d, generator=g).to(dtype)
    cu = lambda lens: torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)  # noqa: E731
    return q, k, v, dout, cu(lens_q), cu(lens_k)


def per_doc_reference(q, k, v, dout, cu_q, cu_k, upcast, **kw):
    """Dense attention document by document (B=1 each); grads through autograd."""
    # float64 leaves for the reference, so its gradients are not rounded to the input dtype
    leaves = [(t.detach().double() if upcast else t.detach().clone()).requires_grad_(True) for t in (q, k, v)]
    outs, lses = [], []
    for i in range(len(cu_q) - 1):
        qs, ks = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
        as_bhsd = lambda t: t.transpose(0, 1).unsqueeze(0)  # noqa: E731
        o, lse = attention_ref(as_bhsd(leaves[0][qs]), as_bhsd(leaves[1][ks]), as_bhsd(leaves[2][ks]),
                               upcast=upcast, **kw)
        outs.append(o[0].transpose(0, 1))
        lses.append(lse[0])
    out = torch.cat(outs, 0)
    grads = torch.autograd.grad(out, leaves, dout.double() if upcast else dout)
    return out, torch.cat(lses, 1), grads


def check_varlen(lens_q, lens_k, hq, hkv, d, dtype, seed, deterministic=False, **kw):
    q, k, v, dout, cu_q, cu_k = packed(lens_q, lens_k, hq, hkv, d, dtype, seed)
    out, lse = attngen.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                        return_lse=True, deterministic=deterministic, **kw)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    kw = dict(kw, scale=1.0 / math.sqrt(d))
    ref, ref_lse, ref_g = per_doc_reference(q, k, v, dout, cu_q, cu_k, True, **kw)
    pt, _, pt_g = per_doc_reference(q, k, v, dout, cu_q, cu_k, False, **kw)
    tag = f"varlen{lens_q}x{lens_k}"
    assert_flash_rule(f"{tag}/out", out, ref, pt, factor=2.0)
    assert_lse_close(f"{tag}/lse", lse, ref_lse)
    for name, g, r, p in zip(("dq", "dk", "dv"), grads, ref_g, pt_g):
        assert_flash_rule(f"{tag}/{name}", g, r, p, factor=3.0)


@pytest.mark.parametrize("spec,path", DOC_KERNELS, ids=[s.uri for s, _ in DOC_KERNELS])
def test_generated_document_kernels(spec, path):
    """Uneven documents (lengths 1, 17, 113, 300), causal inside each document, GQA of the spec."""
    assert spec.mask == "causal"
    check_varlen([1, 17, 113, 300], [1, 17, 113, 300], 2 * spec.gqa_ratio, 2, spec.head_dim_qk,
                 DTYPES[spec.dtype], seed=11, causal=True)


@pytest.mark.parametrize("kw", [dict(causal=False), dict(causal=True, window_size=(15, 0)),
                                dict(causal=False, window_size=(9, 4), softcap=20.0)],
                         ids=["none", "swa", "swa_softcap"])
def test_varlen_other_masks(kw, tmp_path, monkeypatch):
    """Kernels not in generated/ are rendered on demand into the cache; Sq != Sk per document,
    including an empty key document."""
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path))
    check_varlen([17, 1, 40, 9], [30, 5, 40, 0], 4, 2, 64, torch.float16, seed=12,
                 deterministic=True, **kw)


FWD_TWINS = twin_kernels("fwd", varlen=True)


@pytest.mark.parametrize("spec,path,twin_path", FWD_TWINS, ids=[s.uri for s, _, _ in FWD_TWINS])
def test_document_twin_kernels(spec, path, twin_path):
    """Document kernels whose code equals their sm80 twin's (fwd and bwd) run once through the
    launchers and match the twin bitwise."""
    bwd_path = dict((s, p) for s, p, _ in twin_kernels("bwd", varlen=True))[spec.replace(family="bwd")]
    bwd_twin = dict(built_kernels("bwd", varlen=True))[spec.replace(family="bwd", target="sm80")]
    lens = [1, 17, 113, 40]
    q, k, v, dout, cu_q, cu_k = packed(lens, lens, 2 * spec.gqa_ratio, 2, spec.head_dim_qk,
                                       DTYPES[spec.dtype], seed=13)
    q, k, v = q.detach(), k.detach(), v.detach()
    mask = MaskArgs(scale=1 / math.sqrt(spec.head_dim_qk), softcap=0.0, window_left=UNBOUNDED,
                    window_right=0, align_top_left=False)
    results = []
    for fwd_p, bwd_p in ((path, bwd_path), (twin_path, bwd_twin)):
        out = torch.full_like(q, float("nan"))
        lse = torch.full((q.shape[1], q.shape[0]), float("nan"))
        attn_fwd_varlen(load_path(fwd_p), spec, q, k, v, out, lse, cu_q, cu_k, max(lens), mask,
                        FwdConfig(32, 32, 4, 1))
        grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
        attn_bwd_varlen(load_path(bwd_p), spec.replace(family="bwd"), q, k, v, out, dout, lse, *grads,
                        cu_q, cu_k, max(lens), max(lens), mask, BwdConfig(32, 32, 4, 1, 32, 32, 4, 1), True)
        results.append([out, lse, *grads])
    assert all(torch.isfinite(t).all() for t in results[0][2:]), "unwritten gradients"
    for a, b in zip(*results):
        assert torch.equal(a, b), f"{spec.uri} differs from its sm80 twin"
