"""Context-parallel scaling on one multi-GPU host (NCCL): tokens/s and TFLOP/s per GPU against the
number of GPUs, attngen inside torch's ring (attngen.distributed.attention) beside torch's own
context parallelism with SDPA (cuDNN and flash backends) on the same mesh, the same zig-zag
layout (torch's head-tail load balancing) and the same shards.

    python3 benchmarks/tools/cp_scaling.py --gpus 1,2,4,8 --seqlen-per-gpu 16384,65536,131072 \
        --out benchmarks/results/h100x8_cp_scaling_<date>.json
    python3 benchmarks/tools/cp_scaling.py --plot benchmarks/results/h100x8_cp_scaling_<date>.json
                                                        # draws the .png beside it

Each GPU count runs in its own spawned group of processes (one per GPU). Every row is timed with
CUDA events (median of --iters after --warmup, each iteration between barriers; the slowest rank's
time). One GPU also runs attngen.attention at the per-GPU length (the floor's baseline: per-GPU
TFLOP/s at 8 GPUs >= 85% of one GPU's at the same per-GPU sequence length). FLOPs as `attngen
bench`: forward 2 * (Dqk + Dv) * B * Hq * pairs, pairs = S^2 / 2 (causal) or S^2 of the GLOBAL
sequence, per GPU = / W; fwdbwd = 3.5 x forward. Correctness, before timing: attngen-in-CP against
torch CP with cuDNN on every rank's shard (output and gradients, max |diff|) at every length, and
(--check-max) the gathered output and gradients against single-GPU attngen on the full sequence.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

PROVIDERS = ("attngen-cp", "torch-cp-cudnn", "torch-cp-flash")
MODES = ("fwd", "fwdbwd")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def flops_per_gpu(a, seqlen_total: int, world: int, mode: str) -> float:
    pairs = seqlen_total * seqlen_total / (2 if a.causal else 1)
    fwd = 2 * (2 * a.head_dim) * a.batch * a.heads * pairs / world
    return fwd * (3.5 if mode == "fwdbwd" else 1.0)


class TorchCP:
    """torch's context parallelism on local shards: SDPA inside `context_parallel(mesh, ...)`, whose
    monkey-patched scaled_dot_product_attention sends the shards around the ring. The context
    manager is entered with a dummy buffer of 2W tokens so that it turns on its head-tail load
    balancing, which is the layout of the shards we pass (they are never resharded)."""

    def __init__(self, mesh, world: int, backend: str, causal: bool):
        from torch.distributed.tensor.experimental import context_parallel
        from torch.nn.attention import SDPBackend, sdpa_kernel

        self.backend = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]
        self.sdpa_kernel, self.causal = sdpa_kernel, causal
        self.dummy = torch.zeros(2 * world, device="cuda")  # (CUDA only: SDPA's cuDNN / flash backends)
        self.ctx = context_parallel(mesh, buffers=[self.dummy], buffer_seq_dims=[0])

    def __enter__(self):
        self.kernel = self.sdpa_kernel([self.backend])
        self.kernel.__enter__()
        self.ctx.__enter__()
        return self

    def __exit__(self, *exc):
        self.ctx.__exit__(*exc)
        self.kernel.__exit__(*exc)

    def __call__(self, q, k, v):
        import torch.nn.functional as F

        if k.shape[1] != q.shape[1]:  # torch's ring sends what SDPA gets: KV heads repeated for GQA
            k = k.repeat_interleave(q.shape[1] // k.shape[1], 1)
            v = v.repeat_interleave(q.shape[1] // v.shape[1], 1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)


def _inputs(a, seqlen_local: int, rank: int, world: int, seed: int):
    """This rank's zig-zag shards of seeded full-sequence tensors (full tensors are made only when
    the single-GPU check needs them; otherwise each rank draws its shard with its own seed)."""
    import attngen.distributed as agd

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[a.dtype]
    shapes = [(a.batch, h, seqlen_local, a.head_dim) for h in (a.heads, a.heads_kv, a.heads_kv, a.heads)]
    total = seqlen_local * world
    if total <= a.check_max:
        g = torch.Generator(device=a.device).manual_seed(seed)
        full = [torch.randn((s[0], s[1], total, s[3]), generator=g, device=a.device, dtype=dtype) for s in shapes]
        return [agd.shard(x) for x in full], full
    g = torch.Generator(device=a.device).manual_seed(seed + 1000 * rank)
    return [torch.randn(s, generator=g, device=a.device, dtype=dtype) for s in shapes], None


def _step(fn, q, k, v, dout, mode: str):
    if mode == "fwd":
        with torch.no_grad():
            return (fn(q, k, v),)
    leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]
    out = fn(*leaves)
    return (out, *torch.autograd.grad(out, leaves, dout))


def _time(fn, q, k, v, dout, mode: str, a) -> float:
    times = []
    cuda = a.device == "cuda"
    for i in range(a.warmup + a.iters):
        dist.barrier()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        _step(fn, q, k, v, dout, mode)
        if cuda:
            end.record()
            torch.cuda.synchronize()
        if i >= a.warmup:
            times.append(start.elapsed_time(end) if cuda else (time.perf_counter() - t0) * 1e3)
    ms = torch.tensor(sorted(times)[len(times) // 2], device=a.device)
    dist.all_reduce(ms, op=dist.ReduceOp.MAX)
    return float(ms)


def _diffs(xs, ys) -> dict:
    """{out, dq, dk, dv: (max |x - y|, ||x - y|| / ||y||)} over every rank's shard."""
    out = {}
    for name, x, y in zip(("out", "dq", "dk", "dv"), xs, ys):
        d = x.float() - y.float()
        worst = d.abs().max()
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        sums = torch.stack([d.square().sum(), y.float().square().sum()])
        dist.all_reduce(sums)
        out[name] = {"max_abs": float(worst), "rel": float(sums[0].sqrt() / sums[1].sqrt().clamp_min(1e-30))}
    return out


