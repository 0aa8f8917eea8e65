"""`attngen tune` end to end on CPU: kernels run through Triton's interpreter and are checked
against the reference; a fake GPU probe and a fake timer (tests/tuning/fakes.py, a known landscape)
stand in for the H200 and do_bench. What lands in the database, failed and invalid configs, the
winner, --resume, the device check, Ctrl-C, --workers, and the grid-vs-TPE comparison."""

from __future__ import annotations

import dataclasses
import io
import itertools
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from attngen.cli import main as cli
from attngen.db import store as dbs
from attngen.env import REPO_ROOT
from attngen.spec import KernelSpec
from attngen import configs as space
from attngen.families import fwd as fwd_family
from attngen.tuning.compare import compare, replay
from attngen.tuning.targets import space_for
from attngen.tuning.sampling import valid_space
from attngen.configs import FwdConfig

from . import fakes

FAKES = Path(fakes.__file__)
# a kernel the Triton forward serves (hd128's default is the warp-specialized Gluon kernel, which
# the interpreter cannot run and the search space leaves out: attngen.families.fwd.TARGET_SPACES)
URI = "attn_fwd_fp16_hd96_gqa1_causal_sm90"
SPEC = KernelSpec("fwd", "fp16", "sm90", 96, 96, 1, "causal")
BUCKET = "q16_k16_bh4"
DEFAULT = space.default_fwd_config(SPEC, "cuda", 16)  # what the tuner measures first
# A small space around the default: tiles searched, every other field at the default's value.
TILES = {"block_m": (64, 128), "block_n": (32, 64, 128, 256), "num_warps": (4, 8), "num_stages": (2, 3, 4)}
SMALL = {f.name: tuple(sorted(set(TILES.get(f.name, ())) | {getattr(DEFAULT, f.name)}))
         for f in dataclasses.fields(FwdConfig)}
ALL = [FwdConfig(**dict(zip(SMALL, v))) for v in itertools.product(*SMALL.values())]
VALID = [c for c in ALL if space.check_fwd(SPEC, c) is None]
RUNS = [c for c in VALID if not (c.block_n == 32 and c.num_stages == 4)]  # the fake timer fails the rest
GRID_BEST = min(RUNS, key=lambda c: fakes.fake_ms(dataclasses.asdict(c)))


def tune_argv(storage, *extra, trials=6):
    return ["tune", "--device", "h100", "--spec", str(REPO_ROOT / "specs" / "phi3.yaml"),
            "--kernels", URI, "--shapes", BUCKET, "--trials", str(trials), "--storage", str(storage),
            "--timer", f"{FAKES}:timer", "--probe", f"{FAKES}:h200", *extra]


@pytest.fixture
def small_space(monkeypatch):
    """ALL configs: some invalid (the filter), some that 'run out of resources' in the fake timer."""
    monkeypatch.setitem(fwd_family.TARGET_SPACES, "sm90", SMALL)


def rows(path, sql):
    con = sqlite3.connect(path)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def check_consistent(path) -> list[dict]:
    """Every winner is the fastest ok trial of its bucket and names that trial; failed and invalid
    trials carry their error; returns the trials."""
    with dbs.Store(str(path), "read") as st, st.session() as s:
        trials = dbs.where_trials(s)
        ws = dbs.where_winners(s)
    assert rows(path, "PRAGMA integrity_check") == [("ok",)]
    for w in ws:
        ok = [t for t in trials if t["bucket"] == w.bucket and t["uri"] == w.uri and t["status"] == "ok"]
        assert w.time_ms == min(t["time_ms"] for t in ok)
        assert any(t["uid"] == w.trial_uid and t["config"] == w.config for t in ok)
    for t in trials:
        assert (t["status"] == "ok") == (t["time_ms"] is not None)
        assert (t["status"] != "ok") == bool(t["error"]), t
    return trials


