"""Edge-shape benchmark (issue 9: 64-bit addressing and grid limits).

    python3 benchmarks/edges_bench.py --out edges.json [--commit SHA] [--rows offsets,docs,long]

One process, bf16, causal; the JSON holds the commit, GPU, torch and triton versions and, per
attngen row, the kernels it launched with their programs. Rows, quick ones first (the JSON is
rewritten after each, so a crash keeps what ran):
  offsets  the pointer kernels (forward _attn_fwd; backward preprocess, dK/dV, dQ) with 64-bit
           sequence offsets (OFFS_64) forced off vs on, hd128 H16 at B16 S1024 and B64 S256, with
           the tiles the runtime gives them on a call past 2^31 elements: what the 64-bit path
           costs where no tensor needs it (the runtime turns it on only there; the Gluon and TMA
           kernels address through descriptors and never take it). do_bench medians.
  docs     attngen.attention_varlen over 70,000 documents of 3 tokens (8 heads, hd64), forward
           and forward+backward, us per call; SDPA on the same batch as a dense (70000, 8, 3, 64)
           call beside it. do_bench medians.
  long     B1 S=524,288 Hq32/Hkv8 hd128, bshd (q has 2^31 elements: the 64-bit paths), forward
           and backward TFLOP/s (causal half; backward 2.5x the forward's FLOPs) for attngen,
           cuDNN and FA2 (SDPA backends on (B, H, S, D) views of the same bshd tensors, K/V
           expanded to 32 heads). Seconds per call, so one timed call each (CUDA events) after a
           warm-up: a whole call for attngen (compiles) and cuDNN (its plan is per shape), a
           4096-token call for FA2 (loads its kernels). Estimated (not yet run) at two to three
           minutes on an H200: a forward takes ~5 s, a backward ~15-25 s.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

import attngen
from attngen.bench.cases import FWDBWD_FLOP_FACTOR
from attngen.bench.report import git_commit
from attngen.families import bwd as kbwd
from attngen.families import fwd as kfwd
from attngen.problem import Problem
from attngen.runtime import api, loader, plan, validate
from attngen.kernels.launch import CompiledLaunch
from attngen.configs import bwd_triton_fallback, default_bwd_config, default_fwd_config, triton_fallback

BF16 = torch.bfloat16
DEV = "cuda"
BWD_FACTOR = FWDBWD_FLOP_FACTOR - 1.0  # backward FLOPs per forward FLOP


def causal_flops(batch: int, heads: int, seqlen: int, head_dim: int) -> float:
    """Forward FLOPs of causal attention: 4 * D per (query, key) pair and head, half the pairs (the
    benchmark convention of attngen.problem.Problem.flops)."""
    return Problem(batch, heads, heads, seqlen, seqlen, head_dim, head_dim, causal=True).flops(exact=False)


def bench_ms(fn, rep: int = 100) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=rep, return_mode="median")


def once_ms(fn) -> float:
    """One call timed with CUDA events (calls of seconds: one is enough, and all there is time for)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


# --------------------------------------------------------------------------------------------------
# offsets: the pointer kernels with OFFS_64 off vs on


def _pointer_launches(B: int, H: int, S: int, D: int) -> dict[str, list]:
    """{"fwd": [Launch], "bwd": [Launch, ...]} of the pointer kernels on fresh tensors, with the
    configs the runtime gives them on a wide call (the sm90 defaults' Triton fallback, no TMA)."""
    q, k, v, dout = (torch.randn(B, H, S, D, device=DEV, dtype=BF16) for _ in range(4))
    out, lse = torch.empty_like(q), torch.empty(B, H, S, device=DEV)
    mask = validate.make_options(D, True, (-1, -1), 0.0, None, "bottom_right", "bhsd").mask_args
    spec, _ = plan.kernel_spec("fwd", BF16, q.device, D, D, 1, "causal", 0.0, False)
    cfg = dataclasses.replace(triton_fallback(default_fwd_config(spec), spec), tma=False, q_regs=False)
    fwd = kfwd.fwd_launches(loader.load(spec), spec, q, k, v, out, lse, mask, cfg, gluon=False)
    for la in fwd:  # the backward reads a real O and LSE
        la.run()
    bspec = spec.replace(family="bwd")
    bcfg = dataclasses.replace(bwd_triton_fallback(default_bwd_config(bspec)), tma=False)
    grads = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    bwd = kbwd.bwd_launches(loader.load(bspec), bspec, q, k, v, out, dout, lse, torch.empty_like(lse),
                            *grads, mask, bcfg, False, gluon=False)
    return {"fwd": fwd, "bwd": bwd}


