"""Packed documents (varlen): forward and backward against a per-document dense float64 reference,
for the generated document kernels and, through the runtime's on-demand rendering, other masks."""

from __future__ import annotations

import math

import pytest
import torch

import attngen
from attngen.problem import DTYPES, Problem, random_inputs
from attngen.testing import assert_flash_rule, assert_lse_close, check_grads
from tests.kernels.cases import built_kernels

DOC_KERNELS = built_kernels("fwd", varlen=True)
# the runtime on a CPU runs the sm80 family (its pointer kernels); the sm90 family's TMA kernels
# are called directly below
RUNTIME_DOC_KERNELS = [(s, p) for s, p in DOC_KERNELS if s.target == "sm80"]
SM90_DOC_KERNELS = [(s, p) for s, p in DOC_KERNELS if s.target == "sm90"]
BWD_DOC_KERNELS = {s.replace(family="fwd"): p for s, p in built_kernels("bwd", varlen=True)}


def cu_seqlens(lens) -> torch.Tensor:
    return torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)


def per_doc_reference(q, k, v, cu_q, cu_k, upcast, causal=False, window_size=(-1, -1), softcap=0.0,
                      scale=None):
    """attngen.problem's reference of the packed documents cu_q / cu_k: (out (T, H, D), lse (H, T))."""
    lens = lambda cu: [int(b) - int(a) for a, b in zip(cu[:-1], cu[1:])]  # noqa: E731
    p = Problem.packed_documents(lens(cu_q), lens(cu_k), heads_q=q.shape[1], heads_kv=k.shape[1],
                                 head_dim_qk=q.shape[2], head_dim_v=v.shape[2], causal=causal,
                                 window=tuple(window_size), softcap=softcap, scale=scale)
    return p.reference(q, k, v, upcast=upcast)


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


@pytest.mark.parametrize("spec,path", RUNTIME_DOC_KERNELS, ids=[s.uri for s, _ in RUNTIME_DOC_KERNELS])
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


def run_sm90_tma(spec, fpath, bpath, lens_q, lens_k, hkv, causal, window=(-1, -1), softcap=0.0):
    """The sm90 TMA kernels of a document spec, called directly: forward with the plain (Q in
    registers), persistent and warp-specialized key loops, backward on both dQ paths (the dQ pass
    with Q and dO in registers); outputs poisoned first,
    checked against the per-document float64 reference with the flash-attn rules."""
    import attngen.interp
    from attngen.families.bwd import attn_bwd_varlen, bwd_launches
    from attngen.kernels.common import MaskArgs, mask_kind
    from attngen.families.fwd import attn_fwd_varlen, fwd_launches
    from attngen.runtime.loader import load_path
    from attngen.configs import BwdConfig, FwdConfig

    attngen.interp.patch_interpreter()
    hq, d, dtype = hkv * spec.gqa_ratio, spec.head_dim_qk, DTYPES[spec.dtype]
    tq, tk = sum(lens_q), sum(lens_k)
    q, k, v, dout = random_inputs((tq, hq, d), (tk, hkv, d), (tk, hkv, d), (tq, hq, d), dtype=dtype, seed=21)
    cu_q, cu_k, mq, mk = cu_seqlens(lens_q), cu_seqlens(lens_k), max(lens_q), max(lens_k)
    scale = 1.0 / math.sqrt(d)
    mask, wl, wr = mask_kind(causal, window)
    assert mask == spec.mask
    args = MaskArgs(scale=scale, softcap=softcap, window_left=wl, window_right=wr, align_top_left=False)
    kw = dict(causal=causal, window_size=window, softcap=softcap, scale=scale)
    fmod, bspec, bmod = load_path(fpath), spec.replace(family="bwd"), load_path(bpath)
    ref, ref_lse = per_doc_reference(q, k, v, cu_q, cu_k, True, **kw)
    pt, _ = per_doc_reference(q, k, v, cu_q, cu_k, False, **kw)
    out = lse = None
    for cfg in (FwdConfig(32, 32, 4, 1, tma=True, q_regs=True), FwdConfig(32, 32, 4, 1, tma=True, persistent=2, lazy_rescale=True),
                FwdConfig(32, 32, 8, 1, tma=True, warp_specialize=True)):
        out = torch.full((tq, hq, d), float("nan"), dtype=dtype)
        lse = torch.full((hq, tq), float("nan"))
        (la,) = fwd_launches(fmod, spec, q, k, v, out, lse, args, cfg, cu_q, cu_k, mq)
        assert la.fn.__name__ == "_attn_fwd_tma" and sorted(la.descriptors) == ["desc_k", "desc_q", "desc_v"]
        assert la.descriptors["desc_q"][1] == [1, hq, tq, d] and la.descriptors["desc_q"][3] == [1, 1, 32, d]
        attn_fwd_varlen(fmod, spec, q, k, v, out, lse, cu_q, cu_k, mq, args, cfg)
        assert_flash_rule(f"{spec.uri}/{cfg}", out, ref, pt, factor=2.0)
        assert_lse_close(f"{spec.uri}/{cfg}/lse", lse, ref_lse)
    for det, split in ((False, False), (True, False), (False, True)):
        cfg = BwdConfig(32, 32, 4, 1, 32, 32, 4, 1, atomic_dq=not det, tma=True, split_dkdv=split, dq_regs=det)
        grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
        launches = bwd_launches(bmod, bspec, q, k, v, out, dout, lse, lse, *grads, args, cfg, not det,
                                cu_q, cu_k, mq, mk)
        names = [la.fn.__name__ for la in launches]
        assert names == (["_attn_bwd_preprocess"] + ["_attn_bwd_dkdv_tma"] * (1 + split)
                         + (["_attn_bwd_dq_tma"] if det else []))
        # doc_guard=desc kernels make their descriptors per document: tensors and strides, no host
        # descriptors
        per_doc = "desc" not in dict(bmod.ABI["_attn_bwd_dkdv_tma"]).values()
        assert all(la.scratch == per_doc and (la.descriptors is None) == per_doc for la in launches[1:])
        attn_bwd_varlen(bmod, bspec, q, k, v, out, dout, lse, *grads, cu_q, cu_k, mq, mk, args, cfg, det)
        check_grads(f"{spec.uri}/tma/deterministic={det}/split_dkdv={split}",
                    lambda *t, upcast: per_doc_reference(*t, cu_q, cu_k, upcast, **kw)[0], (q, k, v), dout, grads)


