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

A config that loses the GPU (objective.DeviceLost: an illegal address, or a first run that has
not finished after objective.HANG_S seconds) is recorded as a failed trial and ends the run with
exit status 1 (through os._exit when a kernel still runs); `--resume` goes on without it.

Ctrl-C: the trial in flight is not recorded (its transaction rolls back), everything before it is;
`--resume` continues the same studies. `--workers N` starts N processes on one storage (one per GPU,
or sharing the GPUs there are), each running the same studies through Optuna's RDB storage.

The pieces: targets.py (options, the studies to run, their search spaces), study.py (one study),
progress.py (what the user sees), workers.py (--workers processes), compare.py (`db compare`);
this module runs the studies of one process and is `attngen tune`'s entry point.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

from attngen import env
from attngen.db import schema
from attngen.db import store as dbs
from attngen import devices
from attngen.devices import DeviceInfo, check_profile
from attngen.tuning import workers
from attngen.tuning.progress import Progress, RichProgress, TargetReport, summary
from attngen.tuning.sampling import make_sampler
from attngen.tuning.study import Study, make_storage, open_study, unmeasured
from attngen.tuning.targets import SAMPLERS, NoDevice, Target, TuneError, TuneOptions, load_ref, plan


class Tuner:
    """One process's tuning run: checks the device, prepares the studies (preflight), runs each
    planned study (study.Study) and compiles configs ahead for them."""

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
    def _probe(self) -> DeviceInfo:
        if self.probe is not None:
            info = self.probe(self.opts.gpu)
        else:
            from attngen.tuning.timing import probe_cuda

            info = probe_cuda(self.opts.gpu)
        if info is None:
            raise NoDevice("attngen tune needs a CUDA GPU, and none is visible")
        return info

    def resolve_device(self) -> None:
        """opts.device becomes a class name: `auto` the class of the GPU tuning runs on (its
        profile's, or sm<cc> of a newer GPU no profile holds: devices.own_class), an alias (sm90,
        sm80) its class (h100, a100)."""
        try:
            name = devices.canonical(self.opts.device)
        except ValueError as exc:
            raise TuneError(str(exc)) from None
        if name == devices.AUTO:
            info = self._probe()
            name = devices.own_class(*info.capability, info.gpu_name)
            if name is None:
                raise NoDevice(f"GPU {info.index}: {devices.no_class_message(info.gpu_name, info.capability)}")
        self.opts.device = name

    def device_info(self) -> DeviceInfo:
        info = self._probe()
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

    def precompile_ahead(self, store: dbs.Store, t: Target, problem, ids: dict, budget: int,
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

        todo = [c for c in unmeasured(store, t, ids["kernel"], ids["bucket"])
                if (t.spec.uri, t.kernel_hash, schema.config_json(c)) not in self._compiled]
        if not todo or len(todo) > n * min(len(todo), budget * self._studies_left):
            return
        counts = precompile(t.spec, problem, todo, self.torch_device(), n, deadline)
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
                open_study(storage, t, make_sampler("tpe", {}, 1, 0))
        finally:
            storage.remove_session()
            storage.engine.dispose()

    # -- the run --
    def run(self) -> list[TargetReport]:
        """Every planned study in order, until the deadline; one report each."""
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
                reports.append(Study(self, store, storage, device_id, t, deadline).run(i, len(targets)))
        finally:
            storage.remove_session()
            storage.engine.dispose()
            store.close()
        return reports


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
    Tuner(opts, timer, probe).resolve_device()
    if opts.workers > 1 and opts.worker is None:
        if (timer is not None and opts.timer_ref is None) or (probe is not None and opts.probe_ref is None):
            raise TuneError("--workers starts new processes: pass the timer and probe as --timer / "
                            "--probe references, not as Python objects")
        return workers.run_workers(opts, Tuner(opts, timer, probe, Progress(quiet=opts.quiet)))
    prefix = f"[w{opts.worker[0]}] " if opts.worker else ""
    live = opts.worker is None and not opts.quiet and sys.stdout.isatty()
    t0 = time.monotonic()
    tuner = Tuner(opts, timer, probe)
    from attngen.tuning.objective import DeviceLost

    def pack() -> None:  # the file alone is the database, however the run ended
        if opts.worker is None:
            dbs.Store(opts.url, "write").pack()

    lost = None
    try:
        targets = plan(opts)
        tuner.progress = RichProgress(len(targets)) if live else Progress(prefix, opts.quiet)
        with tuner.interrupt:
            reports = tuner.run()
    except DeviceLost as exc:
        lost = exc
    except KeyboardInterrupt:
        print(f"{prefix}interrupted: every finished trial is in {schema.redact(opts.url)}; "
              f"`attngen tune ... --resume` continues", file=sys.stderr, flush=True)
        pack()
        return 130
    finally:
        if tuner.progress:
            tuner.progress.close()
    pack()
    if lost is not None:
        print(f"{prefix}attngen tune: {lost}", file=sys.stderr, flush=True)
        if lost.hung:  # a kernel still runs: CUDA's teardown at exit would wait for it forever
            sys.stdout.flush()
            os._exit(1)
        return 1
    if opts.worker is None:
        summary(reports, time.monotonic() - t0, opts)
    return 0
