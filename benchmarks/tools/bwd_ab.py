"""A/B of backward kernels on the GPU, backward only (preprocess, dK/dV, dQ), median of
triton.testing.do_bench; gradients checked against PyTorch (fp32 math) first. TFLOP/s count 2.5x
the forward's FLOPs (the backward's five matmuls).

    python3 benchmarks/tools/bwd_ab.py --out bwd_ab.json               # head-dim tiles: split vs pad
    python3 benchmarks/tools/bwd_ab.py --out bwd_ab.json --configs     # launch configs (pointer / TMA
                                                                 # kernels, dQ pass / TMA reduce-add)
    python3 benchmarks/tools/bwd_ab.py --out bwd_ab.json --switch head_chunks=split,pad
                                 # codegen options (attngen.codegen.render.template_context) on
                                 # the --configs cases with the default config
    python3 benchmarks/tools/bwd_ab.py --out bwd_ab.json --config 64,64,8,2 --config 128,64,8,2
                                 # the default against other dK/dV tiles / warps / stages
    python3 benchmarks/tools/bwd_ab.py --out bwd_ab.json --cases 5,8 --config 64,64,4,2 --also split_dkdv=True
                                 # each variant again with a BwdConfig field set
    python3 benchmarks/tools/bwd_ab.py --out bwd_ab.json --cases 9 --rounds 5 --config ...
                                 # the variants timed in turn, 5 rounds (ms: the median of the
                                 # rounds' medians; ms_rounds: each round's)
    python3 benchmarks/tools/bwd_ab.py --out bwd_ab.json --cases 0,2 --switch dkdv_order=grouped,lpt \
        --config 64,128,4,2,128,64,4,3,consumers=2,dq_consumers=2
                                 # the default, then each config under each codegen option (--config
                                 # keeps the fields it does not name from the case's default)
    python3 benchmarks/tools/bwd_ab.py --out bwd_ab.json --cases 8 --kernel-times --config ...
                                 # also each kernel's device time (torch.profiler, mean of 5
                                 # calls: kernel_us) and their sum (kernels_us), beside ms
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

from attngen.families.bwd import attn_bwd, bwd_launches
from attngen.kernels.common import MaskArgs
from attngen.families.fwd import attn_fwd
from attngen.runtime import loader
from attngen.spec import KernelSpec
from attngen.configs import BwdConfig, check_bwd, default_bwd_config, default_fwd_config

sys.path.insert(0, str(Path(__file__).parent))
from fwd_ab import render_variant  # noqa: E402

CASES = [  # name, B, Hq, Hkv, S, D, causal
    ("causal B4 H32 S4096 hd80", 4, 32, 32, 4096, 80, True),
    ("causal B4 H32 S4096 hd96", 4, 32, 32, 4096, 96, True),
    ("causal B4 H16 S4096 hd192", 4, 16, 16, 4096, 192, True),
]
CONFIG_CASES = [
    ("causal B4 H16 S4096 hd128", 4, 16, 16, 4096, 128, True),
    ("full B4 H16 S4096 hd128", 4, 16, 16, 4096, 128, False),
    ("gqa32/8 causal B1 S8192 hd128", 1, 32, 8, 8192, 128, True),
    ("causal B4 H32 S4096 hd64", 4, 32, 32, 4096, 64, True),
    ("causal B4 H32 S4096 hd96", 4, 32, 32, 4096, 96, True),
    ("causal B2 H16 S4096 hd256", 2, 16, 16, 4096, 256, True),
    ("window1024 gqa32/8 B1 S8192 hd128", 1, 32, 8, 8192, 128, True, 1024),
    ("window4096 gqa32/8 B1 S8192 hd128", 1, 32, 8, 8192, 128, True, 4096),
    ("causal B4 H16 S4096 hd192", 4, 16, 16, 4096, 192, True),
    ("causal B4 H32 S4096 hd80", 4, 32, 32, 4096, 80, True),
    ("causal B1 H16 S16384 hd128", 1, 16, 16, 16384, 128, True),
]


def config_variants(spec):
    """The default (pointer kernels, separate dQ pass) and the sm90 TMA kernels (BwdConfig.tma:
    every tile through descriptors; with atomic_dq the dQ tiles by TMA reduce-add) over a few dK/dV
    and dQ tiles."""
    d = default_bwd_config(spec)
    r = dataclasses.replace
    out = [d, r(d, tma=True), r(d, atomic_dq=True, tma=True)]
    for bm, bn, w, s in ((32, 64, 4, 2), (64, 128, 8, 2), (64, 64, 4, 3), (32, 64, 4, 3)):
        out.append(r(d, block_m=bm, block_n=bn, num_warps=w, num_stages=s, tma=True))
    out.append(r(d, block_m=64, block_n=128, num_warps=8, num_stages=2, atomic_dq=True, tma=True))
    out.append(r(d, block_m=32, block_n=64, num_warps=4, num_stages=2))
    for dbm, dbn, dw, ds in ((128, 64, 8, 2), (64, 64, 4, 3), (128, 32, 8, 3), (64, 32, 4, 2)):
        out.append(r(d, block_m=32, block_n=64, num_warps=4, num_stages=2, dq_block_m=dbm, dq_block_n=dbn,
                     dq_num_warps=dw, dq_num_stages=ds, tma=True))
    seen, uniq = set(), []
    for c in out:
        if c not in seen and check_bwd(spec, c) is None:
            seen.add(c)
            uniq.append(c)
    return uniq


def config_over(base: BwdConfig, text: str) -> BwdConfig:
    """--config M,N,W,S[,dqM,dqN,dqW,dqS][,field=value...]: `base` with these dK/dV (and dQ) tiles,
    warps, stages, then other fields by name."""
    ints = ("block_m", "block_n", "num_warps", "num_stages", "dq_block_m", "dq_block_n", "dq_num_warps",
            "dq_num_stages")
    parts = text.split(",")
    fields = dict(zip(ints, (int(p) for p in parts if "=" not in p)))
    for item in (p for p in parts if "=" in p):
        name, val = item.split("=", 1)
        fields[name] = {"True": True, "False": False}[val] if val in ("True", "False") else int(val)
    return dataclasses.replace(base, **fields)


def kernel_times(run, calls: int = 5) -> dict:
    """Device microseconds per call of each kernel `run` launches (torch.profiler, mean of `calls`
    calls): what the kernels take, without the host's launch path or gaps between launches."""
    run()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            run()
        torch.cuda.synchronize()
    out: dict = {}
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            out[ev.name] = out.get(ev.name, 0.0) + ev.device_time_total / calls
    return out


