"""The tuner's objective on CPU (Triton's interpreter): the measured shape of a bucket, exact FLOPs,
and a trial's fate: ok, invalid (never launched), failed (raised, wrong result, nothing written)."""

from __future__ import annotations

import dataclasses
import math
import time

import pytest
import torch

import attngen
from attngen.spec import load_spec
from attngen.problem import Problem, keep_mask
from attngen.families import bwd as fbwd
from attngen.families import fwd as ffwd
from attngen.tuning import objective as obj
from attngen.buckets import parse_bucket
from attngen.configs import BwdConfig, FwdConfig
from attngen.env import REPO_ROOT


def entry_and_spec(file, name, family="fwd", dtype="fp16", target="sm90"):
    sf = load_spec(REPO_ROOT / "specs" / file)
    e = next(x for x in sf.entries if x.name == name)
    s = next(k for k in e.kernel_specs() if (k.family, k.dtype, k.target) == (family, dtype, target))
    return e, s


def fixed_timer(ms=1.0):
    calls = []

    def timer(step, config, problem):
        step()
        step()
        calls.append(config)
        return ms
    timer.calls = calls
    return timer


def test_problem_for_bucket_uses_the_entry():
    e, s = entry_and_spec("llama.yaml", "llama3_8b")
    p = obj.problem_for(e, s, parse_bucket("q4096_k4096_bh128"))
    assert (p.batch, p.heads_q, p.heads_kv, p.seqlen_q) == (4, 32, 8, 4096)
    p = obj.problem_for(e, s, parse_bucket("q1024_k1024_bh16"))  # fewer heads than the model
    assert (p.batch, p.heads_q, p.heads_kv) == (1, 16, 4)
    p = obj.problem_for(e, s, parse_bucket("q1024_k1024_bh2"))  # below one GQA group
    assert (p.batch, p.heads_q) == (1, 4)
    e, s = entry_and_spec("mistral.yaml", "mistral_7b")
    p = obj.problem_for(e, s, parse_bucket("q8192_k8192_bh32"))
    assert p.causal and p.window == (4095, 0) and obj.mask_args(p).window_left == 4095
    e, s = entry_and_spec("gemma2.yaml", "gemma2_9b_global")
    p = obj.problem_for(e, s, parse_bucket("q4096_k4096_bh32"))
    assert p.softcap == 50.0 and p.scale == 0.0625
    with pytest.raises(ValueError, match="decode"):
        obj.problem_for(e, s, parse_bucket("q1_k4096_bh32"))
    e2, _ = entry_and_spec("mistral.yaml", "mistral_7b")
    with pytest.raises(ValueError, match="mask 'sliding_window'"):
        obj.problem_for(e2, s, parse_bucket("q4096_k4096_bh32"))


@pytest.mark.parametrize("sq, sk, causal, window, top_left", [
    (64, 64, True, (-1, -1), False), (48, 80, True, (-1, -1), False), (80, 48, True, (-1, -1), True),
    (64, 64, True, (15, 0), False), (64, 64, False, (-1, -1), False), (50, 70, False, (7, 3), False)])
