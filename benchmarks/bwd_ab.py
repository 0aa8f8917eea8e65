"""A/B of the backward's head-dim tiles on the GPU: each case's backward (preprocess, dK/dV, dQ)
with the head dim held as two power-of-two tiles (split) or one padded tile (pad), same inputs and
config, median of triton.testing.do_bench; gradients checked against PyTorch (fp32 math) first.
TFLOP/s count 2.5x the forward's FLOPs (the backward's five matmuls).

    python3 benchmarks/bwd_ab.py --out bwd_ab.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

from attngen.kernels.bwd import attn_bwd
from attngen.kernels.common import MaskArgs
from attngen.kernels.fwd import attn_fwd
from attngen.runtime import loader
from attngen.spec import KernelSpec
from attngen.tuning.space import default_bwd_config, default_fwd_config

sys.path.insert(0, str(Path(__file__).parent))
from fwd_ab import render_variant  # noqa: E402

CASES = [  # name, B, H, S, D (causal, GQA 1)
    ("causal B4 H32 S4096 hd80", 4, 32, 4096, 80),
    ("causal B4 H32 S4096 hd96", 4, 32, 4096, 96),
    ("causal B4 H16 S4096 hd192", 4, 16, 4096, 192),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="attngen_bwd_ab_"))
    rows = []
    for name, B, H, S, D in CASES:
        g = torch.Generator(device="cuda").manual_seed(D)
        q, k, v, dout = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
                         for _ in range(4))
        fspec = KernelSpec("fwd", "bf16", "sm90", D, D, 1, "causal")
        bspec = fspec.replace(family="bwd")
        margs = MaskArgs(scale=1 / math.sqrt(D), softcap=0.0, window_left=-1, window_right=0,
                         align_top_left=False)
        out, lse = torch.empty_like(q), torch.empty(B, H, S, device="cuda")
        attn_fwd(loader.load(fspec), fspec, q, k, v, out, lse, margs, default_fwd_config(fspec, "cuda", S))
        sub = [t[:1, :2].float().requires_grad_(True) for t in (q, k, v)]
        ref = torch.autograd.grad(F.scaled_dot_product_attention(*sub, is_causal=True), sub, dout[:1, :2].float())
        flops = 2.5 * 4 * B * H * (S * S / 2) * D
        cfg = default_bwd_config(bspec)
        row = {"case": name, "config": cfg.as_dict(), "results": []}
        for policy in ("split", "pad"):
            rec = {"head_chunks": policy}
            try:
                mod = render_variant(bspec, {"head_chunks": policy}, tmp)
                dq, dk, dv = (torch.full_like(q, float("nan")) for _ in range(3))
                run = lambda: attn_bwd(mod, bspec, q, k, v, out, dout, lse, dq, dk, dv, margs, cfg, True)  # noqa: E731
                run()
                torch.cuda.synchronize()
                rec["max_err"] = max((a[:1, :2].float() - r).abs().max().item() for a, r in zip((dq, dk, dv), ref))
                if not rec["max_err"] < 5e-2:
                    rec["error"] = f"wrong result: max err {rec['max_err']}"
                else:
                    ms = triton.testing.do_bench(run, warmup=10, rep=50, return_mode="median")
                    rec["ms"], rec["tflops"] = ms, flops / ms / 1e9
            except Exception as exc:  # noqa: BLE001
                rec["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            row["results"].append(rec)
            print(name, rec, flush=True)
        rows.append(row)
        with open(args.out, "w") as fh:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "triton": triton.__version__, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
