"""A/B of the decode merge at run time (DecodeConfig.merge, session 61): every row of the decode
bench (attngen.bench.decode.CASES, contiguous cache, bf16, full rows) through
attention_with_kvcache's warm path, with the config the runtime resolves for it (the tuning
database's winner or the default) and its merge forced to "launch" (the combine kernel) and to
"fused" (the split kernel's last program per row merges), alternated in one process, a few
rounds: do_bench median µs of a call, host µs of a call (200 calls enqueued before one
synchronize), GB/s of K and V read, and the largest difference of the two forms' outputs (the
same merge code in the same split order, compiled into kernels of other warp counts: 0 or a few
ulps). "runtime": the form the row's config runs (DecodeConfig.merge; "launch" unless the
tuning database's winner says otherwise). GPU.

    python3 benchmarks/tools/decode_merge_ab.py --out decode_merge_ab.json [--rounds 3]
    TRITON_INTERPRET=1 python3 benchmarks/tools/decode_merge_ab.py --out /tmp/x.json --device cpu
                      # a smoke run: one small row through the interpreter, one call per timing
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import torch
import triton

import attngen
from attngen.bench.decode import CASES, DecodeCase
from attngen.families import decode as fd
from attngen.runtime import kvcache
from attngen.runtime.dispatch import forced_config


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    dev = args.device
    cpu = dev == "cpu"
    sync = (lambda: None) if cpu else torch.cuda.synchronize

    def bench(f) -> float:  # ms a call: do_bench's median on a GPU, one timed call on the CPU
        if not cpu:
            return triton.testing.do_bench(f, warmup=25, rep=100, return_mode="median")
        t = time.perf_counter()
        f()
        return (time.perf_counter() - t) * 1e3

    rows = []
    for c in [DecodeCase(1, 512, 4, 2, 64)] if cpu else CASES:
        d, B, S, hq, hkv = c.head_dim, c.batch, c.seqlen_k, c.heads_q, c.heads_kv
        g = torch.Generator(device=dev).manual_seed(S + hkv + d)
        q = torch.randn(B, 1, hq, d, device=dev, dtype=torch.bfloat16, generator=g)
        kc, vc = (torch.randn(B, S, hkv, d, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(2))
        lens = torch.full((B,), S, dtype=torch.int32, device=dev)
        kvcache._FAST.clear()
        attngen.attention_with_kvcache(q, kc, vc, lens)
        (plan, _, _), = kvcache._FAST.values()
        base, source, n = plan.config, plan.config_source, plan.num_splits
        row = {"row": c.name, "splits": n, "config": base.as_dict(), "source": source,
               "runtime": "fused" if fd.fused_merge(base, n) else "launch"}
        calls, outs = {}, {}
        for form in ("launch", "fused"):
            cfg = dataclasses.replace(base, merge=form)

            def call(cfg=cfg):
                with forced_config(decode=cfg):
                    return attngen.attention_with_kvcache(q, kc, vc, lens)

            outs[form] = call().clone()
            calls[form] = call
        sync()
        row["max_diff"] = (outs["launch"].float() - outs["fused"].float()).abs().max().item()
        kv_bytes = c.kv_bytes
        for _ in range(args.rounds):
            for form, call in calls.items():
                us = bench(call) * 1e3
                row.setdefault(f"{form}_us", []).append(round(us, 2))
                row.setdefault(f"{form}_gbps", []).append(round(kv_bytes / us / 1e3, 1))
                sync()
                calls_n = 2 if cpu else 200
                t = time.perf_counter()
                for _ in range(calls_n):
                    call()
                row.setdefault(f"{form}_host_us", []).append(round((time.perf_counter() - t) / calls_n * 1e6, 2))
                sync()
        print(json.dumps(row), flush=True)
        rows.append(row)
    doc = {"device": "cpu" if cpu else torch.cuda.get_device_name(), "rounds": args.rounds, "rows": rows}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
