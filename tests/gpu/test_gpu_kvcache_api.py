"""GPU: attention_with_kvcache's flash-attn arguments (cache_batch_idx, cache_leftpad, fused rotary),
the cases of tests/kernels/test_kvcache_api.py on CUDA tensors plus serving shapes (hd128, long
caches, page 16): the caches after the append exactly (the append kernel rotates without FMA, so
its keys round as PyTorch's fp32 rotary does), outputs by flash-attn's 2x rule against float64;
metadata out of range on the default path (no sync: the kernels clamp and flag,
attngen.check_kvcache() names the argument) and with validate=True (the host check raises before
anything is written); a CUDA graph captured with the new arguments and replayed on other values."""

from __future__ import annotations

import pytest
import torch

import attngen
from tests.gpu.test_gpu_kvcache_guard import _clear_flag  # noqa: F401 (an autouse fixture: no flag between tests)
from tests.kernels.test_kvcache_api import (CASES, RANGE, _name, call, check_case, close, expected, make,
                                            poisoned, range_case)  # noqa: F401 (poisoned: a fixture)

pytestmark = pytest.mark.gpu
DEV = "cuda"


# serving shapes, as CASES' rows
SERVING = [
    ("bf16", 8, 1, 8, 128, 4096, 1, True, (-1, -1), 0, "perm", True, 128, False, "q", 0),
    ("bf16", 4, 4, 8, 128, 8192, 4, True, (-1, -1), 16, None, False, 64, True, "fp32", 0),
    ("fp16", 6, 2, 4, 64, 3000, 2, True, (512, -1), 0, "subset", True, 64, False, "q", 0),
]


@pytest.mark.parametrize("case", CASES + SERVING, ids=[_name(c) for c in CASES + SERVING])
def test_gpu_kvcache_api_against_float64(case, poisoned, gpu_records):
    err, pt_err = check_case(case, device=DEV)
    gpu_records.append({"test": "kvcache_api", "case": _name(case), "err": err, "pt_err": pt_err})


def _to(t: dict) -> dict:
    return {n: (x.to(DEV) if isinstance(x, torch.Tensor) else x) for n, x in t.items()}


@pytest.mark.parametrize("name", list(RANGE))
def test_default_path_clamps_and_flags(name):
    t = _to(range_case(name))
    want = expected(t)
    out, lse = call(t)
    torch.cuda.synchronize()
    with pytest.raises(ValueError, match=RANGE[name][2].split(":")[0]):
        attngen.check_kvcache()
    assert torch.equal(t["k_cache"].cpu(), want["k_cache"]) and torch.equal(t["v_cache"].cpu(), want["v_cache"])
    close(f"{name} out", out.cpu(), want["out64"])
    close(f"{name} lse", lse.cpu(), want["lse64"])


@pytest.mark.parametrize("name", list(RANGE))
def test_validate_raises_before_writing(name):
    t = _to(range_case(name))
    k0, v0 = t["k_cache"].clone(), t["v_cache"].clone()
    with pytest.raises(ValueError, match=RANGE[name][2]):
        call(t, validate=True)
    assert torch.equal(t["k_cache"], k0) and torch.equal(t["v_cache"], v0)
    attngen.check_kvcache()  # nothing launched, nothing flagged


def test_cuda_graph_with_the_new_arguments():
    """A decode step with cache_batch_idx, cache_leftpad and rotary captured in a CUDA graph,
    replayed with new lengths, pads, cache rows and tokens: each replay equals an eager call on a
    copy of the caches."""
    case = ("bf16", 4, 1, 8, 128, 2048, 1, True, (-1, -1), 0, "subset", True, 128, False, "q", 0)
    t = make(case, device=DEV)
    names = ("cache_seqlens", "cache_batch_idx", "cache_leftpad", "q", "k", "v")
    with torch.no_grad():
        call(t)  # compile and plan outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out, _ = call(t)
        for seed in (1, 2):
            fresh = make(case, seed=seed, device=DEV)
            for n in names:
                t[n].copy_(fresh[n])
            ref = {**t, "k_cache": t["k_cache"].clone(), "v_cache": t["v_cache"].clone()}
            graph.replay()
            want, _ = call(ref)
            torch.cuda.synchronize()
            assert torch.equal(out, want), f"replay {seed} differs from eager"
            assert torch.equal(t["k_cache"], ref["k_cache"]) and torch.equal(t["v_cache"], ref["v_cache"])


def test_misaligned_new_tokens_after_an_aligned_call():
    # a plan compiled on 16-byte aligned new k / v must not replay its vectorized append on a later
    # call whose new tokens are a misaligned slice (the same shapes and strides): that call takes
    # the JIT path, and the cache holds exactly the tokens given
    g = torch.Generator(device="cuda").manual_seed(5)
    B, S, Hq, Hkv, D = 2, 256, 4, 2, 64
    mk = lambda *s: torch.randn(*s, generator=g, device="cuda").to(torch.float16)  # noqa: E731
    q, kc, vc = mk(B, 1, Hq, D), mk(B, S, Hkv, D), mk(B, S, Hkv, D)
    lens = torch.tensor([17, 100], dtype=torch.int32, device="cuda")
    with torch.no_grad():
        kn, vn = mk(B, 1, Hkv, D), mk(B, 1, Hkv, D)
        attngen.attention_with_kvcache(q, kc, vc, lens, k=kn, v=vn)
        buf_k, buf_v = mk(B * Hkv * D + 1), mk(B * Hkv * D + 1)
        kn2 = buf_k[1:].view(B, 1, Hkv, D)  # 2 bytes past an aligned base
        vn2 = buf_v[1:].view(B, 1, Hkv, D)
        assert kn2.data_ptr() % 16 and kn2.stride() == kn.stride()
        lens2 = lens + 1
        attngen.attention_with_kvcache(q, kc, vc, lens2, k=kn2, v=vn2)
        torch.cuda.synchronize()
    for b in range(B):
        assert torch.equal(kc[b, int(lens2[b])], kn2[b, 0]) and torch.equal(vc[b, int(lens2[b])], vn2[b, 0])
