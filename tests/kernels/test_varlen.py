"""Packed documents (varlen): forward and backward against a per-document dense float64 reference,
for the generated document kernels and, through the runtime's on-demand rendering, other masks."""

from __future__ import annotations

import math

import pytest
import torch

import attngen
from attngen.testing import (assert_flash_rule, assert_lse_close, attention_ref, check_grads,
                             random_inputs)
from tests.kernels.cases import DTYPES, built_kernels

DOC_KERNELS = built_kernels("fwd", varlen=True)


def cu_seqlens(lens) -> torch.Tensor:
    return torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)


def per_doc_reference(q, k, v, cu_q, cu_k, upcast, **kw):
    """Dense attention document by document (B=1 each): (out (T, H, D), lse (H, T))."""
    outs, lses = [], []
    for i in range(len(cu_q) - 1):
        qs, ks = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
        as_bhsd = lambda t: t.transpose(0, 1).unsqueeze(0)  # noqa: E731
        o, lse = attention_ref(as_bhsd(q[qs]), as_bhsd(k[ks]), as_bhsd(v[ks]), upcast=upcast, **kw)
        outs.append(o[0].transpose(0, 1))
        lses.append(lse[0])
    return torch.cat(outs, 0), torch.cat(lses, 1)


def check_varlen(lens_q, lens_k, hq, hkv, d, dtype, seed, deterministic=False, **kw):
    tq, tk = sum(lens_q), sum(lens_k)
    q, k, v, dout = random_inputs((tq, hq, d), (tk, hkv, d), (tk, hkv, d), (tq, hq, d), dtype=dtype,
                                  seed=seed)
    cu_q, cu_k = cu_seqlens(lens_q), cu_seqlens(lens_k)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out, lse = attngen.attention_varlen(*leaves, cu_q, cu_k, max(lens_q), max(lens_k),
                                        return_lse=True, deterministic=deterministic, **kw)
    grads = torch.autograd.grad(out, leaves, dout)
    kw = dict(kw, scale=1.0 / math.sqrt(d))
    ref, ref_lse = per_doc_reference(q, k, v, cu_q, cu_k, True, **kw)
    pt, _ = per_doc_reference(q, k, v, cu_q, cu_k, False, **kw)
    tag = f"varlen{lens_q}x{lens_k}"
    assert_flash_rule(f"{tag}/out", out, ref, pt, factor=2.0)
    assert_lse_close(f"{tag}/lse", lse, ref_lse)
    check_grads(tag, lambda *t, upcast: per_doc_reference(*t, cu_q, cu_k, upcast, **kw)[0],
                (q, k, v), dout, grads)


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
