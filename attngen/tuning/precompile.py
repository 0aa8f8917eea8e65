"""Compiling a study's configs in parallel before it measures them.

On the H200 a forward config takes 2-3 s to compile and 0.3 s to check and time, so a study
measuring configs one by one spends nine tenths of its time in Triton's compiler on one CPU core.
precompile() hands the configs to worker processes (spawned, each with its own CUDA context on
the same GPU) that launch every config once on one input set of the study's own problem: same
shapes, strides and dtypes, so the same specialization, and Triton's on-disk cache then holds the
binary the measuring process loads in milliseconds.

It is a head start, nothing more: a config that fails here (compile error, out of resources) is
left for the measuring process, which records the failure as usual; a worker that dies, a
deadline or Ctrl-C stops the head start and the study goes on compiling as before. Nothing is
timed while it runs (it finishes before the study measures anything).
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import time

_WORKER = {}  # in a worker process: "objective"


def default_workers() -> int:
    """Compile processes for `attngen tune` on a GPU machine: the cores but two, at most 8."""
    return max(0, min(8, (os.cpu_count() or 1) - 2))


def _init(spec, problem, device: str) -> None:
    from attngen.tuning.objective import Objective

    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    _WORKER["objective"] = Objective(spec, problem, device, light=True)


def _compile(values: dict) -> str | None:
    import torch

    obj = _WORKER["objective"]
    cfg = obj.family.config(**values)
    cuda = obj.device.type == "cuda"
    try:
        obj.launch(cfg, obj.sets[0])
        if cuda:
            torch.cuda.synchronize(obj.device)
    except Exception as exc:  # left for the measuring process to record
        try:
            if cuda:
                torch.cuda.synchronize(obj.device)
        except Exception:  # the context is lost: no further launch in this worker is sound
            os._exit(3)
        return f"{type(exc).__name__}: {str(exc)[:300]}"
    return None


def precompile(spec, problem, configs: list[dict], device: str, workers: int,
               deadline: float | None = None) -> dict:
    """Launch each config (field -> value dicts) of kernel `spec` on `problem` once in `workers` processes. Returns counts:
    {"configs", "compiled", "failed", "seconds", "stopped"} (stopped: why it ended early, or
    None)."""
    t0 = time.monotonic()
    counts = {"configs": len(configs), "compiled": 0, "failed": 0, "seconds": 0.0, "stopped": None}
    if not configs or workers <= 0:
        return counts
    ctx = multiprocessing.get_context("spawn")
    pool = cf.ProcessPoolExecutor(max_workers=min(workers, len(configs)), mp_context=ctx,
                                  initializer=_init, initargs=(spec, problem, device))
    futures = [pool.submit(_compile, c) for c in configs]
    try:
        for fut in cf.as_completed(futures, timeout=None if deadline is None
                                   else max(0.0, deadline - time.monotonic())):
            counts["failed" if fut.result() else "compiled"] += 1
    except cf.TimeoutError:
        counts["stopped"] = "the deadline"
    except cf.process.BrokenProcessPool:
        counts["stopped"] = "a compile process died"
    except KeyboardInterrupt:
        counts["stopped"] = "interrupted"
        raise
    finally:
        for fut in futures:
            fut.cancel()
        pool.shutdown(wait=True, cancel_futures=True)  # no launch of it overlaps a measurement
        counts["seconds"] = round(time.monotonic() - t0, 1)
    return counts
