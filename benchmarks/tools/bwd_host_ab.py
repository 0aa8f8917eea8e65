"""A/B of the eager backward's host time (benchmarks/ab/h200_ab_bwd_host_2026-12-04.json), B1 H16
S512 hd128 causal bf16, interleaved rounds: the engine handing the backward a zero-filled
gradient of the non-differentiable lse (ctx.set_materialize_grads True) or None (False), with
autograd's device threads on and off, beside SDPA's cuDNN backend; the time spent inside the
Function's backward. python3 benchmarks/tools/bwd_host_ab.py OUT.json"""
import json
import statistics
import sys
import threading
import time

import torch
import torch.nn.functional as F
import attngen
from attngen.bench.run import host_us
from attngen.runtime import api

dev = torch.device("cuda")
inside, seen = [], {}

def make(materialize: bool, timed: bool):
    class P(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, plan):
            if not materialize:
                ctx.set_materialize_grads(False)
            out, lse = plan.run(q, k, v, None, None)
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.opts = plan.opts
            ctx.mark_non_differentiable(lse)
            return out, lse

        @staticmethod
        def backward(ctx, dout, dlse):
            seen.setdefault(materialize, (type(dlse).__name__, threading.current_thread().name))
            t0 = time.perf_counter()
            q, k, v, out, lse = ctx.saved_tensors
            g = api.backward_impl(dout, q, k, v, out, lse, ctx.opts, False)
            if timed:
                inside.append(time.perf_counter() - t0)
            return (*g, None)
    return P

def host(fn, n=300):
    return round(host_us(fn, n, warmup=20)[0], 1)


S = 512
q, k, v = (torch.randn(1, 16, S, 128, device=dev, dtype=torch.bfloat16) for _ in range(3))
do = torch.randn_like(q)
leaves = tuple(t.clone().requires_grad_(True) for t in (q, k, v))
attngen.attention(*leaves, causal=True)
plan = next(iter(api._FAST.values()))
samples = {}
for rnd in range(7):
    for mt in (True, False):
        torch.autograd.set_multithreading_enabled(mt)
        for mat in (True, False):
            P = make(mat, True)
            def fb():
                o, _ = P.apply(*leaves, plan)
                torch.autograd.grad(o, leaves, do)
            inside.clear()
            tot = host(fb, n=200)
            samples.setdefault(f"mt={mt} materialize={mat} fwd+bwd", []).append(tot)
            samples.setdefault(f"mt={mt} materialize={mat} inside", []).append(round(statistics.median(inside[20:]) * 1e6, 1))
        def fbs():
            o = F.scaled_dot_product_attention(*leaves, is_causal=True)
            torch.autograd.grad(o, leaves, do)
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
            samples.setdefault(f"mt={mt} sdpa-cudnn", []).append(host(fbs, n=200))
    torch.autograd.set_multithreading_enabled(True)
    samples.setdefault("backward_impl on the main thread", []).append(
        host(lambda: api.backward_impl(do, q, k, v, *plan.run(q, k, v, None, None), plan.opts, False), n=200))
row = {k: {"median": statistics.median(v), "rounds": v} for k, v in samples.items()}
row["dlse seen"] = {str(k): v for k, v in seen.items()}
print(json.dumps(row, indent=0), flush=True)
json.dump({"what": "B1 H16 S512 hd128 causal bf16: µs a warm call (host, no sync), 7 interleaved rounds of 200 calls; 'inside': median time in the Function's backward; the last row includes a forward", "rows": row},
          open(sys.argv[1] if len(sys.argv) > 1 else "bwd_host_ab.json", "w"), indent=1)
