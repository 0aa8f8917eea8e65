"""GPU: warm calls replay their kernels through the raw launcher (attngen.kernels.launch.RawLauncher:
Triton 3.6's C launcher called directly, TMA descriptors encoded once per base address, the fp8
buffers passed as addresses). Each check compares the raw replay with the same plan replayed
through Triton's own launcher, bit for bit, on fresh inputs, with outputs kept alive so that the
output (a descriptor's base in the Gluon kernels) moves between calls."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import attngen
from attngen.families.decode import DecodeConfig
from attngen.kernels.launch import RawLauncher
from attngen.problem import random_inputs
from attngen.runtime import api
from attngen.runtime.dispatch import forced_config
from attngen.runtime import fp8 as rt_fp8

pytestmark = pytest.mark.gpu
DEV = "cuda"


def _without_raw(plan):
    """Replay `plan`'s launches through Triton's launcher (kernel.run) for one call."""
    saved = [la.raw for la in plan.launches]
    for la in plan.launches:
        la.raw = None
    raw = getattr(plan, "raw", None)
    if raw is not None:
        plan.raw = False
    return saved, raw


def _restore(plan, saved, raw):
    for la, r in zip(plan.launches, saved):
        la.raw = r
    if raw is not None:
        plan.raw = raw


@pytest.mark.parametrize("shape, causal", [((1, 4, 512, 128), False), ((2, 4, 1031, 128), True),
                                           ((1, 2, 777, 256), True)])
def test_fp8_warm_calls_replay_raw_and_match_triton_launcher(shape, causal):
    q, k, v = random_inputs(shape, shape, shape, dtype=torch.bfloat16, device=DEV, seed=3)
    with torch.no_grad():
        attngen.attention(q, k, v, causal=causal, precision="fp8")  # compiles (JIT launch)
        plan = list(rt_fp8._FAST.values())[-1]
        attngen.attention(q, k, v, causal=causal, precision="fp8")
        assert plan.raw and all(isinstance(la.raw, RawLauncher) for la in plan.launches)
        kept = []
        for seed in range(4, 9):
            q, k, v = random_inputs(shape, shape, shape, dtype=torch.bfloat16, device=DEV, seed=seed)
            out, lse = attngen.attention(q, k, v, causal=causal, precision="fp8", return_lse=True)
            saved, raw = _without_raw(plan)
            try:
                want, want_lse = attngen.attention(q, k, v, causal=causal, precision="fp8", return_lse=True)
            finally:
                _restore(plan, saved, raw)
            assert torch.equal(out, want) and torch.equal(lse, want_lse), f"seed {seed}: raw replay differs"
            kept.append(out)
        maps = [slot[1] for la in plan.launches for slot in la.raw.slots if not isinstance(slot, str)]
        assert maps and len({p for m in maps for p in m}) > 1, "the descriptors' maps never moved"


def test_fp8_quantized_inputs_replay_raw():
    shape = (2, 4, 640, 128)
    q, k, v = (x.to(torch.float8_e4m3fn) for x in random_inputs(shape, shape, shape, dtype=torch.bfloat16, device=DEV, seed=5))
    d = torch.rand(2, 4, device=DEV) + 0.5
    with torch.no_grad():
        first = attngen.attention_fp8(q, k, v, d, d, d, causal=True)
        again = attngen.attention_fp8(q, k, v, d, d, d, causal=True)
        plan = list(rt_fp8._PLANS.values())[-1]
        assert plan.raw and torch.equal(first, again)


def test_bf16_tma_plan_replays_raw():
    """The bf16 forward's TMA / Gluon plan (a shape past the host-bound rule) through the raw
    launcher, against Triton's launcher on the same plan."""
    shape = (2, 8, 1500, 128)
    q, k, v = random_inputs(shape, shape, shape, dtype=torch.bfloat16, device=DEV, seed=7)
    with torch.no_grad():
        attngen.attention(q, k, v, causal=True)
        attngen.attention(q, k, v, causal=True)
        plan = list(api._FAST.values())[-1]
        assert any(la.descs for la in plan.launches) and all(la.raw for la in plan.launches)
        q, k, v = random_inputs(shape, shape, shape, dtype=torch.bfloat16, device=DEV, seed=8)
        out = attngen.attention(q, k, v, causal=True)
        saved, raw = _without_raw(plan)
        try:
            want = attngen.attention(q, k, v, causal=True)
        finally:
            _restore(plan, saved, raw)
        assert torch.equal(out, want)


@pytest.mark.parametrize("paged, splits, want_lse, fused", [(False, 4, False, False), (False, 4, True, False),
                                                            (True, 3, False, False), (False, 1, False, False),
                                                            (True, 16, True, True), (False, 16, False, True)])
