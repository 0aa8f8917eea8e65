"""Issue 48's first question, on the GPU: the backward alone, attngen against cuDNN's (SDPA's
CUDNN_ATTENTION backend), per dense row of `attngen bench` (packed documents and windows cuDNN's
SDPA path cannot take are left out), both timed in one process, alternating: median of
triton.testing.do_bench over `out.backward(g, retain_graph=True)` (the forward outside the timing).
Writes JSON rows: ms and TFLOP/s (2.5x the forward's flops over the pairs kept) of each, and the
ratio; with torch.profiler's kernel names for cuDNN's backward (what it launches).

    python3 benchmarks/tools/bwd_vs_cudnn.py --out FILE.json
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

import attngen
from attngen.bench.cases import CASES


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    rows = []
    for c in CASES:
        if c.docs or c.window > 0:
            continue
        B, Hq, Hkv, S, D = c.batch, c.heads_q, c.heads_kv, c.seqlen, c.head_dim
        torch.manual_seed(0)
        mk = lambda h: torch.randn(B, h, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)  # noqa: E731
        q, k, v = mk(Hq), mk(Hkv), mk(Hkv)
        g = torch.randn(B, Hq, S, D, device="cuda", dtype=torch.bfloat16)
        out_a = attngen.attention(q, k, v, causal=c.causal)
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            out_c = F.scaled_dot_product_attention(q, k, v, is_causal=c.causal, enable_gqa=Hq != Hkv)
        pairs = B * Hq * (S * (S + 1) // 2 if c.causal else S * S)
        flops = 2.5 * 4 * pairs * D
        t = {"attngen": [], "cudnn": []}
        for _ in range(2):  # alternating
            for name, out in (("attngen", out_a), ("cudnn", out_c)):
                t[name].append(triton.testing.do_bench(lambda: out.backward(g, retain_graph=True), warmup=25, rep=100))
        ta, tc = min(t["attngen"]), min(t["cudnn"])
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            out_c.backward(g, retain_graph=True)
            torch.cuda.synchronize()
        kernels = sorted({e.name[:90] for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})
        row = {"case": c.name, "attngen_bwd_ms": ta, "cudnn_bwd_ms": tc, "attngen_bwd_tflops": flops / ta * 1e-9,
               "cudnn_bwd_tflops": flops / tc * 1e-9, "ratio": tc / ta, "cudnn_kernels": kernels,
               "attngen_bwd": attngen.explain(q, k, v, causal=c.causal)["backward"]["kernel"]}
        print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items() if k != "cudnn_kernels"}),
              flush=True)
        rows.append(row)
        del q, k, v, g, out_a, out_c
        torch.cuda.empty_cache()
    with open(a.out, "w") as fh:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
