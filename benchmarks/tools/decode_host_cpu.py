"""The Python share of a warm decode call's host time, on a machine with no GPU: the same
attention_with_kvcache fast path as on a GPU (B1 GQA 32/8 hd128 bf16, a contiguous cache of 1024
keys in 16 slices: a split call and its merge, two launches), with CPU tensors, the plan's
launches replaced by no-ops, the stream query answered 0 (the legacy default stream, as an eager
GPU call) and the host metadata check skipped (it runs only for CPU metadata). What is left is the
key, the lookup, the allocation of the output and the launches' argument dict: what a change to
that Python moves on a GPU too (the GPU adds the two C launches, 9-12 µs on the H200's host,
benchmarks/tools/decode_host_ab.py).

    TRITON_INTERPRET=1 python3 benchmarks/tools/decode_host_cpu.py [--reps 25] [--calls 4000]

One line: min and median µs a call over the repetitions. For an A/B, run it from two checkouts
(PYTHONPATH=<checkout>), alternated, a few rounds: this machine's timings drift by 2x between
processes, the minimum much less.
"""
import argparse
import statistics
import time

import torch

import attngen
from attngen.runtime import kvcache


class _NoLaunch:
    ready = True  # the plan takes its raw-launch path (addresses in its own scratch buffer)

    def __call__(self, tensors, aligned):
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=25)
    ap.add_argument("--calls", type=int, default=4000)
    a = ap.parse_args()
    torch.set_grad_enabled(False)
    b, hq, hkv, s, d = 1, 32, 8, 1024, 128
    q = torch.randn(b, 1, hq, d, dtype=torch.bfloat16)
    kc = torch.randn(b, s, hkv, d, dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    sl = torch.full((b,), s, dtype=torch.int32)

    def call():
        return attngen.attention_with_kvcache(q, kc, vc, sl, num_splits=16)

    call()
    call()  # the second call's plan is the fast path's
    (plan, _, _), = kvcache._FAST.values()
    kvcache._stream = lambda index: 0
    kvcache.check_meta = lambda *args: None
    plan.launches = [_NoLaunch() for _ in plan.launches]
    res = []
    for _ in range(a.reps):
        t = time.perf_counter()
        for _ in range(a.calls):
            call()
        res.append((time.perf_counter() - t) / a.calls * 1e6)
    print(f"min {min(res):.2f} µs, median {statistics.median(res):.2f} µs a call "
          f"({a.reps} x {a.calls} calls, {plan.num_splits} slices, {len(plan.launches)} launches)")


if __name__ == "__main__":
    main()
