"""GPU: shapes at the edges (issue 9: 64-bit addressing and grid limits), the compiled and captured
launch path.

Each edge case (EDGES) runs forward and backward through the runtime and asserts, on an sm90 GPU,
which kernels served it on how many programs: the launches an H200 makes for it, verified on the
CPU by tests/runtime/test_grid_limits.py, which builds the same plans on meta tensors. The issue's
host-bound shapes (B4096 S16, B2100 S8, 70,000 documents of 3 tokens) run the pointer kernels; the
others put grids past 65,535 programs on the Gluon and TMA kernels and tensors past 2^31 elements
on the 64-bit paths. A long sequence is checked on query rows (out, LSE, dQ) and key rows (dK, dV)
at its start, middle and end against a float32 reference on those rows; the other cases against
float32 SDPA on all their batch entries, or on documents at the start, middle and end of the pack.
The summary records each shape, its errors and its launches."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

import attngen
from attngen.kernels.launch import sm_count
from attngen.runtime import api, dispatch
from attngen.problem import random_inputs

pytestmark = pytest.mark.gpu
DEV = "cuda"
BF16 = torch.bfloat16
PER_SM = "per-SM"  # a persistent grid: one program per SM
# error limits by error name (before "@"): relative to the reference's largest magnitude, the LSE
# absolute (natural log)
LIMITS = {"out": 0.03, "lse": 2e-3, "dq": 0.03, "dk": 0.03, "dv": 0.03}
LONG_LIMITS = {"out": 0.02, "lse": 2e-3, "dq": 0.05, "dk": 0.05, "dv": 0.05}


@dataclass(frozen=True)
class Edge:
    """One edge shape (causal, bf16) and what an H200 launches for it: (kernel, programs) per
    launch, in launch order; PER_SM for a persistent grid."""

    id: str
    hq: int
    hkv: int
    d: int
    layout: str  # "bhsd" | "bshd" | "packed"
    batch: int = 1  # dense calls
    seqlen: int = 0
    docs: int = 0  # packed: `docs` documents of `doc_len` tokens each
    doc_len: int = 0
    fwd: tuple = ()
    bwd: tuple = ()

    def shapes(self) -> tuple[tuple, tuple]:
        """(q shape, k / v shape) as the call takes them."""
        if self.layout == "packed":
            return tuple((self.docs * self.doc_len, h, self.d) for h in (self.hq, self.hkv))
        if self.layout == "bshd":
            return tuple((self.batch, self.seqlen, h, self.d) for h in (self.hq, self.hkv))
        return tuple((self.batch, h, self.seqlen, self.d) for h in (self.hq, self.hkv))

    def expected(self, sms: int) -> dict[str, list[tuple[str, int]]]:
        """The launches on a GPU of `sms` SMs (persistent grids: min(work items, SMs); the items
        of every case here outnumber an H200's SMs)."""
        def grids(launches):
            return [(name, sms if grid == PER_SM else grid) for name, grid in launches]

        return {"fwd": grids(self.fwd), "bwd": grids(self.bwd)}


def _bwd(kind: str, pre: int, dkdv: int, dq: int) -> tuple:
    """A backward's launches: preprocess, dK/dV, dQ; kind "" the pointer kernels (64-bit offsets
    where a tensor passes 2^31 elements), "_ws" the Gluon passes."""
    return (("_attn_bwd_preprocess", pre), (f"_attn_bwd_dkdv{kind}", dkdv), (f"_attn_bwd_dq{kind}", dq))


EDGES = {e.id: e for e in (
    # the rows. S540k bshd (q 2.2e9 elements): the Gluon forward; the backward on the 64-bit
    # pointer kernels (a call past 2^31 elements excludes the Gluon and TMA backward)
    Edge("long-bshd-S540000-h32_8-d128", 32, 8, 128, "bshd", seqlen=540_000,
         fwd=(("_attn_fwd_ws", 135_008),), bwd=_bwd("", 135_008, 67_504, 135_008)),
    # host-bound shapes (api.host_bound): the pointer kernels, 32-bit offsets
    Edge("b4096-h32_8-s16-d64", 32, 8, 64, "bhsd", batch=4096, seqlen=16,
         fwd=(("_attn_fwd", 131_072),), bwd=_bwd("", 131_072, 32_768, 131_072)),
    Edge("b2100-h32_32-s8-d128", 32, 32, 128, "bhsd", batch=2100, seqlen=8,
         fwd=(("_attn_fwd", 67_200),), bwd=_bwd("", 67_200, 67_200, 67_200)),
    Edge("varlen-70000docs-x3-h8-d64", 8, 8, 64, "packed", docs=70_000, doc_len=3,
         fwd=(("_attn_fwd", 560_000),), bwd=_bwd("", 560_000, 560_000, 560_000)),
    # past 65,535 programs on the Gluon forward and both Gluon backward passes
    Edge("b2100-h32_32-s64-d128", 32, 32, 128, "bhsd", batch=2100, seqlen=64,
         fwd=(("_attn_fwd_ws", 67_200),), bwd=_bwd("_ws", 67_200, 67_200, 67_200)),
    # packed documents under 1024 tokens: the TMA forward (not the persistent Gluon one) and the
    # Gluon backward, 160,000 programs each
    Edge("varlen-20000docs-x64-h8-d128", 8, 8, 128, "packed", docs=20_000, doc_len=64,
         fwd=(("_attn_fwd_tma", 160_000),), bwd=_bwd("_ws", 160_000, 160_000, 160_000)),
    # packed past 2^31 elements (q 2.5e9): the persistent Gluon forward with 64-bit offsets, the
    # 64-bit pointer backward
    Edge("varlen-600docs-x1024-h32_8-d128", 32, 8, 128, "packed", docs=600, doc_len=1024,
         fwd=(("_attn_fwd_ws", PER_SM),), bwd=_bwd("", 153_600, 76_800, 153_600)),
    Edge("varlen-1doc-x540000-h32_8-d128", 32, 8, 128, "packed", docs=1, doc_len=540_000,
         fwd=(("_attn_fwd_ws", PER_SM),), bwd=_bwd("", 135_008, 67_504, 135_008)),
)}


def rel_err(a, b) -> float:
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def abs_err(a, b) -> float:
    return float((a.detach().float() - b.detach().float()).abs().max())


def _finish(gpu_records, case: Edge, errs: dict[str, float], limits: dict[str, float], t0: float):
    """Record the case (shape, errors, launches), then assert every error within its limit and, on
    an sm90 GPU, the launches EDGES expects."""
    got = api.launched()
    dev = torch.device(DEV, torch.cuda.current_device())
    want = case.expected(sm_count(dev))
    shape_q, shape_kv = case.shapes()
    rec = {"kind": "edge", "id": case.id, "layout": case.layout, "q_shape": list(shape_q),
           "kv_shape": list(shape_kv), "q_elements": math.prod(shape_q), "errors": errs,
           "kernels": {part: [list(x) for x in ls] for part, ls in got.items()},
           "max_programs": max((g for ls in got.values() for _, g in ls), default=0),
           "passed": False, "ratio_to_torch": None, "seconds": round(time.perf_counter() - t0, 1)}
    gpu_records.append(rec)
    bad = {n: e for n, e in errs.items() if not e < limits[n.split("@")[0]]}
    assert not bad, f"{case.id}: errors above their limits {limits}: {bad} (all: {errs})"
    if dispatch.native_target(dev) == "sm90":
        assert got == want, f"{case.id}: launched {got}, expected {want} (EDGES)"
    rec["passed"] = True


def _lse_reference(q, k):
    """fp32 LSE (N, Hq, S) of causal (N, Hq, S, D) queries over (N, Hkv, S, D) keys, Sq == Sk."""
    kk = k.float().repeat_interleave(q.shape[1] // k.shape[1], 1)
    s = q.float() @ kk.transpose(-1, -2) / math.sqrt(q.shape[-1])
    n = q.shape[2]
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.logsumexp(s, -1)


def _rows_reference(q, k, v, dout, starts, n=16):
    """fp32 out, LSE and dQ of query rows r .. r+n-1 for r in `starts`, from every key they see:
    one causal sequence (Sq == Sk) of (S, H, D) tensors, GQA. Yields (rows, out (n, Hq, Dv),
    lse (Hq, n), dq (n, Hq, D)); its scores are n rows x their keys, nothing S x S."""
    hq, hkv = q.shape[1], k.shape[1]
    scale = 1 / math.sqrt(q.shape[2])
    for r0 in starts:
        sl = slice(r0, r0 + n)
        qr = q[sl].float().transpose(0, 1)  # (Hq, n, D)
        kk = k[: r0 + n].float().transpose(0, 1).repeat_interleave(hq // hkv, 0)
        vv = v[: r0 + n].float().transpose(0, 1).repeat_interleave(hq // hkv, 0)
        s = qr @ kk.transpose(1, 2) * scale
        i = torch.arange(r0, r0 + n, device=q.device)[:, None]
        j = torch.arange(kk.shape[1], device=q.device)[None, :]
        s = s.masked_fill(j > i, float("-inf"))
        lse = torch.logsumexp(s, -1)
        p = torch.exp(s - lse[..., None])
        o = p @ vv
        do = dout[sl].float().transpose(0, 1)
        dp = do @ vv.transpose(1, 2)
        delta = (do * o).sum(-1, keepdim=True)
        dq = (p * (dp - delta)) @ kk * scale
        yield sl, o.transpose(0, 1), lse, dq.transpose(0, 1)
        del s, p, kk, vv, dp


def _keys_reference(q, k, v, dout, out, lse, k0, n=16, chunk=32768):
    """fp32 dK and dV (n, Hkv, D) of keys k0 .. k0+n-1 of one causal sequence (Sq == Sk, (S, H, D)
    tensors, GQA), from every query that sees them (i >= j), in chunks of `chunk` queries (scores:
    chunk x n per head). P and delta = rowsum(dO * O) come from the kernel's LSE (Hq, S) and O, as
    its backward reads them (the LSE itself is checked on rows against the reference); a KV head's
    gradient sums over its group of query heads."""
    S, hq, d = q.shape
    hkv = k.shape[1]
    group, scale = hq // hkv, 1 / math.sqrt(d)
    kj = k[k0:k0 + n].float().transpose(0, 1).repeat_interleave(group, 0)  # (Hq, n, D)
    vj = v[k0:k0 + n].float().transpose(0, 1).repeat_interleave(group, 0)
    j = torch.arange(k0, k0 + n, device=q.device)[None, :]
    dk = torch.zeros(hq, n, d, device=q.device)
    dv = torch.zeros(hq, n, v.shape[2], device=q.device)
    for a in range(k0, S, chunk):
        b = min(a + chunk, S)
        qc = q[a:b].float().transpose(0, 1)  # (Hq, C, D)
        doc = dout[a:b].float().transpose(0, 1)
        delta = (doc * out[a:b].float().transpose(0, 1)).sum(-1, keepdim=True)  # (Hq, C, 1)
        s = qc @ kj.transpose(1, 2) * scale  # (Hq, C, n)
        i = torch.arange(a, b, device=q.device)[:, None]
        p = torch.exp(s.masked_fill(j > i, float("-inf")) - lse[:, a:b, None])
        ds = p * (doc @ vj.transpose(1, 2) - delta)
        dv += p.transpose(1, 2) @ doc
        dk += ds.transpose(1, 2) @ qc
        del qc, doc, delta, s, p, ds
    dk, dv = dk * scale, dv
    return (dk.view(hkv, group, n, d).sum(1).transpose(0, 1),
            dv.view(hkv, group, n, -1).sum(1).transpose(0, 1))


def _long_sequence_errors(q, k, v, dout, out, lse, dq, dk, dv) -> dict[str, float]:
    """Errors of one long causal sequence ((S, H, D) tensors, lse (Hq, S)) on 16 query rows and 16
    key rows at its start, middle and end."""
    S = q.shape[0]
    starts = (0, S // 2 - 8, S - 16)
    errs = {}
    for sl, o_ref, lse_ref, dq_ref in _rows_reference(q, k, v, dout, starts):
        errs[f"out@{sl.start}"] = rel_err(out[sl], o_ref)
        errs[f"lse@{sl.start}"] = abs_err(lse[:, sl], lse_ref)
        errs[f"dq@{sl.start}"] = rel_err(dq[sl], dq_ref)
    for k0 in starts:
        dk_ref, dv_ref = _keys_reference(q, k, v, dout, out, lse, k0)
        errs[f"dk@{k0}"] = rel_err(dk[k0:k0 + 16], dk_ref)
        errs[f"dv@{k0}"] = rel_err(dv[k0:k0 + 16], dv_ref)
    return errs


def test_long_context_bshd_past_2_31_elements(gpu_records):
    """B1 S=540,000 Hq32/Hkv8 hd128 bf16 causal, bshd: row x stride (H*D) passes 2^31 elements."""
    case = EDGES["long-bshd-S540000-h32_8-d128"]
    t0 = time.perf_counter()
    shape_q, shape_kv = case.shapes()
    q, k, v, dout = random_inputs(shape_q, shape_kv, shape_kv, shape_q, dtype=BF16, device=DEV, seed=1)
    assert q.numel() >= 1 << 31
    leaves = [t.requires_grad_(True) for t in (q, k, v)]
    api.clear_plans()
    out, lse = attngen.attention(*leaves, causal=True, layout="bshd", return_lse=True)
    dq, dk, dv = torch.autograd.grad(out, leaves, dout)
    torch.cuda.synchronize()
    errs = _long_sequence_errors(*(t.detach()[0] for t in (q, k, v, dout, out)), lse[0], dq[0], dk[0], dv[0])
    _finish(gpu_records, case, errs, LONG_LIMITS, t0)


def test_one_document_of_540000_tokens(gpu_records):
    """The same sequence as one packed document (attention_varlen): the persistent Gluon forward
    under 64-bit offsets, the 64-bit pointer backward."""
    case = EDGES["varlen-1doc-x540000-h32_8-d128"]
    t0 = time.perf_counter()
    shape_q, shape_kv = case.shapes()
    q, k, v, dout = random_inputs(shape_q, shape_kv, shape_kv, shape_q, dtype=BF16, device=DEV, seed=2)
    S = case.doc_len
    cu = torch.tensor([0, S], dtype=torch.int32, device=DEV)
    leaves = [t.requires_grad_(True) for t in (q, k, v)]
    api.clear_plans()
    out, lse = attngen.attention_varlen(*leaves, cu, cu, S, S, causal=True, return_lse=True)
    dq, dk, dv = torch.autograd.grad(out, leaves, dout)
    torch.cuda.synchronize()
    errs = _long_sequence_errors(*(t.detach() for t in (q, k, v, dout, out)), lse, dq, dk, dv)
    _finish(gpu_records, case, errs, LONG_LIMITS, t0)


def _dense_check(case: Edge, gpu_records, seed: int):
    """A bhsd case, forward and backward, against float32 SDPA on every batch entry."""
    t0 = time.perf_counter()
    shape_q, shape_kv = case.shapes()
    q, k, v, dout = random_inputs(shape_q, shape_kv, shape_kv, shape_q, dtype=BF16, device=DEV, seed=seed)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    api.clear_plans()
    out, lse = attngen.attention(*leaves, causal=True, return_lse=True)
    grads = torch.autograd.grad(out, leaves, dout)
    ref_leaves = [t.float().requires_grad_(True) for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(*ref_leaves, is_causal=True, enable_gqa=case.hq != case.hkv)
    ref_g = torch.autograd.grad(ref, ref_leaves, dout.float())
    errs = {"out": rel_err(out, ref), "lse": abs_err(lse, _lse_reference(q, k)),
            **{n: rel_err(g, r) for n, g, r in zip(("dq", "dk", "dv"), grads, ref_g)}}
    _finish(gpu_records, case, errs, LIMITS, t0)


def _varlen_check(case: Edge, gpu_records, seed: int, per_slice: int | None = None):
    """A packed case, forward and backward, against float32 SDPA on its documents: all of them, or
    `per_slice` documents at the start, the middle and the end of the pack."""
    t0 = time.perf_counter()
    docs, L = case.docs, case.doc_len
    shape_q, shape_kv = case.shapes()
    q, k, v, dout = random_inputs(shape_q, shape_kv, shape_kv, shape_q, dtype=BF16, device=DEV, seed=seed)
    cu = torch.arange(0, docs * L + 1, L, dtype=torch.int32, device=DEV)
    leaves = [t.requires_grad_(True) for t in (q, k, v)]
    api.clear_plans()
    out, lse = attngen.attention_varlen(*leaves, cu, cu, L, L, causal=True, return_lse=True)
    grads = torch.autograd.grad(out, leaves, dout)
    n = docs if per_slice is None else per_slice
    errs = {}
    for a in sorted({0, (docs - n) // 2, docs - n}):
        tok = slice(a * L, (a + n) * L)

        def as_b(t):  # packed rows of documents a .. a+n-1 -> (n, H, L, D) float32
            return t[tok].detach().float().view(n, L, t.shape[1], t.shape[2]).transpose(1, 2)

        ref_leaves = [as_b(t).requires_grad_(True) for t in (q, k, v)]
        ref = F.scaled_dot_product_attention(*ref_leaves, is_causal=True, enable_gqa=case.hq != case.hkv)
        ref_g = torch.autograd.grad(ref, ref_leaves, as_b(dout))
        lse_ref = _lse_reference(*(t.detach() for t in ref_leaves[:2]))
        errs[f"out@doc{a}"] = rel_err(as_b(out), ref)
        errs[f"lse@doc{a}"] = abs_err(lse[:, tok].view(case.hq, n, L).transpose(0, 1), lse_ref)
        for name, g, r in zip(("dq", "dk", "dv"), grads, ref_g):
            errs[f"{name}@doc{a}"] = rel_err(as_b(g), r)
        del ref_leaves, ref, ref_g, lse_ref
    _finish(gpu_records, case, errs, LIMITS, t0)


def test_batch_heads_past_65535(gpu_records):
    _dense_check(EDGES["b4096-h32_8-s16-d64"], gpu_records, seed=4096)


def test_batch_2100_heads_32(gpu_records):
    _dense_check(EDGES["b2100-h32_32-s8-d128"], gpu_records, seed=2100)


def test_70000_documents(gpu_records):
    _varlen_check(EDGES["varlen-70000docs-x3-h8-d64"], gpu_records, seed=3)


def test_gluon_grids_past_65535(gpu_records):
    """Not host-bound: the Gluon forward and backward, 67,200 programs each."""
    _dense_check(EDGES["b2100-h32_32-s64-d128"], gpu_records, seed=64)


def test_20000_documents_tma_forward_gluon_backward(gpu_records):
    """160,000 programs per launch; 2,000 documents checked at the start, middle and end."""
    _varlen_check(EDGES["varlen-20000docs-x64-h8-d128"], gpu_records, seed=20, per_slice=2000)


def test_600_documents_past_2_31_elements(gpu_records):
    """q has 2.5e9 elements: the persistent Gluon forward and the pointer backward under 64-bit
    offsets; 8 documents checked at the start, middle and end."""
    case = EDGES["varlen-600docs-x1024-h32_8-d128"]
    assert math.prod(case.shapes()[0]) >= 1 << 31
    _varlen_check(case, gpu_records, seed=600, per_slice=8)


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_inductor_fullgraph_forward_backward(layout):
    q, k, v, dout = random_inputs((2, 1000, 8, 64), (2, 1000, 2, 64), (2, 1000, 2, 64), (2, 1000, 8, 64),
                                  dtype=torch.bfloat16, device=DEV, seed=4)
    if layout == "bhsd":
        q, k, v, dout = (t.transpose(1, 2).contiguous() for t in (q, k, v, dout))

    def fn(q, k, v):
        return attngen.attention(q, k, v, causal=True, layout=layout) * 2.0

    compiled = torch.compile(fn, fullgraph=True)
    a = [t.clone().requires_grad_(True) for t in (q, k, v)]
    b = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out_c, out_e = compiled(*a), fn(*b)
    g_c, g_e = torch.autograd.grad(out_c, a, dout), torch.autograd.grad(out_e, b, dout)
    assert torch.equal(out_c, out_e)
    for x, y in zip(g_c, g_e):
        assert torch.equal(x, y)


def test_cuda_graph_capture_and_replay():
    q, k, v = random_inputs((2, 8, 777, 128), (2, 2, 777, 128), (2, 2, 777, 128),
                            dtype=torch.bfloat16, device=DEV, seed=5)
    static = [t.clone() for t in (q, k, v)]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            attngen.attention(*static, causal=True)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = attngen.attention(*static, causal=True)
    for seed in (6, 7):
        new = random_inputs((2, 8, 777, 128), (2, 2, 777, 128), (2, 2, 777, 128), dtype=torch.bfloat16,
                            device=DEV, seed=seed)
        for dst, src in zip(static, new):
            dst.copy_(src)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, attngen.attention(*new, causal=True)), "replay differs from eager"


def test_lengths_do_not_recompile():
    def fns():
        out = {}
        for plan in list(api._FWD.values()) + list(api._BWD.values()):
            for la in plan.launches:
                out[id(la.fn)] = la.fn
        return out.values()

    def call(s):
        q = torch.randn(1, 8, s, 128, device=DEV, dtype=torch.bfloat16, requires_grad=True)
        kv = torch.randn(1, 2, s, 128, device=DEV, dtype=torch.bfloat16, requires_grad=True)
        attngen.attention(q, kv, kv, causal=True).sum().backward()

    call(2050)
    before = sum(len(c[0]) for f in fns() for c in f.device_caches.values())
    for s in (2051, 2053, 2064, 2100, 2999, 3001, 4096):
        call(s)
    after = sum(len(c[0]) for f in fns() for c in f.device_caches.values())
    assert after == before, f"{after - before} compiles for new lengths in one bucket"


@pytest.mark.parametrize("d", [59, 111, 8, 200, 96])
def test_any_head_dim(d, gpu_records):
    """Head dims that are not multiples of 8 (padded tiles, unspecialized strides), forward and
    backward against float64 with the flash-attn rule."""
    from attngen.problem import attention_ref
    from attngen.testing import assert_flash_rule, check_grads

    q, k, v, dout = random_inputs((2, 8, 1023, d), (2, 2, 1023, d), (2, 2, 1023, d), (2, 8, 1023, d),
                                  dtype=torch.bfloat16, device=DEV, seed=d)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = attngen.attention(*leaves, causal=True)
    grads = torch.autograd.grad(out, leaves, dout)
    ref, _ = attention_ref(q, k, v, causal=True)
    pt, _ = attention_ref(q, k, v, causal=True, upcast=False)
    err, pt_err = assert_flash_rule(f"hd{d}/out", out, ref, pt, 2.0)
    errs = check_grads(f"hd{d}", lambda *t, upcast: attention_ref(*t, causal=True, upcast=upcast)[0],
                       (q, k, v), dout, grads)
    gpu_records.append({"kind": "head_dim", "id": f"hd{d}-b2-h8_2-s1023", "passed": True,
                        "ratio_to_torch": max([err / pt_err] + [e / p for e, p in errs.values() if p > 0]),
                        "seconds": 0.0})