def test_decode_warm_calls_replay_raw_with_scratch_addresses(paged, splits, want_lse, fused):
    """attention_with_kvcache's warm calls (its fast path, kvcache._FAST): both launches through
    the raw launcher without descriptor slots (one C-level pick of the arguments), the split
    partials and an unwanted logsumexp as addresses in one allocation; bit for bit against the
    same plan through Triton's launcher with tensors, on fresh queries and lengths. `fused`: a
    forced config with merge "fused" (64-key steps, 16 slices), one launch on the plan's counter."""
    from attngen.runtime import kvcache

    B, Hq, Hkv, D = 2, 16, 4, 128
    S = 1008 if splits < 16 else 2032  # 16 slices of the forced 64-key steps
    shape = (B * S // 16, 16, Hkv, D) if paged else (B, S, Hkv, D)
    kc, vc = random_inputs(shape, shape, dtype=torch.bfloat16, device=DEV, seed=1)
    table = torch.randperm(B * S // 16, device=DEV).to(torch.int32).reshape(B, S // 16) if paged else None
    kvcache._FAST.clear()

    def call(seed):
        q, = random_inputs((B, 1, Hq, D), dtype=torch.bfloat16, device=DEV, seed=seed)
        lens = torch.tensor([700 + seed, 900 - seed], dtype=torch.int32, device=DEV)
        with forced_config(**({"decode": DecodeConfig(64, 4, 3, splits, "fused")} if fused else {})):
            return attngen.attention_with_kvcache(q, kc, vc, lens, block_table=table, num_splits=splits,
                                                  return_lse=want_lse)

    with torch.no_grad():
        call(2), call(3)
        (plan, _, _), = kvcache._FAST.values()
        assert plan.raw and plan.num_splits == splits
        assert plan.fused == fused and len(plan.launches) == (2 if splits > 1 and not fused else 1)
        assert all(la.raw is not None and la.raw.pick is not None for la in plan.launches)
        for seed in range(4, 8):
            got = call(seed)
            saved, raw = _without_raw(plan)
            try:
                want = call(seed)
            finally:
                _restore(plan, saved, raw)
            if want_lse:
                assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), f"seed {seed}"
            else:
                assert torch.equal(got, want), f"seed {seed}"


@pytest.mark.parametrize("fused", [False, True])
def test_decode_scratch_reuse_is_per_stream_and_graph_safe(fused):
    """A warm split call on the legacy default stream reuses its plan's scratch buffer; on a
    side stream (running at the same time) and inside a CUDA graph it takes the caching
    allocator's. Calls queued on both streams without a synchronize in between, and a graph
    replayed while default-stream calls run, give the outputs of cold calls (bit for bit). `fused`:
    a forced config with merge "fused" (the tuned or default config's block, warps and stages),
    the merge in the split kernel on a counter per stream (and a captured one in the graph), which
    every call leaves at zero."""
    from attngen.runtime import kvcache

    B, Hq, Hkv, S, D = 2, 16, 4, 4096, 128
    kc, vc = random_inputs((B, S, Hkv, D), (B, S, Hkv, D), dtype=torch.bfloat16, device=DEV, seed=11)
    lens = torch.tensor([4000, 3111], dtype=torch.int32, device=DEV)
    qs = random_inputs(*[(B, 1, Hq, D)] * 6, dtype=torch.bfloat16, device=DEV, seed=12)
    kvcache._FAST.clear()
    with torch.no_grad():
        attngen.attention_with_kvcache(qs[0], kc, vc, lens, num_splits=4)
        (plan, _, _), = kvcache._FAST.values()
        forced = {"decode": dataclasses.replace(plan.config, merge="fused")} if fused else {}
    kvcache._FAST.clear()

    def call(q):
        with forced_config(**forced):
            return attngen.attention_with_kvcache(q, kc, vc, lens, num_splits=4)

    with torch.no_grad():
        call(qs[0]), call(qs[0])
        (plan, _, _), = kvcache._FAST.values()
        assert plan.raw and plan.num_splits == 4 and plan.fused == fused
        # references, one at a time
        want = []
        for q in qs:
            want.append(call(q).clone())
            torch.cuda.synchronize()
        assert plan.scratch is not None
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        got_main, got_side = [], []
        for i in range(3):
            got_main.append(call(qs[i]))
            with torch.cuda.stream(side):
                got_side.append(call(qs[i + 3]))
        torch.cuda.synchronize()
        for i in range(3):
            assert torch.equal(got_main[i], want[i]), f"default stream, call {i}"
            assert torch.equal(got_side[i], want[i + 3]), f"side stream, call {i}"
        static_q = qs[0].clone()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_out = call(static_q)
        for i in (1, 2, 3):
            static_q.copy_(qs[i])
            g.replay()
            main = call(qs[(i + 1) % 6])
            torch.cuda.synchronize()
            assert torch.equal(static_out, want[i]), f"graph replay {i}"
            assert torch.equal(main, want[(i + 1) % 6]), f"default stream beside replay {i}"
        if plan.fused:  # the default stream's and the side stream's (the graph's is its own)
            assert len(plan.counters) == 2 and not any(c.any() for c in plan.counters.values()), plan.counters
