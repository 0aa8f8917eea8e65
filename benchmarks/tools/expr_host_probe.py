"""Where the time of an expression call goes (GPU): per row of `attngen bench --mode mods`
(attngen.bench.mods), the host time of one call (enqueue only, measured over back-to-back calls
before a synchronize) beside the GPU time of its kernels (torch.profiler, per kernel), forward
and forward+backward. A row whose host time exceeds its kernel time is host-bound under
do_bench.

    python3 benchmarks/tools/expr_host_probe.py [ROW ...] > probe.json
"""
import json
import sys
import time

import torch

import attngen
from attngen.bench import mods


def _host_us(fn, n=40):
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return host


def _kernels(fn, n=10):
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        if e.device_type.name == "CUDA" and e.self_device_time_total > 0:
            out[e.key[:80]] = round(e.self_device_time_total / n, 1)
    return dict(sorted(out.items(), key=lambda kv: -kv[1])[:8])


def main(names):
    dev = torch.device("cuda")
    for name, B, Hq, Hkv, S, D, kind in mods.ROWS:
        if names and name not in names:
            continue
        torch.manual_seed(0)
        q = torch.randn(B, Hq, S, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(B, Hkv, S, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(B, Hkv, S, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
        mask_mod, score_mod, sinks = mods._mods(kind, B, Hq, S, dev)
        call = lambda: attngen.attention(q, k, v, mask_mod=mask_mod, score_mod=score_mod, sinks=sinks)  # noqa: E731
        g = torch.randn(B, Hq, S, D, device=dev, dtype=torch.bfloat16)
        both = lambda: torch.autograd.grad(call(), (q, k, v), g)  # noqa: E731
        row = {"name": name}
        with torch.no_grad():
            row["fwd_host_us"] = round(_host_us(call), 1)
            row["fwd_kernels_us"] = _kernels(call)
        row["fwdbwd_host_us"] = round(_host_us(both), 1)
        row["fwdbwd_kernels_us"] = _kernels(both)
        ex = attngen.explain(q, k, v, mask_mod=mask_mod, score_mod=score_mod, sinks=sinks)
        row["fwd_config"] = ex["config"]
        row["fwd_config_source"] = ex.get("config_source")
        row["bwd"] = {k2: ex["backward"].get(k2) for k2 in ("kernel", "config", "config_source")} if ex.get("backward") else None
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
