"""GPU: KV-cache metadata out of range (issue 51), the cases of tests/kernels/test_kvcache_guard.py
on CUDA tensors. Written to run under compute-sanitizer's memcheck
(benchmarks/tools/kvcache_guard_gpu.sh): no call may read or write outside a tensor, whatever
cache_seqlens and block_table hold.
* default path (no sync): the call returns, the kernels clamp and flag, attngen.check_kvcache()
  raises naming the argument, the caches hold exactly what the rows may write;
* validate=True and ATTNGEN_CHECK_KVCACHE=1: the host check raises before anything is written;
* a CUDA graph captured on valid metadata and replayed on bad metadata: no fault, the flag set;
* torch.compile(fullgraph=True): the same flag;
* an e4m3 cache: the append kernel's guards and rounding."""

from __future__ import annotations

import pytest
import torch

import attngen
from tests.kernels.test_kvcache_guard import CASES, close, expected, make

pytestmark = pytest.mark.gpu
DEV = "cuda"
BAD = [n for n in CASES if CASES[n][5] is not None]
ARG = {n: CASES[n][5].split(":")[0] for n in BAD}  # the argument the error names


def _cpu(*ts):
    return tuple(None if t is None else t.cpu() for t in ts)


@pytest.fixture(autouse=True)
def _clear_flag():
    try:  # no state between tests: read and clear the flag first
        attngen.check_kvcache()
    except ValueError:
        pass
    yield


@pytest.mark.parametrize("name", list(CASES))
def test_default_path_clamps_and_flags(name):
    q, kc, vc, bt, seqlens, kn, vn, page = make(name, device=DEV)
    ke, ve, o64, l64, slots = expected(*_cpu(q, kc, vc, bt, seqlens, kn, vn), page)
    with torch.no_grad():
        out, lse = attngen.attention_with_kvcache(q, kc, vc, seqlens, k=kn, v=vn, block_table=bt, return_lse=True)
    torch.cuda.synchronize()
    if slots:
        with pytest.raises(ValueError, match=ARG[name]):
            attngen.check_kvcache()
    attngen.check_kvcache()  # read and cleared: nothing left
    assert torch.equal(kc.cpu(), ke) and torch.equal(vc.cpu(), ve), f"{name}: the caches hold other values"
    close(f"{name} out", out.cpu(), o64)
    close(f"{name} lse", lse.cpu(), l64)


@pytest.mark.parametrize("name", BAD)
@pytest.mark.parametrize("how", ["argument", "environment"])
def test_validate_raises_before_writing(name, how, monkeypatch):
    q, kc, vc, bt, seqlens, kn, vn, page = make(name, device=DEV)
    k0, v0 = kc.clone(), vc.clone()
    kw = {"validate": True} if how == "argument" else {}
    if how == "environment":
        monkeypatch.setenv("ATTNGEN_CHECK_KVCACHE", "1")
    with torch.no_grad(), pytest.raises(ValueError, match=CASES[name][5]):
        attngen.attention_with_kvcache(q, kc, vc, seqlens, k=kn, v=vn, block_table=bt, **kw)
    assert torch.equal(kc, k0) and torch.equal(vc, v0)
    attngen.check_kvcache()  # nothing launched, nothing flagged


