"""attngen.flash_attn_interface on the GPU: the CPU suite's cases (tests/runtime/
test_flash_attn_interface.py) at GPU sizes -- flash_attn_func with GQA, causal, windows, softcap and
ALiBi (both slope shapes) forward and backward, packed documents, the KV cache (paged, ALiBi,
flash-attn's causal=False default; dense with an int cache_seqlens), FlashAttention-3's fp8
descales -- against float64 by the flash-attn rule, and deterministic gradients bitwise equal."""

from __future__ import annotations

import pytest
import torch

from tests.runtime.test_flash_attn_interface import (BF16, F16, check_dense, check_deterministic, check_fp8,
                                                     check_kvcache, check_varlen, slopes_of)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]

DENSE = {  # B, Sq, Sk, Hq, Hkv, D, dtype, causal, window, softcap, alibi slope shape
    "gqa_d128_bf16_causal": (2, 1023, 2049, 8, 2, 128, BF16, True, (-1, -1), 0.0, None),
    "mha_d64_fp16_window": (2, 777, 777, 4, 4, 64, F16, False, (127, 31), 0.0, None),
    "gqa_d256_bf16_softcap": (1, 513, 1025, 4, 1, 256, BF16, True, (-1, -1), 30.0, None),
    "alibi_heads_causal_d128": (2, 1023, 1023, 8, 2, 128, BF16, True, (-1, -1), 0.0, "h"),
    "alibi_batch_heads_d64": (2, 700, 1300, 4, 2, 64, F16, False, (-1, -1), 0.0, "bh"),
    "alibi_window_softcap_d96": (1, 900, 900, 4, 2, 96, BF16, True, (255, 0), 20.0, "bh"),
}


@pytest.mark.parametrize("name", sorted(DENSE))
def test_gpu_flash_attn_func(name):
    B, Sq, Sk, Hq, Hkv, D, dtype, causal, window, softcap, alibi = DENSE[name]
    slopes = None if alibi is None else slopes_of(alibi, B, Hq, "cuda")
    check_dense(B, Sq, Sk, Hq, Hkv, D, dtype, causal, window, softcap, slopes=slopes, seed=21, device="cuda")


@pytest.mark.parametrize("alibi", [False, True])
def test_gpu_varlen(alibi):
    lens_q, lens_k = [300, 1, 1000, 77], [500, 64, 1000, 77]
    slopes = slopes_of("bh", 4, 8, "cuda") if alibi else None
    check_varlen(lens_q, lens_k, 8, 2, 128, BF16, causal=True, slopes=slopes, seed=22, device="cuda")


@pytest.mark.parametrize("paged", [False, True])
def test_gpu_kvcache(paged):
    check_kvcache(paged, device="cuda", seed=23, slopes_shape="bh" if paged else None)


def test_gpu_fp8_descales():
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 needs sm89 / sm90")
    check_fp8(device="cuda", B=2, Sq=1023, Sk=2049, Hq=8, Hkv=2, D=128, seed=24)


@pytest.mark.parametrize("alibi", [False, True])
def test_gpu_deterministic_backward(alibi):
    check_deterministic(alibi, B=2, S=1023, Hq=8, Hkv=2, D=128, dtype=BF16, device="cuda", seed=25)
