"""A/B of plan.HOST_BOUND_WORK with the raw launcher (benchmarks/ab/h200_ab_host_bound_2026-12-04.json):
small bf16 shapes through the pointer kernels (the rule as shipped) against the TMA configs (the
rule off), forward and forward+backward. python3 benchmarks/tools/host_bound_ab.py OUT.json"""
import json, sys
import torch
import attngen
from triton.testing import do_bench
from attngen.bench.run import host_us
from attngen.runtime import api, plan, tools

dev = torch.device("cuda")

def per_call(fn, n=500):
    host, wall = host_us(fn, n, warmup=20)
    return {"host_us": round(host, 1), "wall_us": round(wall, 1),
            "do_bench_us": round(do_bench(fn, warmup=25, rep=150, return_mode="median") * 1e3, 1)}


SHAPES = [(1, 4, 64, 64, False), (1, 16, 256, 128, True), (1, 16, 512, 128, False), (1, 16, 512, 128, True),
          (2, 32, 256, 128, True), (4, 8, 512, 64, True), (1, 32, 1024, 128, True)]
rows = []
for b, h, s, d, causal in SHAPES:
    q, k, v = (torch.randn(b, h, s, d, device=dev, dtype=torch.bfloat16) for _ in range(3))
    do = torch.randn_like(q)
    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
    work = s * s * b * h
    row = {"shape": f"B{b} H{h} S{s} hd{d}" + (" causal" if causal else ""), "work": work,
           "host_bound": work <= plan.HOST_BOUND_WORK}
    for rule, val in (("default", 1 << 22), ("off", 0)):
        plan.HOST_BOUND_WORK = val
        api.clear_plans()
        ex = tools.explain(q, k, v, causal=causal)
        f = lambda: attngen.attention(q, k, v, causal=causal)
        def fb():
            o = attngen.attention(qg, kg, vg, causal=causal)
            torch.autograd.grad(o, (qg, kg, vg), do)
        with torch.no_grad():
            fwd = per_call(f)
        both = per_call(fb, n=200)
        row[rule] = {"fwd_launches": [l["entry"] for l in ex["launches"]], "config": ex["config"], "why": ex["why"],
                     "bwd_config": ex["backward"]["config"], "fwd": fwd, "fwd_bwd": both}
    rows.append(row)
    print(json.dumps(row), flush=True)
json.dump({"what": "µs per call: host (no sync), wall (drained), do_bench median; rule 'default' = HOST_BOUND_WORK 2^22, 'off' = 0 (TMA configs)",
           "rows": rows}, open(sys.argv[1] if len(sys.argv) > 1 else "host_bound_ab.json", "w"), indent=1)
