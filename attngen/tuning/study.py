"""One study of `attngen tune` in one process: the default config first (the yardstick), then
Optuna's search, each measured config one transaction (the trial row and, when it is ok and faster,
the winner). The Optuna storage and the pieces a study is made of (its Optuna study, warm starts,
the configs left to measure) are here too; the run over every study is attngen.tuning.tuner."""

from __future__ import annotations

import dataclasses
import json
import random
import time
import warnings

from attngen import configs as space
from attngen import devices
from attngen.buckets import parse_bucket
from attngen.db import schema
from attngen.db import store as dbs
from attngen.families import family as family_of
from attngen.tuning.progress import TargetReport
from attngen.tuning.sampling import make_sampler, valid_space
from attngen.tuning.targets import Target, TuneError, default_config, in_space, valid_count

HEARTBEAT_S, GRACE_S = 30, 120
RACE_RETRIES = 20  # optimize() restarts after a trial another worker told first (SQLite)


class TrialFailed(Exception):
    """Raised inside the Optuna objective so that Optuna records the trial as FAIL."""


def make_storage(url: str):
    import optuna

    kwargs = {"connect_args": {"timeout": dbs.BUSY_TIMEOUT_S}} if url.startswith("sqlite") else {}
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    try:
        return optuna.storages.RDBStorage(url, engine_kwargs=kwargs, heartbeat_interval=HEARTBEAT_S,
                                          grace_period=GRACE_S)
    except Exception as exc:  # optuna wraps driver errors its own way
        raise TuneError(f"{schema.redact(url)}: Optuna cannot use this storage ({schema.one_line(exc)})") from None


def open_study(storage, target: Target, sampler):
    """The target's Optuna study, created with its user attributes when it does not exist yet."""
    import optuna

    study = optuna.create_study(storage=storage, study_name=target.study_name, sampler=sampler,
                                direction="minimize", load_if_exists=True)
    if not study.user_attrs:
        for k, v in (("uri", target.spec.uri), ("template_hash", target.kernel_hash),
                     ("device_class", target.device_class), ("bucket", target.bucket.key),
                     ("spec", target.spec.as_dict())):
            study.set_user_attr(k, v)
    return study


def unmeasured(store: dbs.Store, t: Target, kernel_id: int, bucket_id: int) -> list[dict]:
    """The valid configs of the study's space not measured yet on its device class."""
    with store.session() as s:
        seen = set(dbs.where_measured_configs(s, kernel_id, t.device_class, bucket_id))
    return [c for c in valid_space(t.spec, t.space).configs() if schema.config_json(c) not in seen]


def warm_starts(store: dbs.Store, t: Target, dcfg, space_: dict, n: int = 2) -> list[dict]:
    """Optuna's first proposals: the default config, then the winners of the nearest buckets
    already tuned for this kernel and device class (configs move slowly across buckets), or for
    the class it falls back to (an h200 study starts from h100's winner of the same bucket)."""
    fam = family_of(t.spec.family)
    starts = [dataclasses.asdict(dcfg)]
    classes = devices.lineage(t.device_class)
    with store.session() as s:
        others = [w for w in dbs.where_winners(s)
                  if w.device_class in classes and w.uri == t.spec.uri and w.template_hash == t.kernel_hash
                  and not (w.device_class == t.device_class and w.bucket == t.bucket.key)]
    others.sort(key=lambda w: (t.bucket.distance(parse_bucket(w.bucket)), classes.index(w.device_class),
                               w.bucket))
    for w in others:
        if len(starts) > n or w.config in starts:
            continue
        try:
            cfg = space.config_from_dict(fam.config, w.config)
        except ValueError:
            continue
        if fam.check(t.spec, cfg) is None:
            starts.append(dataclasses.asdict(cfg))
    return [c for c in starts if in_space(c, space_)]


def _outcome(trial_row):
    from attngen.tuning.objective import Outcome

    return Outcome(trial_row.status, trial_row.time_ms, trial_row.tflops, trial_row.error)


