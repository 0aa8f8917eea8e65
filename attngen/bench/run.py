"""Measuring: one case and mode across the providers, never raising for a provider's failure.

Time is the median of ``triton.testing.do_bench(step, warmup, rep, return_mode="median")``; the
fwd+bwd step is forward, then the gradients of sum(out * dout) for a fixed random dout. Every
provider's output (and gradients) is compared once with the first provider's before timing.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from attngen.bench.cases import DTYPE_NAMES, Case, case_flops
from attngen.bench.providers import (REFERENCE, Inputs, Prepared, Provider, Unsupported, is_attngen,
                                     sync)

TIMING = {"full": {"warmup_ms": 25, "rep_ms": 100}, "quick": {"warmup_ms": 5, "rep_ms": 20}}
# GPU work (ms) before a provider's timing in the decode and fp8 benches, after its first call: that
# call may compile (Triton, FlexAttention) while the GPU idles and clocks down, and the first rows
# of a process read 3-10x slow for every provider without it (H200, 2026-12-04)
BUSY_MS = 200.0


# The decode and fp8 benches run their first case twice and keep the second: after the busy wait,
# the first case timed in a process still read low for most providers (H200, 2026-12-04: cuDNN
# fp8 94 TFLOP/s at S512 against 145 in the run before; decode's first provider likewise).
def with_discarded_first(cases: Sequence) -> list[tuple[object, bool]]:
    """(case, keep) pairs: the first case once unrecorded, then every case recorded."""
    cases = list(cases)
    return [(c, False) for c in cases[:1]] + [(c, True) for c in cases]


# Max |out - attngen's out| above which a row's check is marked failed (informational, not fatal).
OUT_TOLERANCE = {torch.bfloat16: 3e-2, torch.float16: 5e-3}


def make_inputs(case: Case, dtype: torch.dtype, device: torch.device, mode: str,
                seed: int = 0) -> Inputs:
    g = torch.Generator(device=device).manual_seed(seed)
    B, S, D = case.batch, case.seqlen, case.head_dim
    grad = mode == "fwdbwd"

    def rand(h):
        return torch.randn((B, h, S, D), generator=g, device=device, dtype=dtype)

    q, k, v = (rand(h).requires_grad_(grad) for h in (case.heads_q, case.heads_kv, case.heads_kv))
    cu, _ = case.problem().cu_seqlens(device)  # each sequence's documents, or the sequences
    return Inputs(q, k, v, rand(case.heads_q), cu)


def make_step(p: Prepared, mode: str) -> Callable[[], tuple[torch.Tensor, ...]]:
    if mode == "fwd":
        return lambda: (p.forward(),)

    def step():
        out = p.forward()
        return (out, *torch.autograd.grad(out, p.leaves, p.dout))

    return step


def do_bench_timer(step: Callable[[], object], warmup_ms: int, rep_ms: int) -> float:
    from triton.testing import do_bench

    return float(do_bench(step, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


def host_us(fn: Callable[[], object], n: int = 2000, warmup: int = 50) -> tuple[float, float]:
    """(host, wall) µs per call of `fn` over n warm calls on the current GPU: host is the loop's
    time without a synchronization (what Python and the launches cost while the GPU keeps up),
    wall the same loop drained."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return (t1 - t0) / n * 1e6, (t2 - t0) / n * 1e6


def _max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    from attngen.testing import max_err

    if a.shape != b.shape:  # no broadcasting past a layout mistake
        raise ValueError(f"shape {tuple(a.shape)} vs reference {tuple(b.shape)}")
    return max_err(a, b)


def ratio_pairs(names: Sequence[str]) -> list[tuple[str, str]]:
    """(numerator, denominator) of the ratios among `names`, in the order of Row.ratios."""
    pairs = [(REFERENCE, n) for n in names if n != REFERENCE]
    peers = [n for n in names if not is_attngen(n)]
    return pairs + [(v, n) for v in names if v != REFERENCE and is_attngen(v) for n in peers]


