"""Where the packed-documents fwd+bwd step of `attngen bench` spends its time (GPU): the kernels
a torch.profiler trace of the timed step shows, the backward plans the runtime built (the hd256 case too), and the
step split into forward and backward (median of triton.testing.do_bench). Then the forward of
documents of several lengths (same 8192 tokens) through the Triton TMA kernel and the Gluon one.

    python3 benchmarks/tools/diag_docs.py --out diag_docs.json
"""

from __future__ import annotations

import argparse
import json
import math

import torch
import triton

from attngen.bench.cases import CASES_BY_NAME, case_flops
from attngen.bench.providers import _prepare_attngen
from attngen.bench.run import make_inputs, make_step
from attngen.kernels.common import MaskArgs
from attngen.families.fwd import attn_fwd_varlen
from attngen.runtime import api, loader
from attngen.spec import KernelSpec
from attngen.configs import WS_DEFAULT, FwdConfig


def bench(fn) -> float:
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def plans() -> list[dict]:
    rows = []
    for cache in (api._FWD, api._BWD):
        for plan in cache.values():
            rows.append({"plan": type(plan).__name__, "config": plan.config.as_dict(),
                         "source": plan.config_source, "tma": getattr(plan, "tma", None),
                         "kernels": [la.fn.__name__ if hasattr(la.fn, "__name__") else str(la.fn.fn.__name__)
                                     for la in plan.launches],
                         "fallback": getattr(plan, "_fallback", None) is not None})
    return rows


def step_profile(out: dict, name: str) -> None:
    case = CASES_BY_NAME[name]
    x = make_inputs(case, torch.bfloat16, torch.device("cuda"), "fwdbwd")
    p = _prepare_attngen(case, x, "fwdbwd")
    step = make_step(p, "fwdbwd")
    flops = case_flops(case, "fwdbwd")
    ms = bench(step)
    fwd_ms = bench(p.forward)
    o = p.forward()
    bwd_ms = bench(lambda: torch.autograd.grad(o, p.leaves, p.dout, retain_graph=True))
    with torch.no_grad():
        nograd_ms = bench(p.forward)
    out = out.setdefault(name, {})
    out["step"] = {"case": case.name, "ms": ms, "tflops": flops / ms / 1e9, "fwd_with_grad_ms": fwd_ms,
                   "bwd_ms": bwd_ms, "fwd_no_grad_ms": nograd_ms}
    out["plans"] = plans()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    kernels = {}
    for ev in prof.key_averages():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            kernels[ev.key] = {"count": ev.count, "us_total": ev.device_time_total}
    out["kernels"] = kernels
    print(json.dumps(out, indent=1), flush=True)


def host_profile(out: dict, name: str, steps: int = 40) -> None:
    """Host time per fwd+bwd step (the enqueue time of `steps` steps, no sync in between) and a
    cProfile of those steps (top functions by own time)."""
    import cProfile
    import io
    import pstats

    from attngen.bench.run import host_us

    case = CASES_BY_NAME[name]
    x = make_inputs(case, torch.bfloat16, torch.device("cuda"), "fwdbwd")
    step = make_step(_prepare_attngen(case, x, "fwdbwd"), "fwdbwd")
    host = host_us(step, steps)[0]
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        step()
    prof.disable()
    torch.cuda.synchronize()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(30)
    out.setdefault(name, {})["host_us_per_step"] = host
    out[name]["cprofile"] = buf.getvalue()
    print(name, "host us/step", round(host, 1), flush=True)
    print(buf.getvalue()[:6000], flush=True)


def doc_lengths(out: dict) -> None:
    rows = []
    T, H, Hkv, D = 8192, 32, 8, 128
    spec = KernelSpec("fwd", "bf16", "sm90", D, D, H // Hkv, "causal", varlen=True)
    mod = loader.load(spec)
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(T, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    o, lse = torch.empty_like(q), torch.empty(H, T, device="cuda")
    margs = MaskArgs(scale=1 / math.sqrt(D), softcap=0.0, window_left=1 << 30, window_right=0,
                     align_top_left=False)
    for n in (512, 1024, 2048, 4096, 8192):
        cu = torch.arange(0, T + 1, n, dtype=torch.int32, device="cuda")
        flops = (T // n) * 4 * H * n * n / 2 * D
        row = {"doc_len": n}
        for name, cfg in (("triton_tma_64x64", FwdConfig(64, 64, 4, 3, tma=True)), ("gluon_ws", WS_DEFAULT)):
            try:
                ms = bench(lambda: attn_fwd_varlen(mod, spec, q, k, v, o, lse, cu, cu, n, margs, cfg))
                row[name] = round(flops / ms / 1e9, 1)
            except Exception as exc:  # noqa: BLE001
                row[name] = f"{type(exc).__name__}: {str(exc)[:200]}"
        rows.append(row)
        print(row, flush=True)
    out["fwd_by_doc_len"] = rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--host", action="store_true", help="host time and cProfile of the steps only")
    args = ap.parse_args()
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
    if args.host:
        for name in ("docs8-causal-8k", "causal"):
            host_profile(out, name)
        with open(args.out, "w") as fh:
            json.dump(out, fh, indent=1)
        return
    for name in ("docs8-causal-8k", "causal-hd256-4k"):
        step_profile(out, name)
    doc_lengths(out)
    with open(args.out, "w") as fh:
        json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
