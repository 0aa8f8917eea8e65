"""GPU: `attngen tune` end to end on the real device -- configs compiled ahead in worker processes,
TPE proposing valid configs only, each measured config checked and timed, the winner the fastest
ok trial -- and the runtime then serving that winner. Needs optuna and SQLAlchemy (the device
image lacks them: benchmarks/gpu_tune.sh installs their wheels into /tmp/attngen_site)."""

from __future__ import annotations

import json

import pytest
import torch

from attngen.cli import main as cli
from attngen.families import family as family_of

pytestmark = pytest.mark.gpu
URI = "attn_fwd_bf16_hd128_gqa4_causal_sm90"


def test_tune_compiles_ahead_measures_valid_configs_and_the_winner_is_the_fastest(tmp_path, capsys):
    pytest.importorskip("optuna")
    pytest.importorskip("sqlalchemy")
    from attngen.db import store as dbs
    from attngen.spec import KernelSpec

    db = tmp_path / "t.sqlite"
    argv = ["tune", "--device", "h100", "--spec", "specs/llama.yaml", "--kernels", URI,
            "--shapes", "q1024_k1024_bh32", "--trials", "6", "--compile-workers", "2",
            "--fix", "consumers=2", "--fix", "pair_tiles=false",  # the Gluon corner: 8 configs
            "--storage", str(db)]
    assert cli(argv) == 0
    out = capsys.readouterr().out
    assert "configs ahead in" in out and "with 2 processes" in out
    with dbs.Store(str(db), "read") as st, st.session() as s:
        trials = dbs.where_trials(s)
        (w,) = dbs.where_winners(s)
    spec = KernelSpec(**trials[0]["spec"])
    fam = family_of("fwd")
    assert {t["status"] for t in trials} <= {"ok", "failed"}  # nothing invalid was proposed
    assert all(fam.check(spec, fam.config(**t["config"])) is None for t in trials)
    configs = {json.dumps(t["config"], sort_keys=True) for t in trials}
    assert len(configs) >= 6
    ok = [t for t in trials if t["status"] == "ok"]
    assert ok and all(t["time_ms"] > 0 and t["tflops"] > 0 for t in ok)
    assert w.time_ms == min(t["time_ms"] for t in ok)
    torch.cuda.synchronize()


def test_timer_warms_an_idle_gpu_first(monkeypatch):
    """The tuner's timer keeps the GPU busy before timing after a pause (a GPU left idle clocks
    down), and not between back-to-back timings."""
    import torch

    from attngen.tuning import timing

    warmed = []
    monkeypatch.setattr(timing, "busy_gpu", lambda device, ms: warmed.append(ms))
    x = torch.randn(1 << 20, device="cuda")
    monkeypatch.setattr(timing, "_last_timed", [float("-inf")])
    assert timing.do_bench_median(lambda: x.mul_(1.0)) > 0 and warmed == [timing.WARM_MS]
    timing.do_bench_median(lambda: x.mul_(1.0))
    assert warmed == [timing.WARM_MS]  # right after the last timing: no warm-up
    timing._last_timed[0] -= 2 * timing.IDLE_S
    timing.do_bench_median(lambda: x.mul_(1.0))
    assert warmed == [timing.WARM_MS] * 2