class Study:
    """One target's study, run by `tuner` (attngen.tuning.tuner.Tuner: options, timer, progress,
    Ctrl-C, compiling ahead) against the tuning database `store` and Optuna's `storage`."""

    def __init__(self, tuner, store: dbs.Store, storage, device_id: int, target: Target,
                 deadline: float | None):
        self.tuner, self.opts = tuner, tuner.opts
        self.store, self.storage, self.deadline = store, storage, deadline
        self.t = target
        self.space = target.space
        self.budget = min(self.opts.trials, valid_count(target.spec, self.space))
        self.report = TargetReport(target)
        self.yardstick = {"ms": None, "tflops": None}  # the default config's time, once measured
        with store.session() as s:
            kernel = dbs.find_or_add_kernel(s, target.spec.uri, target.kernel_hash, target.spec.family,
                                            target.spec.as_dict())
            bucket = dbs.find_or_add_bucket(s, target.bucket.key)
            self.kernel_id, self.bucket_id = kernel.id, bucket.id
        self.rows = dict(kernel=self.kernel_id, device=device_id, bucket=self.bucket_id)
        worker = self.opts.worker[0] if self.opts.worker else 0
        self.seed = self.opts.seed + 1000 * worker
        # TPE walks the valid configs (sampling.ValidSpace); the grid enqueues them instead
        self.walk = None if self.opts.sampler == "grid" else valid_space(target.spec, self.space)
        self.repeat_rng = random.Random(self.seed)
        self.cap = 10 * self.budget + 50  # Optuna trials, counting re-proposals of known configs
        self.trials_seen = 0  # Optuna trials of the study, read back when the search starts
        self.problem = self.bench = None

    def run(self, index: int, total: int) -> TargetReport:
        if not self._set_up_measurement():
            self.tuner.progress.finish(self.t, self.report)
            return self.report
        dcfg = self._measure_default()
        self.tuner.precompile_ahead(self.store, self.t, self.problem, self.rows, self.budget, self.deadline)
        study = self._prepare_search(dcfg)
        self.tuner.progress.start(index, total, self.t, self.budget, self.measured())
        self._optimize(study)
        self.report.measured = self.measured()
        b = self.best()
        if b:
            self.report.best_ms, self.report.best_tflops, self.report.best_config = b
        self.tuner.progress.finish(self.t, self.report)
        return self.report

    # -- steps --
    def _set_up_measurement(self) -> bool:
        """The problem and its objective (inputs, reference); False when they cannot be set up."""
        from attngen.tuning.objective import Objective, problem_for

        try:
            self.problem = problem_for(self.t.entry, self.t.spec, self.t.bucket)
            self.bench = Objective(self.t.spec, self.problem, self.tuner.torch_device(), timer=self.tuner.timer,
                                   seed=self.opts.seed)
        except Exception as exc:  # e.g. the inputs do not fit the GPU
            self.report.skipped = (f"cannot set up the measurement: {type(exc).__name__}: "
                                   f"{schema.one_line(exc)}")
            return False
        return True

    def _measure_default(self):
        """The default config: the yardstick of the gain, and Optuna's first trial. The GPU's
        default table even when a fake GPU runs kernels in the interpreter: the winner competes
        with what the runtime would launch on the device class. Found when measured before on this
        device (as the default or as an ordinary trial), else measured now."""
        dcfg = default_config(self.t.spec, "cuda", self.t.bucket.seqlen_q)
        outcome = None
        with self.store.session() as s:
            prev = dbs.find_default_trial(s, self.kernel_id, self.rows["device"], self.bucket_id)
            if prev is not None:
                outcome = _outcome(prev)
        if outcome is None:
            outcome = self.known(dcfg)
        if outcome is None:
            outcome = self.measure(dcfg, is_default=True)
        if outcome.status == "ok":
            self.yardstick.update(ms=outcome.time_ms, tflops=outcome.tflops)
            self.report.default_ms, self.report.default_tflops = outcome.time_ms, outcome.tflops
        return dcfg

    def _prepare_search(self, dcfg):
        """The Optuna study with its first trials enqueued: the warm starts, and for the grid every
        valid config not measured yet, in a seeded order (Optuna's GridSampler walks the flat
        product, mostly invalid configs, and reads every trial of the study back for each
        proposal)."""
        sampler = make_sampler(self.opts.sampler, self.space, self.budget, self.seed)
        study = open_study(self.storage, self.t, sampler)
        for start in warm_starts(self.store, self.t, dcfg, self.space):
            params = start if self.walk is None else self.walk.params(start)
            if params is not None:
                study.enqueue_trial(params, skip_if_exists=True)
        if self.walk is None:
            todo = unmeasured(self.store, self.t, self.kernel_id, self.bucket_id)
            random.Random(self.opts.seed).shuffle(todo)
            for cfg in todo:
                study.enqueue_trial(cfg)
        return study

    def _optimize(self, study) -> None:
        """Optuna's loop until the budget, the trial cap or the deadline; restarted after a trial
        another worker told first."""
        self.trials_seen = len(study.get_trials(deepcopy=False))  # (study.trials deep-copies them all)
        for _ in range(RACE_RETRIES):
            if self.measured() >= self.budget or self._past_deadline():
                break
            remaining = None if self.deadline is None else max(0.0, self.deadline - time.monotonic())
            try:
                study.optimize(self.objective, timeout=remaining, callbacks=[self.stop],
                               catch=(TrialFailed,), n_trials=max(1, self.cap - self.trials_seen))
                break
            except ValueError as exc:
                # two workers popped the same enqueued trial (SQLite has no row locks) and the
                # other one told it first: its measurement is in the database; go on
                if "Cannot tell a COMPLETE trial" not in str(exc):
                    raise

    def _past_deadline(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    # -- Optuna's objective and callback --
    def objective(self, trial) -> float:
        if self.walk is None:
            values = {n: trial.suggest_categorical(n, list(c)) for n, c in self.space.items()}
        else:
            values = self.walk.suggest(trial)
        cfg = space.config_from_dict(family_of(self.t.spec.family).config, values)
        outcome = self.known(cfg)
        if outcome is not None and self.walk is not None:
            with self.store.session() as s:
                seen = set(dbs.where_measured_configs(s, self.kernel_id, self.t.device_class, self.bucket_id))
            self.walk.after_repeat(trial.study, values, seen, self.repeat_rng)
        if outcome is None:
            outcome = self.measure(cfg, optuna_trial=trial.number)
            self.tuner.progress.trial(self.t, self.measured(), self.budget, values, outcome, self.best())
        else:
            trial.set_user_attr("reused", True)
        trial.set_user_attr("status", outcome.status)
        if outcome.error:
            trial.set_user_attr("error", outcome.error[:1000])
        if outcome.status != "ok":
            raise TrialFailed(f"{outcome.status}: {outcome.error}")
        trial.set_user_attr("tflops", outcome.tflops)
        return outcome.time_ms

    def stop(self, study_, _trial) -> None:
        self.tuner.interrupt.check()  # a Ctrl-C Python swallowed during the trial stops the run here
        self.trials_seen += 1
        if self.measured() >= self.budget or self.trials_seen >= self.cap or self._past_deadline():
            study_.stop()

    def measure(self, cfg, is_default: bool = False, optuna_trial: int | None = None):
        """Run and record one config. A config that loses the GPU is recorded as failed before
        DeviceLost stops the run, so that --resume never runs it again."""
        from attngen.tuning.objective import DeviceLost, Outcome

        try:
            outcome = self.bench.run(cfg)
        except DeviceLost as exc:
            self.record(cfg, Outcome("failed", error=f"lost the GPU: {exc}"), is_default, optuna_trial)
            raise
        self.record(cfg, outcome, is_default, optuna_trial)
        return outcome

    # -- the database --
    def record(self, cfg, outcome, is_default: bool = False, optuna_trial: int | None = None) -> None:
        """One transaction: the trial and its winner offer."""
        t, rows = self.t, self.rows
        with self.store.session() as s:
            k, d, b = (s.get(m, rows[n]) for m, n in ((dbs.KernelModel, "kernel"),
                                                      (dbs.DeviceModel, "device"),
                                                      (dbs.ShapeBucketModel, "bucket")))
            row = dbs.add_trial(s, kernel=k, device=d, bucket=b, config=dataclasses.asdict(cfg),
                                status=outcome.status, shape=self.problem.as_dict(),
                                time_ms=outcome.time_ms, tflops=outcome.tflops,
                                error=outcome.error, study_name=t.study_name,
                                optuna_trial=optuna_trial, is_default=is_default)
            if outcome.status == "ok":
                if is_default:
                    self.yardstick.update(ms=outcome.time_ms, tflops=outcome.tflops)
                dbs.offer_winner(s, row, t.device_class, self.yardstick["ms"], self.yardstick["tflops"])

    def known(self, cfg):
        """The outcome of `cfg` measured before on this device, or None."""
        with self.store.session() as s:
            prev = dbs.find_trial_by_config(s, self.kernel_id, self.t.device_class, self.bucket_id,
                                            schema.config_json(dataclasses.asdict(cfg)))
            if prev is None or prev.device_id != self.rows["device"]:
                return None
            return _outcome(prev)

    def measured(self) -> int:
        """Distinct configs of this study's space measured (the default, measured first, may lie
        outside it, e.g. pinned away by --fix: it does not count)."""
        with self.store.session() as s:
            keys = dbs.where_measured_configs(s, self.kernel_id, self.t.device_class, self.bucket_id,
                                              self.t.study_name)
        return sum(in_space(json.loads(k), self.space) for k in keys)

    def best(self) -> tuple[float, float, dict] | None:
        with self.store.session() as s:
            w = dbs.find_winner(s, self.kernel_id, self.t.device_class, self.bucket_id)
            return (w.time_ms, w.tflops, json.loads(w.config_json)) if w else None
