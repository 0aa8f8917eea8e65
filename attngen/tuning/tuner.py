"""`attngen tune`: Optuna over the config search spaces, every trial into the tuning database.

One Optuna study per (kernel uri + kernel hash, device class, shape bucket), stored in the same
RDB URL as attngen's tables, so `optuna-dashboard <URL>` shows them. Per study:

  1. the default config (space.default_*_config) is measured first (or found, measured earlier on
     this device) and is the yardstick of the winner's gain; it is also Optuna's first trial,
     followed by the winners of the nearest buckets already tuned (warm starts);
  2. the configs not measured yet are compiled ahead in parallel processes (precompile.py); the
     sampler proposes valid configs (TPE, seeded, walking the fields as sampling.py says; or the
     exhaustive grid, every valid config in a seeded order); a config measured before on this
     device, by this process, another worker or an earlier run, is not measured again (TPE's
     next trial is then the nearest unmeasured config);
  3. each measured config is one transaction: the trial row and, when it is ok and faster, the
     winner (store.offer_winner);
  4. the study stops when `--trials` distinct configs were measured (all workers together, earlier
     runs included), the space is exhausted, or the time is up.

Ctrl-C: the trial in flight is not recorded (its transaction rolls back), everything before it is;
`--resume` continues the same studies. `--workers N` starts N processes on one storage (one per GPU,
or sharing the GPUs there are), each running the same studies through Optuna's RDB storage.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import hashlib
import importlib
import importlib.util
import itertools
import json
import math
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from attngen import env
from attngen.db import schema
from attngen.db import store as dbs
from attngen.families import FAMILIES, family as family_of
from attngen.spec import KernelSpec, SpecEntry, SpecError, load_spec, spec_files
from attngen import configs as space
from attngen.tuning.sampling import make_sampler, valid_space
from attngen.buckets import ShapeBucket, bucket_of, parse_bucket
from attngen.devices import PROFILES, DeviceInfo, check_profile

DEFAULT_SEQLENS = (1024, 2048, 4096, 8192, 16384)  # Sq = Sk, powers of two
DEFAULT_BATCHES = (1, 4)  # batch x heads classes: the entry's query heads times these
SAMPLERS = ("tpe", "grid")
HEARTBEAT_S, GRACE_S = 30, 120
RACE_RETRIES = 20  # optimize() restarts after a trial another worker told first (SQLite)


class TuneError(RuntimeError):
    """A problem found before or while tuning; one line for the user (exit code 2)."""


class TrialFailed(Exception):
    """Raised inside the Optuna objective so that Optuna records the trial as FAIL."""


# ------------------------------------------------------------------------------------------------
# What to tune

@dataclass(frozen=True)
class Target:
    """One study: a kernel of a spec entry, for one device class and shape bucket."""

    entry: SpecEntry
    spec: KernelSpec
    bucket: ShapeBucket
    kernel_hash: str  # the generated module's KERNEL_HASH (codegen.naming.kernel_hash)
    device_class: str
    fixed: tuple[tuple[str, object], ...] = ()  # --fix FIELD=VALUE: fields pinned to one value

    @property
    def space(self) -> dict[str, tuple]:
        return space_for(self.spec, dict(self.fixed))

    @property
    def study_name(self) -> str:
        """uri.kernel_hash.device_class.bucket.space_hash: a changed kernel or search space
        starts a new study (Optuna cannot change a study's parameter ranges); configs measured in
        the old one are still found and not measured again."""
        sp = json.dumps(self.space, sort_keys=True)
        space_hash = hashlib.sha256(sp.encode()).hexdigest()[:8]
        return f"{self.spec.uri}.{self.kernel_hash}.{self.device_class}.{self.bucket.key}.{space_hash}"

    @property
    def label(self) -> str:
        return f"{self.spec.uri} {self.bucket.key}"


@dataclass
class TuneOptions:
    device: str
    specs: list[str] = field(default_factory=list)  # files or folders; default: the repo's specs/
    shapes: list[ShapeBucket] | None = None
    trials: int = 20
    timeout: float | None = None
    storage: str | None = None  # default env.tuning_db_url()
    resume: bool = False
    workers: int = 1
    sampler: str = "tpe"
    families: tuple[str, ...] = tuple(FAMILIES)  # every registered family
    kernels: str | None = None  # glob over kernel uris
    fixed: dict = field(default_factory=dict)  # --fix FIELD=VALUE
    seed: int = 0
    worker: tuple[int, int] | None = None  # (index, count) in a --workers child
    gpu: int = 0
    timer_ref: str | None = None  # "file.py:func" / "module:func": a timer instead of do_bench
    probe_ref: str | None = None  # the same for the device probe
    quiet: bool = False
    compile_workers: int | None = None  # None: precompile.default_workers() on a real GPU

    @property
    def url(self) -> str:
        return schema.to_url(self.storage or env.tuning_db_url(writing=True))


def default_buckets(entry: SpecEntry) -> list[ShapeBucket]:
    """Sq = Sk over DEFAULT_SEQLENS, batch x heads = the entry's query heads x DEFAULT_BATCHES. The
    decode bucket (Sq = 1) is left to the split-KV family."""
    heads = entry.num_q_heads or 16 * entry.gqa_ratio
    return sorted({bucket_of(s, s, heads * b) for s in DEFAULT_SEQLENS for b in DEFAULT_BATCHES})


def plan(opts: TuneOptions) -> list[Target]:
    """The studies to run, in a fixed order (spec files, entries, kernels, buckets)."""
    from attngen.codegen.naming import kernel_hash
    from attngen.codegen.render import render  # jinja2: the tuner may import it

    profile = PROFILES[opts.device]
    try:
        files = [f for t in (opts.specs or [env.REPO_ROOT / "specs"]) for f in spec_files(t)]
        loaded = [load_spec(f) for f in files]
    except SpecError as exc:
        raise TuneError(str(exc).splitlines()[0] + (" (and more)" if len(exc.problems) > 1 else "")) from None
    targets, seen = [], set()
    for sf in loaded:
        for entry in sf.entries:
            for spec in entry.kernel_specs():
                if spec.target != profile.target or spec.family not in opts.families:
                    continue
                if opts.kernels and not fnmatch.fnmatchcase(spec.uri, opts.kernels):
                    continue
                if spec.uri in seen:  # two entries with one kernel: the first one's values
                    continue
                seen.add(spec.uri)
                h = kernel_hash(render(spec))
                try:
                    fixed = tuple(sorted(pin(spec, opts.fixed).items()))
                except ValueError as exc:
                    raise TuneError(f"--fix: {exc}") from None
                for b in (opts.shapes or default_buckets(entry)):
                    if b.decode:
                        raise TuneError(f"{b.key}: the decode bucket (Sq = 1) is not tuned by these "
                                        f"kernel families")
                    targets.append(Target(entry, spec, b, h, profile.name, fixed))
    used = {name for t in targets for name, _ in t.fixed}
    for name in opts.fixed:
        if targets and name not in used:
            names = sorted({f.name for t in targets for f in dataclasses.fields(family_of(t.spec.family).config)})
            raise TuneError(f"--fix: no kernel to tune has a config field {name!r} (fields: "
                            f"{', '.join(names)})")
    if not targets:
        raise TuneError(f"nothing to tune: no {'/'.join(opts.families)} kernel for target "
                        f"{profile.target} in {', '.join(map(str, files))}"
                        + (f" matches --kernels {opts.kernels!r}" if opts.kernels else ""))
    return targets


# ------------------------------------------------------------------------------------------------
# Pieces shared with tests and `db compare`

def load_ref(ref: str) -> Callable:
    """"path/to/file.py:func" or "package.module:func" -> the function."""
    mod_name, sep, func = ref.rpartition(":")
    if not sep or not mod_name or not func:
        raise TuneError(f"{ref!r}: expected FILE.py:FUNCTION or MODULE:FUNCTION")
    try:
        if mod_name.endswith(".py"):
            path = Path(mod_name).resolve()
            spec = importlib.util.spec_from_file_location(f"attngen_ref_{path.stem}", path)
            if spec is None or not path.exists():
                raise TuneError(f"{ref!r}: no such file {path}")
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
        else:
            mod = importlib.import_module(mod_name)
        return getattr(mod, func)
    except (ImportError, AttributeError, OSError) as exc:
        raise TuneError(f"{ref!r}: cannot load it ({type(exc).__name__}: {exc})") from None


def pin(spec: KernelSpec, fixed: dict[str, str | object]) -> dict[str, object]:
    """The --fix FIELD=VALUE pairs this kernel's config class has, values parsed to the field's
    type (plan() makes sure every pinned field exists in some planned kernel)."""
    fields = {f.name: f for f in dataclasses.fields(family_of(spec.family).config)}
    return {name: _parse_value(name, value, fields[name].type)
            for name, value in fixed.items() if name in fields}


def _parse_value(name: str, value, type_) -> object:
    if not isinstance(value, str):
        return value
    t = str(type_)
    if "bool" in t:
        if value.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"{name}={value!r}: expected true or false")
        return value.lower() in ("true", "1")
    try:
        return int(value) if "int" in t else float(value) if "float" in t else value
    except ValueError:
        raise ValueError(f"{name}={value!r}: expected {t}") from None


def space_for(spec: KernelSpec, fixed: dict | None = None) -> dict[str, tuple]:
    """The search space of a kernel: its family's config fields -> candidates (attngen/configs.py), with
    the --fix fields pinned, and without the candidate values no valid config of this kernel
    takes (e.g. the Gluon kernels' knobs at a head dim they do not exist for), so the sampler
    never proposes them."""
    sp = space.search_space(family_of(spec.family).config, spec.family, spec.target)
    for name, value in (fixed or {}).items():
        sp[name] = (value,)
    return dict(_drop_never_valid(spec, tuple(sp.items())))


@functools.lru_cache(maxsize=256)
def _drop_never_valid(spec: KernelSpec, items: tuple) -> tuple:
    fam = family_of(spec.family)
    names = [name for name, _ in items]
    used: dict[str, set] = {name: set() for name in names}
    missing = sum(len(cands) for _, cands in items)  # candidate values no valid config took yet
    for values in itertools.product(*(cands for _, cands in items)):
        if fam.check(spec, fam.config(**dict(zip(names, values)))) is None:
            for name, value in zip(names, values):
                if value not in used[name]:
                    used[name].add(value)
                    missing -= 1
            if not missing:  # every value is taken by some valid config: nothing to drop
                break
    if not used[names[0]]:  # nothing valid: the space as it is (the study reports it)
        return items
    return tuple((name, tuple(c for c in cands if c in used[name])) for name, cands in items)


def valid_count(spec: KernelSpec, space_: dict[str, tuple] | None = None) -> int:
    """Configs of the space (the kernel's full space by default) that pass the validity filter."""
    return len(valid_space(spec, space_ or space_for(spec)))


def in_space(config: dict, space_: dict[str, tuple]) -> bool:
    return set(config) == set(space_) and all(config[k] in space_[k] for k in config)


def default_config(spec: KernelSpec, kind: str, seqlen_q: int):
    return family_of(spec.family).default(spec, kind, seqlen_q)


def make_storage(url: str):
    import optuna

    kwargs = {"connect_args": {"timeout": dbs.BUSY_TIMEOUT_S}} if url.startswith("sqlite") else {}
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    try:
        return optuna.storages.RDBStorage(url, engine_kwargs=kwargs, heartbeat_interval=HEARTBEAT_S,
                                          grace_period=GRACE_S)
    except Exception as exc:  # optuna wraps driver errors its own way
        raise TuneError(f"{schema.redact(url)}: Optuna cannot use this storage ({schema.one_line(exc)})") from None


SHORT = {"block_m": "M", "block_n": "N", "num_warps": "w", "num_stages": "s", "dq_block_m": "dqM",
         "dq_block_n": "dqN", "dq_num_warps": "dqw", "dq_num_stages": "dqs", "atomic_dq": "atomic",
         "warp_specialize": "ws"}


def config_text(config: dict, family: str | None = None) -> str:
    """"M=128 N=64 w=8 s=3 tma=1": in the config class's field order when the family is known."""
    if family in FAMILIES:
        order = [f.name for f in dataclasses.fields(FAMILIES[family].config)]
        config = {k: config[k] for k in sorted(config, key=lambda k: (k not in order,
                                                                       order.index(k) if k in order else 0, k))}
    return " ".join(f"{SHORT.get(k, k)}={int(v) if isinstance(v, bool) else v}" for k, v in config.items())


# ------------------------------------------------------------------------------------------------
# Progress

class Progress:
    """Plain lines (logs, tests, workers); RichProgress draws bars when stdout is a terminal."""

    def __init__(self, prefix: str = "", quiet: bool = False):
        self.prefix, self.quiet = prefix, quiet

    def say(self, text: str) -> None:
        if not self.quiet:
            print(f"{self.prefix}{text}", flush=True)

    def start(self, index: int, total: int, target: Target, budget: int, measured: int) -> None:
        self.say(f"[{index + 1}/{total}] {target.label}: {measured}/{budget} configs measured")

    def trial(self, target: Target, measured: int, budget: int, cfg: dict, outcome, best) -> None:
        short = config_text(cfg, target.spec.family)
        if outcome.status == "ok":
            what = f"{outcome.time_ms:.4f} ms {outcome.tflops:.4g} TFLOP/s"
        else:
            what = f"{outcome.status}: {(outcome.error or '')[:120]}"
        best_s = f"; best {best[0]:.4f} ms {best[1]:.4g} TFLOP/s" if best else ""
        self.say(f"  {measured}/{budget} {short}: {what}{best_s}")

    def finish(self, target: Target, report: "TargetReport") -> None:
        self.say(f"  done {target.label}: {report.line()}")

    def close(self) -> None:
        pass


class RichProgress(Progress):
    def __init__(self, total: int):
        super().__init__()
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress as _P, TextColumn,
                                   TimeElapsedColumn, TimeRemainingColumn)

        self.bar = _P(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TextColumn("{task.fields[best]}"), TimeElapsedColumn(), TextColumn("ETA"),
                      TimeRemainingColumn())
        self.bar.start()
        self.all = self.bar.add_task("studies", total=total, best="")
        self.task = None

    def say(self, text: str) -> None:
        self.bar.console.print(text)

    def start(self, index, total, target, budget, measured) -> None:
        if self.task is not None:
            self.bar.remove_task(self.task)
        self.task = self.bar.add_task(target.label, total=budget, completed=measured, best="")

    def trial(self, target, measured, budget, cfg, outcome, best) -> None:
        best_s = f"best {best[0]:.4f} ms {best[1]:.0f} TFLOP/s" if best else ""
        self.bar.update(self.task, completed=measured, best=best_s)
        if outcome.status != "ok":
            text = config_text(cfg, target.spec.family)
            self.bar.console.print(f"  {target.label} {text}: {outcome.status}: "
                                   f"{(outcome.error or '')[:100]}")

    def finish(self, target, report) -> None:
        self.bar.advance(self.all)
        self.bar.console.print(f"{target.label}: {report.line()}")

    def close(self) -> None:
        self.bar.stop()


# ------------------------------------------------------------------------------------------------
# One process's tuning

@dataclass
class TargetReport:
    target: Target
    measured: int = 0
    best_ms: float | None = None
    best_tflops: float | None = None
    best_config: dict | None = None
    default_ms: float | None = None
    default_tflops: float | None = None
    skipped: str | None = None

    def line(self) -> str:
        if self.skipped:
            return f"skipped: {self.skipped}"
        if self.best_ms is None:
            return f"{self.measured} measured, no config passed"
        gain = (f", {self.default_ms / self.best_ms - 1:+.1%} vs default "
                f"{self.default_tflops:.4g} TFLOP/s") if self.default_ms else ""
        return (f"{self.measured} measured; winner {self.best_ms:.4f} ms {self.best_tflops:.4g} "
                f"TFLOP/s {config_text(self.best_config, self.target.spec.family)}{gain}")


class Tuner:
    def __init__(self, opts: TuneOptions, timer=None, probe=None, progress: Progress | None = None):
        self.opts = opts
        self.timer = timer if timer is not None else (load_ref(opts.timer_ref) if opts.timer_ref else None)
        self.probe = probe if probe is not None else (load_ref(opts.probe_ref) if opts.probe_ref else None)
        self.progress = progress
        self.url = opts.url
        self.interrupt = Interrupt()  # tune() installs it as the SIGINT handler
        self._compiled: set[tuple[str, str, str]] = set()  # (uri, kernel hash, config) compiled ahead
        self._studies_left = 1  # of the kernel being tuned, this one included (its compiles are shared)

    # -- checks before any work --
    def device_info(self) -> DeviceInfo:
        if self.probe is not None:
            info = self.probe(self.opts.gpu)
        else:
            from attngen.tuning.timing import probe_cuda

            info = probe_cuda(self.opts.gpu)
        if info is None:
            raise TuneError("attngen tune needs a CUDA GPU, and none is visible")
        why = check_profile(info, self.opts.device)
        if why:
            raise TuneError(why)
        if env.interpreting() and self.timer is None:
            raise TuneError("Triton's interpreter is on (TRITON_INTERPRET=1): its timings mean "
                            "nothing, so attngen tune will not run there")
        return info

    def torch_device(self) -> str:
        return "cpu" if env.interpreting() else f"cuda:{self.opts.gpu}"

    def compile_workers(self) -> int:
        """Processes compiling ahead (tuning/precompile.py): as asked, else the default on a real
        GPU in the process that was started (not a --workers child, not a fake timer or probe)."""
        if self.opts.compile_workers is not None:
            return self.opts.compile_workers
        if (self.timer is not None or self.probe is not None or env.interpreting()
                or self.opts.worker is not None):
            return 0
        from attngen.tuning.precompile import default_workers

        return default_workers()

    @staticmethod
    def _unmeasured(store: dbs.Store, t: Target, kernel_id: int, bucket_id: int) -> list[dict]:
        """The valid configs of the study's space not measured yet on its device class."""
        with store.session() as s:
            seen = set(dbs.where_measured_configs(s, kernel_id, t.device_class, bucket_id))
        return [c for c in valid_space(t.spec, t.space).configs() if schema.config_json(c) not in seen]

    def _precompile(self, store: dbs.Store, t: Target, problem, ids: dict, budget: int,
                    deadline) -> None:
        """Every valid config of the study's space not measured yet and not compiled ahead by
        this process, compiled in parallel processes before the search measures anything -- when
        that is quicker than compiling what the searches of this kernel left in the run will
        measure one by one (budget x studies, at most the space): a 20-trial TPE study of a
        292-config space compiles its 20 configs as it goes."""
        n = self.compile_workers()
        if n <= 0:
            return
        from attngen.tuning.precompile import precompile

        todo = [c for c in self._unmeasured(store, t, ids["kernel"], ids["bucket"])
                if (t.spec.uri, t.kernel_hash, schema.config_json(c)) not in self._compiled]
        if not todo or len(todo) > n * min(len(todo), budget * self._studies_left):
            return
        counts = precompile(problem, todo, self.torch_device(), n, deadline)
        self._compiled.update((t.spec.uri, t.kernel_hash, schema.config_json(c)) for c in todo)
        stopped = f", stopped: {counts['stopped']}" if counts["stopped"] else ""
        self.progress.say(f"  compiled {counts['compiled']} of {counts['configs']} configs ahead in "
                          f"{counts['seconds']:.0f} s with {n} processes ({counts['failed']} failed, "
                          f"left to the trials{stopped})")

    def preflight(self, targets: list[Target]) -> None:
        """Schema and Optuna tables exist, and no study would be silently extended (without
        --resume) -- once, in the process that starts the workers."""
        import optuna

        dbs.Store(self.url, "create").close()
        storage = make_storage(self.url)
        try:
            done = {s.study_name: s.n_trials for s in
                    optuna.get_all_study_summaries(storage, include_best_trial=False)}
            started = [t.study_name for t in targets if done.get(t.study_name, 0) > 0]
            if started and not self.opts.resume:
                raise TuneError(f"{len(started)} of these studies already ran in "
                                f"{schema.redact(self.url)} (e.g. {started[0]}): pass --resume to "
                                f"continue them, or --storage for a fresh database")
            for t in targets:  # created here, so workers never race to create one
                self._study(storage, t, make_sampler("tpe", {}, 1, 0))
        finally:
            storage.remove_session()
            storage.engine.dispose()

    def _study(self, storage, target: Target, sampler):
        import optuna

        study = optuna.create_study(storage=storage, study_name=target.study_name, sampler=sampler,
                                    direction="minimize", load_if_exists=True)
        if not study.user_attrs:
            for k, v in (("uri", target.spec.uri), ("template_hash", target.kernel_hash),
                         ("device_class", target.device_class), ("bucket", target.bucket.key),
                         ("spec", target.spec.as_dict())):
                study.set_user_attr(k, v)
        return study

    def _warm_starts(self, store: dbs.Store, t: Target, dcfg, space_: dict, n: int = 2) -> list[dict]:
        """Optuna's first proposals: the default config, then the winners of the nearest buckets
        already tuned for this kernel and device class (configs move slowly across buckets)."""
        fam = family_of(t.spec.family)
        starts = [dataclasses.asdict(dcfg)]
        with store.session() as s:
            others = [w for w in dbs.where_winners(s, device_class=t.device_class)
                      if w.uri == t.spec.uri and w.template_hash == t.kernel_hash
                      and w.bucket != t.bucket.key]
        others.sort(key=lambda w: (t.bucket.distance(parse_bucket(w.bucket)), w.bucket))
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

    # -- the run --
    def run(self) -> list[TargetReport]:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.ERROR)
        targets = plan(self.opts)
        info = self.device_info()
        if self.opts.worker is None:
            self.preflight(targets)
        store = dbs.Store(self.url, "create")
        storage = make_storage(self.url)
        deadline = time.monotonic() + self.opts.timeout if self.opts.timeout else None
        reports: list[TargetReport] = []
        try:
            with store.session() as s:
                device_id = dbs.find_or_add_device(s, info.as_record(self.opts.device)).id
            for i, t in enumerate(targets):
                self.interrupt.check()
                if deadline is not None and time.monotonic() >= deadline:
                    self.progress.say(f"--timeout reached: {len(targets) - i} studies left "
                                      f"(--resume continues)")
                    break
                self._studies_left = sum(1 for u in targets[i:] if (u.spec.uri, u.kernel_hash)
                                         == (t.spec.uri, t.kernel_hash))
                reports.append(self._tune_one(store, storage, device_id, t, i, len(targets), deadline))
        finally:
            storage.remove_session()
            storage.engine.dispose()
            store.close()
        return reports

    def _tune_one(self, store: dbs.Store, storage, device_id: int, t: Target, index: int,
                  total: int, deadline: float | None) -> TargetReport:
        from attngen.tuning.objective import Objective, problem_for

        family, spec = t.spec.family, t.spec
        space_ = t.space
        budget = min(self.opts.trials, valid_count(spec, space_))
        report = TargetReport(t)
        with store.session() as s:
            kernel = dbs.find_or_add_kernel(s, spec.uri, t.kernel_hash, family, spec.as_dict())
            bucket = dbs.find_or_add_bucket(s, t.bucket.key)
            kernel_id, bucket_id = kernel.id, bucket.id
        try:
            problem = problem_for(t.entry, spec, t.bucket)
            bench = Objective(problem, self.torch_device(), timer=self.timer, seed=self.opts.seed)
        except Exception as exc:  # e.g. the inputs do not fit the GPU
            report.skipped = f"cannot set up the measurement: {type(exc).__name__}: {schema.one_line(exc)}"
            self.progress.finish(t, report)
            return report
        rows = dict(kernel=kernel_id, device=device_id, bucket=bucket_id)

        yardstick = {"ms": None, "tflops": None}  # the default config's time, once measured

        def record(cfg, outcome, is_default=False, optuna_trial=None) -> None:
            with store.session() as s:  # one transaction: the trial and its winner offer
                k, d, b = (s.get(m, rows[n]) for m, n in ((dbs.KernelModel, "kernel"),
                                                          (dbs.DeviceModel, "device"),
                                                          (dbs.ShapeBucketModel, "bucket")))
                row = dbs.add_trial(s, kernel=k, device=d, bucket=b, config=dataclasses.asdict(cfg),
                                    status=outcome.status, shape=problem.as_dict(),
                                    time_ms=outcome.time_ms, tflops=outcome.tflops,
                                    error=outcome.error, study_name=t.study_name,
                                    optuna_trial=optuna_trial, is_default=is_default)
                if outcome.status == "ok":
                    if is_default:
                        yardstick.update(ms=outcome.time_ms, tflops=outcome.tflops)
                    dbs.offer_winner(s, row, t.device_class, yardstick["ms"], yardstick["tflops"])

        def known(cfg):
            from attngen.tuning.objective import Outcome

            with store.session() as s:
                prev = dbs.find_trial_by_config(s, kernel_id, t.device_class, bucket_id,
                                                schema.config_json(dataclasses.asdict(cfg)))
                if prev is None or prev.device_id != device_id:
                    return None
                return Outcome(prev.status, prev.time_ms, prev.tflops, prev.error)

        # 1. the default config: the yardstick of the gain, and Optuna's first trial
        # the GPU's default table even when a fake GPU runs kernels in the interpreter: the
        # winner competes with what the runtime would launch on the device class
        dcfg = default_config(spec, "cuda", t.bucket.seqlen_q)
        default_outcome = None
        with store.session() as s:
            prev = dbs.find_default_trial(s, kernel_id, device_id, bucket_id)
            if prev is not None:
                from attngen.tuning.objective import Outcome

                default_outcome = Outcome(prev.status, prev.time_ms, prev.tflops, prev.error)
        if default_outcome is None:
            default_outcome = known(dcfg)  # measured as an ordinary trial before
        if default_outcome is None:
            default_outcome = bench.run(dcfg)
            record(dcfg, default_outcome, is_default=True)
        if default_outcome.status == "ok":
            yardstick.update(ms=default_outcome.time_ms, tflops=default_outcome.tflops)
            report.default_ms, report.default_tflops = default_outcome.time_ms, default_outcome.tflops

        # 2. the search, after a head start on compiling its configs
        self._precompile(store, t, problem, rows, budget, deadline)
        worker = self.opts.worker[0] if self.opts.worker else 0
        sampler = make_sampler(self.opts.sampler, space_, budget, self.opts.seed + 1000 * worker)
        study = self._study(storage, t, sampler)
        walk = None if self.opts.sampler == "grid" else valid_space(spec, space_)
        repeat_rng = random.Random(self.opts.seed + 1000 * worker)
        for start in self._warm_starts(store, t, dcfg, space_):
            params = start if walk is None else walk.params(start)
            if params is not None:
                study.enqueue_trial(params, skip_if_exists=True)
        if walk is None:
            # the exhaustive grid: every valid config not measured yet, in a seeded order, as
            # enqueued trials (Optuna's GridSampler walks the flat product, mostly invalid
            # configs, and reads every trial of the study back for each proposal)
            todo = self._unmeasured(store, t, kernel_id, bucket_id)
            random.Random(self.opts.seed).shuffle(todo)
            for cfg in todo:
                study.enqueue_trial(cfg)
        cap = 10 * budget + 50  # Optuna trials, counting re-proposals of known configs

        def measured() -> int:
            """Distinct configs of this study's space measured (the default, measured first, may
            lie outside it, e.g. pinned away by --fix: it does not count)."""
            with store.session() as s:
                keys = dbs.where_measured_configs(s, kernel_id, t.device_class, bucket_id, t.study_name)
            return sum(in_space(json.loads(k), space_) for k in keys)

        def best() -> tuple[float, float] | None:
            with store.session() as s:
                w = dbs.find_winner(s, kernel_id, t.device_class, bucket_id)
                return (w.time_ms, w.tflops, json.loads(w.config_json)) if w else None

        self.progress.start(index, total, t, budget, measured())

        def objective(trial) -> float:
            if walk is None:
                values = {n: trial.suggest_categorical(n, list(c)) for n, c in space_.items()}
            else:
                values = walk.suggest(trial)
            cfg = space.config_from_dict(family_of(family).config, values)
            outcome = known(cfg)
            if outcome is not None and walk is not None:
                with store.session() as s:
                    seen = set(dbs.where_measured_configs(s, kernel_id, t.device_class, bucket_id))
                walk.after_repeat(trial.study, values, seen, repeat_rng)
            if outcome is None:
                outcome = bench.run(cfg)
                record(cfg, outcome, optuna_trial=trial.number)
                self.progress.trial(t, measured(), budget, values, outcome, best())
            else:
                trial.set_user_attr("reused", True)
            trial.set_user_attr("status", outcome.status)
            if outcome.error:
                trial.set_user_attr("error", outcome.error[:1000])
            if outcome.status != "ok":
                raise TrialFailed(f"{outcome.status}: {outcome.error}")
            trial.set_user_attr("tflops", outcome.tflops)
            return outcome.time_ms

        trials_seen = [len(study.get_trials(deepcopy=False))]  # (study.trials deep-copies them all)

        def stop(study_, _trial) -> None:
            self.interrupt.check()  # a Ctrl-C Python swallowed during the trial stops the run here
            trials_seen[0] += 1
            if (measured() >= budget or trials_seen[0] >= cap
                    or (deadline is not None and time.monotonic() >= deadline)):
                study_.stop()

        for _ in range(RACE_RETRIES):
            if measured() >= budget or (deadline is not None and time.monotonic() >= deadline):
                break
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                study.optimize(objective, timeout=remaining, callbacks=[stop], catch=(TrialFailed,),
                               n_trials=max(1, cap - trials_seen[0]))
                break
            except ValueError as exc:
                # two workers popped the same enqueued trial (SQLite has no row locks) and the
                # other one told it first: its measurement is in the database; go on
                if "Cannot tell a COMPLETE trial" not in str(exc):
                    raise
        report.measured = measured()
        b = best()
        if b:
            report.best_ms, report.best_tflops, report.best_config = b
        self.progress.finish(t, report)
        return report


class Interrupt:
    """Ctrl-C during a tuning run. As SIGINT's handler (a context manager, main thread only) it
    raises KeyboardInterrupt as Python's own handler does, and also records it: an interrupt that
    lands where Python swallows exceptions (a weakref or garbage-collection callback prints
    "Exception ignored" and carries on) still stops the run at the next trial boundary (check)."""

    def __init__(self):
        self.hit = False
        self._previous = None

    def __enter__(self) -> Interrupt:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def _handler(self, signum, frame) -> None:
        self.hit = True
        raise KeyboardInterrupt

    def check(self) -> None:
        if self.hit:
            raise KeyboardInterrupt


# ------------------------------------------------------------------------------------------------
# Entry points

def tune(opts: TuneOptions, timer=None, probe=None) -> int:
    """What `attngen tune` does; returns the exit code. Raises TuneError / TuningDBError for
    problems the user must fix (the CLI prints them on one line)."""
    if opts.sampler not in SAMPLERS:
        raise TuneError(f"--sampler must be one of {', '.join(SAMPLERS)}")
    if opts.trials < 1:
        raise TuneError("--trials must be >= 1")
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    if opts.workers > 1 and opts.worker is None:
        return _run_workers(opts, timer, probe)
    prefix = f"[w{opts.worker[0]}] " if opts.worker else ""
    live = opts.worker is None and not opts.quiet and sys.stdout.isatty()
    t0 = time.monotonic()
    tuner = Tuner(opts, timer, probe)
    try:
        targets = plan(opts)
        tuner.progress = RichProgress(len(targets)) if live else Progress(prefix, opts.quiet)
        with tuner.interrupt:
            reports = tuner.run()
    except KeyboardInterrupt:
        print(f"{prefix}interrupted: every finished trial is in {schema.redact(opts.url)}; "
              f"`attngen tune ... --resume` continues", file=sys.stderr, flush=True)
        if opts.worker is None:  # the file alone is the database, interrupted or not
            dbs.Store(opts.url, "write").pack()
        return 130
    finally:
        if tuner.progress:
            tuner.progress.close()
    if opts.worker is None:
        dbs.Store(opts.url, "write").pack()
        _summary(reports, time.monotonic() - t0, opts)
    return 0


def _summary(reports: list[TargetReport], seconds: float, opts: TuneOptions) -> None:
    if opts.quiet:
        return
    print(f"tuned {len(reports)} studies in {seconds:.0f} s into {schema.redact(opts.url)}")
    for r in reports:
        print(f"  {r.target.label}: {r.line()}")


def _child_argv(opts: TuneOptions, index: int, gpu: int) -> list[str]:
    argv = [sys.executable, "-m", "attngen.cli", "tune", "--device", opts.device,
            "--trials", str(opts.trials), "--storage", opts.url, "--resume",
            "--sampler", opts.sampler, "--seed", str(opts.seed),
            "--worker", f"{index}/{opts.workers}", "--gpu", str(gpu)]
    for s in opts.specs:
        argv += ["--spec", str(s)]
    if opts.shapes:
        argv += ["--shapes", ",".join(b.key for b in opts.shapes)]
    if opts.timeout:
        argv += ["--timeout", str(opts.timeout)]
    if len(opts.families) == 1:
        argv += ["--family", opts.families[0]]
    if opts.kernels:
        argv += ["--kernels", opts.kernels]
    for name, value in opts.fixed.items():
        argv += ["--fix", f"{name}={value}"]
    if opts.timer_ref:
        argv += ["--timer", opts.timer_ref]
    if opts.probe_ref:
        argv += ["--probe", opts.probe_ref]
    return argv


def _run_workers(opts: TuneOptions, timer, probe) -> int:
    """N processes on one storage; each takes GPU i mod (GPUs there are)."""
    if (timer is not None and opts.timer_ref is None) or (probe is not None and opts.probe_ref is None):
        raise TuneError("--workers starts new processes: pass the timer and probe as --timer / "
                        "--probe references, not as Python objects")
    t0 = time.monotonic()
    tuner = Tuner(opts, timer, probe, Progress(quiet=opts.quiet))
    targets = plan(opts)
    tuner.device_info()
    tuner.preflight(targets)
    if tuner.probe is not None or env.interpreting():
        gpus = 1
    else:
        from attngen.tuning.timing import cuda_device_count

        gpus = max(1, cuda_device_count())
    if not opts.quiet:
        print(f"{opts.workers} workers on {gpus} GPU(s), {len(targets)} studies, storage "
              f"{schema.redact(opts.url)}" + ("; workers share GPUs, so their timings disturb "
                                              "each other" if opts.workers > gpus else ""), flush=True)
    procs = [subprocess.Popen(_child_argv(opts, i, i % gpus)) for i in range(opts.workers)]
    try:
        codes = [p.wait() for p in procs]
    except KeyboardInterrupt:
        codes = [p.wait() for p in procs]  # they got the same Ctrl-C; let them record and exit
        print(f"interrupted: every finished trial is in {schema.redact(opts.url)}; --resume "
              f"continues", file=sys.stderr)
        dbs.Store(opts.url, "write").pack()
        return 130
    dbs.Store(opts.url, "write").pack()
    if not opts.quiet:
        print(f"workers exited with {codes} after {time.monotonic() - t0:.0f} s")
        with dbs.Store(opts.url, "read") as st, st.session() as s:
            uris = {t.spec.uri for t in targets}
            for w in dbs.where_winners(s, device_class=opts.device):
                if w.uri in uris:
                    gain = f" ({w.gain:+.1%} vs default)" if w.gain is not None else ""
                    print(f"  {w.uri} {w.bucket}: {w.time_ms:.4f} ms {config_text(w.config, w.family)}{gain}")
    return max(codes) if codes else 0


# ------------------------------------------------------------------------------------------------
# Is the search worth it? Optuna against the exhaustive grid over the same space.

def replay(table: dict[str, float | None], space_: dict[str, tuple], budget: int, seed: int,
           sampler: str = "tpe", first: dict | None = None,
           spec: KernelSpec | None = None) -> tuple[float, int]:
    """Run a sampler against a table of measured times (config_json -> ms, None = failed; a config
    not in the table counts as invalid) until `budget` distinct table configs were seen; returns
    (best ms found, distinct configs seen). `first` is enqueued first (the default config). With
    `spec`, the sampler proposes as in `attngen tune` (the ValidSpace walk of sampling.py);
    without, every field independently over the flat space."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    study = optuna.create_study(sampler=make_sampler(sampler, space_, budget, seed), direction="minimize")
    walk = valid_space(spec, space_) if spec is not None else None
    if first is not None:
        params = first if walk is None else walk.params(first)
        if params is not None:
            study.enqueue_trial(params)
    seen: dict[str, float | None] = {}
    rng = random.Random(seed)

    def objective(trial):
        if walk is None:
            values = {n: trial.suggest_categorical(n, list(c)) for n, c in space_.items()}
        else:
            values = walk.suggest(trial)
        key = schema.config_json(values)
        if key not in table:
            raise TrialFailed("invalid")
        if key in seen and walk is not None:
            walk.after_repeat(trial.study, values, set(seen), rng)
        seen[key] = table[key]
        if table[key] is None:
            raise TrialFailed("failed")
        return table[key]

    def stop(study_, t):
        if len(seen) >= budget or t.number + 1 >= 20 * budget + 100:
            study_.stop()

    study.optimize(objective, callbacks=[stop], catch=(TrialFailed,), n_trials=20 * budget + 100)
    ok = [v for v in seen.values() if v is not None]
    return (min(ok) if ok else math.inf), len(seen)


def _study_space(url: str, study_name: str | None) -> dict[str, tuple] | None:
    """The parameter space an Optuna study sampled from (its trials' distributions)."""
    import optuna

    if not study_name:
        return None
    try:
        study = optuna.load_study(study_name=study_name, storage=make_storage(schema.to_url(url)))
    except (KeyError, TuneError):
        return None
    for t in study.get_trials(deepcopy=False):
        if t.distributions:
            return {n: tuple(d.choices) for n, d in t.distributions.items()}
    return None


def compare(exhaustive: str, search: str, budget_frac: float = 0.30, goal_gap: float = 0.03,
            seeds: int = 20) -> dict:
    """For each (kernel, device class, bucket) tuned in both databases: the exhaustive best, the
    searched winner's time (live, and as the exhaustive run measured that config), the fraction of
    the measured configs the search needed; plus replays of TPE, and of random search for scale,
    against the exhaustive table over `seeds` seeds with the same budget. The space is the one the
    exhaustive study sampled (its Optuna distributions, --fix included)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    with dbs.Store(exhaustive, "read") as a, a.session() as s:
        ex_trials = dbs.where_trials(s)
    with dbs.Store(search, "read") as b, b.session() as s:
        se_trials = dbs.where_trials(s)
        se_winners = dbs.where_winners(s)

    def key_of(t) -> tuple:
        return (t["uri"], t["template_hash"], t["device_class"], t["bucket"])

    rows = []
    for w in se_winners:
        key = (w.uri, w.template_hash, w.device_class, w.bucket)
        mine = [t for t in ex_trials if key_of(t) == key and t["status"] != "invalid"]
        if not mine:
            continue
        studies: dict[str | None, int] = {}
        for t in mine:
            studies[t["study_name"]] = studies.get(t["study_name"], 0) + 1
        ex_study = max(studies, key=lambda n: (studies[n], n or ""))
        tab: dict[str, float | None] = {}
        for t in mine:
            if t["study_name"] != ex_study:
                continue
            ck = schema.config_json(t["config"])
            if t["status"] == "ok":
                tab[ck] = min(t["time_ms"], tab.get(ck) or math.inf)
            else:
                tab.setdefault(ck, None)
        spec = KernelSpec(**mine[0]["spec"])
        space_ = _study_space(exhaustive, ex_study) or space_for(spec)

        # the default config is measured under the study's name even when it lies outside the
        # study's space (e.g. pinned away by --fix): not part of the exhaustive grid
        tab = {k: v for k, v in tab.items() if in_space(json.loads(k), space_)}
        ok = [v for v in tab.values() if v is not None]
        if not ok:
            continue
        best = min(ok)
        # the search's pick within the space (its database winner may be the default measured
        # outside it, as in the exhaustive study), and the space's configs it measured
        se_mine = [t for t in se_trials if key_of(t) == key and t["status"] != "invalid"
                   and in_space(t["config"], space_)]
        se_measured = len({schema.config_json(t["config"]) for t in se_mine})
        se_studies = sorted({t["study_name"] or "" for t in se_mine})
        se_ok = [t for t in se_mine if t["status"] == "ok"]
        se_best = min(se_ok, key=lambda t: t["time_ms"]) if se_ok else None
        picked = tab.get(schema.config_json(se_best["config"])) if se_best else None
        budget = max(1, int(budget_frac * len(tab)))
        valid = valid_count(spec, space_)
        dflt = dataclasses.asdict(default_config(spec, "cuda", schema.bucket_fields(w.bucket)[0]))
        dflt = dflt if schema.config_json(dflt) in tab else None
        rep = {}
        for name, smp, first in (("tpe_with_default", "tpe", dflt), ("tpe_from_scratch", "tpe", None),
                                 ("random_from_scratch", "random", None)):
            gaps = [replay(tab, space_, budget, sd, smp, first, spec)[0] / best - 1
                    for sd in range(seeds)]
            rep[name] = {"median_gap": statistics.median(gaps), "worst_gap": max(gaps),
                         "share_within_goal": sum(g <= goal_gap for g in gaps) / len(gaps)}
        gap = picked / best - 1 if picked else None
        frac = se_measured / len(tab)
        rows.append({
            "uri": w.uri, "bucket": w.bucket, "device_class": w.device_class,
            "exhaustive_study": ex_study, "search_studies": se_studies,
            "same_space": se_studies == [ex_study or ""],
            "space": {k: list(v) for k, v in space_.items()},
            "space_valid": valid, "exhaustive_complete": len(tab) >= valid,
            "exhaustive_measured": len(tab), "exhaustive_best_ms": best,
            "search_measured": se_measured, "search_fraction": frac,
            "search_winner": se_best["config"] if se_best else None,
            "search_winner_ms_live": se_best["time_ms"] if se_best else None,
            "search_winner_ms_in_exhaustive_run": picked,
            "database_winner": w.config, "database_winner_in_space": in_space(w.config, space_),
            "gap": gap, "gap_live": se_best["time_ms"] / best - 1 if se_best else None,
            "meets_goal": (gap is not None and gap <= goal_gap and frac <= budget_frac + 1e-9
                           and len(tab) >= valid),
            "replay_budget": budget, "replay_seeds": seeds, "replay": rep,
        })
    return {"goal": {"gap": goal_gap, "fraction": budget_frac},
            "exhaustive": schema.redact(schema.to_url(exhaustive)),
            "search": schema.redact(schema.to_url(search)), "rows": rows,
            "all_meet_goal": bool(rows) and all(r["meets_goal"] for r in rows)}
