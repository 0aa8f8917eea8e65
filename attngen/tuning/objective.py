"""One kernel, one launch config, one shape: launch it, check its output against a reference, time
it. The tuner's objective.

Nothing here knows a family: inputs, launches, the reference, the accuracy check and the throughput
(TFLOP/s, or GB/s for decode) come from the family's tuning hooks (Family.hooks: attngen/families/
<name>.py, or a sibling such as fwd_tuning.py; TuningHooks), so a new family tunes without an edit here.

A config's fate, recorded by the tuner as the trial's status:
  invalid  the family's validity filter rejects it: never compiled
  failed   compiling or launching raised (out of shared memory or registers, a compile error), or
           its output broke the accuracy rule: the error text is kept, it never wins; also a
           config that lost the GPU (DeviceLost: an illegal address, or a first run still not
           finished after HANG_S seconds, a kernel that never ends), recorded before the run stops
  ok       checked, then timed: median ms of the timer over a step that rotates input sets
The check comes first, on outputs poisoned with NaN beforehand (a config that writes nothing fails);
the accuracy rule is attngen.testing's flash-attn rule against a float64 reference (forward factor 2,
backward factor 3, as the GPU tests), and the LSE must match the float64 one.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from dataclasses import dataclass
from typing import Callable

import torch

from attngen import env
from attngen.families import family as family_of
from attngen.kernels.common import MaskArgs, mask_kind
from attngen.runtime import loader
from attngen.spec import KernelSpec, SpecEntry
from attngen.problem import Problem
from attngen.tuning import timing
from attngen.buckets import ShapeBucket


Timer = Callable[..., float]  # timer(step, config: dict, problem: attngen.problem.Problem) -> ms


class DeviceLost(RuntimeError):
    """The GPU failed in a way that poisons the process (illegal address, launch failure, a kernel
    that never ends): no further trial can be trusted. The tuner records the config as failed and
    stops; `attngen tune --resume` continues in a fresh process without it. `hung`: a kernel is
    still running, so the process must not wait for the GPU on its way out."""

    def __init__(self, message: str, hung: bool = False):
        super().__init__(message)
        self.hung = hung


# seconds a config's first (checked) run may take on the GPU (its compile comes before) before it
# is taken for a kernel that never ends (a deadlocked producer / consumer ring, 2026-12-04): far
# above any real run (a backward of the largest default bucket, S16k and 128 heads, is about
# 4.4e13 flops: about a second at 50 TFLOP/s)
HANG_S = 120.0


def wait_for_gpu(done: Callable[[], bool], seconds: float, what: str) -> None:
    """Poll `done` (a CUDA event's query) until it is true; DeviceLost(hung=True) after `seconds`."""
    deadline = time.monotonic() + seconds
    while not done():
        if time.monotonic() > deadline:
            raise DeviceLost(f"{what} did not finish within {seconds:g} s: taken for a kernel that never ends "
                             f"(a deadlock); the GPU cannot be recovered in this process. The config is "
                             f"recorded as failed; continue with `attngen tune --resume`", hung=True)
        time.sleep(0.0005)


def mask_args(problem: Problem) -> MaskArgs:
    """The launchers' mask arguments of a problem."""
    mask, wl, wr = mask_kind(problem.causal, problem.window)
    return MaskArgs(scale=problem.softmax_scale, softcap=problem.softcap, window_left=wl, window_right=wr,
                    align_top_left=problem.top_left)


def problem_for(entry: SpecEntry, spec: KernelSpec, bucket: ShapeBucket) -> Problem:
    """The shape measured for `bucket`: Sq, Sk as the bucket says; batch x heads = the bucket's
    B*H class, with the entry's query-head count where it divides it (else fewer heads, a multiple
    of the GQA ratio); the entry's window, softcap, scale and causal alignment. Dense: batch x
    heads_q; varlen: `batch` packed documents of seqlen_q / seqlen_k tokens each (the bucket's
    longest document)."""
    if bucket.decode != (spec.family == "decode"):
        raise ValueError(f"{bucket.key}: the decode bucket (Sq = 1) belongs to the decode family, and "
                         f"that family tunes on it only")
    gqa = spec.gqa_ratio
    bh = bucket.batch_heads
    want = entry.num_q_heads or 16 * gqa
    heads = max(gqa, (min(want, bh) // gqa) * gqa)
    while heads > gqa and bh % heads:
        heads -= gqa
    batch = max(1, bh // heads)
    inner = entry.document_mask if entry.mask == "document" else entry.mask
    if inner == "sliding_window":
        causal, window = True, (entry.window - 1, 0)
    else:
        causal, window = inner == "causal", (-1, -1)
    p = Problem(batch=batch, heads_q=heads, heads_kv=heads // gqa, seqlen_q=bucket.seqlen_q,
                seqlen_k=bucket.seqlen_k, head_dim_qk=spec.head_dim_qk, head_dim_v=spec.head_dim_v,
                # fp8 kernels take bf16 inputs and quantize them inside the measured launch
                dtype="bf16" if spec.dtype == "fp8_e4m3" else spec.dtype, causal=causal, window=window,
                softcap=entry.softcap,
                scale=entry.softmax_scale or 1.0 / math.sqrt(spec.head_dim_qk),
                top_left=entry.causal_alignment == "top_left",
                layout="packed" if spec.varlen else "bshd" if spec.family == "decode" else "bhsd")
    mask = mask_kind(causal, window)[0]
    if mask != spec.mask or (entry.softcap > 0) != spec.softcap:
        raise ValueError(f"{spec.uri}: entry {entry.name!r} gives mask {mask!r}, softcap "
                         f"{entry.softcap}; the kernel is {spec.mask!r}, softcap={spec.softcap}")
    return p


@dataclass(frozen=True)
class Outcome:
    status: str  # "ok" | "failed" | "invalid"
    time_ms: float | None = None
    tflops: float | None = None
    error: str | None = None


def _error_text(exc: BaseException, limit: int = 2000) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) <= limit else text[:limit - 3] + "..."


class Objective:
    """Inputs, reference and launches of one kernel for one Problem on one device; `run(cfg)` is
    one trial. Everything family-specific comes from the family's tuning hooks (Family.hooks:
    inputs, launch, reference, check, throughput): nothing here branches on a family name."""

    def __init__(self, spec: KernelSpec, problem: Problem, device: str | torch.device = "cuda",
                 timer: Timer | None = None, seed: int = 0, light: bool = False):
        """light: one input set and no reference (tuning/precompile.py launches, never checks)."""
        self.problem = problem
        self.spec = spec
        self.family = family_of(spec.family)
        self.hooks = self.family.tuning_hooks()
        self.device = torch.device(device)
        self.timer = timer or timing.do_bench_median
        self.dtype = problem.torch_dtype
        self.kind = "cpu" if env.interpreting() else self.device.type
        if env.interpreting():
            from attngen.interp import patch_interpreter

            patch_interpreter()
        self.load = loader.load  # the hooks load other modules of the kernel through it
        self.mod = loader.load(self.spec)
        self.mask = mask_args(problem)
        first = self.hooks.inputs(self, seed)
        n = 1 if light else timing.rotation_sets(sum(t.numel() * t.element_size() for t in first.values()),
                                                 timing.l2_bytes(self.device))
        self.sets = [first] + [self.hooks.inputs(self, seed + i) for i in range(1, n)]
        self.ref = None if light else self.hooks.reference(self, first)

    @property
    def unit(self) -> str:
        """What Outcome.tflops measures for this family: "TFLOP/s", or "GB/s" (decode)."""
        return self.hooks.unit

    def throughput(self, ms: float) -> float:
        return self.hooks.throughput(self, ms)

    def launch(self, cfg, t: dict) -> None:
        self.hooks.launch(self, cfg, t)

    def check(self, t: dict) -> str | None:
        """None when the kernel's outputs in `t` pass the accuracy rule, else why not."""
        try:
            self.hooks.check(self, f"{self.spec.uri} {self.problem.seqlen_q}x{self.problem.seqlen_k}", t, self.ref)
        except AssertionError as exc:
            return str(exc).strip().splitlines()[0][:1000]
        return None

    # ---- one trial --------------------------------------------------------------------------
    def run(self, cfg) -> Outcome:
        why = self.family.check(self.spec, cfg)
        if why:
            return Outcome("invalid", error=why)
        first = self.sets[0]
        try:
            for n in self.hooks.outputs:
                first[n].fill_(float("nan"))
            self.launch(cfg, first)
            self._finish_first_run(cfg)
            wrong = self.check(first)
            if wrong:
                return Outcome("failed", error=f"wrong result: {wrong}")
            counter = itertools.count()
            sets = self.sets

            def step() -> None:
                self.launch(cfg, sets[next(counter) % len(sets)])

            ms = float(self.timer(step, dataclasses.asdict(cfg), self.problem))
            self._sync()
        except DeviceLost:
            raise
        except Exception as exc:  # compile error, out of resources, launch failure
            self._raise_if_device_lost(exc, cfg)
            return Outcome("failed", error=_error_text(exc))
        if not (ms > 0 and math.isfinite(ms)):
            return Outcome("failed", error=f"timer returned {ms!r} ms")
        return Outcome("ok", time_ms=ms, tflops=self.throughput(ms))

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _finish_first_run(self, cfg) -> None:
        """Wait for a config's first launches, at most HANG_S seconds (a plain synchronize would
        wait for a deadlocked kernel forever)."""
        if self.device.type != "cuda":
            return
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(self.device))
        wait_for_gpu(done.query, HANG_S, f"config {dataclasses.asdict(cfg)}")

    def _raise_if_device_lost(self, exc: BaseException, cfg) -> None:
        if self.device.type != "cuda":
            return
        try:
            torch.cuda.synchronize(self.device)
            torch.zeros(1, device=self.device).add_(1).item()
        except Exception as again:
            raise DeviceLost(f"the GPU failed during config {dataclasses.asdict(cfg)} "
                             f"({_error_text(exc, 300)}; then {_error_text(again, 200)}): the CUDA "
                             f"context is lost, continue with `attngen tune --resume`") from None
