"""Host time of a warm decode call (attention_with_kvcache, eager, enqueue only: back-to-back calls
before a synchronize), B1 KV4k GQA 32/8 hd128 bf16, contiguous and paged caches, three variants
alternated in one process: "new" (the fast path, kvcache._FAST; the raw launcher's one-pick
arguments; the split partials in one allocation), "old" (the fast path with the raw launcher's
per-slot argument loop and four allocations a call), "full" (no fast path: every call through the
argument checks); do_bench beside each; then cProfile of 500 "new" calls. GPU.

    python3 benchmarks/tools/decode_host_ab.py > out.txt
"""
import cProfile
import io
import json
import pstats
import time

import torch
import triton

import attngen
from attngen.runtime import kvcache
from attngen.runtime.plans import PlanCache

class NoHit(PlanCache):
    def get(self, key, default=None):
        return None

dev = torch.device("cuda")
B, Hq, Hkv, S, D = 1, 32, 8, 4096, 128
q = torch.randn(B, 1, Hq, D, device=dev, dtype=torch.bfloat16)
kc = torch.randn(B, S, Hkv, D, device=dev, dtype=torch.bfloat16)
vc = torch.randn(B, S, Hkv, D, device=dev, dtype=torch.bfloat16)
kp, vp = kc.view(S // 16, 16, Hkv, D), vc.view(S // 16, 16, Hkv, D)
table = torch.arange(S // 16, dtype=torch.int32, device=dev)[None]
sl = torch.full((B,), S, dtype=torch.int32, device=dev)
calls = {"dense": lambda: attngen.attention_with_kvcache(q, kc, vc, sl),
         "paged": lambda: attngen.attention_with_kvcache(q, kp, vp, sl, block_table=table)}
fast = kvcache._FAST
res = {}
torch.set_grad_enabled(False)
for name, f in calls.items():
    kvcache._FAST = fast
    fast.clear()
    for _ in range(5): f()
    torch.cuda.synchronize()
    (plan, _, _), = fast.values()
    picks = [la.raw.pick for la in plan.launches]
    def host(mode, n=300):
        t = time.perf_counter()
        if mode == "old":
            for _ in range(n):
                plan.raw = False
                f()
        else:
            for _ in range(n): f()
        h = (time.perf_counter() - t) / n * 1e6
        torch.cuda.synchronize(); return h
    for rnd in range(3):
        for mode in ("new", "old", "full"):
            kvcache._FAST = NoHit() if mode == "full" else fast
            for la, p in zip(plan.launches, picks):
                la.raw.pick = None if mode == "old" else p
            res.setdefault(f"{name}_{mode}_host_us", []).append(host(mode))
            res.setdefault(f"{name}_{mode}_do_bench_us", []).append(triton.testing.do_bench(f, warmup=25, rep=200) * 1e3)
    for la, p in zip(plan.launches, picks):
        la.raw.pick = p
    kvcache._FAST = fast
print(json.dumps({k: [round(x, 2) for x in v] for k, v in res.items()}))
print(torch.cuda.get_device_name())
f = calls["dense"]
pr = cProfile.Profile(); pr.enable()
for _ in range(500): f()
pr.disable(); torch.cuda.synchronize()
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(22)
print(s.getvalue()[:5000])