@pytest.mark.parametrize("spec,path", SM90_DOC_KERNELS, ids=[s.uri for s, _ in SM90_DOC_KERNELS])
def test_sm90_document_kernels_tma(spec, path):
    """The sm90 family's document kernels on documents of 1, 17, 113 and 70 tokens with 32-row
    tiles, so that tiles cross every document's end: descriptors over the (1, H, T, D) views from
    each document's first row (a tile past the end reads the next document's rows, which the
    masked stages drop), O, dQ, dK, dV through masked pointer stores."""
    run_sm90_tma(spec, path, BWD_DOC_KERNELS[spec], [1, 17, 113, 70], [1, 17, 113, 70], 2, causal=True)


def test_sm90_document_backward_with_per_document_descriptors(tmp_path):
    """The backward rendered with doc_guard=desc (descriptors made in the kernel over each
    document's rows: loads past the end read zeros, stores clip there; A/B runs and the way in for
    paged KV), against the reference on the same documents."""
    from attngen.codegen.render import render

    spec, path = next((s, p) for s, p in SM90_DOC_KERNELS if s.mask == "causal")
    bpath = tmp_path / f"{spec.uri}_bwd_desc.py"
    bpath.write_text(render(spec.replace(family="bwd"), options={"doc_guard": "desc"}))
    run_sm90_tma(spec, path, bpath, [1, 17, 113, 70], [1, 17, 113, 70], 2, causal=True)


@pytest.mark.parametrize("mask,dtype,gqa,kw", [
    ("none", "fp16", 2, dict(causal=False, softcap=20.0)),
    ("sliding_window", "bf16", 1, dict(causal=True, window=(15, 0))),
    ("sliding_window", "fp16", 2, dict(causal=False, window=(9, 4)))], ids=["none_softcap", "swa", "swa_2sided"])
def test_sm90_tma_other_document_masks(mask, dtype, gqa, kw, tmp_path, monkeypatch):
    """The same on kernels rendered on demand, Sq != Sk per document and an empty key document."""
    from attngen.runtime import loader
    from attngen.spec import KernelSpec

    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path))
    spec = KernelSpec("fwd", dtype, "sm90", 64, 64, gqa, mask, softcap=bool(kw.get("softcap")), varlen=True)
    fpath, bpath = (loader.module_path(spec.replace(family=f)) for f in ("fwd", "bwd"))
    run_sm90_tma(spec, fpath, bpath, [17, 1, 40, 9], [30, 5, 40, 0], 2, **kw)


