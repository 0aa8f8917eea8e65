"""GPU: the decode family on the grid of the CPU tests (tests/kernels/test_decode.py) plus serving
shapes (hd128 GQA 32/8 and MHA, long caches, page 16), the 2x rule against float64 per row; a CUDA
graph captured around attention_with_kvcache (append included) and replayed with other
cache_seqlens values, compared with eager calls."""

from __future__ import annotations

import math

import pytest
import torch

import attngen
from attngen.families import decode as fd
from attngen.kernels.common import MaskArgs, mask_kind
from attngen.runtime import loader
from attngen.spec import KernelSpec
from attngen.problem import random_inputs
from attngen.testing import assert_flash_rule, assert_lse_close
from tests.kernels.test_decode import CASES, DTYPES, _name, make_cache, reference, rows_view

pytestmark = pytest.mark.gpu
DEV = "cuda"

# (dtype, B, Sq, Hq, Hkv, D, capacity, causal, window, softcap, page, num_splits)
SERVING = [
    ("bf16", 1, 1, 32, 8, 128, 32768, True, (-1, -1), 0.0, 0, 0),
    ("bf16", 8, 1, 32, 8, 128, 8192, True, (-1, -1), 0.0, 16, 0),
    ("fp16", 4, 4, 32, 8, 128, 4099, True, (-1, -1), 0.0, 16, 0),
    ("bf16", 2, 1, 16, 16, 64, 5000, True, (1024, -1), 0.0, 0, 0),
    ("bf16", 3, 8, 8, 8, 128, 2048, True, (-1, -1), 50.0, 32, 7),
]


def _cache(B, cap, hkv, d, dtype, page, seed):
    return make_cache(B, cap, hkv, d, dtype, page, seed, device=DEV, spare=5)


@pytest.mark.parametrize("case", CASES + SERVING, ids=[_name(c) for c in CASES + SERVING])
def test_gpu_decode_against_float64(case):
    dt, B, sq, hq, hkv, d, cap, causal, window, softcap, page, splits = case
    dtype = DTYPES[dt]
    k_cache, v_cache, table = _cache(B, cap, hkv, d, dtype, page, seed=1)
    capacity = table.shape[1] * page if page else cap
    q, = random_inputs((B, sq, hq, d), dtype=dtype, device=DEV, seed=2, mults=[3.0 if softcap else 1.0])
    g = torch.Generator().manual_seed(3)
    lens = [1] + [int(x) for x in torch.randint(sq, capacity + 1, (B - 1,), generator=g)]
    lens[-1] = capacity
    seqlens = torch.tensor(lens, dtype=torch.int32, device=DEV)
    with torch.no_grad():
        out, lse = attngen.attention_with_kvcache(q, k_cache, v_cache, seqlens, block_table=table, causal=causal,
                                                  window_size=window, softcap=softcap, return_lse=True,
                                                  num_splits=splits)
    kr, vr = rows_view(k_cache, table, B), rows_view(v_cache, table, B)
    scale = 1.0 / math.sqrt(d)
    o64, l64 = reference(q, kr, vr, lens, causal, window, softcap, scale)
    opt, _ = reference(q, kr, vr, lens, causal, window, softcap, scale, upcast=False)
    assert_flash_rule(_name(case), out, o64, opt, 2.0)
    assert_lse_close(_name(case) + " lse", lse, l64)