def test_tune_records_every_trial_and_the_fastest_ok_config_wins(tmp_path, small_space, capsys):
    db = tmp_path / "t.sqlite"
    assert cli(tune_argv(db, trials=8)) == 0
    out = capsys.readouterr().out
    assert "tuned 1 studies" in out and "vs default" in out
    trials = check_consistent(db)
    measured = {json.dumps(t["config"], sort_keys=True) for t in trials if t["status"] != "invalid"}
    assert len(measured) == 8
    default = [t for t in trials if t["is_default"]]
    assert len(default) == 1 and default[0]["config"] == dataclasses.asdict(DEFAULT)
    assert default[0]["time_ms"] == fakes.fake_ms(dataclasses.asdict(DEFAULT))
    with dbs.Store(str(db), "read") as st, st.session() as s:
        (w,) = dbs.where_winners(s)
    assert (w.uri, w.bucket, w.device_class, w.gpu_name) == (URI, BUCKET, "h100", "NVIDIA H200 (fake)")
    assert w.default_time_ms == default[0]["time_ms"] and w.time_ms <= w.default_time_ms
    # the Optuna study sits in the same database, named and labelled for optuna-dashboard
    (summary,) = optuna.get_all_study_summaries(f"sqlite:///{db}", include_best_trial=False)
    assert summary.study_name.startswith(URI + ".") and f".h100.{BUCKET}." in summary.study_name
    assert summary.user_attrs["bucket"] == BUCKET and summary.n_trials >= 8
    assert rows(db, "PRAGMA journal_mode") == [("delete",)]  # packed for committing


@pytest.fixture(scope="module")
def grid_db(tmp_path_factory):
    """One exhaustive run over SMALL, shared by the tests that read it."""
    db = tmp_path_factory.mktemp("grid") / "grid.sqlite"
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(fwd_family.TARGET_SPACES, "sm90", SMALL)
        assert cli(tune_argv(db, "--sampler", "grid", "--quiet", trials=100)) == 0
    return db


def test_grid_measures_the_whole_space_and_failed_configs_never_win(grid_db):
    db = grid_db
    trials = check_consistent(db)
    by_status = {}
    for t in trials:
        by_status.setdefault(t["status"], []).append(t)
    assert len(ALL) > len(VALID) > len(RUNS) > 10
    assert "invalid" not in by_status  # the grid enqueues the valid configs only: none reaches a trial
    assert len(by_status["failed"]) == len(VALID) - len(RUNS)
    assert all("FakeOutOfResources" in t["error"] and t["config"]["block_n"] == 32 for t in by_status["failed"])
    assert len(by_status["ok"]) == len(RUNS)  # every valid config once (the default's row is its grid point)
    with dbs.Store(str(db), "read") as st, st.session() as s:
        (w,) = dbs.where_winners(s)
    best_ms = fakes.fake_ms(dataclasses.asdict(GRID_BEST))
    assert w.time_ms == best_ms and fakes.fake_ms(w.config) == best_ms
    assert w.gain == pytest.approx(fakes.fake_ms(dataclasses.asdict(DEFAULT)) / best_ms - 1.0)


def test_existing_studies_need_resume_and_resume_measures_nothing_twice(tmp_path, small_space, capsys):
    db = tmp_path / "r.sqlite"
    assert cli(tune_argv(db, trials=4)) == 0
    capsys.readouterr()
    assert cli(tune_argv(db, trials=4)) == 2
    err = capsys.readouterr().err
    assert "--resume" in err and err.count("\n") == 1
    assert cli(tune_argv(db, "--resume", trials=9)) == 0
    trials = check_consistent(db)
    measured = [json.dumps(t["config"], sort_keys=True) for t in trials
                if t["status"] != "invalid" and not t["is_default"]]
    assert len(set(measured)) == len(measured), "a config was measured twice"
    assert len(set(measured) | {json.dumps(dataclasses.asdict(DEFAULT), sort_keys=True)}) == 9


def test_a_config_that_loses_the_gpu_is_recorded_and_resume_never_runs_it(tmp_path, small_space, monkeypatch,
                                                                            capsys):
    """DeviceLost (an illegal address, a kernel that never ends) stops the run with exit 1 and one
    line; the config is a failed trial, so --resume goes on without running it again."""
    monkeypatch.setenv("ATTNGEN_FAKE_LOSE", str(tmp_path))
    db = tmp_path / "l.sqlite"
    argv = tune_argv(db, trials=5)
    argv[argv.index(f"{FAKES}:timer")] = f"{FAKES}:timer_loses_gpu"
    assert cli(argv) == 1
    err = capsys.readouterr().err
    assert "attngen tune: fake: an illegal memory access" in err
    lost = json.loads((tmp_path / "lost.json").read_text())
    trials = check_consistent(db)
    (row,) = [t for t in trials if t["config"] == lost]
    assert row["status"] == "failed" and row["error"] == "lost the GPU: fake: an illegal memory access"
    assert cli(argv + ["--resume"]) == 0
    trials = check_consistent(db)
    assert [t["config"] for t in trials].count(lost) == 1
    assert len({json.dumps(t["config"], sort_keys=True) for t in trials if t["status"] != "invalid"}) >= 5


