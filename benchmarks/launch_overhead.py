"""Host time per warm call and compiles while the sequence length sweeps (the runtime launch path).

    python3 benchmarks/launch_overhead.py --out results.json

Host time: the mean wall time of N back-to-back calls, measured while the GPU is idle (tiny shapes:
the launch path, not the kernel, is what is timed), after warm-up; each provider is measured
--repeats times, interleaved, and the median is reported (all repeats are in the JSON).
Providers, in one process, without and with grad (requires_grad inputs, forward only timed):
  attngen          attngen.attention
  bare launch      the same compiled Triton kernel launched directly (CompiledKernel.run), outputs
                   preallocated: the floor of any Python launcher; with grad, that launch inside a
                   minimal torch.autograd.Function (the floor of any differentiable Python op)
  sdpa             torch.nn.functional.scaled_dot_product_attention (its default backend)
  flex             torch.nn.attention.flex_attention (compiled once)
Compiles: Triton kernel-cache entries added while S sweeps 1000..1100 after warming S = 1000
(B2 Hq8/Hkv2 hd128 causal: a shape the sm90 kernels serve, forward and forward+backward).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import triton

import attngen
from attngen.bench.report import git_commit
from attngen.bench.run import host_us
from attngen.kernels.descriptors import make_descriptors
from attngen.runtime import api


def kernel_cache_entries() -> int:
    total = 0
    for plan in list(api._FWD.values()) + list(api._BWD.values()):
        for la in plan.launches:
            caches = la.fn.device_caches
            total += sum(len(c[0]) for c in caches.values())
    return total


def compiled_fns():
    seen = {}
    for plan in list(api._FWD.values()) + list(api._BWD.values()):
        for la in plan.launches:
            seen[id(la.fn)] = la.fn
    return list(seen.values())


def count_compiles(fns) -> int:
    return sum(len(c[0]) for f in fns for c in f.device_caches.values())


class _BareFn(torch.autograd.Function):
    """The floor of a differentiable launch: the bare launch in the lightest autograd Function
    (one output allocation, as any op that returns a new tensor)."""

    @staticmethod
    def forward(ctx, q, k, v, launch):
        launch()
        return torch.empty_like(q)

    @staticmethod
    def backward(ctx, dout):
        return None, None, None, None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--commit", default=None, help="the tree measured (default: git rev-parse HEAD)")
    args = ap.parse_args()
    dev = "cuda"
    B, H, S, D = 1, 4, 64, 64
    q, k, v = (torch.randn(B, H, S, D, device=dev, dtype=torch.bfloat16) for _ in range(3))
    kw = dict(causal=True)
    attngen.attention(q, k, v, **kw)
    plan = next(iter(api._FAST.values()))
    la = plan.launches[0]
    out, lse = plan.empty()
    tensors = {"Q": q, "K": k, "V": v, "Out": out, "Lse": lse, "cu_seqlens_q": None, "cu_seqlens_k": None}
    if plan.descriptors:  # the sm90 family's TMA kernel: descriptors built once, outside the loop
        tensors.update(make_descriptors(plan.descriptors, tensors))
    kern, args_ = la.kernel, la.pick(tensors)
    stream = torch.cuda.current_stream().cuda_stream

    def bare():
        kern.run(la.grid, 1, 1, stream, kern.function, kern.packed_metadata, None, None, None, *args_, *la.tail)

    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
    providers = [
        ("attngen", False, lambda: attngen.attention(q, k, v, **kw)),
        ("bare launch", False, bare),
        ("sdpa", False, lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)),
        ("attngen", True, lambda: attngen.attention(qg, kg, vg, **kw)),
        ("bare launch", True, lambda: _BareFn.apply(qg, kg, vg, bare)),
        ("sdpa", True, lambda: torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=True)),
    ]
    errors = []
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        bm = create_block_mask(lambda b, h, qi, ki: qi >= ki, B, H, S, S, device=dev)
        flex = torch.compile(flex_attention)
        flex(q, k, v, block_mask=bm)
        flex(qg, kg, vg, block_mask=bm)
        providers += [("flex", False, lambda: flex(q, k, v, block_mask=bm)),
                      ("flex", True, lambda: flex(qg, kg, vg, block_mask=bm))]
    except Exception as exc:  # noqa: BLE001
        errors.append({"provider": "flex", "error": str(exc)[:200]})
    samples = {(name, grad): [] for name, grad, _ in providers}
    for _ in range(args.repeats):
        for name, grad, fn in providers:
            samples[(name, grad)].append(host_us(fn, 2000 if not grad else 1000)[0])
    rows = [{"provider": name, "grad": grad, "host_us": statistics.median(samples[(name, grad)]),
             "repeats_us": samples[(name, grad)]} for name, grad, _ in providers] + errors

    # a new sequence length on every call (B1 H4 hd64 causal, S = 1000 .. 1499, each once): every
    # call is a plan miss -- validation, kernel and config from the bucket, launch values, the
    # first launch through Triton's JIT (no compile: lengths are not specialized)
    seqs = [(torch.randn(1, 4, n, 64, device=dev, dtype=torch.bfloat16),
             torch.randn(1, 4, n, 64, device=dev, dtype=torch.bfloat16)) for n in range(1000, 1500)]
    for qn, kn in (seqs[0], seqs[-1]):  # the two buckets' (1k, 2k) kernels compiled once
        attngen.attention(qn, kn, kn, causal=True)
        torch.nn.functional.scaled_dot_product_attention(qn, kn, kn, is_causal=True)
    seqs = seqs[1:-1]
    compiles_before = count_compiles(compiled_fns())
    for name, fn in (("attngen, new length every call", lambda qn, kn: attngen.attention(qn, kn, kn, causal=True)),
                     ("sdpa, new length every call", lambda qn, kn: torch.nn.functional.scaled_dot_product_attention(
                         qn, kn, kn, is_causal=True))):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for qn, kn in seqs:
            fn(qn, kn)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        rows.append({"provider": name, "grad": False, "host_us": (t1 - t0) / len(seqs) * 1e6,
                     "note": "host time per call; each call a new length (S 1001..1498)"})
        if name.startswith("attngen"):
            rows[-1]["compiles"] = count_compiles(compiled_fns()) - compiles_before
        print(rows[-1], flush=True)
    for r in rows:
        print(r, flush=True)

    # compiles while S sweeps 1000..1100 (forward and backward), after warming S = 1000
    comp = {}
    for grad in (False, True):
        def call(s):
            qs = torch.randn(2, 8, s, 128, device=dev, dtype=torch.bfloat16, requires_grad=grad)
            ks = torch.randn(2, 2, s, 128, device=dev, dtype=torch.bfloat16, requires_grad=grad)
            o = attngen.attention(qs, ks, ks, causal=True)
            if grad:
                o.sum().backward()
        call(1000)
        call(1024 + 1)  # the next bucket's config compiled too (warmup)
        torch.cuda.synchronize()
        fns = compiled_fns()
        before = count_compiles(fns)
        t0 = time.perf_counter()
        for s in range(1000, 1101):
            call(s)
        torch.cuda.synchronize()
        comp["fwd+bwd" if grad else "fwd"] = {"lengths": 101, "compiles": count_compiles(compiled_fns()) - before,
                                             "seconds": round(time.perf_counter() - t0, 2)}
    sweep = attngen.explain(torch.empty(2, 8, 1050, 128, device=dev, dtype=torch.bfloat16),
                            *(torch.empty(2, 2, 1050, 128, device=dev, dtype=torch.bfloat16),) * 2,
                            causal=True)
    res = {"gpu": torch.cuda.get_device_name(), "commit": args.commit or git_commit() or "unknown",
           "kernel": la.fn.__name__, "config": plan.config.as_dict(), "torch": torch.__version__,
           "triton": triton.__version__,
           "sweep_kernels": {"fwd": [x["entry"] for x in sweep["launches"]],
                             "bwd_kernel": sweep["backward"]["kernel"]},
           "shape": {"B": B, "H": H, "S": S, "D": D, "causal": True, "dtype": "bf16"},
           "host_us": rows, "recompiles_while_S_sweeps": comp}
    print(json.dumps(res, indent=1))
    with open(args.out, "w") as fh:
        json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
