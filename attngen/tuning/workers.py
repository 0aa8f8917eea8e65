"""`attngen tune --workers N`: N processes on one storage, each running the same studies through
Optuna's RDB storage (one per GPU, or sharing the GPUs there are)."""

from __future__ import annotations

import subprocess
import sys
import time

from attngen import env
from attngen.db import schema
from attngen.db import store as dbs
from attngen.tuning.progress import config_text
from attngen.tuning.targets import TuneOptions, plan


def child_argv(opts: TuneOptions, index: int, gpu: int) -> list[str]:
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


def run_workers(opts: TuneOptions, tuner) -> int:
    """N processes on one storage; each takes GPU i mod (GPUs there are). `tuner` (a
    tuner.Tuner of this process) checks the device and prepares the studies first."""
    t0 = time.monotonic()
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
    procs = [subprocess.Popen(child_argv(opts, i, i % gpus)) for i in range(opts.workers)]
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