def _worker(rank: int, world: int, a, port: int, out_path: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if a.device == "cuda":
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    else:  # a smoke run of the harness on the CPU (gloo, Triton's interpreter): attngen-cp only
        from attngen import env

        env.setup_interpreter()  # before anything imports triton
        dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh

    import attngen
    import attngen.distributed as agd

    if a.device == "cpu":
        from attngen.interp import patch_interpreter

        patch_interpreter()
    mesh = init_device_mesh(a.device, (world,))
    group = mesh.get_group()
    rows = []

    def attngen_cp(q, k, v):
        return agd.attention(q, k, v, group=group, causal=a.causal, rotate=a.rotate)

    makers = {"attngen-cp": lambda: _Null(attngen_cp),
              "torch-cp-cudnn": lambda: TorchCP(mesh, world, "cudnn", a.causal),
              "torch-cp-flash": lambda: TorchCP(mesh, world, "flash", a.causal)}
    for s_local in a.seqlen_per_gpu:
        total = s_local * world
        (q, k, v, dout), full = _inputs(a, s_local, rank, world, seed=s_local)
        checks = {}
        results = {}
        for name in a.providers:
            try:
                with makers[name]() as fn:
                    results[name] = _step(fn, q, k, v, dout, "fwdbwd")
            except Exception as e:  # a provider that cannot run this shape: a row with the reason
                results[name] = f"{type(e).__name__}: {str(e)[:300]}"
        base = results.get("attngen-cp")
        for name, r in results.items():
            if isinstance(r, str):
                checks[f"{name}_error"] = r
            elif name != "attngen-cp" and base is not None and not isinstance(base, str):
                checks[f"{name}_vs_attngen-cp"] = _diffs(r, base)
        if full is not None and not isinstance(base, str) and base is not None:
            parts = [agd.unshard(x.contiguous(), group=group) for x in base]
            leaves = [x.detach().requires_grad_(True) for x in full[:3]]
            one = attngen.attention(*leaves, causal=a.causal)
            ref = (one, *torch.autograd.grad(one, leaves, full[3]))
            checks["attngen-cp_vs_single_gpu"] = {
                n: {"max_abs": (p.float() - r.float()).abs().max().item(),
                    "rel": ((p.float() - r.float()).norm() / r.float().norm().clamp_min(1e-30)).item()}
                for n, p, r in zip(("out", "dq", "dk", "dv"), parts, ref)}
        del results, base
        for mode in a.modes:
            for name in a.providers:
                row = {"world": world, "seqlen_per_gpu": s_local, "seqlen_total": total, "provider": name,
                       "mode": mode}
                try:
                    with makers[name]() as fn:
                        ms = _time(fn, q, k, v, dout, mode, a)
                    row.update(ms=ms, tflops_per_gpu=flops_per_gpu(a, total, world, mode) / ms / 1e9,
                               tokens_per_s_per_gpu=a.batch * s_local / ms * 1e3)
                except Exception as e:
                    row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                rows.append(row)
        if world == 1:  # the single-GPU baseline: the plain call, no ring
            for mode in a.modes:
                ms = _time(lambda q_, k_, v_: attngen.attention(q_, k_, v_, causal=a.causal), q, k, v, dout, mode, a)
                rows.append({"world": 1, "seqlen_per_gpu": s_local, "seqlen_total": s_local, "provider": "attngen",
                             "mode": mode, "ms": ms, "tflops_per_gpu": flops_per_gpu(a, s_local, 1, mode) / ms / 1e9,
                             "tokens_per_s_per_gpu": a.batch * s_local / ms * 1e3})
        if rank == 0:
            rows.append({"world": world, "seqlen_per_gpu": s_local, "seqlen_total": total, "checks": checks})
        if a.device == "cuda":
            torch.cuda.empty_cache()
    if rank == 0:
        Path(out_path).write_text(json.dumps(rows))
    dist.barrier()
    dist.destroy_process_group()


class _Null:
    """A provider with nothing to enter."""

    def __init__(self, fn):
        self.fn = fn

    def __enter__(self):
        return self.fn

    def __exit__(self, *exc):
        return False


def header(a) -> dict:
    import triton

    from attngen import __version__
    from attngen.bench.report import git_commit

    cuda = a.device == "cuda"
    return {"gpu": torch.cuda.get_device_name() if cuda else "cpu (harness smoke run)",
            "gpus_on_host": torch.cuda.device_count(),
            "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if cuda else None,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
            "attngen": __version__, "git_commit": git_commit(), "python": sys.version.split()[0],
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "shape": {"batch": a.batch, "heads_q": a.heads, "heads_kv": a.heads_kv, "head_dim": a.head_dim,
                      "dtype": a.dtype, "causal": a.causal},
            "layout": "zig-zag (torch's head-tail load balancing), the same shards for every provider",
            "rotate": a.rotate or "torch's default (allgather)",
            "timing": {"warmup": a.warmup, "iters": a.iters, "stat": "median, slowest rank, CUDA events"},
            "flops": "forward 2*(Dqk+Dv)*B*Hq*pairs/W, pairs = S^2/2 (causal) or S^2 of the global sequence; "
                     "fwdbwd = 3.5 x forward"}


def plot(path: str, png: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    doc = json.loads(Path(path).read_text())
    rows = [r for r in doc["rows"] if "tflops_per_gpu" in r]
    modes = sorted({r["mode"] for r in rows})
    lengths = sorted({r["seqlen_per_gpu"] for r in rows})
    fig, axes = plt.subplots(len(modes), len(lengths), figsize=(4.5 * len(lengths), 3.5 * len(modes)), squeeze=False)
    for i, mode in enumerate(modes):
        for j, s in enumerate(lengths):
            ax = axes[i][j]
            for prov in sorted({r["provider"] for r in rows}):
                pts = sorted((r["world"], r["tflops_per_gpu"]) for r in rows
                             if (r["provider"], r["mode"], r["seqlen_per_gpu"]) == (prov, mode, s))
                if pts:
                    ax.plot(*zip(*pts), marker="o", label=prov)
            ax.set_title(f"{mode}, {f'{s // 1024}k' if s >= 1024 else s} tokens per GPU")
            ax.set_xlabel("GPUs")
            ax.set_ylabel("TFLOP/s per GPU")
            ax.set_xscale("log", base=2)
            ax.set_ylim(bottom=0)
            ax.legend(fontsize=7)
    sh = doc["shape"]
    fig.suptitle(f"context parallelism, {doc['gpu']}: B{sh['batch']} Hq{sh['heads_q']} Hkv{sh['heads_kv']} "
                 f"hd{sh['head_dim']} {sh['dtype']}{' causal' if sh['causal'] else ''}", fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    p.add_argument("--gpus", type=ints, default=[1, 2, 4, 8])
    p.add_argument("--seqlen-per-gpu", type=ints, default=[16384, 65536, 131072])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--heads-kv", type=int, default=32)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    p.add_argument("--no-causal", dest="causal", action="store_false")
    p.add_argument("--modes", type=lambda s: s.split(","), default=list(MODES))
    p.add_argument("--providers", type=lambda s: s.split(","), default=list(PROVIDERS))
    p.add_argument("--rotate", choices=("allgather", "alltoall"), default=None)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--check-max", type=int, default=131072,
                   help="global lengths up to this are also checked against single-GPU attngen on the full sequence")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: a smoke run of this harness (gloo, Triton's interpreter, tiny shapes, attngen-cp only)")
    p.add_argument("--out", help="results JSON")
    p.add_argument("--plot", help="draw this results JSON (with --png) instead of measuring")
    p.add_argument("--png")
    a = p.parse_args(argv)
    if a.plot:
        plot(a.plot, a.png or str(Path(a.plot).with_suffix(".png")))
        return 0
    if not a.out:
        p.error("--out is required when measuring")
    unknown = set(a.providers) - set(PROVIDERS)
    if unknown:
        p.error(f"--providers: unknown {sorted(unknown)} (known: {', '.join(PROVIDERS)})")
    rows, skipped = [], []
    for world in a.gpus:
        if a.device == "cuda" and world > torch.cuda.device_count():
            skipped.append({"world": world, "reason": f"{torch.cuda.device_count()} GPUs on this host"})
            continue
        with tempfile.TemporaryDirectory() as tmp:
            part = os.path.join(tmp, "rows.json")
            mp.spawn(_worker, args=(world, a, _free_port(), part), nprocs=world, join=True)
            rows += json.loads(Path(part).read_text())
        print(f"{world} GPU(s): done", flush=True)
    doc = {**header(a), "skipped": skipped, "rows": rows}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
    for r in rows:
        if "tflops_per_gpu" in r:
            print(f"W={r['world']} S/GPU={r['seqlen_per_gpu']:>7} {r['mode']:>6} {r['provider']:>15}: "
                  f"{r['ms']:9.2f} ms {r['tflops_per_gpu']:7.1f} TFLOP/s/GPU "
                  f"{r['tokens_per_s_per_gpu']:12.0f} tok/s/GPU")
        elif "checks" in r:
            print(f"W={r['world']} S={r['seqlen_total']}: checks {r['checks']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