def test_a_hung_kernel_ends_the_process_without_waiting_for_the_gpu(tmp_path):
    """DeviceLost(hung=True): the process leaves through os._exit (CUDA's teardown would wait for
    the kernel forever), after the failed trial is in the database."""
    db = tmp_path / "h.sqlite"
    argv = tune_argv(db, trials=5)
    argv[argv.index(f"{FAKES}:timer")] = f"{FAKES}:timer_loses_gpu"
    code = ("import sys, json; from attngen.cli import main; from attngen.families import fwd; "
            f"fwd.TARGET_SPACES['sm90'] = {SMALL!r}; sys.exit(main({argv!r}))")
    env = dict(os.environ, ATTNGEN_FAKE_LOSE=str(tmp_path), ATTNGEN_FAKE_LOSE_HUNG="1",
               PYTHONPATH=str(REPO_ROOT))
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 1, res.stderr[-2000:]
    assert "attngen tune: fake: an illegal memory access" in res.stderr
    lost = json.loads((tmp_path / "lost.json").read_text())
    (row,) = [t for t in check_consistent(db) if t["config"] == lost]
    assert row["status"] == "failed"


def test_gpu_outside_the_profile_stops_before_any_work(tmp_path, capsys):
    db = tmp_path / "x.sqlite"
    argv = tune_argv(db)
    argv[argv.index(f"{FAKES}:h200")] = f"{FAKES}:a100"
    assert cli(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("attngen tune: GPU 0 is NVIDIA A100 (fake) (sm80, class a100); --device h100 needs sm90")
    assert not db.exists()
    argv = [a for a in tune_argv(db) if a not in ("--probe", f"{FAKES}:h200")]
    assert cli(argv) == 1  # the machine lacks what tuning needs
    assert "needs a CUDA GPU" in capsys.readouterr().err and not db.exists()


@pytest.mark.parametrize("device, cls", [("auto", "h200"), ("sm90", "h100")])
def test_auto_and_the_architecture_name_tune_the_gpus_class(tmp_path, small_space, device, cls, capsys):
    """`--device auto` (the default) stores winners under the GPU's own class, the one the runtime
    reads first for it (an H200: h200, then h100); `--device sm90` under the architecture's."""
    db = tmp_path / "t.sqlite"
    argv = tune_argv(db, trials=2)
    if device == "auto":
        del argv[argv.index("--device"):argv.index("--device") + 2]
    else:
        argv[argv.index("h100")] = device
    assert cli(argv) == 0, capsys.readouterr().err
    with dbs.Store(str(db), "read") as st, st.session() as s:
        (w,) = dbs.where_winners(s)
    assert (w.device_class, w.gpu_name) == (cls, "NVIDIA H200 (fake)")


def test_auto_on_an_ada_gpu_tunes_the_sm80_kernels_under_sm89(tmp_path, capsys):
    db = tmp_path / "t.sqlite"
    argv = tune_argv(db, trials=2)
    del argv[argv.index("--device"):argv.index("--device") + 2]
    argv[argv.index(f"{FAKES}:h200")] = f"{FAKES}:l40s"
    argv[argv.index(URI)] = URI.replace("_sm90", "_sm80")
    assert cli(argv) == 0, capsys.readouterr().err
    with dbs.Store(str(db), "read") as st, st.session() as s:
        (w,) = dbs.where_winners(s)
    assert (w.uri, w.device_class) == (URI.replace("_sm90", "_sm80"), "sm89")


def test_auto_on_a_gpu_no_profile_holds_tunes_the_sm80_kernels_under_its_own_class(tmp_path, small_space, monkeypatch,
                                                                                 capsys):
    """A newer GPU (a B200, sm100) runs the sm80 kernels; `--device auto` tunes them there under
    the class sm100, and the runtime serves that winner to such a GPU (dispatch.device_class is
    sm100 there too). `--device sm100` names it; an H200 is not one."""
    from attngen.buckets import parse_bucket
    from attngen.db import winners
    from attngen.runtime import dispatch, loader

    db = tmp_path / "t.sqlite"
    uri = URI.replace("_sm90", "_sm80")
    argv = tune_argv(db, trials=8)
    del argv[argv.index("--device"):argv.index("--device") + 2]
    argv[argv.index(f"{FAKES}:h200")] = f"{FAKES}:b200"
    argv[argv.index(URI)] = uri
    assert cli(argv) == 0, capsys.readouterr().err
    with dbs.Store(str(db), "read") as st, st.session() as s:
        (w,) = dbs.where_winners(s)
    assert (w.uri, w.device_class, w.gpu_name) == (uri, "sm100", "NVIDIA B200 (fake)")
    assert w.time_ms < 0.9 * w.default_time_ms  # a winner the runtime serves (past winners.MIN_GAIN)
    monkeypatch.setenv("ATTNGEN_DB", str(db))
    winners.reset()
    try:
        spec = SPEC.replace(target="sm80")
        cfg, source = dispatch.select_config(spec, loader.load(spec).KERNEL_HASH, "sm100", parse_bucket(BUCKET))
        assert (source, dataclasses.asdict(cfg)) == ("tuned", w.config)
        assert dispatch.select_config(spec, loader.load(spec).KERNEL_HASH, "sm120", parse_bucket(BUCKET))[1] == "default"
    finally:
        monkeypatch.delenv("ATTNGEN_DB")
        winners.reset()
    capsys.readouterr()
    argv = tune_argv(tmp_path / "u.sqlite", "--device", "sm100")
    argv[argv.index(URI)] = uri
    assert cli(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("attngen tune: GPU 0 is NVIDIA H200 (fake) (sm90, class h200); --device sm100 needs sm100"), err


def test_a_gpu_older_than_sm80_is_exit_1_and_says_why(tmp_path, capsys):
    db = tmp_path / "t.sqlite"
    argv = tune_argv(db, "--device", "auto")
    argv[argv.index(f"{FAKES}:h200")] = f"{FAKES}:t4"
    assert cli(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("attngen tune: GPU 0: Tesla T4 (fake) (sm75) is older than sm80"), err
    assert not db.exists()


def test_nothing_to_tune_and_bad_buckets_are_clear(tmp_path, capsys):
    argv = tune_argv(tmp_path / "x.sqlite")
    argv[argv.index(URI)] = "attn_nothing_*"
    assert cli(argv) == 2
    assert "nothing to tune" in capsys.readouterr().err
    argv = tune_argv(tmp_path / "x.sqlite")
    argv[argv.index(BUCKET)] = "q100_k100_bh4"
    assert cli(argv) == 2
    assert "powers of two" in capsys.readouterr().err


def _subprocess_env(**extra):
    return {**os.environ, "PYTHONUNBUFFERED": "1", **extra}


def test_ctrl_c_leaves_the_database_consistent_and_resume_finishes(tmp_path):
    """Ctrl-C while the fourth trial is being measured (the fake timer holds there and says so
    through a file, so the interrupt always lands inside a trial, not at a random point)."""
    db = tmp_path / "c.sqlite"
    held = tmp_path / "held"
    argv = [sys.executable, "-m", "attngen.cli", *tune_argv(db, trials=10)]
    p = subprocess.Popen(argv, env=_subprocess_env(ATTNGEN_FAKE_TIMER_HOLD=f"{held}:4"), cwd=REPO_ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and p.poll() is None and not held.exists():
            time.sleep(0.05)
        assert held.exists() and p.poll() is None, f"tune never reached its fourth trial: {p.communicate()}"
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:  # a failed check must not leave the tuner running
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 130, (out[-3000:], err)
    assert "interrupted" in err and "--resume" in err and "Traceback" not in err
    assert_packed(db)
    before = check_consistent(db)
    assert 3 <= len({json.dumps(t["config"]) for t in before if t["status"] != "invalid"}) < 10
    assert cli(tune_argv(db, "--resume", trials=10)) == 0
    after = check_consistent(db)
    assert len({json.dumps(t["config"]) for t in after if t["status"] != "invalid"}) == 10
    assert {t["uid"] for t in before} <= {t["uid"] for t in after}


def assert_packed(db):
    """An interrupted run still leaves the file alone as the database (a rollback journal, no -wal
    beside it), as a finished one does: what gets committed or read from a read-only folder."""
    assert db.read_bytes()[18:20] == b"\x01\x01", "still in WAL mode"
    assert not os.path.exists(f"{db}-wal")


def test_ctrl_c_that_python_swallows_still_stops_the_run(tmp_path):
    """A Ctrl-C whose KeyboardInterrupt lands where Python swallows it (here a __del__; in the
    wild a weakref callback of the garbage collector) still ends the run at the next trial
    boundary with exit code 130 and a consistent database, instead of tuning on to exit 0."""
    db = tmp_path / "s.sqlite"
    argv = [sys.executable, "-m", "attngen.cli", *tune_argv(db, trials=10)]
    argv[argv.index(f"{FAKES}:timer")] = f"{FAKES}:timer_swallowed_interrupt"
    res = subprocess.run(argv, env=_subprocess_env(), cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert "Exception ignored" in res.stderr and "KeyboardInterrupt" in res.stderr, res.stderr[-3000:]
    assert res.returncode == 130, (res.stdout[-3000:], res.stderr[-3000:])
    assert "interrupted" in res.stderr and "--resume" in res.stderr
    assert_packed(db)
    trials = check_consistent(db)
    assert 3 <= len({json.dumps(t["config"]) for t in trials if t["status"] != "invalid"}) < 10


def test_two_workers_share_one_storage(tmp_path, capfd):
    db = tmp_path / "w.sqlite"
    assert cli(tune_argv(db, "--workers", "2", trials=6)) == 0
    out = capfd.readouterr().out
    assert "2 workers on 1 GPU(s)" in out and "[w0]" in out and "[w1]" in out
    trials = check_consistent(db)
    measured = {json.dumps(t["config"], sort_keys=True) for t in trials if t["status"] != "invalid"}
    assert 6 <= len(measured) <= 7  # both stop at the budget; one may finish a trial in flight
    with dbs.Store(str(db), "read") as st, st.session() as s:
        assert len(dbs.where_winners(s)) == 1
    (summary,) = optuna.get_all_study_summaries(f"sqlite:///{db}", include_best_trial=False)
    assert summary.n_trials >= 6


def test_a_trial_another_worker_told_first_is_not_a_crash(tmp_path, monkeypatch):
    """Two workers on SQLite can pop the same enqueued Optuna trial (no row locks); the one that
    tells second gets "Cannot tell a COMPLETE trial" out of study.optimize (seen in CI). The
    tuner goes on with the next trial: the run still measures its budget and ends with one
    consistent winner."""
    real = optuna.study.Study.optimize
    calls = []

    def racing(self, func, *args, **kwargs):
        calls.append(kwargs.get("n_trials"))
        if len(calls) == 1:  # one trial, then the race
            real(self, func, *args, **{**kwargs, "n_trials": 1})
            raise ValueError("Cannot tell a COMPLETE trial.")
        return real(self, func, *args, **kwargs)

    monkeypatch.setattr(optuna.study.Study, "optimize", racing)
    db = tmp_path / "r.sqlite"
    assert cli(tune_argv(db, "--quiet", trials=4)) == 0
    assert len(calls) >= 2
    trials = check_consistent(db)
    assert len({json.dumps(t["config"], sort_keys=True) for t in trials if t["status"] != "invalid"}) == 4
    with dbs.Store(str(db), "read") as st, st.session() as s:
        assert len(dbs.where_winners(s)) == 1


def test_compare_grid_with_search(tmp_path, grid_db, small_space):
    grid, tpe = grid_db, tmp_path / "tpe.sqlite"
    assert cli(tune_argv(tpe, "--quiet", trials=5)) == 0
    res = compare(str(grid), str(tpe), seeds=3)
    (r,) = res["rows"]
    best = fakes.fake_ms(dataclasses.asdict(GRID_BEST))
    assert r["exhaustive_measured"] == len(VALID) and r["exhaustive_best_ms"] == best
    assert r["search_measured"] == 5 and r["search_fraction"] == pytest.approx(5 / len(VALID))
    expected = fakes.fake_ms(r["search_winner"])
    assert r["search_winner_ms_in_exhaustive_run"] == expected and r["gap"] == pytest.approx(expected / best - 1)
    assert r["space_valid"] == len(VALID) and r["exhaustive_complete"] is True and r["same_space"] is True
    assert r["space"] == {k: list(v) for k, v in SMALL.items()}
    assert r["meets_goal"] == (r["gap"] <= 0.03)
    assert r["replay_budget"] == int(0.3 * len(VALID))
    assert set(r["replay"]) == {"tpe_with_default", "tpe_from_scratch", "random_from_scratch"}
    assert cli(["db", "compare", "--exhaustive", str(grid), "--search", str(tpe), "--seeds", "2",
                "--out", str(tmp_path / "c.json")]) == 0
    assert json.loads((tmp_path / "c.json").read_text())["rows"][0]["uri"] == URI


def test_compare_takes_the_searchs_best_inside_the_space(tmp_path, small_space):
    """The tuner measures the default first even when --fix pins it out of the space, and it may
    win the database; the comparison is about the space: it takes the search's best config in it."""
    fix = ["--fix", "block_n=128"]  # the default has 64
    grid, tpe = tmp_path / "grid.sqlite", tmp_path / "tpe.sqlite"
    assert cli(tune_argv(grid, "--sampler", "grid", "--quiet", *fix, trials=100)) == 0
    assert cli(tune_argv(tpe, "--quiet", *fix, trials=4)) == 0
    (r,) = compare(str(grid), str(tpe), seeds=2)["rows"]
    assert r["search_winner"]["block_n"] == 128 and r["search_winner_ms_in_exhaustive_run"] is not None
    assert r["search_measured"] == 4 and r["gap"] is not None
    assert r["database_winner_in_space"] == (r["database_winner"]["block_n"] == 128)


def test_replay_finds_the_best_of_a_table():
    sp = {"a": (1, 2, 3, 4), "b": (1, 2, 3, 4)}
    table = {json.dumps({"a": a, "b": b}, sort_keys=True, separators=(",", ":")): 1.0 + abs(a - 3) + abs(b - 2)
             for a in sp["a"] for b in sp["b"] if (a, b) != (4, 4)}
    best, seen = replay(table, sp, budget=15, seed=0)
    assert best == 1.0 and seen == 15  # 15 of the 15 configs in the table: found
    best, seen = replay(table, sp, budget=3, seed=1, sampler="random")
    assert seen == 3 and best >= 1.0


def test_a_new_bucket_starts_from_the_default_and_the_nearest_winner(tmp_path, small_space):
    db = tmp_path / "ws.sqlite"
    assert cli(tune_argv(db, "--quiet", trials=10)) == 0
    with dbs.Store(str(db), "read") as st, st.session() as s:
        (first,) = dbs.where_winners(s)
    assert first.config != dataclasses.asdict(DEFAULT)
    argv = tune_argv(db, "--quiet", trials=3)
    argv[argv.index(BUCKET)] = "q32_k32_bh4"
    assert cli(argv) == 0
    study = next(sm for sm in optuna.get_all_study_summaries(f"sqlite:///{db}", include_best_trial=False)
                 if ".q32_k32_bh4." in sm.study_name)
    loaded = optuna.load_study(study_name=study.study_name, storage=f"sqlite:///{db}")
    spec = KernelSpec(**loaded.user_attrs["spec"])
    walk = valid_space(spec, space_for(spec))  # TPE's parameters: the walk through valid configs
    assert [t.params for t in loaded.trials[:2]] == [walk.params(dataclasses.asdict(DEFAULT)),
                                                     walk.params(first.config)]
    assert None not in [walk.params(dataclasses.asdict(DEFAULT)), walk.params(first.config)]


def test_pinned_grid_measures_its_whole_space_when_the_default_lies_outside(tmp_path, small_space):
    db = tmp_path / "pin.sqlite"
    other = 8 if DEFAULT.num_warps != 8 else 4
    assert cli(tune_argv(db, "--sampler", "grid", "--fix", f"num_warps={other}", "--quiet", trials=1000)) == 0
    trials = check_consistent(db)
    grid = {json.dumps(t["config"], sort_keys=True) for t in trials if t["status"] != "invalid"
            and t["config"]["num_warps"] == other}
    assert len(grid) == len([c for c in VALID if c.num_warps == other])
    assert [t["config"]["num_warps"] for t in trials if t["is_default"]] == [DEFAULT.num_warps]


def test_timeout_ends_the_run_between_trials_and_says_what_is_left(tmp_path, small_space, monkeypatch, capsys):
    """--timeout S: the trial in flight finishes, no study starts after the deadline, the database
    holds what was measured (consistent), and the run says how many studies are left.

    On a fake clock, so that the machine's speed cannot decide the outcome (on the wall clock, a
    1 s timeout left room for about one 0.3 s trial after the run's set-up, and a loaded machine
    could spend the whole second before the first trial): the tuner's deadline checks read a clock
    that only the fake timer's sleeps move, 30 fake seconds a measured config, no real waiting. The
    100 s timeout is crossed by the 4th measurement."""
    from types import SimpleNamespace

    from attngen.tuning import study as study_mod
    from attngen.tuning import tuner as tuner_mod

    clock = [0.0]

    def fake_sleep(seconds: float) -> None:
        clock[0] += seconds

    fake_time = SimpleNamespace(monotonic=lambda: clock[0])
    monkeypatch.setattr(tuner_mod, "time", fake_time)
    monkeypatch.setattr(study_mod, "time", fake_time)
    monkeypatch.setattr(time, "sleep", fake_sleep)  # the fake timer's sleep (tests/tuning/fakes.py)
    monkeypatch.setenv("ATTNGEN_FAKE_TIMER_SLEEP", "30")
    db = tmp_path / "t.sqlite"
    argv = tune_argv(db, "--timeout", "100", trials=40)
    argv[argv.index("--shapes") + 1] = f"{BUCKET},q32_k32_bh4"
    t0 = time.monotonic()
    assert cli(argv) == 0
    assert time.monotonic() - t0 < 60
    out = capsys.readouterr()
    assert "--timeout reached: 1 studies left" in out.out + out.err
    trials = check_consistent(db)
    assert {t["bucket"] for t in trials} == {BUCKET}, "a study started after the deadline"
    assert len(trials) == 4, trials  # the deadline passed during the 4th config's measurement
    assert 1 <= len([t for t in trials if t["status"] == "ok"]) < 40


class _Terminal(io.StringIO):
    """A stdout that says it is a terminal, so `attngen tune` draws rich's live progress."""

    def isatty(self) -> bool:
        return True


def test_terminal_progress_shows_trials_best_and_eta(tmp_path, small_space, monkeypatch):
    term = _Terminal()
    monkeypatch.setattr(sys, "stdout", term)
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.delenv("TERM", raising=False)
    db = tmp_path / "t.sqlite"
    assert cli(tune_argv(db, trials=3)) == 0
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", term.getvalue())  # without the terminal codes
    assert "studies" in shown and "ETA" in shown, shown[-2000:]
    assert re.search(r"\b3/3\b", shown) and re.search(r"best \d+\.\d+ ms \d+ TFLOP/s", shown), shown[-2000:]
    assert f"{URI} {BUCKET}: 3 measured; winner" in shown
    check_consistent(db)


def test_the_reserved_decode_bucket_is_a_clear_error(tmp_path, capsys):
    db = tmp_path / "t.sqlite"
    argv = tune_argv(db)
    argv[argv.index("--shapes") + 1] = "q1_k1024_bh32"
    assert cli(argv) == 2
    err = capsys.readouterr().err
    assert "q1_k1024_bh32: the decode bucket (Sq = 1) is tuned by the decode family only" in err
    assert "Traceback" not in err and not db.exists()


def test_compile_ahead_takes_the_unmeasured_valid_configs_when_that_is_quicker(tmp_path, small_space,
                                                                              monkeypatch):
    from attngen.tuning import precompile as pre

    calls = []

    def fake_precompile(spec, problem, configs, device, workers, deadline=None):
        calls.append((configs, workers))
        return {"configs": len(configs), "compiled": len(configs), "failed": 0, "seconds": 0.0,
                "stopped": None}

    monkeypatch.setattr(pre, "precompile", fake_precompile)
    # 1 trial, 2 processes: compiling every valid config ahead would take longer than one compile
    assert cli(tune_argv(tmp_path / "a.sqlite", "--compile-workers", "2", "--quiet", trials=1)) == 0
    assert calls == []
    # the grid measures every valid config: all of them but the default (measured first) go ahead
    # (--timeout: the compiling ahead comes before the search, which is not needed here)
    assert cli(tune_argv(tmp_path / "b.sqlite", "--compile-workers", "2", "--sampler", "grid", "--quiet",
                         "--timeout", "1", trials=1000)) == 0
    (configs, workers), = calls
    assert workers == 2
    keys = {json.dumps(c, sort_keys=True) for c in configs}
    assert keys == {json.dumps(dataclasses.asdict(c), sort_keys=True) for c in VALID if c != DEFAULT}
    # a fake timer or probe means no GPU to compile for: nothing ahead unless asked
    calls.clear()
    assert cli(tune_argv(tmp_path / "c.sqlite", "--sampler", "grid", "--quiet", "--timeout", "1",
                         trials=1000)) == 0
    assert calls == []