OUTPUTS = {"fwd": ("Out", "Lse"), "bwd": ("DQ", "DK", "DV")}  # what the last launch of each part writes


def offsets_row(B: int, H: int, S: int, D: int = 128) -> dict:
    launches = _pointer_launches(B, H, S, D)
    flops = causal_flops(B, H, S, D)
    row = {"case": f"offsets causal B{B} H{H} S{S} hd{D}: pointer kernels, OFFS_64 off vs on",
           "kernels": {p: [la.fn.__name__ for la in ls] for p, ls in launches.items()}}
    for part, ls in launches.items():
        written = []  # the outputs of the last call of each variant: the same bits expected
        for wide in (False, True):
            runs = []
            for la in ls:
                la.values["OFFS_64"] = wide
                runs.append((CompiledLaunch(la, torch.device(DEV, torch.cuda.current_device()), False),
                             la.values))

            def call():
                for cl, tensors in runs:
                    cl(tensors, True)

            ms = bench_ms(call)
            tag = f"{part}_{'64' if wide else '32'}bit"
            row[f"{tag}_ms"] = ms
            row[f"{tag}_tflops"] = flops * (1.0 if part == "fwd" else BWD_FACTOR) / ms / 1e9
            written.append([ls[-1].values[n].clone() for n in OUTPUTS[part]])
        row[f"{part}_64bit_cost"] = row[f"{part}_64bit_ms"] / row[f"{part}_32bit_ms"] - 1.0
        row[f"{part}_same_bits"] = all(torch.equal(a, b) for a, b in zip(*written))
    return row


# --------------------------------------------------------------------------------------------------
# docs: many small sequences


def docs_row(docs: int = 70_000, L: int = 3, H: int = 8, D: int = 64) -> dict:
    T = docs * L
    q, k, v, dout = (torch.randn(T, H, D, device=DEV, dtype=BF16) for _ in range(4))
    cu = torch.arange(0, T + 1, L, dtype=torch.int32, device=DEV)
    leaves = [t.requires_grad_(True) for t in (q, k, v)]
    api.clear_plans()
    out = attngen.attention_varlen(*leaves, cu, cu, L, L, causal=True)
    torch.autograd.grad(out, leaves, dout)
    row = {"case": f"many-docs varlen {docs} x {L} tokens, {H} heads, hd{D}, causal",
           "kernels": api.launched()}
    with torch.no_grad():
        row["attngen_fwd_us"] = bench_ms(lambda: attngen.attention_varlen(q, k, v, cu, cu, L, L, causal=True)) * 1e3

    def fwdbwd():
        torch.autograd.grad(attngen.attention_varlen(*leaves, cu, cu, L, L, causal=True), leaves, dout)

    row["attngen_fwdbwd_us"] = bench_ms(fwdbwd) * 1e3
    dense = [t.detach().view(docs, L, H, D).transpose(1, 2).requires_grad_(True) for t in (q, k, v)]
    ddout = dout.view(docs, L, H, D).transpose(1, 2)
    # SDPA's default backend on the dense (docs, H, L, D) batch; one it cannot run is recorded
    # (the H200's cuDNN backward fails on this shape)
    for name, fn in (("sdpa_dense_fwd_us", lambda: F.scaled_dot_product_attention(
                          *(t.detach() for t in dense), is_causal=True)),
                     ("sdpa_dense_fwdbwd_us", lambda: torch.autograd.grad(
                          F.scaled_dot_product_attention(*dense, is_causal=True), dense, ddout))):
        try:
            row[name] = bench_ms(fn) * 1e3
        except Exception as exc:  # noqa: BLE001
            row[name.replace("_us", "_error")] = str(exc)[:200]
    return row


# --------------------------------------------------------------------------------------------------
# long: one bshd sequence past 2^31 elements, beside cuDNN and FA2


