"""A/B of the packed-document (varlen) kernels on the GPU: pointer kernels against the sm90
family's TMA kernels over a few launch configs, forward and backward-only, side by side in one
process (median of triton.testing.do_bench; every result checked first against attngen.problem's
reference of the documents on KV head 0 and its query heads).

    python3 benchmarks/tools/varlen_ab.py --out varlen_ab.json
    python3 benchmarks/tools/varlen_ab.py --out varlen_ab.json --only bwd --switch doc_guard=zero,desc
                                 # a codegen option (template_context): each value's modules with
                                 # the default TMA configs only
    python3 benchmarks/tools/varlen_ab.py --out varlen_ab.json --only fwd --config 64,64,4,3,q_regs=True
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

import torch
import triton

from attngen.families.bwd import attn_bwd_varlen
from attngen.kernels.common import MaskArgs
from attngen.families.fwd import attn_fwd_varlen
from attngen.problem import Problem
from attngen.runtime import loader
from attngen.spec import KernelSpec
from attngen.configs import WS_BWD_DEFAULT, WS_DEFAULT, BwdConfig, FwdConfig, check_bwd, check_fwd

sys.path.insert(0, str(Path(__file__).parent))
from fwd_ab import parse_config, render_variant  # noqa: E402

CASES = [  # name, document lengths, Hq, Hkv, D
    ("8 docs x 1024 causal gqa32/8 hd128", [1024] * 8, 32, 8, 128),
    ("8 uneven docs (8192 tokens) causal gqa32/8 hd128", [3000, 1500, 1000, 900, 700, 500, 300, 292], 32, 8, 128),
]
FWD = [FwdConfig(64, 64, 4, 3), FwdConfig(128, 64, 8, 3),
       FwdConfig(64, 64, 4, 3, tma=True), FwdConfig(64, 64, 4, 2, tma=True),
       FwdConfig(128, 64, 8, 3, tma=True), FwdConfig(64, 64, 4, 3, tma=True, lazy_rescale=True),
       FwdConfig(64, 64, 4, 3, tma=True, persistent=2), FwdConfig(128, 128, 8, 2, tma=True, lazy_rescale=True),
       FwdConfig(64, 64, 4, 4, tma=True), FwdConfig(64, 128, 4, 3, tma=True), FwdConfig(64, 128, 8, 3, tma=True),
       FwdConfig(64, 64, 8, 3, tma=True), FwdConfig(64, 32, 4, 4, tma=True), WS_DEFAULT]
BWD = [BwdConfig(64, 64, 4, 2, 128, 64, 8, 3), BwdConfig(64, 64, 4, 2, 128, 64, 8, 3, tma=True),
       BwdConfig(32, 64, 4, 2, 128, 64, 8, 3, tma=True), BwdConfig(64, 64, 4, 2, 64, 64, 4, 3, tma=True),
       BwdConfig(64, 128, 8, 2, 128, 64, 8, 3, tma=True), BwdConfig(64, 64, 4, 2, 128, 64, 8, 3, True, tma=True),
       WS_BWD_DEFAULT]  # the warp-specialized Gluon passes (the default for dense and packed hd128)


def reference(q, k, v, dout, cu, heads):
    """attngen.problem's float64 reference of the causal documents on query heads 0..heads-1 (KV
    head 0), as float32: out, and dq, dk, dv (dk / dv of KV head 0, its query heads summed)."""
    lens = [b - a for a, b in zip(cu[:-1], cu[1:])]
    problem = Problem.packed_documents(lens, lens, heads_q=heads, heads_kv=1, head_dim_qk=q.shape[2],
                                       head_dim_v=v.shape[2], causal=True)
    sub = [t[:, :n].detach().double().requires_grad_(True) for t, n in ((q, heads), (k, 1), (v, 1))]
    out, _ = problem.reference(*sub)
    grads = torch.autograd.grad(out, sub, dout[:, :heads].double())
    return out.detach().float(), [g.float() for g in grads]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", choices=("fwd", "bwd"), help="one direction only")
    ap.add_argument("--switch", default=None,
                    help="name=v1,v2,...: a codegen option (attngen.codegen.render.template_context); "
                         "each value's modules with the default TMA configs only")
    ap.add_argument("--config", action="append", default=[],
                    help="M,N,W,S[,field=value...]: forward configs (TMA on) measured after the default "
                         "TMA config, instead of the built-in list")
    args = ap.parse_args()
    switches = [{}]
    if args.switch:
        key, values = args.switch.split("=", 1)
        switches = [{key: val} for val in values.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="attngen_varlen_ab_"))
    rows = []
    for name, lens, H, Hkv, D in CASES:
        T = sum(lens)
        g = torch.Generator(device="cuda").manual_seed(T)
        q, dout = (torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        k, v = (torch.randn(T, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device="cuda")
        mx = max(lens)
        fspec = KernelSpec("fwd", "bf16", "sm90", D, D, H // Hkv, "causal", varlen=True)
        bspec = fspec.replace(family="bwd")
        for sw in switches:
            # a switched direction is rendered with the option; with --only, the other keeps the build
            fmod = render_variant(fspec, sw, tmp) if sw and args.only != "bwd" else loader.load(fspec)
            bmod = render_variant(bspec, sw, tmp) if sw and args.only != "fwd" else loader.load(bspec)
            rows.append(run_case(args, name, lens, q, k, v, dout, cu, mx, fspec, bspec, fmod, bmod, sw))
        with open(args.out, "w") as fh:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "triton": triton.__version__, "rows": rows}, fh, indent=1)


def run_case(args, name, lens, q, k, v, dout, cu, mx, fspec, bspec, fmod, bmod, sw):
    """One case with one pair of modules: forward and backward configs, checked, then timed."""
    T, H, D = q.shape
    Hkv = k.shape[1]
    fwd_cfgs, bwd_cfgs = (FWD, BWD) if not sw else ([FWD[2]], [BWD[1]])
    if args.config:
        fwd_cfgs = [FWD[2]] + [parse_config(c) for c in args.config]
    margs = MaskArgs(scale=1 / math.sqrt(D), softcap=0.0, window_left=1 << 30, window_right=0,
                     align_top_left=False)
    r = H // Hkv
    ref_out, ref_grads = reference(q, k, v, dout, cu.tolist(), r)
    flops = sum(4 * H * n * n / 2 * D for n in lens)
    row = {"case": name, "lens": lens, "switch": sw, "fwd": [], "bwd": []}
    out, lse = torch.empty_like(q), torch.empty(H, T, device="cuda")
    for cfg in fwd_cfgs if args.only != "bwd" else []:
        rec = {"config": cfg.as_dict()}
        why = check_fwd(fspec, cfg)
        if why:
            rec["error"] = f"invalid: {why}"
        else:
            try:
                out.fill_(float("nan"))
                run = lambda: attn_fwd_varlen(fmod, fspec, q, k, v, out, lse, cu, cu, mx, margs, cfg)  # noqa: E731
                run()
                torch.cuda.synchronize()
                rec["max_err"] = (out[:, :r].float() - ref_out).abs().max().item()
                if not rec["max_err"] < 2e-2:
                    rec["error"] = f"wrong result: max err {rec['max_err']}"
                else:
                    ms = triton.testing.do_bench(run, warmup=10, rep=50, return_mode="median")
                    rec["ms"], rec["tflops"] = ms, flops / ms / 1e9
            except Exception as exc:  # noqa: BLE001
                rec["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        row["fwd"].append(rec)
        print(name, sw, "fwd", rec, flush=True)
    attn_fwd_varlen(fmod, fspec, q, k, v, out, lse, cu, cu, mx, margs, FWD[0])
    for cfg in bwd_cfgs if args.only != "fwd" else []:
        rec = {"config": cfg.as_dict()}
        why = check_bwd(bspec, cfg)
        if why:
            rec["error"] = f"invalid: {why}"
        else:
            try:
                dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
                run = lambda: attn_bwd_varlen(bmod, bspec, q, k, v, out, dout, lse, dq, dk, dv, cu, cu,  # noqa: E731
                                              mx, mx, margs, cfg, False)
                run()
                torch.cuda.synchronize()
                # dK / dV of KV head 0 sum its r query heads
                errs = [(dq[:, :r].float() - ref_grads[0]).abs().max().item(),
                        (dk[:, :1].float() - ref_grads[1].sum(1, keepdim=True)).abs().max().item(),
                        (dv[:, :1].float() - ref_grads[2].sum(1, keepdim=True)).abs().max().item()]
                rec["max_err"] = max(errs)
                if not (rec["max_err"] < 5e-2 and torch.isfinite(dk).all() and torch.isfinite(dv).all()):
                    rec["error"] = f"wrong result: max err {rec['max_err']}"
                else:
                    ms = triton.testing.do_bench(run, warmup=10, rep=50, return_mode="median")
                    rec["ms"], rec["tflops"] = ms, 2.5 * flops / ms / 1e9
            except Exception as exc:  # noqa: BLE001
                rec["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        row["bwd"].append(rec)
        print(name, sw, "bwd", rec, flush=True)
    return row


if __name__ == "__main__":
    main()
