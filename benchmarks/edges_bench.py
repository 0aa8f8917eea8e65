"""Edge-shape benchmark (long contexts, many small sequences, the cost of 64-bit offsets).

    python3 benchmarks/edges_bench.py --out results.json

Times are medians of triton.testing.do_bench. Rows:
  long-context   B1 S=524,288 causal GQA 32/8 hd128 bf16 forward: attngen, cuDNN and FA2 (SDPA
                 backends; K/V expanded to 32 heads for them), TFLOP/s on the causal half
  many-docs      attngen.attention_varlen over 70,000 documents of 3 tokens (8 heads, hd64, causal):
                 us per call; SDPA on the same batch as a dense (70000, 8, 3, 64) call beside it
  offsets        causal B4 H16 S4096 hd128 forward with 64-bit sequence offsets forced on vs the
                 default (off unless a tensor passes 2^31 elements): what "only where needed" saves
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

import attngen
from attngen.kernels import fwd as kfwd
from attngen.runtime import api


def bench(fn, rep=100):
    return triton.testing.do_bench(fn, warmup=1 if rep < 10 else 25, rep=rep, return_mode="median")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rows = []
    S, Hq, Hkv, D = 524_288, 32, 8, 128
    q = torch.randn(1, Hq, S, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, Hkv, S, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    flops = 4 * Hq * S * S * D / 2
    ms = bench(lambda: attngen.attention(q, k, v, causal=True), rep=1)
    row = {"case": "long-context causal B1 S524288 Hq32/Hkv8 hd128 bf16 fwd", "attngen_ms": ms,
           "attngen_tflops": flops / ms / 1e9}
    ke, ve = k.repeat_interleave(Hq // Hkv, 1), v.repeat_interleave(Hq // Hkv, 1)
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION)):
        try:
            with sdpa_kernel(backend):
                ms_p = bench(lambda: F.scaled_dot_product_attention(q, ke, ve, is_causal=True), rep=1)
            row[f"{name}_ms"], row[f"{name}_tflops"] = ms_p, flops / ms_p / 1e9
        except Exception as exc:  # noqa: BLE001
            row[f"{name}_error"] = str(exc)[:200]
    rows.append(row)
    print(row, flush=True)
    del q, k, v, ke, ve
    torch.cuda.empty_cache()

    docs, L, H, Dd = 70_000, 3, 8, 64
    T = docs * L
    qp, kp, vp = (torch.randn(T, H, Dd, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cu = torch.arange(0, T + 1, L, dtype=torch.int32, device="cuda")
    us = bench(lambda: attngen.attention_varlen(qp, kp, vp, cu, cu, L, L, causal=True)) * 1e3
    qd, kd, vd = (t.view(docs, L, H, Dd).transpose(1, 2) for t in (qp, kp, vp))
    us_sdpa = bench(lambda: F.scaled_dot_product_attention(qd, kd, vd, is_causal=True)) * 1e3
    rows.append({"case": "many-docs varlen 70000 x 3 tokens, 8 heads, hd64, causal, fwd",
                 "attngen_us": us, "sdpa_dense_us": us_sdpa})
    print(rows[-1], flush=True)

    q, k, v = (torch.randn(4, 16, 4096, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    flops = 4 * 4 * 16 * 4096 * 4096 * 128 / 2
    res = {}
    for wide in (False, True):
        kfwd.needs_int64 = (lambda *t, w=wide: w)
        api._FWD.clear(), api._FAST.clear()
        ms = bench(lambda: attngen.attention(q, k, v, causal=True))
        res["64bit" if wide else "32bit"] = flops / ms / 1e9
    rows.append({"case": "offsets causal B4 H16 S4096 hd128 fwd TFLOP/s", **res})
    print(rows[-1], flush=True)
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "rows": rows}
    with open(args.out, "w") as fh:
        json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
