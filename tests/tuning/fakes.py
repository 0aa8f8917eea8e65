"""Stand-ins for the GPU in CPU tests of `attngen tune`: a device probe that reports an H200 (or an
A100), and a timer whose milliseconds are a fixed function of the config, so a search has a known
best. Kernels still run (through Triton's interpreter) and are checked against the reference; only
the timing is fake. Passed to the CLI as `--timer tests/tuning/fakes.py:timer` (also to --workers
children) or to attngen.tuning.tuner.tune() as objects."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from attngen.devices import DeviceInfo

# the fake landscape's best forward config
BEST_FWD = {"block_m": 128, "block_n": 128, "num_warps": 8, "num_stages": 2}


def h200(index: int = 0) -> DeviceInfo:
    return DeviceInfo("NVIDIA H200 (fake)", (9, 0), "570.00", "12.8", "2.11.0", "3.6.0", index)


def a100(index: int = 0) -> DeviceInfo:
    return DeviceInfo("NVIDIA A100 (fake)", (8, 0), "570.00", "12.8", "2.11.0", "3.6.0", index)


def l40s(index: int = 0) -> DeviceInfo:
    return DeviceInfo("NVIDIA L40S (fake)", (8, 9), "570.00", "12.8", "2.11.0", "3.6.0", index)


def t4(index: int = 0) -> DeviceInfo:
    return DeviceInfo("Tesla T4 (fake)", (7, 5), "570.00", "12.8", "2.11.0", "3.6.0", index)


def b200(index: int = 0) -> DeviceInfo:
    return DeviceInfo("NVIDIA B200 (fake)", (10, 0), "570.00", "12.8", "2.11.0", "3.6.0", index)


def fake_ms(config: dict) -> float:
    """1.0 ms at BEST_FWD, more the further a config is from it; backward configs: by their
    dK/dV part. Deterministic."""
    ms = 1.0
    for k in ("block_m", "block_n", "num_warps", "num_stages"):
        a, b = config[k], BEST_FWD[k]
        ms += 0.05 * abs(a.bit_length() - b.bit_length()) if k != "num_stages" else 0.03 * abs(a - b)
    if config.get("atomic_dq"):
        ms += 0.01
    return ms


class FakeOutOfResources(RuntimeError):
    pass


_HELD = [0]  # the timer's calls in this process (ATTNGEN_FAKE_TIMER_HOLD)


def timer(step, config, problem) -> float:
    """Runs the step once (so a broken launch still fails) and returns fake_ms(config); block_n 32
    with 4 stages "runs out of shared memory", as a compile failure the filter did not catch would.
    With ATTNGEN_FAKE_TIMER_SLEEP=seconds it also sleeps, failing or not. With
    ATTNGEN_FAKE_TIMER_HOLD=<file>:<n> its n-th call creates <file> and then sleeps until a signal
    ends the run (the Ctrl-C test: the interrupt lands inside a trial, every time)."""
    step()
    hold = os.environ.get("ATTNGEN_FAKE_TIMER_HOLD")
    if hold:
        path, _, n = hold.rpartition(":")
        _HELD[0] += 1
        if _HELD[0] == int(n):
            open(path, "w").close()
            time.sleep(120)  # the test sends SIGINT now
    delay = float(os.environ.get("ATTNGEN_FAKE_TIMER_SLEEP", "0"))
    if delay:  # before the failure too: every measured config takes this long, failed or not
        time.sleep(delay)
    if config.get("block_n") == 32 and config.get("num_stages") == 4:
        raise FakeOutOfResources("out of resource: shared memory (fake)")
    return fake_ms(config)


_CALLS = [0]


class _SigintOnDelete:
    """Sends this process SIGINT from inside __del__: the KeyboardInterrupt its handler raises
    there is one Python swallows ("Exception ignored in ..."), as when Ctrl-C lands in a garbage
    collection callback."""

    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # the handler runs here, still inside __del__


def timer_swallowed_interrupt(step, config, problem) -> float:
    """timer() whose third call is hit by a Ctrl-C that Python swallows."""
    _CALLS[0] += 1
    if _CALLS[0] == 3:
        obj = _SigintOnDelete()
        del obj
    return timer(step, config, problem)


def timer_loses_gpu(step, config, problem) -> float:
    """timer() whose second call in the folder ATTNGEN_FAKE_LOSE loses the GPU (DeviceLost, as an
    illegal address would; hung when ATTNGEN_FAKE_LOSE_HUNG is set, as a kernel that never ends
    would), and loses it again should that config ever be measured a second time."""
    from attngen.tuning.objective import DeviceLost

    folder = Path(os.environ["ATTNGEN_FAKE_LOSE"])
    lost, calls = folder / "lost.json", folder / "calls"
    key = json.dumps(config, sort_keys=True)
    if lost.exists() and lost.read_text() == key:
        raise DeviceLost("fake: the config that lost the GPU ran again")
    n = int(calls.read_text()) + 1 if calls.exists() else 1
    calls.write_text(str(n))
    if n == 2:
        lost.write_text(key)
        raise DeviceLost("fake: an illegal memory access", hung=bool(os.environ.get("ATTNGEN_FAKE_LOSE_HUNG")))
    return timer(step, config, problem)
