"""Host time per warm call and compiles while the sequence length sweeps (the runtime launch path).

    python3 benchmarks/launch_overhead.py --out results.json

Host time: the mean wall time of N back-to-back calls, measured while the GPU is idle (tiny shapes:
the launch path, not the kernel, is what is timed), after warm-up. Providers, in one process:
  attngen          attngen.attention (no grad; with grad: forward with requires_grad inputs)
  bare launch      the same compiled Triton kernel launched directly (CompiledKernel.run), outputs
                   preallocated: the floor of any Python launcher
  sdpa             torch.nn.functional.scaled_dot_product_attention (its default backend)
  flex             torch.nn.attention.flex_attention (compiled once)
Compiles: Triton kernel-cache entries added while S sweeps 1000..1100 after warming S = 1000.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import triton

import attngen
from attngen.kernels.launch import make_descriptors
from attngen.runtime import api


def host_us(fn, n=2000) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dev = "cuda"
    rows = []
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

    rows.append({"provider": "attngen", "grad": False, "host_us": host_us(lambda: attngen.attention(q, k, v, **kw))})
    rows.append({"provider": "bare launch", "grad": False, "host_us": host_us(bare)})
    if plan.descriptors:  # the same call through the pointer kernel's plan (no descriptors to build)
        pplan = plan._pointer_plan()
        pplan.run(q, k, v)
        rows.append({"provider": "attngen plan.run, pointer kernel", "grad": False,
                     "host_us": host_us(lambda: pplan.run(q, k, v))})
        pla = pplan.launches[0]
        pk, pargs = pla.kernel, pla.pick(tensors)
        rows.append({"provider": "bare launch, pointer kernel", "grad": False, "host_us": host_us(
            lambda: pk.run(pla.grid, 1, 1, stream, pk.function, pk.packed_metadata, None, None, None,
                           *pargs, *pla.tail))})
    rows.append({"provider": "sdpa", "grad": False, "host_us": host_us(
        lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))})
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        bm = create_block_mask(lambda b, h, qi, ki: qi >= ki, B, H, S, S, device=dev)
        flex = torch.compile(flex_attention)
        flex(q, k, v, block_mask=bm)
        rows.append({"provider": "flex", "grad": False, "host_us": host_us(lambda: flex(q, k, v, block_mask=bm))})
    except Exception as exc:  # noqa: BLE001
        rows.append({"provider": "flex", "grad": False, "error": str(exc)[:200]})
    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
    rows.append({"provider": "attngen", "grad": True, "host_us": host_us(lambda: attngen.attention(qg, kg, vg, **kw), 500)})
    rows.append({"provider": "sdpa", "grad": True, "host_us": host_us(
        lambda: torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=True), 500)})

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
    res = {"gpu": torch.cuda.get_device_name(), "kernel": la.fn.__name__, "config": plan.config.as_dict(), "torch": torch.__version__, "triton": triton.__version__,
           "shape": {"B": B, "H": H, "S": S, "D": D, "causal": True, "dtype": "bf16"},
           "host_us": rows, "recompiles_while_S_sweeps": comp}
    print(json.dumps(res, indent=1))
    with open(args.out, "w") as fh:
        json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
