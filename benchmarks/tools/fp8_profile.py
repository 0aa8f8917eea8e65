"""Where an fp8 call's time goes, per bench row (attngen.bench.fp8.CASES): for attngen's fp8 call
(`attngen-fp8`), attention_fp8 on tensors quantized beforehand (`attngen-fp8-kernel`), attngen's
bf16 forward (`attngen`) and cuDNN's fp8 SDPA (`cudnn-fp8`), each kernel's GPU time (torch.profiler,
mean over 20 calls, µs), the host time of a warm call (50 calls launched back to back without a
sync, µs each) and the bench's own time (median of triton.testing.do_bench, µs).

    python3 benchmarks/tools/fp8_profile.py OUT.json     # needs a GPU (and nvidia-cudnn-frontend)
"""

from __future__ import annotations

import collections
import json
import sys
import time

import torch
import triton
from torch.profiler import ProfilerActivity, profile

from attngen.bench import fp8 as bench_fp8
from attngen.devices import busy_gpu

PROVIDERS = ["attngen-fp8", "attngen-fp8-kernel", "attngen", "cudnn-fp8"]


def measure(fn) -> dict:
    """Host µs a warm call, the bench's µs and each kernel's µs a call."""
    with torch.no_grad():
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(50):
            fn()
        host = (time.perf_counter() - t) / 50 * 1e6
        torch.cuda.synchronize()
        busy_gpu("cuda")
        ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
    kernels = collections.defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels[e.name[:60]] += e.device_time / 20
    top = sorted(kernels.items(), key=lambda kv: -kv[1])[:6]
    return {"host_us": round(host, 1), "bench_us": round(ms * 1e3, 1),
            "kernels_us": {name: round(us, 1) for name, us in top}}


def main() -> None:
    out = {}
    for case in bench_fp8.CASES:
        calls = bench_fp8._providers(case, torch.device("cuda"))
        out[case.name] = {n: measure(calls[n]) for n in PROVIDERS if calls.get(n) is not None}
        print(case.name, json.dumps(out[case.name]), flush=True)
    with open(sys.argv[1], "w") as fh:
        json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