def kernel_stats(mod, spec, q, k, v, out, dout, lse, margs, cfg) -> dict:
    """Registers and spills of each compiled kernel of `cfg` (one more run of the backward)."""
    delta = torch.empty_like(lse)
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device) if cfg.atomic_dq else torch.empty_like(q)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    stats = {}
    for la in bwd_launches(mod, spec, q, k, v, out, dout, lse, delta, dq, dk, dv, margs, cfg, cfg.atomic_dq):
        kern = la.run()
        if kern is not None:
            part = {(True, False): "[dK]", (False, True): "[dV]"}.get(
                (la.values.get("WANT_DK"), la.values.get("WANT_DV")), "")
            stats[la.fn.__name__ + part] = {"regs": getattr(kern, "n_regs", None), "spills": getattr(kern, "n_spills", None)}
    return stats


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--configs", action="store_true", help="launch configs instead of head-dim tiles")
    ap.add_argument("--switch", action="append", default=[], help="name=v1,v2,... (a codegen option)")
    ap.add_argument("--cases", default=None, help="comma-separated case indices")
    ap.add_argument("--config", action="append", default=[],
                    help="M,N,W,S[,dqM,dqN,dqW,dqS][,field=value]: the default config with these dK/dV "
                         "(and dQ) tiles, warps, stages, fields (repeatable; the default itself is measured first)")
    ap.add_argument("--also", action="append", default=[],
                    help="field=value: every config variant measured again with this BwdConfig field "
                         "set (e.g. split_dkdv=True)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="time the variants in turn this many times (alternated in one process)")
    ap.add_argument("--kernel-times", action="store_true",
                    help="also each kernel's device time (torch.profiler over 5 calls, after the rounds)")
    args = ap.parse_args()
    switches = [{}]
    for sw in args.switch:
        key, values = sw.split("=", 1)
        switches = [{**v, key: val} for v in switches for val in values.split(",")]
    cases = CONFIG_CASES if (args.configs or args.switch or args.config) else CASES
    if args.cases:
        cases = [cases[int(i)] for i in args.cases.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="attngen_bwd_ab_"))
    rows = []
    for name, B, H, Hkv, S, D, causal, *win in cases:
        window = win[0] if win else None
        g = torch.Generator(device="cuda").manual_seed(D)
        q, dout = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        k, v = (torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        mask = "sliding_window" if window else "causal" if causal else "none"
        fspec = KernelSpec("fwd", "bf16", "sm90", D, D, H // Hkv, mask)
        bspec = fspec.replace(family="bwd")
        margs = MaskArgs(scale=1 / math.sqrt(D), softcap=0.0, window_left=window or -1,
                         window_right=0 if causal else -1, align_top_left=False)
        out, lse = torch.empty_like(q), torch.empty(B, H, S, device="cuda")
        attn_fwd(loader.load(fspec), fspec, q, k, v, out, lse, margs, default_fwd_config(fspec, "cuda", S))
        r = H // Hkv
        sub = [q[:1, :2].float(), k[:1, :2 // r or 1].float(), v[:1, :2 // r or 1].float()]
        sub = [sub[0]] + [t.repeat_interleave(2 // t.shape[1], 1) for t in sub[1:]]
        sub = [t.requires_grad_(True) for t in sub]
        if window:  # causal with `window` keys to the left: a dense boolean mask for the reference
            i = torch.arange(S, device="cuda")
            keep = (i[None, :] <= i[:, None]) & (i[None, :] >= i[:, None] - window)
            ref = torch.autograd.grad(F.scaled_dot_product_attention(*sub, attn_mask=keep), sub, dout[:1, :2].float())
            pairs = float(keep.sum())
        else:
            ref = torch.autograd.grad(F.scaled_dot_product_attention(*sub, is_causal=causal), sub, dout[:1, :2].float())
            pairs = S * S / (2 if causal else 1)
        flops = 2.5 * 4 * B * H * pairs * D
        if args.config:  # with --switch: the default, then every config under every codegen option
            d = default_bwd_config(bspec)
            variants = [({}, d)] + [(sw, config_over(d, c)) for sw in switches for c in args.config]
        elif args.switch:
            variants = [(sw, default_bwd_config(bspec)) for sw in switches]
        elif args.configs:
            variants = [({}, c) for c in config_variants(bspec)]
        else:
            variants = [({"head_chunks": p}, default_bwd_config(bspec)) for p in ("split", "pad")]
        for extra in args.also:
            field, value = extra.split("=", 1)
            value = {"True": True, "False": False}.get(value, value)
            value = int(value) if isinstance(value, str) and value.isdigit() else value
            variants += [(sw, dataclasses.replace(c, **{field: value})) for sw, c in variants]
        seen = []
        variants = [x for x in variants if not (x in seen or seen.append(x))]
        row = {"case": name, "results": []}
        timed = []  # (record, run) of the variants that passed the check
        for switch, cfg in variants:
            rec = {"switch": switch, "config": cfg.as_dict()}
            try:
                mod = render_variant(bspec, switch, tmp) if switch else loader.load(bspec)
                dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
                # the variant's own module, config and buffers bound now: the rounds below call each
                # run after the loop (a closure over the loop variables would time the last variant
                # every time -- as the --rounds runs of session 54 did)
                run = functools.partial(attn_bwd, mod, bspec, q, k, v, out, dout, lse, dq, dk, dv, margs, cfg, False)
                run()
                torch.cuda.synchronize()
                got = (dq[:1, :2], dk[:1, :1] if r > 1 else dk[:1, :2], dv[:1, :1] if r > 1 else dv[:1, :2])
                want = (ref[0], ref[1].sum(1, keepdim=True) if r > 1 else ref[1],
                        ref[2].sum(1, keepdim=True) if r > 1 else ref[2])
                # GQA: the reference's dK/dV of the first KV head sums its query heads (2 of r here)
                rec["max_err"] = max((a.float() - w).abs().max().item() for a, w in zip(got[:1], want[:1])) if r > 1 \
                    else max((a.float() - w).abs().max().item() for a, w in zip(got, want))
                if not rec["max_err"] < 5e-2:
                    rec["error"] = f"wrong result: max err {rec['max_err']}"
                else:
                    rec["kernels"] = kernel_stats(mod, bspec, q, k, v, out, dout, lse, margs, cfg)
                    timed.append((rec, run))
            except Exception as exc:  # noqa: BLE001
                # the end of the message: an InvalidConfig's reason follows the config's repr
                msg = str(exc)
                rec["error"] = f"{type(exc).__name__}: {msg if len(msg) <= 600 else msg[:150] + ' ... ' + msg[-450:]}"
            row["results"].append(rec)
        for _ in range(args.rounds):  # the variants in turn, each round
            for rec, run in timed:
                rec.setdefault("ms_rounds", []).append(
                    triton.testing.do_bench(run, warmup=10, rep=50, return_mode="median"))
        for rec, _ in timed:
            rec["ms"] = sorted(rec["ms_rounds"])[len(rec["ms_rounds"]) // 2]
            rec["tflops"] = flops / rec["ms"] / 1e9
        if args.kernel_times:
            for rec, run in timed:
                rec["kernel_us"] = kernel_times(run)
                rec["kernels_us"] = sum(rec["kernel_us"].values())
        for rec in row["results"]:
            print(name, rec, flush=True)
        rows.append(row)
        del q, k, v, dout, out, lse
        torch.cuda.empty_cache()
        with open(args.out, "w") as fh:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "triton": triton.__version__, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
