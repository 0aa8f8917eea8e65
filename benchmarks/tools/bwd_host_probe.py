"""Where a small bf16 forward+backward's host time goes (benchmarks/ab/h200_ab_bwd_host_2026-12-04.json,
first run): attngen against SDPA, an empty autograd Function (the autograd floor), the backward plan
alone, and autograd without its device threads. [host, wall] µs per call, 300 warm calls.
python3 benchmarks/tools/bwd_host_probe.py OUT.json"""
import json
import sys

import torch
import torch.nn.functional as F
import attngen
from attngen.bench.run import host_us
from attngen.runtime import api, validate

dev = torch.device("cuda")
res = {}

def host(fn, n=300):
    return tuple(round(x, 1) for x in host_us(fn, n, warmup=20))


class Empty(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        ctx.save_for_backward(q, k, v)
        return torch.empty_like(q)
    @staticmethod
    def backward(ctx, do):
        q, k, v = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

for S in (512, 2048):
    q, k, v = (torch.randn(1, 16, S, 128, device=dev, dtype=torch.bfloat16) for _ in range(3))
    do = torch.randn_like(q)
    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
    leaves = (qg, kg, vg)
    def fb(fn):
        def f():
            o = fn()
            torch.autograd.grad(o, leaves, do)
        return f
    row = {}
    row["attngen fwd no-grad"] = host(lambda: attngen.attention(q, k, v, causal=True))
    row["attngen fwd grad"] = host(lambda: attngen.attention(qg, kg, vg, causal=True))
    row["attngen fwd+bwd"] = host(fb(lambda: attngen.attention(qg, kg, vg, causal=True)))
    for name, be in (("flash", torch.nn.attention.SDPBackend.FLASH_ATTENTION),
                     ("cudnn", torch.nn.attention.SDPBackend.CUDNN_ATTENTION)):
        with torch.nn.attention.sdpa_kernel(be):
            try:
                row[f"sdpa-{name} fwd+bwd"] = host(fb(lambda: F.scaled_dot_product_attention(qg, kg, vg, is_causal=True)))
            except Exception as e:
                row[f"sdpa-{name} fwd+bwd"] = str(e)[:100]
    row["empty Function fwd+bwd"] = host(fb(lambda: Empty.apply(qg, kg, vg)))
    out, lse = attngen.attention(q, k, v, causal=True, return_lse=True)
    opts = validate.make_options(128, True, (-1, -1), 0.0, None, "bottom_right", "bhsd")
    row["backward_impl alone"] = host(lambda: api.backward_impl(do, q, k, v, out, lse, opts, False))
    plan = next(iter(api._BWD.values()))
    row["bwd plan.run alone"] = host(lambda: plan.run(do, q, k, v, out, lse))
    row["bwd launches"] = [la.fn.__name__ for la in plan.launches]
    row["bwd raw"] = [getattr(la, "raw", None) is not None for la in getattr(plan, "launches", [])]
    torch.autograd.set_multithreading_enabled(False)
    row["attngen fwd+bwd, autograd multithreading off"] = host(fb(lambda: attngen.attention(qg, kg, vg, causal=True)))
    row["empty Function, multithreading off"] = host(fb(lambda: Empty.apply(qg, kg, vg)))
    torch.autograd.set_multithreading_enabled(True)
    res[f"B1 H16 S{S} hd128 causal"] = row
    print(S, json.dumps(row, indent=0), flush=True)
json.dump({"what": "[host µs a call (no sync), wall µs (drained)] over 300 warm calls", "rows": res},
          open(sys.argv[1] if len(sys.argv) > 1 else "bwd_host_probe.json", "w"), indent=1)
