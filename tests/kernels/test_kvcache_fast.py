"""attention_with_kvcache's eager fast path (attngen.runtime.kvcache._FAST, keyed on the call's
own arguments: shapes, strides, dtypes and devices of every tensor, the options): a warm call
skips the argument checks and the options' build, and still
* computes each call from its own metadata values and new tokens (float64 reference per call);
* checks CPU metadata values before the launch: a named ValueError, nothing written;
* refuses a call that wants a gradient, and takes a call that differs in any option, shape or
  None-ness to the full path (a plan of its own).
fp16: Triton 3.6's interpreter converts fp32 to bf16 by truncation (tests/kernels/test_kvcache_api.py)."""

from __future__ import annotations

import math

import pytest
import torch

import attngen
from attngen.problem import random_inputs
from attngen.runtime import kvcache
from attngen.testing import assert_flash_rule
from tests.kernels.test_decode import make_cache, reference, rows_view

B, SQ, HQ, HKV, D, CAP, PAGE = 2, 1, 4, 2, 32, 96, 16


def _call(k_cache, v_cache, table, lens, new, seed, causal=True):
    q, = random_inputs((B, SQ, HQ, D), dtype=torch.float16, seed=seed)
    kn, vn = random_inputs((B, new, HKV, D), (B, new, HKV, D), dtype=torch.float16, seed=seed + 100)
    seqlens = torch.tensor(lens, dtype=torch.int32)
    out = attngen.attention_with_kvcache(q, k_cache, v_cache, seqlens, k=kn, v=vn, block_table=table, causal=causal)
    kr, vr = rows_view(k_cache, table, B), rows_view(v_cache, table, B)
    total = [n + new for n in lens]
    for b, n in enumerate(lens):  # the new tokens landed at cache_seqlens
        assert torch.equal(kr[b, n:n + new], kn[b]) and torch.equal(vr[b, n:n + new], vn[b])
    scale = 1.0 / math.sqrt(D)
    o64, _ = reference(q, kr, vr, total, causal, (-1, -1), 0.0, scale)
    opt, _ = reference(q, kr, vr, total, causal, (-1, -1), 0.0, scale, upcast=False)
    assert_flash_rule(f"lens {lens}", out, o64, opt, 2.0)
    return out


@pytest.mark.parametrize("page", [0, PAGE])
def test_warm_calls_take_their_own_values(page, monkeypatch):
    kvcache._FAST.clear()
    k_cache, v_cache, table = make_cache(B, CAP, HKV, D, torch.float16, page, seed=1)
    _call(k_cache, v_cache, table, [5, 40], 2, seed=3)
    assert len(kvcache._FAST) == 1

    def full_path(*a, **kw):
        raise AssertionError("the full path ran")

    monkeypatch.setattr(kvcache, "check_args", full_path)  # warm calls must not reach it
    _call(k_cache, v_cache, table, [60, 7], 2, seed=4)  # other lengths, other tokens
    _call(k_cache, v_cache, table, [0, 93], 2, seed=5)
    with pytest.raises(AssertionError, match="the full path ran"):  # another option: the full path
        _call(k_cache, v_cache, table, [11, 3], 2, seed=6, causal=False)
    monkeypatch.undo()
    _call(k_cache, v_cache, table, [11, 3], 2, seed=6, causal=False)  # its own key
    assert len(kvcache._FAST) == 2


def test_warm_calls_check_cpu_metadata_and_write_nothing():
    kvcache._FAST.clear()
    k_cache, v_cache, table = make_cache(B, CAP, HKV, D, torch.float16, PAGE, seed=1)
    _call(k_cache, v_cache, table, [5, 40], 2, seed=3)
    before = (k_cache.clone(), v_cache.clone())
    q, = random_inputs((B, SQ, HQ, D), dtype=torch.float16, seed=7)
    kn, vn = random_inputs((B, 2, HKV, D), (B, 2, HKV, D), dtype=torch.float16, seed=8)
    with pytest.raises(ValueError, match="cache_seqlens: row 1 holds 95 keys"):
        attngen.attention_with_kvcache(q, k_cache, v_cache, torch.tensor([3, 95], dtype=torch.int32), k=kn, v=vn,
                                       block_table=table)
    bad = table.clone()
    bad[0, 0] = 99
    with pytest.raises(ValueError, match="block_table: row 0, entry 0 is 99"):
        attngen.attention_with_kvcache(q, k_cache, v_cache, torch.tensor([3, 4], dtype=torch.int32), k=kn, v=vn,
                                       block_table=bad)
    assert torch.equal(k_cache, before[0]) and torch.equal(v_cache, before[1])
    assert len(kvcache._FAST) == 1


def test_a_warm_key_still_refuses_a_gradient():
    kvcache._FAST.clear()
    k_cache, v_cache, _ = make_cache(B, CAP, HKV, D, torch.float16, 0, seed=1)
    q, = random_inputs((B, SQ, HQ, D), dtype=torch.float16, seed=2)
    lens = torch.tensor([10, 20], dtype=torch.int32)
    attngen.attention_with_kvcache(q, k_cache, v_cache, lens)
    assert len(kvcache._FAST) == 1
    with pytest.raises(ValueError, match="inference only"):
        attngen.attention_with_kvcache(q.clone().requires_grad_(True), k_cache, v_cache, lens)
    with pytest.raises(ValueError, match="num_splits"):
        attngen.attention_with_kvcache(q, k_cache, v_cache, lens, num_splits=True)
