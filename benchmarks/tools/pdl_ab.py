"""A/B of programmatic dependent launch (Launch.pdl, templates/_pdl.py.jinja) on the GPU: the fp8
forward (attngen.attention(precision="fp8") on bf16 inputs, the prologue's time included) and
split-KV decode (attngen.attention_with_kvcache, contiguous and paged-16 caches), with PDL as the
launcher decides (on, sm90) or switched off. One process per variant and round (the plans are
built with the variant's launches), median of triton.testing.do_bench after 200 ms of GPU work.
Prints one JSON line {"pdl": bool, "rows": {case: {"us", "tflops" | "GB/s"}}}.
`--q-inside off` (fp8) keeps Q's quantization in the prologue instead of the Gluon attention
kernel (fwd_fp8.ws_quant_q), the A/B of that change.

    for r in 1 2; do for p in on off; do python3 benchmarks/tools/pdl_ab.py --family fp8 --pdl $p; done; done
    python3 benchmarks/tools/pdl_ab.py --family decode --pdl off
    python3 benchmarks/tools/pdl_ab.py --family fp8 --q-inside off
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import triton

import attngen
from attngen.devices import busy_gpu
from attngen.families import decode as fd
from attngen.families import fwd_fp8 as f8

FP8 = [(512, 128, False), (1024, 128, False), (2048, 128, False), (4096, 128, False), (16384, 128, False),
       (512, 128, True), (1024, 128, True), (2048, 128, True), (4096, 128, True), (8192, 128, True),
       (4096, 256, False), (4096, 256, True)]  # S, head dim, causal; B1 H16
DECODE = [(1, 32768, 32, 8), (8, 32768, 32, 8), (1, 131072, 32, 8), (1, 4096, 32, 8), (16, 16384, 32, 8),
          (1, 32768, 32, 32)]  # B, cache length, Hq, Hkv; hd128


def timed(fn) -> float:
    fn()
    busy_gpu(torch.device("cuda"), 200)
    return triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")


def fp8_rows() -> dict:
    res = {}
    for S, D, causal in FP8:
        g = torch.Generator(device="cuda").manual_seed(S + D)
        q, k, v = (torch.randn(1, 16, S, D, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        with torch.no_grad():
            ms = timed(lambda: attngen.attention(q, k, v, causal=causal, precision="fp8"))
        flops = 4 * 16 * S * S * D * (0.5 if causal else 1.0)
        res[f"{'causal' if causal else 'full'}-hd{D}-{S}"] = {"us": round(ms * 1e3, 2),
                                                             "tflops": round(flops / ms / 1e9, 1)}
    return res


def decode_rows() -> dict:
    res = {}
    for B, S, hq, hkv in DECODE:
        for page in (0, 16):
            g = torch.Generator(device="cuda").manual_seed(B + S)
            q = torch.randn(B, 1, hq, 128, generator=g, device="cuda", dtype=torch.bfloat16)
            shape = (B * S // page, page, hkv, 128) if page else (B, S, hkv, 128)
            kc, vc = (torch.randn(shape, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            table = (torch.randperm(B * S // page, device="cuda", dtype=torch.int32).view(B, S // page)
                     if page else None)
            lens = torch.full((B,), S, dtype=torch.int32, device="cuda")
            ms = timed(lambda: attngen.attention_with_kvcache(q, kc, vc, lens, block_table=table))
            res[f"B{B} KV{S} {hq}/{hkv} page{page}"] = {"us": round(ms * 1e3, 2),
                                                        "GB/s": round(2 * B * S * hkv * 128 * 2 / ms / 1e6, 1)}
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", choices=("fp8", "decode"), required=True)
    ap.add_argument("--pdl", choices=("on", "off"), default="on")
    ap.add_argument("--q-inside", choices=("on", "off"), default="on")
    args = ap.parse_args()
    if args.pdl == "off":
        f8.pdl = fd.pdl = lambda t: False
    if args.q_inside == "off":
        f8.ws_quant_q = lambda *a: False
    rows = fp8_rows() if args.family == "fp8" else decode_rows()
    for name, row in rows.items():
        print(name, row, file=sys.stderr)
    print(json.dumps({"family": args.family, "pdl": args.pdl == "on", "q_inside": args.q_inside == "on",
                      "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