@pytest.mark.parametrize("paged", [False, True])
def test_cuda_graph_replays_bad_metadata_safely(paged):
    """Captured on valid metadata (no host sync in the call), replayed with cache_seqlens past the
    capacity and (paged) a page past the pool: no fault, the flag names the argument, and a replay
    on valid metadata again matches an eager call."""
    name = "padding_past_used_pages" if paged else "dense_past_s_max"
    q, kc, vc, bt, seqlens, kn, vn, _ = make(name, device=DEV)
    kn = kn if kn is not None else torch.randn(q.shape[0], 1, kc.shape[2], kc.shape[3], device=DEV, dtype=q.dtype)
    vn = vn if vn is not None else torch.randn_like(kn)
    good = torch.zeros_like(seqlens)

    def step():
        return attngen.attention_with_kvcache(q, kc, vc, seqlens, k=kn, v=vn, block_table=bt)

    with torch.no_grad():
        seqlens.copy_(good)
        step()
        torch.cuda.synchronize()
        attngen.check_kvcache()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step()
        seqlens.fill_(10 ** 6)
        if paged:
            bt[0, 0] = 10 ** 6
        graph.replay()
        torch.cuda.synchronize()
        with pytest.raises(ValueError, match="block_table" if paged else "cache_seqlens"):
            attngen.check_kvcache()
        assert torch.isfinite(out).all()
        if paged:
            bt[0, 0] = 4
        seqlens.copy_(good + 3)
        kc2, vc2 = kc.clone(), vc.clone()
        graph.replay()
        ref = attngen.attention_with_kvcache(q, kc2, vc2, seqlens, k=kn, v=vn, block_table=bt)
        torch.cuda.synchronize()
        attngen.check_kvcache()
        assert torch.equal(out, ref) and torch.equal(kc, kc2)


def test_torch_compile_flags():
    q, kc, vc, bt, seqlens, kn, vn, _ = make("append_into_bad_page", device=DEV)

    @torch.compile(fullgraph=True)
    def step(q, kc, vc, s, kn, vn, bt):
        return attngen.attention_with_kvcache(q, kc, vc, s, k=kn, v=vn, block_table=bt)

    with torch.no_grad():
        step(q, kc, vc, seqlens, kn, vn, bt)
    torch.cuda.synchronize()
    with pytest.raises(ValueError, match="block_table"):
        attngen.check_kvcache()


@pytest.mark.parametrize("page", [0, 16])
def test_fp8_cache_append_guards(page):
    """An e4m3 cache: tokens that fit are divided by the descales and rounded to e4m3 (saturating)
    as torch rounds them; a row past its capacity writes nothing past it and is flagged."""
    E4 = torch.float8_e4m3fn
    B, hkv, d = 2, 2, 64
    g = torch.Generator().manual_seed(5)
    shape = (6, 16, hkv, d) if page else (B, 32, hkv, d)
    k8 = (torch.randn(shape, generator=g) * 20).to(E4).to(DEV)
    v8 = (torch.randn(shape, generator=g) * 20).to(E4).to(DEV)
    bt = torch.tensor([[3, 1], [0, 5]], dtype=torch.int32, device=DEV) if page else None
    q = torch.randn(B, 1, 4, d, generator=g).to(torch.bfloat16).to(DEV)
    kn = (torch.randn(B, 2, hkv, d, generator=g) * 30).to(torch.bfloat16).to(DEV)
    vn = (torch.randn(B, 2, hkv, d, generator=g) * 30).to(torch.bfloat16).to(DEV)
    kd = torch.full((B, hkv), 0.05, device=DEV)
    vd = torch.full((B, hkv), 0.02, device=DEV)
    seqlens = torch.tensor([5, 31], dtype=torch.int32, device=DEV)  # row 1: one token fits of two
    k0 = k8.clone()
    with torch.no_grad():
        attngen.attention_with_kvcache(q, k8, v8, seqlens, k=kn, v=vn, block_table=bt, k_descale=kd, v_descale=vd)
    torch.cuda.synchronize()
    with pytest.raises(ValueError, match="cache_seqlens"):
        attngen.check_kvcache()
    want = k0.clone()
    quant = (kn.float() / kd[:, None, :, None]).clamp(-448, 448).to(E4)
    for b, s, n in ((0, 5, 2), (1, 31, 1)):
        for t in range(n):
            at = (int(bt[b, (s + t) // 16]), (s + t) % 16) if page else (b, s + t)
            want[at] = quant[b, t]
    assert torch.equal(k8.view(torch.uint8), want.view(torch.uint8))
