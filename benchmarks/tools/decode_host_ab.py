"""Host time of a warm decode call (attention_with_kvcache, eager, enqueue only: back-to-back calls
before a synchronize), B1 KV4k GQA 32/8 hd128 bf16, contiguous and paged caches, three variants
alternated in one process: "new" (the fast path, kvcache._FAST; the raw launcher's one-pick
arguments; the split partials in the plan's own buffer on the default stream), "alloc" (the same
with the partials' buffer allocated a call), "full" (no fast path: every call through the
argument checks); do_bench beside each; the floor: the two raw launches alone on one prepared
argument dict ("launches"), and one torch.empty ("empty"); then cProfile of 500 "new" calls. GPU.

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
    out = torch.empty(plan.out_shape, dtype=plan.dtype, device=dev)
    lse = torch.empty(plan.lse_shape, dtype=torch.float32, device=dev)
    op, lp = plan.partials()
    args = {"Q": q, "K": kc if name == "dense" else kp, "V": vc if name == "dense" else vp, "Out": out, "Lse": lse,
            "OutP": op, "LseP": lp, "CacheSeqlens": sl, "BlockTable": None if name == "dense" else table,
            "KDescale": None, "VDescale": None, "Flags": plan.flags, "KNew": None, "VNew": None,
            "CacheBatchIdx": None, "CacheLeftpad": None, "RotaryCos": None, "RotarySin": None,
            "Counter": plan.counter()}
    def host(mode, n=300):
        t = time.perf_counter()
        if mode == "alloc":
            for _ in range(n):
                plan.scratch = None
                f()
        elif mode == "launches":
            for _ in range(n):
                for la in plan.launches:
                    la(args, True)
        elif mode == "empty":
            for _ in range(n):
                torch.empty(plan.out_shape, dtype=plan.dtype, device=dev)
        else:
            for _ in range(n): f()
        h = (time.perf_counter() - t) / n * 1e6
        torch.cuda.synchronize(); return h
    for rnd in range(3):
        for mode in ("new", "alloc", "full", "launches", "empty"):
            kvcache._FAST = NoHit() if mode == "full" else fast
            res.setdefault(f"{name}_{mode}_host_us", []).append(host(mode))
            if mode in ("new", "alloc", "full"):
                res.setdefault(f"{name}_{mode}_do_bench_us", []).append(
                    triton.testing.do_bench(f, warmup=25, rep=200) * 1e3)
    kvcache._FAST = fast
print(json.dumps({k: [round(x, 2) for x in v] for k, v in res.items()}))
print(torch.cuda.get_device_name())
f = calls["dense"]
pr = cProfile.Profile(); pr.enable()
for _ in range(500): f()
pr.disable(); torch.cuda.synchronize()
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(22)
print(s.getvalue()[:5000])
