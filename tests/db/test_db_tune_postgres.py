"""`attngen tune` with its Optuna studies and attngen's tables on a PostgreSQL server (fake GPU and
timer, as tests/tuning/test_tune_cli.py), then `db show` and the runtime lookup from there."""

from __future__ import annotations

from pathlib import Path

import optuna

from attngen.cli import main as cli
from attngen.db import store as dbs
from attngen.env import REPO_ROOT
from attngen.spec import KernelSpec
from attngen.families import fwd as fwd_family
from attngen.tuning import targets

FAKES = Path(__file__).resolve().parents[1] / "tuning" / "fakes.py"
URI = "attn_fwd_fp16_hd128_gqa4_causal_sm90"


def test_tune_into_postgresql(pg_url, monkeypatch, capsys):
    monkeypatch.setitem(fwd_family.TARGET_SPACES, "sm90",
                        {"block_m": (64, 128), "block_n": (64,), "num_warps": (4, 8), "num_stages": (2, 3)})
    for name in list(fwd_family.SPACE):  # all other fields at their dataclass defaults
        monkeypatch.delitem(fwd_family.SPACE, name)
    argv = ["tune", "--device", "h100", "--spec", str(REPO_ROOT / "specs" / "llama.yaml"),
            "--kernels", URI, "--shapes", "q16_k16_bh4", "--trials", "4", "--storage", pg_url,
            "--timer", f"{FAKES}:timer", "--probe", f"{FAKES}:h200", "--quiet"]
    assert cli(argv) == 0
    with dbs.Store(pg_url, "read") as st, st.session() as s:
        trials = dbs.where_trials(s)
        (w,) = dbs.where_winners(s)
    ok = [t for t in trials if t["status"] == "ok"]
    sp = targets.space_for(KernelSpec(**ok[0]["spec"]))
    assert len({str(t["config"]) for t in ok if targets.in_space(t["config"], sp)}) == 4  # the budget
    assert w.time_ms == min(t["time_ms"] for t in ok)
    (summary,) = optuna.get_all_study_summaries(pg_url, include_best_trial=False)
    assert summary.n_trials >= 3  # the default config may lie outside this space: measured, not a trial
    assert cli([*argv, "--resume", "--trials", "6"]) == 0  # the later --trials wins
    with dbs.Store(pg_url, "read") as st, st.session() as s:
        measured = {str(t["config"]) for t in dbs.where_trials(s)
                    if t["status"] != "invalid" and targets.in_space(t["config"], sp)}
    assert len(measured) == 6
    capsys.readouterr()
    assert cli(["db", "show", "--storage", pg_url]) == 0
    assert URI in capsys.readouterr().out
