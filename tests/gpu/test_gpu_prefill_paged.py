"""GPU: the prefill_paged family on the grid of the CPU tests (tests/kernels/test_prefill_paged.py,
the sm80 pointer kernel through its launcher, outputs poisoned) plus serving shapes through
attention_varlen(..., block_table=...) on the device's own target (hd128 GQA 32/8 chunks of 1 to
2048 queries on up to 8k keys, pages of 16; hd256 softcap + window; a mixed batch of prefill
chunks and one-token decodes), each by the 2x rule against float64 per sequence and against the
dense varlen forward; metadata out of range on the default (no sync) path, the host check under
ATTNGEN_CHECK_KVCACHE=1, and a CUDA graph replayed with other key counts and tables."""

from __future__ import annotations

import math

import pytest
import torch

import attngen
from attngen.problem import random_inputs
from attngen.testing import assert_flash_rule, assert_lse_close
from tests.gpu.test_gpu_kvcache_guard import _clear_flag  # noqa: F401 (autouse: the flag clear before each test)
from tests.kernels import test_prefill_paged_guard as guard
from tests.kernels.test_kvcache_guard import close
from tests.kernels.test_prefill_paged import (
    CASES,
    TMA_CASES,
    _name,
    cumulative,
    dense_keys,
    make_paged,
    reference,
    run_case,
)

pytestmark = pytest.mark.gpu
DEV = "cuda"


@pytest.mark.parametrize("case", CASES, ids=[_name(c) for c in CASES])
def test_gpu_prefill_paged_kernel_grid(case):
    out, lse, o64, l64, opt = run_case(case, device=DEV)
    assert_flash_rule(_name(case), out, o64, opt, 2.0)
    assert_lse_close(_name(case) + " lse", lse, l64)


@pytest.mark.parametrize("case", TMA_CASES, ids=[_name(c) for c in TMA_CASES])
def test_gpu_prefill_paged_tma_kernel_grid(case):
    out, lse, o64, l64, opt = run_case(case, device=DEV, tma=True)
    assert_flash_rule(_name(case) + " tma", out, o64, opt, 2.0)
    assert_lse_close(_name(case) + " tma lse", lse, l64)


# (chunks, key counts, Hq, Hkv, D, page, window, softcap); at the default configs the MHA hd128
# rows with pages of 64 take the copy engine (tma_kv), the rest the pointer gather
SERVING = [
    ([1, 512, 2048, 77], [3000, 1500, 2100, 700], 32, 8, 128, 16, (-1, -1), 0.0),
    ([1000, 1, 1, 300], [8192, 4097, 16, 5000], 32, 8, 128, 16, (-1, -1), 0.0),
    ([700, 64], [4100, 64], 16, 8, 256, 32, (4095, -1), 50.0),
    ([256] * 3 + [1] * 13, [2048] * 16, 32, 32, 64, 16, (-1, -1), 0.0),
    ([1, 512, 2048, 77], [3000, 1500, 2100, 700], 32, 8, 128, 64, (-1, -1), 0.0),
    ([1000, 1, 1, 300], [8192, 4097, 16, 5000], 32, 8, 128, 128, (1023, -1), 30.0),
    ([700, 64], [4100, 64], 16, 8, 256, 64, (4095, -1), 50.0),
    ([1, 512, 2048, 77], [3000, 1500, 2100, 700], 16, 16, 128, 64, (-1, -1), 0.0),
    ([1000, 1, 300], [8192, 4097, 5000], 16, 16, 128, 64, (1023, -1), 30.0),
]


