"""How many key slices a decode call should take: the split counts of a few rules side by side, GPU.

families/decode.splits() takes n = ceil(2 x SMs / rows) slices (rows = batch x KV heads), so the
programs overshoot two per SM by up to a row's worth. Per-SM balance says that costs: with P
programs of equal work on S SMs, the slowest SM runs ceil(P / S) of them, so the time goes as
ceil(P / S) / P. The one isolated pair so far (H100 tune log of session 59, MHA B1 KV32k hd128,
128-key steps, 4 warps, 1 stage): 9 slices (288 programs) 2079 GB/s, 8 slices (256) 2817.

This times, per shape, the runtime's own choice (num_splits=0: a tuned winner's count, else the
rule) against the rule's ceil and floor and the most balanced count between one and four programs
per SM, each through attention_with_kvcache(num_splits=n) (the config's block / warps / stages
kept), rounds alternated in one process, median of do_bench. GB/s of the cache read.

    python3 benchmarks/tools/decode_splits_ab.py --rounds 2 --out decode_splits.json
"""
import argparse
import json
import math

import torch
import triton

import attngen
from attngen.families import decode as fam_decode

# (B, Hq, Hkv, S, D): rows = B x Hkv of 32 (MHA B1), 64 (B8 GQA 32/8), 24, 40, 96, 128, 256
SHAPES = [(1, 32, 32, 32768, 128), (8, 32, 8, 32768, 128), (8, 32, 8, 32768, 64), (3, 32, 8, 16384, 128),
          (5, 32, 8, 16384, 128), (12, 32, 8, 8192, 128), (16, 32, 8, 16384, 128), (8, 32, 32, 8192, 128)]


def balance(p: int, sms: int) -> float:
    return p / (math.ceil(p / sms) * sms)


def candidates(rows: int, sms: int) -> dict:
    target = fam_decode.PROGRAMS_PER_SM * sms
    ceil_n = -(-target // rows)
    floor_n = max(1, target // rows)
    span = [n for n in range(1, 4 * sms // rows + 2) if sms <= rows * n <= 4 * sms] or [ceil_n]
    best = max(span, key=lambda n: (round(balance(rows * n, sms), 3), -abs(math.log(rows * n / target))))
    return {"ceil": ceil_n, "floor": floor_n, "balanced": best}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="decode_splits.json")
    args = ap.parse_args()
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    torch.set_grad_enabled(False)
    rows_out = []
    for B, Hq, Hkv, S, D in SHAPES:
        gen = torch.Generator(device=dev).manual_seed(B * 1000 + S)
        q = torch.randn(B, 1, Hq, D, device=dev, dtype=torch.bfloat16, generator=gen)
        kc = torch.randn(B, S, Hkv, D, device=dev, dtype=torch.bfloat16, generator=gen)
        vc = torch.randn(B, S, Hkv, D, device=dev, dtype=torch.bfloat16, generator=gen)
        sl = torch.full((B,), S, dtype=torch.int32, device=dev)
        rows = B * Hkv
        rules = {"runtime": 0, **candidates(rows, sms)}
        ref = attngen.attention_with_kvcache(q, kc, vc, sl, num_splits=0)
        us = {name: [] for name in rules}
        diff = {}
        for _ in range(args.rounds):
            for name, n in rules.items():
                out = attngen.attention_with_kvcache(q, kc, vc, sl, num_splits=n)
                diff[name] = (out.float() - ref.float()).abs().max().item()
                us[name].append(1e3 * triton.testing.do_bench(
                    lambda: attngen.attention_with_kvcache(q, kc, vc, sl, num_splits=n), warmup=25, rep=100,
                    return_mode="median"))
        nbytes = 2 * kc.numel() * kc.element_size()
        row = {"shape": [B, Hq, Hkv, S, D], "rows": rows, "sms": sms, "splits": rules,
               "programs_asked": {k: rows * n for k, n in rules.items() if n},
               "us": us, "GBps": {k: round(nbytes / (1e3 * min(v)), 1) for k, v in us.items()}, "max_diff": diff}
        print(json.dumps(row), flush=True)
        rows_out.append(row)
    info = {"gpu": torch.cuda.get_device_name(dev), "torch": torch.__version__, "triton": triton.__version__}
    with open(args.out, "w") as f:
        json.dump({**info, "rows": rows_out}, f, indent=1)


if __name__ == "__main__":
    main()