def test_pairs_is_the_exact_count(sq, sk, causal, window, top_left):
    e, s = entry_and_spec("llama.yaml", "llama3_8b")
    p = Problem(2, 8, 8 // s.gqa_ratio, sq, sk, s.head_dim_qk, s.head_dim_v, causal=causal, window=window,
                scale=0.1, top_left=top_left)
    assert p.pairs() == 2 * int(keep_mask(sq, sk, causal, window, top_left).sum())  # both sequences
    assert p.flops() == 2 * (128 + 128) * 8 * p.pairs()
    docs = Problem.packed_documents((sq, sk // 2 + 1), (sk, sk), heads_q=8, heads_kv=2, head_dim_qk=128,
                                    head_dim_v=128, causal=causal, window=window, top_left=top_left)
    assert docs.pairs() == int(docs.keep().sum())


@pytest.fixture(scope="module")
def _fwd_objective():
    e, s = entry_and_spec("llama.yaml", "llama3_8b")
    p = obj.problem_for(e, s, parse_bucket("q16_k32_bh8"))
    return obj.Objective(s, p, "cpu", timer=fixed_timer(2.0))


@pytest.fixture
def fwd_objective(_fwd_objective):
    """One objective for the module (its inputs and reference are made once), without the
    launches an earlier test's trials left to replay."""
    _fwd_objective.hooks.__dict__.pop("_replays", None)
    return _fwd_objective


def test_ok_trial_is_checked_then_timed(fwd_objective):
    o = fwd_objective.run(FwdConfig(64, 32, 4, 2))
    assert o.status == "ok" and o.time_ms == 2.0
    assert o.tflops == pytest.approx(fwd_objective.problem.flops() / 2.0 / 1e9)
    assert fwd_objective.timer.calls[-1] == dataclasses.asdict(FwdConfig(64, 32, 4, 2))


def _after_launches(monkeypatch, after, drop: bool = False):
    """The forward objective's replay of a config on input set t, followed by after(t) on every
    launch of the set (a check or a timed step); drop=True leaves the real launches out."""
    from attngen.families import fwd_tuning

    real = fwd_tuning.TuningHooks.steps

    def steps(self, o, cfg, t):
        return [*([] if drop else real(self, o, cfg, t)), lambda: after(t)]
    monkeypatch.setattr(fwd_tuning.TuningHooks, "steps", steps)


def test_invalid_config_is_never_launched(fwd_objective, monkeypatch):
    monkeypatch.setattr(ffwd, "fwd_launches", lambda *a, **k: pytest.fail("launched an invalid config"))
    o = fwd_objective.run(FwdConfig(64, 128, 4, 4))
    assert o.status == "invalid" and "shared memory" in o.error


@pytest.mark.parametrize("where", ["build", "launch"])
def test_launch_error_is_a_failed_trial(fwd_objective, monkeypatch, where):
    from attngen.kernels.launch import CompiledLaunch

    def boom(*a, **k):
        raise RuntimeError("out of resource: shared memory, Required: 999999")
    monkeypatch.setattr(*((ffwd, "fwd_launches") if where == "build" else (CompiledLaunch, "__call__")), boom)
    o = fwd_objective.run(FwdConfig(64, 32, 4, 2))
    assert o.status == "failed" and o.time_ms is None and "RuntimeError: out of resource" in o.error


def test_trial_replays_its_launches(fwd_objective, monkeypatch):
    """A config's launches are built once per input set: the checked launch and the timed steps
    replay them (going through the launchers on every step timed their Python at short buckets)."""
    built = []
    real = ffwd.fwd_launches
    monkeypatch.setattr(ffwd, "fwd_launches", lambda *a, **k: built.append(a[2].data_ptr()) or real(*a, **k))

    def timer(step, config, problem):
        for _ in range(9):
            step()
        return 1.0
    fwd_objective.timer = timer
    assert fwd_objective.run(FwdConfig(64, 32, 4, 2)).status == "ok"
    sets = fwd_objective.sets
    assert sorted(built) == sorted({t["q"].data_ptr() for t in sets[:9]})  # each set once
    assert fwd_objective.run(FwdConfig(32, 32, 4, 2)).status == "ok"  # another config: built again
    assert len(built) == 2 * min(len(sets), 9)


@pytest.mark.parametrize("corrupt", ["zero", "nothing", "one_row", "lse"])
def test_wrong_result_is_a_failed_trial(fwd_objective, monkeypatch, corrupt):
    def wrong(t):
        if corrupt == "nothing":
            return
        if corrupt == "zero":
            t["out"].zero_()
        elif corrupt == "one_row":
            t["out"][0, 1, 3] += 0.05
        else:
            t["lse"][0, 0, 0] += 1e-2
    _after_launches(monkeypatch, wrong, drop=corrupt == "nothing")
    timer = fixed_timer()
    fwd_objective.timer = timer
    o = fwd_objective.run(FwdConfig(64, 32, 4, 2))
    assert o.status == "failed" and o.error.startswith("wrong result:"), o
    assert ("non-finite" in o.error) == (corrupt == "nothing")
    assert ("lse" in o.error) == (corrupt == "lse")
    assert not timer.calls, "a wrong config must not be timed"


def test_bad_timer_value_is_a_failed_trial(fwd_objective):
    fwd_objective.timer = lambda step, c, p: math.nan
    assert fwd_objective.run(FwdConfig(64, 32, 4, 2)).status == "failed"


def test_step_rotates_through_input_sets(monkeypatch):
    e, s = entry_and_spec("llama.yaml", "llama3_8b")
    p = obj.problem_for(e, s, parse_bucket("q16_k16_bh4"))
    monkeypatch.setattr(obj.timing, "l2_bytes", lambda device: 1 << 16)  # a tiny "L2": several sets
    seen = []
    _after_launches(monkeypatch, lambda t: seen.append(t["q"].data_ptr()))

    def timer(step, config, problem):
        for _ in range(7):
            step()
        return 1.0
    o = obj.Objective(s, p, "cpu", timer=timer)
    n = len(o.sets)
    assert n == obj.timing.rotation_sets(sum(t.numel() * t.element_size() for t in o.sets[0].values()), 1 << 16) > 2
    assert o.run(FwdConfig(64, 32, 4, 2)).status == "ok"
    assert len(seen) == 8 and len(set(seen[1:])) == min(n, 7)  # seen[0]: the checked launch on set 0
    assert len({t["q"].data_ptr() for t in o.sets}) == n
    assert not torch.equal(o.sets[0]["q"], o.sets[1]["q"])  # fresh inputs, not copies


def test_backward_varlen_trial(monkeypatch):
    """A backward trial through the replayed launches: with dQ by atomics the fp32 accumulator is
    zeroed before every replay (a second trial of the config replays launches that already ran in
    the first trial's check and timed steps, and is checked again); a wrong dK fails the trial."""
    from attngen.families import bwd_tuning

    e, s = entry_and_spec("llama.yaml", "llama3_8b_packed", family="bwd")
    p = obj.problem_for(e, s, parse_bucket("q16_k16_bh8"))
    assert p.batch == 1 and s.varlen
    o = obj.Objective(s, p, "cpu", timer=fixed_timer())
    assert o.run(BwdConfig(32, 64, 4, 1, 64, 32, 4, 1)).status == "ok"
    atomic = BwdConfig(32, 64, 4, 1, 64, 32, 4, 1, atomic_dq=True)
    assert o.run(atomic).status == "ok" and o.run(atomic).status == "ok"
    real = bwd_tuning.TuningHooks.steps

    def off_by_a_bit(self, o_, cfg, t):
        def bump():
            t["dk"][3, 1, 5] += 0.05  # dk of one key of one KV head
        return [*real(self, o_, cfg, t), bump]
    monkeypatch.setattr(bwd_tuning.TuningHooks, "steps", off_by_a_bit)
    r = o.run(BwdConfig(32, 64, 4, 1, 64, 32, 4, 1))
    assert r.status == "failed" and " dk:" in r.error, r


def test_decode_objective_measures_gb_per_second(monkeypatch):
    """The decode family tunes on the decode bucket through its own hooks: one query token on a
    full cache, contiguous and paged by 16 in one trial (one winner serves both), each checked
    against float64 per row, throughput in GB/s of K and V read (twice); a wrong or unwritten
    output of either layout is a failed trial, a config its filter rejects is never launched."""
    from attngen.families import decode as fdec
    from attngen.families.decode import DecodeConfig

    e, s = entry_and_spec("llama.yaml", "llama3_8b", family="decode")
    with pytest.raises(ValueError, match="decode"):
        obj.problem_for(e, s, parse_bucket("q16_k64_bh8"))
    p = obj.problem_for(e, s, parse_bucket("q1_k64_bh8"))
    assert (p.seqlen_q, p.seqlen_k, p.batch * p.heads_q, p.layout) == (1, 64, 8, "bshd")
    o = obj.Objective(s, p, "cpu", timer=fixed_timer(2.0))
    assert o.unit == "GB/s"
    ok = o.run(DecodeConfig(32, 4, 1, 2))
    kv_bytes = p.batch * 64 * p.heads_kv * 256 * 2
    assert ok.status == "ok" and ok.tflops == pytest.approx(2 * kv_bytes / 2.0 / 1e6), ok
    assert o.run(DecodeConfig(24, 4, 1)).status == "invalid"
    real = fdec.decode_launches

    def drop_a_split(*a, paged_only=False, **k):
        las = real(*a, **k)
        return las[:1] if not paged_only or len(a) > 14 else las  # the combine never runs: NaN stays
    # (the hooks build a config's launches once and replay them: each broken run is a new config)
    monkeypatch.setattr(fdec, "decode_launches", drop_a_split)
    bad = o.run(DecodeConfig(32, 4, 2, 2))
    assert bad.status == "failed" and "contiguous" in bad.error and "non-finite" in bad.error, bad
    monkeypatch.setattr(fdec, "decode_launches", lambda *a, **k: drop_a_split(*a, paged_only=True, **k))
    bad = o.run(DecodeConfig(32, 2, 1, 2))
    assert bad.status == "failed" and "paged by 16" in bad.error and "non-finite" in bad.error, bad


def test_fp8_objective_quantizes_inside_the_trial(monkeypatch):
    """The fp8 family tunes through its own hooks: bf16 inputs quantized by the prologue inside the
    timed launch, the flash-attn rule against its PyTorch emulation; a wrong output is a failed
    trial, a config its filter rejects is never launched."""
    from attngen.families import fwd_fp8 as f8

    e, s = entry_and_spec("llama.yaml", "llama3_8b_fp8", family="fwd_fp8", dtype="fp8_e4m3")
    p = obj.problem_for(e, s, parse_bucket("q64_k64_bh8"))
    assert p.dtype == "bf16" and p.causal
    o = obj.Objective(s, p, "cpu", timer=fixed_timer())
    assert o.unit == "TFLOP/s"
    assert o.run(f8.Fp8Config(32, 32, 4, 1)).status == "ok"
    assert o.run(f8.Fp8Config(32, 32, 4, 1, precise_acc=True)).status == "ok"
    assert o.run(f8.Fp8Config(256, 32, 4, 1)).status == "invalid"
    # the trial times the launches the runtime's plan makes: the prologue in one launch, then the
    # attention kernel (here the Triton kernel: no Gluon on the CPU)
    steps = o.hooks.steps(o, f8.Fp8Config(32, 32, 4, 1), o.sets[0])
    assert [x.fn.__name__ for x in steps] == ["_fp8_quant_qkv", "_attn_fwd_fp8"]
    assert [la["entry"] for la in attngen.explain(*(o.sets[0][n] for n in "qkv"), causal=True, precision="fp8")
            ["launches"]] == ["_fp8_quant_qkv", "_attn_fwd_fp8"]
    from attngen.families import fwd_fp8_tuning as f8t

    real = f8t.fp8_launches

    def scaled_wrong(mod, spec, q8, k8, vt, qs, ks, vs, *rest, **kw):
        return real(mod, spec, q8, k8, vt, qs * 1.05, ks, vs, *rest, **kw)  # a Q descale 5 % off
    monkeypatch.setattr(f8t, "fp8_launches", scaled_wrong)
    bad = o.run(f8.Fp8Config(32, 32, 4, 1))
    assert bad.status == "failed" and "wrong result" in bad.error, bad


def test_fp8_reference_by_head_chunks_equals_one_piece(monkeypatch):
    """The fp8 objective's float64 reference and emulation run over groups of query heads when a
    bucket's scores would not fit (32 heads at 16k x 16k: 64 GiB); the groups keep whole GQA
    groups, and the result is the one-piece result exactly."""
    from attngen.families import fwd_fp8_tuning as t8
    from attngen.problem import attention_ref

    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 8, 40, 64, generator=g).to(torch.bfloat16)
    k, v = (torch.randn(1, 2, 50, 64, generator=g).to(torch.bfloat16) for _ in range(2))
    kw = dict(causal=True, window_size=(-1, -1), softcap=0.0, scale=0.125)
    for fn in (attention_ref, t8.emulate):
        whole = fn(q, k, v, **kw)
        calls = []
        monkeypatch.setattr(t8, "REF_SCORE_BYTES", 40 * 50 * 8 * 4)  # 4 heads' scores: two groups of 4

        def counted(*a, **k_):
            calls.append(a[0].shape[1])
            return fn(*a, **k_)
        parts = t8.by_head_chunks(counted, q, k, v, kw)
        monkeypatch.undo()
        assert calls == [4, 4]
        assert torch.equal(whole[0], parts[0]) and torch.equal(whole[1], parts[1])


def test_a_first_run_that_never_finishes_is_a_lost_gpu():
    """wait_for_gpu: a CUDA event that never completes (a deadlocked kernel) becomes DeviceLost
    (hung) after the deadline instead of a wait without end; a completed one returns at once."""
    from attngen.tuning.objective import DeviceLost, wait_for_gpu

    t0 = time.monotonic()
    with pytest.raises(DeviceLost) as exc:
        wait_for_gpu(lambda: False, 0.05, "config {'block_m': 64}")
    assert exc.value.hung and 0.05 <= time.monotonic() - t0 < 5
    assert str(exc.value).startswith("config {'block_m': 64} did not finish within 0.05 s")
    assert "--resume" in str(exc.value)
    polls = iter([False, False, True])
    wait_for_gpu(lambda: next(polls), 5.0, "x")
