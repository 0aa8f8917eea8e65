"""A/B of the decode family's split merge on the GPU: the combine launch (the build) against the
split kernel's own merge (codegen option decode_combine=fused: the last program of each row to
finish merges the row's splits; one launch). Per row, alternated in one process, a few rounds:
do_bench median (µs, the whole call: every launch and the gaps between them), the host time of a
call (enqueue only, 200 calls before a synchronize) and the max |difference| of the outputs
(both forms merge in the same order: expected 0). bf16, hd128, contiguous cache, default config.

    python3 benchmarks/tools/decode_merge_ab.py --out decode_merge_ab.json [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

import torch
import triton

from attngen.codegen.render import render
from attngen.families import decode as fd
from attngen.kernels.common import MaskArgs
from attngen.runtime import loader
from attngen.spec import KernelSpec

ROWS = [  # name, B, Hq, Hkv, KV
    ("B1 KV4k gqa32/8", 1, 32, 8, 4096), ("B1 KV32k gqa32/8", 1, 32, 8, 32768),
    ("B1 KV128k gqa32/8", 1, 32, 8, 131072), ("B1 KV32k mha32", 1, 32, 32, 32768),
    ("B8 KV32k gqa32/8", 8, 32, 8, 32768),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="attngen_decode_merge_"))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for name, B, hq, hkv, S in ROWS:
        spec = KernelSpec("decode", "bf16", "sm90", 128, 128, hq // hkv, "causal")
        mods = {}
        for form in ("launch", "fused"):
            path = tmp / f"{spec.uri}_{form}.py"
            path.write_text(render(spec, options={"decode_combine": form}))
            mods[form] = loader.load_path(path)
        g = torch.Generator(device="cuda").manual_seed(S + hkv)
        q = torch.randn(B, 1, hq, 128, device="cuda", dtype=torch.bfloat16, generator=g)
        kc, vc = (torch.randn(B, S, hkv, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        lens = torch.full((B,), S, dtype=torch.int32, device="cuda")
        cfg = fd.default_decode_config(spec, "cuda")
        n, split_len = fd.splits(cfg, B, hkv, S, sms)
        ops, lps = fd.partial_shapes(B, hkv, n, fd.rows_tile(hq // hkv, 1), 128)
        op, lp = torch.empty(ops, device="cuda"), torch.empty(lps, device="cuda")
        margs = MaskArgs(1 / math.sqrt(128), 0.0, -1, 0, False)
        counter = torch.zeros(B * hkv, dtype=torch.int32, device="cuda")
        outs, runs = {}, {}
        for form, mod in mods.items():
            out = torch.empty(B, 1, hq, 128, device="cuda", dtype=torch.bfloat16)
            lse = torch.empty(B, hq, 1, device="cuda")
            las = fd.decode_launches(mod, spec, q, kc, vc, out, lse, op, lp, margs, cfg, n, split_len, lens,
                                     counter=counter if form == "fused" else None)
            runs[form] = lambda las=las: [la.run() for la in las]
            runs[form]()
            outs[form] = out
        torch.cuda.synchronize()
        row = {"row": name, "splits": n, "config": cfg.as_dict(),
               "max_diff": (outs["launch"].float() - outs["fused"].float()).abs().max().item(),
               "counter_zero": not bool(counter.any())}
        for _ in range(args.rounds):
            for form, run in runs.items():
                row.setdefault(f"{form}_us", []).append(
                    round(triton.testing.do_bench(run, warmup=25, rep=100, return_mode="median") * 1e3, 2))
                t = time.perf_counter()
                for _ in range(200):
                    run()
                row.setdefault(f"{form}_host_us", []).append(round((time.perf_counter() - t) / 200 * 1e6, 2))
                torch.cuda.synchronize()
        print(json.dumps(row), flush=True)
        rows.append(row)
        with open(args.out, "w") as fh:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                       "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