def _describe_error(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"error: {type(exc).__name__}: {first}"[:400]



@dataclass
class Row:
    case: Case
    mode: str
    dtype: torch.dtype
    flops: float
    tflops: dict[str, float | str] = field(default_factory=dict)
    ms: dict[str, float] = field(default_factory=dict)
    first_call_s: dict[str, float] = field(default_factory=dict)
    max_abs_diff: dict[str, dict[str, float]] = field(default_factory=dict)
    check_ok: dict[str, bool] = field(default_factory=dict)
    check_ref: str | None = None
    notes: dict[str, str] = field(default_factory=dict)

    def ratios(self) -> dict[str, float | None]:
        """"attngen/<peer>" for every other provider, then "<variant>/<peer>" for attngen's
        variants (attngen-sm80) over the non-attngen peers; None where either side has no number."""
        out = {}
        for num, den in ratio_pairs(list(self.tflops)):
            ours, theirs = self.tflops.get(num), self.tflops[den]
            ok = isinstance(ours, float) and isinstance(theirs, float) and theirs > 0
            out[f"{num}/{den}"] = round(ours / theirs, 3) if ok else None
        return out

    def as_json(self) -> dict:
        d = {"case": self.case.name, "mode": self.mode, **self.case.describe(),
             "dtype": DTYPE_NAMES[self.dtype], "flops": self.flops,
             "tflops": self.tflops, "ratios": self.ratios(), "ms": self.ms,
             "first_call_s": self.first_call_s, "max_abs_diff": self.max_abs_diff,
             "check_ok": self.check_ok, "check_ref": self.check_ref, "notes": self.notes}
        if "flex" in self.first_call_s:
            d["flex_compile_s"] = self.first_call_s["flex"]
        return d


def run_case(case: Case, mode: str, providers: Sequence[Provider], dtype: torch.dtype,
             device: torch.device, timer: Callable[[Callable[[], object]], float],
             log: Callable[[str], None] = lambda s: None) -> Row:
    """Measure every provider on one case and mode. Never raises for a provider's failure."""
    row = Row(case, mode, dtype, case_flops(case, mode))
    x = make_inputs(case, dtype, device, mode)
    ref: tuple[torch.Tensor, ...] | None = None
    names = ("out", "dq", "dk", "dv")
    for prov in providers:
        grad_ctx = torch.no_grad() if mode == "fwd" else contextlib.nullcontext()
        try:
            with grad_ctx:
                p = prov.prepare(case, x, mode)
                step = make_step(p, mode)
                with p.context():
                    t0 = time.perf_counter()
                    results = step()
                    sync(device)
                    row.first_call_s[prov.name] = round(time.perf_counter() - t0, 3)
                    dense = tuple(t.detach() for t in p.to_dense(results))
                    del results
                    if not all(bool(torch.isfinite(t).all()) for t in dense):
                        row.notes[prov.name] = "non-finite values in the output or gradients"
                    if ref is None:
                        ref, row.check_ref = dense, prov.name
                    else:
                        diffs = {n: _max_abs_diff(a, b) for n, a, b in zip(names, dense, ref)}
                        row.max_abs_diff[prov.name] = {n: round(d, 6) for n, d in diffs.items()}
                        row.check_ok[prov.name] = diffs["out"] <= OUT_TOLERANCE[dtype]
                    del dense
                    ms = timer(step)
            row.ms[prov.name] = round(ms, 4)
            row.tflops[prov.name] = round(row.flops / (ms * 1e-3) / 1e12, 1)
            if p.note:
                row.notes[prov.name] = p.note
        except Unsupported as exc:
            row.tflops[prov.name] = str(exc)
        except Exception as exc:  # noqa: BLE001 - a provider's failure (OOM too) is a result
            row.tflops[prov.name] = _describe_error(exc)
        finally:
            p = step = None
            if prov.name == "flex":
                torch._dynamo.reset()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        log(f"  {case.name:<18} {mode:<7} {prov.name:<12} {fmt_value(row.tflops[prov.name], 72)}")
    return row




def fmt_value(v, width: int = 8) -> str:
    if isinstance(v, float):
        return f"{v:.1f}"
    return (v or "-")[:width]