@pytest.mark.parametrize("case", SERVING, ids=[f"serving{i}" for i in range(len(SERVING))])
def test_gpu_serving_shapes(case):
    lq, lk, hq, hkv, d, page, window, softcap = case
    kp, vp, table = make_paged(lk, hkv, d, torch.bfloat16, page, seed=1, device=DEV, spare=7, room=2)
    for b, n in enumerate(lk):  # slots past each sequence's keys: NaN, never read into a row
        if n % page:
            kp[table[b, n // page].long(), n % page:] = float("nan")
            vp[table[b, n // page].long(), n % page:] = float("nan")
    q, = random_inputs((sum(lq), hq, d), dtype=torch.bfloat16, device=DEV, seed=2, mults=[3.0 if softcap else 1.0])
    cu_q, cu_k = cumulative(lq, DEV), cumulative(lk, DEV)
    used = torch.tensor(lk, dtype=torch.int32, device=DEV)
    kw = dict(causal=True, window_size=window, softcap=softcap)
    with torch.no_grad():
        out, lse = attngen.attention_varlen(q, kp, vp, cu_q, None, max(lq), max(lk), block_table=table, seqused_k=used,
                                            return_lse=True, **kw)
        k, v = dense_keys(kp, table, lk), dense_keys(vp, table, lk)
        dense = attngen.attention_varlen(q, k, v, cu_q, cu_k, max(lq), max(lk), **kw)
    scale = 1.0 / math.sqrt(d)
    o64, l64 = reference(q, k, v, lq, lk, True, window, softcap, scale)
    opt, _ = reference(q, k, v, lq, lk, True, window, softcap, scale, upcast=False)
    assert_flash_rule("serving", out, o64, opt, 2.0)
    assert_flash_rule("serving dense", dense, o64, opt, 2.0)
    assert_lse_close("serving lse", lse, l64)
    attngen.check_kvcache()


def _cuda(*ts):
    return tuple(None if t is None else t.to(DEV) for t in ts)


@pytest.mark.parametrize("name", list(guard.CASES))
def test_gpu_metadata_out_of_range(name, monkeypatch):
    """The default path does not sync: the kernel clamps and flags, check_kvcache() names the
    argument; ATTNGEN_CHECK_KVCACHE=1 raises the CPU's error before the launch."""
    cpu = guard.make(name)
    q, kp, vp, table, cu_q, cu_k, used = cpu
    o64, l64 = guard.expected(q, kp, vp, table, cu_k, used)
    args = _cuda(*cpu)
    call = dict(causal=True, block_table=args[3], seqused_k=args[6])
    with torch.no_grad():
        out, lse = attngen.attention_varlen(*args[:3], args[4], args[5], max(guard.LQ), 0, return_lse=True, **call)
        torch.cuda.synchronize()
        slots, message = guard.CASES[name][4], guard.CASES[name][3]
        if slots:
            with pytest.raises(ValueError, match="seqused_k" if guard.KEYS in slots else "block_table"):
                attngen.check_kvcache()
        attngen.check_kvcache()
        close(f"{name} out", out.cpu(), o64)
        close(f"{name} lse", lse.cpu(), l64)
        if message is not None:
            monkeypatch.setenv("ATTNGEN_CHECK_KVCACHE", "1")
            with pytest.raises(ValueError, match=message.split(" (")[0]):
                attngen.attention_varlen(*args[:3], args[4], args[5], max(guard.LQ), 0, **call)


def test_cuda_graph_prefill_step():
    """A paged prefill call captured in a CUDA graph and replayed with other key counts and
    tables (values only): each replay equals an eager call."""
    lq, lk, hq, hkv, d = [300, 1, 40], [1000, 2000, 800], 32, 8, 128
    kp, vp, table = make_paged([2048] * 3, hkv, d, torch.bfloat16, 16, seed=3, device=DEV)
    q, = random_inputs((sum(lq), hq, d), dtype=torch.bfloat16, device=DEV, seed=4)
    cu_q = cumulative(lq, DEV)
    used = torch.tensor(lk, dtype=torch.int32, device=DEV)

    def step():
        return attngen.attention_varlen(q, kp, vp, cu_q, None, 300, 2048, causal=True, block_table=table,
                                        seqused_k=used)

    with torch.no_grad():
        step()  # compile, plan and check cu_seqlens_q outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step()
        for i, counts in enumerate(([300, 1, 2048], [2047, 17, 40])):
            used.copy_(torch.tensor(counts, dtype=torch.int32))
            table.copy_(table.flip(0))
            graph.replay()
            ref = step()
            torch.cuda.synchronize()
            assert torch.equal(out, ref), f"replay {i} differs from eager"
