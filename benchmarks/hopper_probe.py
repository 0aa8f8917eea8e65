"""sm90 family probe: the forward's TMA / warp-specialized kernel against the pointer kernel (the
sm80 code) and cuDNN, per case and config, in one process.

    python3 benchmarks/hopper_probe.py --out results.json

Every config is checked against SDPA (math backend, fp32) before it is timed; a config that fails
to compile or launch is recorded with its error. Times: median of triton.testing.do_bench.
TFLOP/s count attended pairs only (causal: half).
"""

from __future__ import annotations

import argparse
import json
import math

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from attngen.kernels.common import MaskArgs, mask_kind
from attngen.kernels.fwd import attn_fwd
from attngen.runtime import loader
from attngen.spec import KernelSpec
from attngen.tuning.space import FwdConfig, check_fwd, default_fwd_config

CASES = [  # name, B, Hq, Hkv, S, D, causal, window
    ("full B4 H16 S4096 hd128", 4, 16, 16, 4096, 128, False, None),
    ("causal B4 H16 S4096 hd128", 4, 16, 16, 4096, 128, True, None),
    ("causal B1 H16 S16384 hd128", 1, 16, 16, 16384, 128, True, None),
    ("gqa32/8 causal B1 S8192 hd128", 1, 32, 8, 8192, 128, True, None),
    ("causal B4 H32 S4096 hd64", 4, 32, 32, 4096, 64, True, None),
    ("window1024 gqa32/8 B1 S8192 hd128", 1, 32, 8, 8192, 128, True, 1024),
    ("causal B2 H16 S4096 hd256", 2, 16, 16, 4096, 256, True, None),
    ("causal B4 H32 S4096 hd96", 4, 32, 32, 4096, 96, True, None),
]
T, Fa = True, False
TMA = [FwdConfig(bm, bn, w, s, tma=True, warp_specialize=ws)
       for bm, bn, w in ((128, 64, 8), (128, 128, 8), (64, 64, 4)) for s in (2, 3) for ws in (Fa, T)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default=None, help="comma-separated case indices")
    args = ap.parse_args()
    picks = [int(i) for i in args.cases.split(",")] if args.cases else range(len(CASES))
    rows = []
    for ci in picks:
        name, B, hq, hkv, S, D, causal, window = CASES[ci]
        g = torch.Generator(device="cuda").manual_seed(ci)
        q = torch.randn(B, hq, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k = torch.randn(B, hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
        v = torch.randn(B, hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
        wsz = (window - 1, 0) if window else (-1, -1)
        mask, wl, wr = mask_kind(causal, wsz)
        spec = KernelSpec("fwd", "bf16", "sm90", D, D, hq // hkv, mask)
        mod = loader.load(spec)
        margs = MaskArgs(scale=1 / math.sqrt(D), softcap=0.0, window_left=wl, window_right=wr,
                         align_top_left=False)
        pairs = S * S if not causal else (S * (S + 1) / 2 if not window else S * window)
        flops = 4 * B * hq * pairs * D
        ke, ve = k.repeat_interleave(hq // hkv, 1), v.repeat_interleave(hq // hkv, 1)
        amask = None
        if window:
            i = torch.arange(S, device="cuda")
            amask = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - window)
        ref = F.scaled_dot_product_attention(q[:1, :2].float(), ke[:1, :2].float(), ve[:1, :2].float(),
                                             is_causal=causal and amask is None, attn_mask=amask)
        row = {"case": name, "configs": []}
        try:
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                fn = (lambda: F.scaled_dot_product_attention(q, ke, ve, is_causal=causal)) if not window else None
                if fn:
                    ms = triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")
                    row["cudnn_tflops"] = flops / ms / 1e9
        except Exception as exc:  # noqa: BLE001
            row["cudnn_error"] = str(exc)[:200]
        out = torch.empty_like(q)
        lse = torch.empty(B, hq, S, device="cuda")
        for cfg in [default_fwd_config(spec, "cuda", S)] + TMA:
            rec = {"config": cfg.as_dict()}
            why = check_fwd(spec, cfg)
            if why:
                rec["invalid"] = why
                row["configs"].append(rec)
                continue
            try:
                run = lambda: attn_fwd(mod, spec, q, k, v, out, lse, margs, cfg)  # noqa: E731
                out.fill_(float("nan"))
                run()
                torch.cuda.synchronize()
                err = (out[:1, :2].float() - ref).abs().max().item()
                rec["max_err"] = err
                if not err < 2e-2:
                    rec["error"] = f"wrong result: max err {err}"
                else:
                    ms = triton.testing.do_bench(run, warmup=10, rep=50, return_mode="median")
                    rec["tflops"] = flops / ms / 1e9
            except Exception as exc:  # noqa: BLE001
                rec["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            row["configs"].append(rec)
            print(name, rec, flush=True)
        ok = [c for c in row["configs"] if "tflops" in c]
        if ok:
            best = max(ok, key=lambda c: c["tflops"])
            row["best"] = best
            row["default"] = row["configs"][0].get("tflops")
        rows.append(row)
        print("==", name, "cudnn", row.get("cudnn_tflops"), "default", row.get("default"),
              "best", row.get("best"), flush=True)
        del q, k, v, ke, ve, out, lse
        torch.cuda.empty_cache()
    with open(args.out, "w") as fh:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "triton": triton.__version__, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
