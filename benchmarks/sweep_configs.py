"""Launch-config sweep on the GPU: forward and backward tiles/warps/stages per head dim, to pick the
defaults in attngen/tuning/space.py until the Optuna tuner lands. A config that fails to compile or
runs out of resources is recorded with its error and skipped.

    PYTHONPATH=. python3 benchmarks/sweep_configs.py --out results.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import math

import torch
import triton

from attngen.kernels.bwd import attn_bwd
from attngen.kernels.common import MaskArgs
from attngen.kernels.fwd import attn_fwd
from attngen.runtime import loader
from attngen.spec import KernelSpec
from attngen.tuning.space import BwdConfig, FwdConfig, check_fwd


def flops_fwd(b, h, s, d, causal):
    return 4 * b * h * s * s * d / (2 if causal else 1)


def sweep(d: int, causal: bool, b: int, h: int, s: int, do_bwd: bool) -> list[dict]:
    spec = KernelSpec("fwd", "bf16", "sm90", d, d, 1, "causal" if causal else "none")
    mod = loader.load(spec)
    bmod = loader.load(spec.replace(family="bwd")) if do_bwd else None
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    dout = torch.randn_like(q)
    out, lse = torch.empty_like(q), torch.empty(b, h, s, device="cuda")
    mask = MaskArgs(scale=1 / math.sqrt(d), softcap=0.0, window_left=1 << 30,
                    window_right=0 if causal else 1 << 30, align_top_left=False)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    rows = []
    for bm, bn, w, st in itertools.product((64, 128), (64, 128), (4, 8), (2, 3, 4)):
        cfg = FwdConfig(bm, bn, w, st)
        row = {"kind": "fwd", "d": d, "causal": causal, **cfg.as_dict()}
        why = check_fwd(spec, cfg)
        if why:
            rows.append({**row, "error": why})
            continue
        try:
            fn = lambda: attn_fwd(mod, spec, q, k, v, out, lse, mask, cfg)  # noqa: E731
            fn()
            torch.cuda.synchronize()
            err = (out.float() - ref.float()).abs().max().item()
            ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
            rows.append({**row, "ms": ms, "tflops": flops_fwd(b, h, s, d, causal) / ms / 1e9, "max_err": err})
        except Exception as exc:  # compile failure / out of resources: record, go on
            rows.append({**row, "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
    if do_bwd:
        attn_fwd(mod, spec, q, k, v, out, lse, mask, FwdConfig(128, 64, 8, 3))
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        for bm, bn, w, st, det in itertools.product((32, 64), (64, 128), (4, 8), (1, 2), (False, True)):
            cfg = BwdConfig(bm, bn, w, st, 128 if bn == 128 else 64, bm, w, st, atomic_dq=not det)
            row = {"kind": "bwd", "d": d, "causal": causal, "deterministic": det, **cfg.as_dict()}
            try:
                fn = lambda: attn_bwd(bmod, spec.replace(family="bwd"), q, k, v, out, dout, lse,  # noqa: E731
                                      dq, dk, dv, mask, cfg, det)
                fn()
                torch.cuda.synchronize()
                ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
                rows.append({**row, "ms": ms, "tflops": 2.5 * flops_fwd(b, h, s, d, causal) / ms / 1e9})
            except Exception as exc:
                rows.append({**row, "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
    return rows


def _time(fn) -> float:
    fn()
    torch.cuda.synchronize()
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def sweep_bwd_split(d: int, b: int, h: int, s: int) -> list[dict]:
    """Deterministic backward, causal: the dK/dV kernel's config swept with the dQ kernel's fixed,
    then the dQ kernel's with the best dK/dV config (they are separate launches)."""
    spec = KernelSpec("bwd", "bf16", "sm90", d, d, 1, "causal")
    fmod, bmod = loader.load(spec.replace(family="fwd")), loader.load(spec)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    dout = torch.randn_like(q)
    out, lse = torch.empty_like(q), torch.empty(b, h, s, device="cuda")
    mask = MaskArgs(scale=1 / math.sqrt(d), softcap=0.0, window_left=1 << 30, window_right=0,
                    align_top_left=False)
    attn_fwd(fmod, spec.replace(family="fwd"), q, k, v, out, lse, mask, FwdConfig(128, 64, 8, 3))
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    flops = 2.5 * flops_fwd(b, h, s, d, True)
    rows, best = [], None
    base = BwdConfig(64, 64, 4, 2, 64, 64, 4, 2)
    for part, grid in (("dkdv", itertools.product((32, 64, 128), (64, 128), (4, 8), (1, 2, 3))),
                       ("dq", itertools.product((64, 128), (32, 64, 128), (4, 8), (1, 2, 3)))):
        for bm, bn, w, st in grid:
            if part == "dkdv":
                cfg = BwdConfig(bm, bn, w, st, base.dq_block_m, base.dq_block_n, base.dq_num_warps,
                                base.dq_num_stages)
            else:
                cfg = BwdConfig(best.block_m, best.block_n, best.num_warps, best.num_stages, bm, bn, w, st)
            row = {"kind": f"bwd_{part}", "d": d, "causal": True, **cfg.as_dict()}
            try:
                ms = _time(lambda: attn_bwd(bmod, spec, q, k, v, out, dout, lse, dq, dk, dv, mask,  # noqa: E731
                                            cfg, True))
                rows.append({**row, "ms": ms, "tflops": flops / ms / 1e9})
            except Exception as exc:  # out of resources / compile failure: record, go on
                rows.append({**row, "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
        ok = [r for r in rows if r["kind"] == f"bwd_{part}" and "tflops" in r]
        top = max(ok, key=lambda r: r["tflops"])
        print(f"d{d} best {part}: {top['tflops']:.0f} TFLOP/s {top}", flush=True)
        best = BwdConfig(**{kk: top[kk] for kk in BwdConfig.__dataclass_fields__})
    return rows


def sweep_swa(b: int, h: int, hkv: int, s: int, window: int) -> list[dict]:
    spec = KernelSpec("fwd", "bf16", "sm90", 128, 128, h // hkv, "sliding_window")
    mod = loader.load(spec)
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, h, s, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(b, hkv, s, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    out, lse = torch.empty_like(q), torch.empty(b, h, s, device="cuda")
    mask = MaskArgs(scale=1 / math.sqrt(128), softcap=0.0, window_left=window - 1, window_right=0,
                    align_top_left=False)
    pairs = sum(min(i + 1, window) for i in range(s))
    rows = []
    for bm, bn, w, st in itertools.product((64, 128), (32, 64, 128), (4, 8), (2, 3, 4)):
        cfg = FwdConfig(bm, bn, w, st)
        row = {"kind": "fwd_swa", "window": window, **cfg.as_dict()}
        try:
            ms = _time(lambda: attn_fwd(mod, spec, q, k, v, out, lse, mask, cfg))  # noqa: E731
            rows.append({**row, "ms": ms, "tflops": 4 * b * h * pairs * 128 / ms / 1e9})
        except Exception as exc:
            rows.append({**row, "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
    top = max((r for r in rows if "tflops" in r), key=lambda r: r["tflops"])
    print(f"best swa{window}: {top['tflops']:.0f} TFLOP/s {top}", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="sweep.json")
    ap.add_argument("--split", action="store_true",
                    help="sweep the backward's two kernels separately, and the SWA forward")
    args = ap.parse_args()
    if args.split:
        rows = []
        for part in (lambda: sweep_bwd_split(128, 4, 16, 4096), lambda: sweep_swa(1, 32, 8, 8192, 1024)):
            rows += part()
            json.dump({"gpu": torch.cuda.get_device_name(), "triton": triton.__version__, "rows": rows},
                      open(args.out, "w"), indent=1)
        return
    rows = []
    for d, causal, h, do_bwd in ((128, True, 16, True), (64, True, 32, True), (128, False, 16, False)):
        rows += sweep(d, causal, 4, h, 4096, do_bwd=do_bwd)
        json.dump({"gpu": torch.cuda.get_device_name(), "triton": triton.__version__, "rows": rows},
                  open(args.out, "w"), indent=1)
        print(f"swept d={d} causal={causal}: {len(rows)} rows so far", flush=True)
    for kind in ("fwd", "bwd"):
        for d in (64, 128):
            for causal in (True, False):
                ok = [r for r in rows if r["kind"] == kind and r["d"] == d and r["causal"] == causal and "tflops" in r]
                for det in ((False, True) if kind == "bwd" else (None,)):
                    sel = [r for r in ok if r.get("deterministic") == det]
                    if sel:
                        best = max(sel, key=lambda r: r["tflops"])
                        print(f"{kind} d{d} causal={causal} det={det}: best {best['tflops']:.0f} TFLOP/s {best}")
    print(f"{sum('error' in r for r in rows)} configs failed or invalid")


if __name__ == "__main__":
    main()