def _attngen(q, k, v):
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    return leaves, lambda: attngen.attention(*leaves, causal=True, layout="bshd")


def _sdpa(backend):
    def prepare(q, k, v):
        group = q.shape[2] // k.shape[2]
        leaves = [q.detach().requires_grad_(True), k.repeat_interleave(group, 2).requires_grad_(True),
                  v.repeat_interleave(group, 2).requires_grad_(True)]

        def forward():
            with sdpa_kernel(backend):
                views = (t.transpose(1, 2) for t in leaves)
                return F.scaled_dot_product_attention(*views, is_causal=True).transpose(1, 2)

        return leaves, forward

    return prepare


# name -> (prepare(q, k, v) -> (leaves, forward), warm-up: "full" call or a 4096-token "short" one)
PROVIDERS = {
    "attngen": (_attngen, "full"),
    "cudnn": (_sdpa(SDPBackend.CUDNN_ATTENTION), "full"),
    "fa2": (_sdpa(SDPBackend.FLASH_ATTENTION), "short"),
}


def long_row(S: int = 524_288, Hq: int = 32, Hkv: int = 8, D: int = 128) -> dict:
    q, dout = (torch.randn(1, S, Hq, D, device=DEV, dtype=BF16) for _ in range(2))
    k, v = (torch.randn(1, S, Hkv, D, device=DEV, dtype=BF16) for _ in range(2))
    flops = causal_flops(1, Hq, S, D)
    row = {"case": f"long-context causal B1 S{S} Hq{Hq}/Hkv{Hkv} hd{D} bf16 bshd",
           "q_elements": q.numel()}
    for name, (prepare, warm) in PROVIDERS.items():
        t0 = time.perf_counter()
        api.clear_plans()
        try:
            if warm == "short":
                leaves, forward = prepare(*(t[:, :4096] for t in (q, k, v)))
                torch.autograd.grad(forward(), leaves, dout[:, :4096])
            leaves, forward = prepare(q, k, v)
            if warm == "full":
                torch.autograd.grad(forward(), leaves, dout)
            res = {}
            res["out"] = None

            def fwd():
                res["out"] = forward()

            fwd_ms = once_ms(fwd)
            bwd_ms = once_ms(lambda: torch.autograd.grad(res["out"], leaves, dout))
            row[f"{name}_fwd_ms"], row[f"{name}_bwd_ms"] = fwd_ms, bwd_ms
            row[f"{name}_fwd_tflops"] = flops / fwd_ms / 1e9
            row[f"{name}_bwd_tflops"] = flops * BWD_FACTOR / bwd_ms / 1e9
            row[f"{name}_fwdbwd_tflops"] = flops * FWDBWD_FLOP_FACTOR / (fwd_ms + bwd_ms) / 1e9
            if name == "attngen":
                row["kernels"] = api.launched()
        except Exception as exc:  # noqa: BLE001 -- a provider that cannot run is recorded
            row[f"{name}_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        row[f"{name}_seconds"] = round(time.perf_counter() - t0, 1)
        res = leaves = forward = None
        torch.cuda.empty_cache()
        print(name, {k_: v_ for k_, v_ in row.items() if k_.startswith(name)}, flush=True)
    return row


ROWS = {
    "offsets": lambda: [offsets_row(16, 16, 1024), offsets_row(64, 16, 256)],
    "docs": lambda: [docs_row()],
    "long": lambda: [long_row()],
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", default=None, help="the commit measured (default: git rev-parse HEAD)")
    ap.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, of {', '.join(ROWS)}")
    args = ap.parse_args(argv)
    wanted = [r for r in args.rows.split(",") if r]
    unknown = [r for r in wanted if r not in ROWS]
    if unknown:
        ap.error(f"--rows: unknown {unknown} (known: {', '.join(ROWS)})")
    result = {"commit": args.commit or git_commit() or "unknown (no git checkout)", "gpu": torch.cuda.get_device_name(),
              "torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton.__version__,
              "rows": []}
    t0 = time.perf_counter()
    for name in wanted:
        for row in ROWS[name]():
            result["rows"].append(row)
            print(json.dumps(row), flush=True)
            result["seconds"] = round(time.perf_counter() - t0, 1)
            Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
