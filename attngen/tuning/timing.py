"""Timing on the GPU: the probe of what measures (DeviceInfo), and the timer the tuner uses by
default: the median of triton.testing.do_bench over a step that rotates through input sets.

A timer is any callable timer(step, config, problem) -> milliseconds; the tuner takes one as a
parameter (tests pass a fake one that never touches a GPU).
"""

from __future__ import annotations

import math
import time

from attngen.devices import DeviceInfo, busy_gpu

WARMUP_MS = 25
REP_MS = 100
L2_FACTOR = 3  # rotate through at least this many times the L2 cache's bytes of input sets
MAX_SETS = 16


def probe_cuda(index: int = 0) -> DeviceInfo | None:
    """The CUDA device `index` and the software around it; None without a CUDA GPU."""
    import torch
    import triton

    if not torch.cuda.is_available():
        return None
    return DeviceInfo(gpu_name=torch.cuda.get_device_name(index),
                      capability=tuple(torch.cuda.get_device_capability(index)),
                      driver=_driver_version(), cuda_version=str(torch.version.cuda),
                      torch_version=torch.__version__, triton_version=triton.__version__,
                      index=index)


def cuda_device_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _driver_version() -> str:
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        try:
            v = pynvml.nvmlSystemGetDriverVersion()
            return v.decode() if isinstance(v, bytes) else str(v)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVML: the CUDA driver API version (e.g. 12080) is the next best thing
        try:
            import torch

            v = torch._C._cuda_getDriverVersion()
            return f"cuda-driver-api {v // 1000}.{(v % 1000) // 10}"
        except Exception:
            return "unknown"


def l2_bytes(device) -> int:
    import torch

    if getattr(device, "type", str(device)).startswith("cuda"):
        return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 << 20))
    return 0


def rotation_sets(set_bytes: int, l2: int) -> int:
    """How many input sets a step rotates through so that what one launch reads was evicted from
    the L2 by the launches since its set was last used: sets x bytes >= L2_FACTOR x L2."""
    if l2 <= 0 or set_bytes <= 0:
        return 1
    return max(1, min(MAX_SETS, math.ceil(L2_FACTOR * l2 / set_bytes)))


IDLE_S = 1.0  # a pause since the last timing after which the GPU is warmed up first (busy_gpu)
WARM_MS = 200.0
_last_timed = [float("-inf")]


def do_bench_median(step, config=None, problem=None) -> float:
    """Median milliseconds of `step` (which moves to the next input set on every call). After a
    pause of more than IDLE_S seconds since the last timing (compiling configs ahead, a config
    compiled by its trial, a new study's inputs) the GPU is kept busy for WARM_MS first, as the
    benches do before a row: a GPU left idle clocks down (devices.busy_gpu). (The slow first fp8
    study that prompted it, 2026-12-04, turned out to be timing Python, fixed in the objective.)"""
    import torch
    import triton

    if time.monotonic() - _last_timed[0] > IDLE_S:
        busy_gpu(torch.cuda.current_device(), WARM_MS)
    ms = float(triton.testing.do_bench(step, warmup=WARMUP_MS, rep=REP_MS, return_mode="median"))
    _last_timed[0] = time.monotonic()
    return ms