def run_tma_documents(spec, fpath, bpath, q, k, v, dout, lens):
    """Forward (plain and warp-specialized key loops) and backward (both dQ paths) of the sm90 TMA
    document kernels on 32-row tiles, outputs poisoned first: [out, lse, dq, dk, dv] per run."""
    import attngen.interp
    from attngen.families.bwd import attn_bwd_varlen
    from attngen.kernels.common import MaskArgs
    from attngen.families.fwd import attn_fwd_varlen
    from attngen.runtime.loader import load_path
    from attngen.configs import BwdConfig, FwdConfig

    attngen.interp.patch_interpreter()
    cu, m = cu_seqlens(lens), max(lens)
    args = MaskArgs(scale=1.0 / math.sqrt(q.shape[-1]), softcap=0.0, window_left=-1, window_right=0,
                    align_top_left=False)
    fmod, bspec, bmod = load_path(fpath), spec.replace(family="bwd"), load_path(bpath)
    runs = []
    for fcfg in (FwdConfig(32, 32, 4, 1, tma=True), FwdConfig(32, 32, 8, 1, tma=True, warp_specialize=True)):
        out = torch.full_like(q, float("nan"))
        lse = torch.full((q.shape[1], q.shape[0]), float("nan"))
        attn_fwd_varlen(fmod, spec, q, k, v, out, lse, cu, cu, m, args, fcfg)
        runs.append([out, lse])
    for det in (False, True):
        bcfg = BwdConfig(32, 32, 4, 1, 32, 32, 4, 1, atomic_dq=not det, tma=True)
        grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
        attn_bwd_varlen(bmod, bspec, q, k, v, runs[0][0], dout, runs[0][1], *grads, cu, cu, m, m, args, bcfg, det)
        runs.append(grads)
    return runs


def _poisoned_documents():
    """The causal sm90 document spec, documents of 17, 40 and 9 tokens (32-row tiles cross every
    document edge), clean inputs (q, k, v, dout) and a copy with document 1 poisoned by NaN and
    +-inf rows, and the token rows of documents 0 and 2."""
    spec = next(s for s, _ in SM90_DOC_KERNELS if s.mask == "causal")
    lens, hkv = [17, 40, 9], 2
    hq, d, dtype, t = hkv * spec.gqa_ratio, spec.head_dim_qk, DTYPES[spec.dtype], sum(lens)
    clean = random_inputs((t, hq, d), (t, hkv, d), (t, hkv, d), (t, hq, d), dtype=dtype, seed=5)
    poisoned = [x.clone() for x in clean]
    for x in poisoned:
        x[17:57:3] = float("nan")
        x[18:57:3] = float("inf")
        x[19:57:3] = float("-inf")
    keep = torch.cat([torch.arange(0, 17), torch.arange(57, 66)])
    return spec, lens, clean, poisoned, keep


@pytest.mark.parametrize("bwd_guard", ["built", "desc"])
def test_sm90_tma_documents_are_isolated(bwd_guard, tmp_path):
    """A tile past a document's end must not bring the next document's rows into a product with
    the mask's zeros (0 * inf is NaN): a NaN or inf in one document's Q, K, V or dO must not reach
    its neighbours' O, Lse, dQ, dK, dV. Document 1 (of 17, 40, 9 tokens) poisoned with NaN and
    +-inf rows: documents 0 and 2 come out bit for bit as in the clean run (itself checked against
    the reference by the tests above). The built kernels (rows past the end zeroed), and the
    backward rendered with descriptors made per document (codegen option doc_guard=desc)."""
    from attngen.codegen.render import render

    spec, lens, clean, poisoned, keep = _poisoned_documents()
    fpath, bpath = dict(SM90_DOC_KERNELS)[spec], BWD_DOC_KERNELS[spec]
    if bwd_guard != "built":
        bpath = tmp_path / f"{spec.uri}_bwd_{bwd_guard}.py"
        bpath.write_text(render(spec.replace(family="bwd"), options={"doc_guard": bwd_guard}))
    want = run_tma_documents(spec, fpath, bpath, *clean, lens)
    got = run_tma_documents(spec, fpath, bpath, *poisoned, lens)
    for run, (w_run, g_run) in enumerate(zip(want, got)):
        names = ("out", "lse") if run < 2 else ("dq", "dk", "dv")
        for name, w, g in zip(names, w_run, g_run):
            name = f"run {run} {name}"
            w, g = (w[:, keep], g[:, keep]) if name.endswith("lse") else (w[keep], g[keep])  # lse is (H, T)
            assert torch.isfinite(w).all(), f"{name}: the clean run is not finite"
            assert torch.equal(g, w), (f"{name}: a poisoned neighbour changed documents 0 / 2 "
                                       f"({int((~torch.isfinite(g)).sum())} non-finite values)")


def test_sm90_tma_documents_leak_without_the_guard(tmp_path):
    """The isolation above is the guard's doing: the same kernels rendered with it switched off
    (codegen option doc_guard=off, for A/B runs only) let document 1's NaN / inf into document 0."""
    from attngen.codegen.render import render

    spec, lens, _, poisoned, _ = _poisoned_documents()
    paths = []
    for fam in ("fwd", "bwd"):
        path = tmp_path / f"{spec.uri}_{fam}_noguard.py"
        path.write_text(render(spec.replace(family=fam), options={"doc_guard": "off"}))
        paths.append(path)
    runs = run_tma_documents(spec, *paths, *poisoned, lens)
    assert not torch.isfinite(runs[0][0][:17]).all(), "forward: document 0 stayed finite without the guard"
    for det, (dq, dk, dv) in zip((False, True), runs[2:]):
        assert not torch.isfinite(dv[:17]).all(), f"deterministic={det}: dV of document 0 stayed finite"