@pytest.mark.parametrize("merge", ["launch", "fused"])
def test_gpu_decode_poisoned_outputs_are_all_written(merge):
    """Through the launcher with NaN-poisoned outputs and partial buffers (several splits, some
    empty for the short rows); on sm90 the combine follows the split kernel with programmatic
    dependent launch (use_pdl None: the launcher's choice; it reads the partial buffers only after
    waiting for the split kernel), and without it (False) the outputs are the same bits. merge
    "fused": one launch (the split kernel merges), no programmatic dependent launch either way."""
    B, sq, hq, hkv, d, cap = 4, 2, 16, 4, 128, 3000
    spec = KernelSpec("decode", "bf16", "sm90", d, d, hq // hkv, "causal", False, False)
    mod = loader.load(spec)
    k_cache, v_cache, _ = _cache(B, cap, hkv, d, torch.bfloat16, 0, seed=4)
    q, = random_inputs((B, sq, hq, d), dtype=torch.bfloat16, device=DEV, seed=5)
    lens = [2, 100, 1777, 3000]
    cfg = fd.DecodeConfig(64, 4, 2, 16, merge)
    n, split_len = fd.splits(cfg, B, hkv, cap, 132)
    mask, wl, wr = mask_kind(True, (-1, -1))
    o64, l64 = reference(q, k_cache, v_cache, lens, True, (-1, -1), 0.0, 1 / math.sqrt(d))
    opt, _ = reference(q, k_cache, v_cache, lens, True, (-1, -1), 0.0, 1 / math.sqrt(d), upcast=False)
    got = {}
    for use_pdl in (None, False):
        out = torch.full((B, sq, hq, d), float("nan"), dtype=torch.bfloat16, device=DEV)
        lse = torch.full((B, hq, sq), float("nan"), device=DEV)
        ps, ls = fd.partial_shapes(B, hkv, n, fd.rows_tile(hq // hkv, sq), d)
        op, lp = torch.full(ps, float("nan"), device=DEV), torch.full(ls, float("nan"), device=DEV)
        launches = fd.decode_launches(mod, spec, q, k_cache, v_cache, out, lse, op, lp,
                                      MaskArgs(1 / math.sqrt(d), 0.0, wl, wr, False), cfg, n, split_len,
                                      torch.tensor(lens, dtype=torch.int32, device=DEV), use_pdl=use_pdl)
        if merge == "launch":
            assert n > 1 and launches[-1].fn.__name__ == "_attn_decode_combine"
            assert launches[-1].pdl is (use_pdl is None and torch.cuda.get_device_capability() >= (9, 0))
        else:
            assert n > 1 and [la.fn.__name__ for la in launches] == ["_attn_decode"] and not launches[0].pdl
        for la in launches:
            la.run()
        assert_flash_rule(f"poisoned pdl={use_pdl}", out, o64, opt, 2.0)
        assert_lse_close(f"poisoned pdl={use_pdl} lse", lse, l64)
        got[use_pdl] = (out, lse)
    assert torch.equal(got[None][0], got[False][0]) and torch.equal(got[None][1], got[False][1])


@pytest.mark.parametrize("paged", [False, True])
def test_cuda_graph_decode_step(paged):
    """One decode step (append + attend) captured in a CUDA graph, replayed with new cache_seqlens
    values and new tokens: each replay equals an eager call on a copy of the caches."""
    B, hq, hkv, d, cap = 4, 32, 8, 128, 4096
    k_cache, v_cache, table = _cache(B, cap, hkv, d, torch.bfloat16, 16 if paged else 0, seed=6)
    q, k_new, v_new = random_inputs((B, 1, hq, d), (B, 1, hkv, d), (B, 1, hkv, d), dtype=torch.bfloat16,
                                    device=DEV, seed=7)
    seqlens = torch.tensor([10, 200, 3000, 4000], dtype=torch.int32, device=DEV)

    def step():
        return attngen.attention_with_kvcache(q, k_cache, v_cache, seqlens, k=k_new, v=v_new, block_table=table)

    with torch.no_grad():
        step()  # compile and plan outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step()
        for i, lens in enumerate(([1, 2, 3, 4], [4095, 0, 17, 2048])):
            seqlens.copy_(torch.tensor(lens, dtype=torch.int32))
            qn, kn, vn = random_inputs(q.shape, k_new.shape, v_new.shape, dtype=torch.bfloat16, device=DEV,
                                       seed=20 + i)
            q.copy_(qn), k_new.copy_(kn), v_new.copy_(vn)
            kc, vc = k_cache.clone(), v_cache.clone()
            graph.replay()
            ref = attngen.attention_with_kvcache(q, kc, vc, seqlens, k=k_new, v=v_new, block_table=table)
            torch.cuda.synchronize()
            assert torch.equal(out, ref), f"replay {i} differs from eager"
            assert torch.equal(kc, k_cache) and torch.equal(vc, v_cache), f"replay {i}: caches differ"


@pytest.mark.parametrize("page", [0, 16])
def test_gpu_fp8_cache_serving_shape(page):
    """An e4m3 cache with per-(batch, KV head) descales, hd128 GQA 32/8, 8k keys, paged by 16 or
    not, with a new token appended: the 2x rule against PyTorch in bf16 on the dequantized cache."""
    B, hq, hkv, d, cap = 4, 32, 8, 128, 8192
    k_src, v_src, table = _cache(B, cap, hkv, d, torch.bfloat16, page, seed=31)
    kd = torch.full((B, hkv), 0.02, device=DEV)
    vd = torch.full((B, hkv), 0.015, device=DEV)
    k8 = (k_src.float() / 0.02).to(torch.float8_e4m3fn)
    v8 = (v_src.float() / 0.015).to(torch.float8_e4m3fn)
    q, k_new, v_new = random_inputs((B, 1, hq, d), (B, 1, hkv, d), (B, 1, hkv, d), dtype=torch.bfloat16,
                                    device=DEV, seed=32)
    capacity = table.shape[1] * page if page else cap
    lens = [5, 4000, capacity - 1, 777]
    seqlens = torch.tensor(lens, dtype=torch.int32, device=DEV)
    with torch.no_grad():
        out, lse = attngen.attention_with_kvcache(q, k8, v8, seqlens, k=k_new, v=v_new, block_table=table,
                                                  return_lse=True, k_descale=kd, v_descale=vd)
    kf = rows_view(k8, table, B).double() * 0.02
    vf = rows_view(v8, table, B).double() * 0.015
    lens = [n + 1 for n in lens]
    scale = 1.0 / math.sqrt(d)
    o64, l64 = reference(q, kf, vf, lens, True, (-1, -1), 0.0, scale)
    opt, _ = reference(q, kf.bfloat16(), vf.bfloat16(), lens, True, (-1, -1), 0.0, scale, upcast=False)
    assert_flash_rule(f"fp8 cache page {page}", out, o64, opt, 2.0)
    assert_lse_close("fp8 cache lse", lse, l64)
