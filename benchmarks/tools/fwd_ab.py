"""A/B of forward kernels on the GPU: the same cases over launch configs and codegen options,
each variant rendered from the current templates, timed side by side with cuDNN in one process
(median of triton.testing.do_bench; every output checked against SDPA in fp32 first).

    python3 benchmarks/tools/fwd_ab.py --out ab.json                         # configs only
    python3 benchmarks/tools/fwd_ab.py --out ab.json --switch head_chunks=split,pad --cases 7,8,9
    python3 benchmarks/tools/fwd_ab.py --out ab.json --configs default --config 64,64,4,2,q_regs=True,maxnreg=168

--switch name=v1,v2 renders each value of a codegen option (attngen.codegen.render.template_context
options; head_chunks: split head dims into two power-of-two column tiles, or pad to one).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from attngen.codegen.render import render
from attngen.kernels.common import MaskArgs, mask_kind
from attngen.families.fwd import attn_fwd
from attngen.runtime import loader
from attngen.spec import KernelSpec
from attngen.bench.probe import parse_config
from attngen.configs import FwdConfig, check_fwd, default_fwd_config

CASES = [  # name, B, Hq, Hkv, S, D, causal, window
    ("full B4 H16 S4096 hd128", 4, 16, 16, 4096, 128, False, None),
    ("causal B4 H16 S4096 hd128", 4, 16, 16, 4096, 128, True, None),
    ("causal B1 H16 S16384 hd128", 1, 16, 16, 16384, 128, True, None),
    ("gqa32/8 causal B1 S8192 hd128", 1, 32, 8, 8192, 128, True, None),
    ("causal B4 H32 S4096 hd64", 4, 32, 32, 4096, 64, True, None),
    ("window1024 gqa32/8 B1 S8192 hd128", 1, 32, 8, 8192, 128, True, 1024),
    ("causal B2 H16 S4096 hd256", 2, 16, 16, 4096, 256, True, None),
    ("causal B4 H32 S4096 hd96", 4, 32, 32, 4096, 96, True, None),
    ("causal B4 H32 S4096 hd80", 4, 32, 32, 4096, 80, True, None),
    ("causal B4 H16 S4096 hd192", 4, 16, 16, 4096, 192, True, None),
]
EXTRA = [FwdConfig(bm, bn, w, 3, tma=True, lazy_rescale=lazy)
         for bm, bn, w in ((64, 64, 4), (128, 128, 8), (128, 64, 8)) for lazy in (False, True)]
EXTRA += [FwdConfig(128, 64, 8, 3), FwdConfig(64, 64, 4, 2, tma=True), FwdConfig(128, 64, 8, 2, tma=True)]
# --configs default,knobs: the default with the TMA kernel's schedule knob switched (persistent
# programs per SM), also on the 128x128 tiles with lazy rescaling


def knob_variants(base: FwdConfig) -> list[FwdConfig]:
    r = dataclasses.replace
    big = FwdConfig(128, 128, 8, 2, tma=True, lazy_rescale=True)
    return [r(base, persistent=1), r(base, persistent=2), big, r(big, persistent=1)]


def qregs_variants(base: FwdConfig) -> list[FwdConfig]:
    """--configs qregs: the default and its neighbours with the Q tile held in registers (q_regs);
    without Q in shared memory a 64x64 tile with 2 stages fits three programs per SM."""
    r = dataclasses.replace
    out = [r(base, q_regs=True), r(base, q_regs=True, num_stages=2)]
    if base.block_m != 64 or base.block_n != 64:
        out += [FwdConfig(64, 64, 4, 3, tma=True, q_regs=True), FwdConfig(64, 64, 4, 2, tma=True, q_regs=True)]
    out += [FwdConfig(128, 128, 8, 2, tma=True, lazy_rescale=True, q_regs=True),
            FwdConfig(64, 128, 4, 2, tma=True, q_regs=True)]
    return out


def render_variant(spec: KernelSpec, switch: dict, tmp: Path):
    """The module of `spec` rendered with codegen options `switch`, loaded from `tmp`; the option
    "templates" (--templates) names another templates folder to render from."""
    switch = dict(switch)
    root = switch.pop("templates", None)
    tag = "_".join(f"{k}-{v}" for k, v in switch.items()) + ("_tree-" + Path(root).name if root else "")
    path = tmp / f"{spec.uri}__{tag}.py"
    path.write_text(render(spec, root=Path(root) if root else None, options=switch or None))
    return loader.load_path(path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default=None, help="comma-separated case indices")
    ap.add_argument("--switch", action="append", default=[], help="name=v1,v2,... (a template switch)")
    ap.add_argument("--configs", default="default,extra", help="default[,extra][,knobs][,qregs]")
    ap.add_argument("--templates", default=None,
                    help="another templates folder (e.g. a past commit's: git archive REV templates | tar -x -C DIR): "
                         "its modules are timed beside the build's, same launcher")
    ap.add_argument("--config", action="append", default=[],
                    help="M,N,W,S[,field=value...]: one more config (TMA on), e.g. 64,64,4,2,q_regs=True,maxnreg=168")
    args = ap.parse_args()
    variants = [{}] + ([{"templates": args.templates}] if args.templates else [])
    for sw in args.switch:
        name, values = sw.split("=", 1)
        variants = [{**v, name: val} for v in variants for val in values.split(",")]
    picks = [int(i) for i in args.cases.split(",")] if args.cases else range(len(CASES))
    tmp = Path(tempfile.mkdtemp(prefix="attngen_ab_"))
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
        row = {"case": name, "results": []}
        if not window:
            try:
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    fn = lambda: F.scaled_dot_product_attention(q, ke, ve, is_causal=causal)  # noqa: E731
                    row["cudnn_tflops"] = flops / triton.testing.do_bench(
                        fn, warmup=10, rep=50, return_mode="median") / 1e9
            except Exception as exc:  # noqa: BLE001
                row["cudnn_error"] = str(exc)[:200]
        out = torch.empty_like(q)
        lse = torch.empty(B, hq, S, device="cuda")
        cfgs = [default_fwd_config(spec, "cuda", S)]
        if "extra" in args.configs:
            cfgs += [c for c in EXTRA if c != cfgs[0]]
        if "knobs" in args.configs:
            cfgs += [c for c in knob_variants(cfgs[0]) if c not in cfgs]
        if "qregs" in args.configs:
            cfgs += [c for c in qregs_variants(cfgs[0]) if c not in cfgs]
        cfgs += [c for c in map(parse_config, args.config) if c not in cfgs]
        for sw in variants:
            try:
                mod = render_variant(spec, sw, tmp) if sw else loader.load(spec)
            except Exception as exc:  # noqa: BLE001
                row["results"].append({"switch": sw, "error": f"render: {exc}"[:300]})
                continue
            for cfg in cfgs:
                rec = {"switch": sw, "config": cfg.as_dict()}
                why = check_fwd(spec, cfg)
                if why:
                    rec["invalid"] = why
                    row["results"].append(rec)
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
                        if "cudnn_tflops" in row:
                            rec["ratio_cudnn"] = rec["tflops"] / row["cudnn_tflops"]
                except Exception as exc:  # noqa: BLE001
                    rec["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                row["results"].append(rec)
                print(name, rec, flush=True)
        rows.append(row)
        del q, k, v, ke, ve, out, lse
        torch.cuda.empty_cache()
        with open(args.out, "w") as fh:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "triton": triton.__version__, "switches": args.switch, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
