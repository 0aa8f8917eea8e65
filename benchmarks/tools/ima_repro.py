"""The illegal memory access of the 20,000-document packed case, one path at a time (GPU).

tests/gpu/test_gpu_edges.py::test_20000_documents_tma_forward_gluon_backward (20,000 documents of
64 tokens, 8 heads, hd128, causal; the TMA forward and the Gluon backward, 160,000 programs each)
hit an illegal address in one of two runs with three copies of it sharing an H100 (session 60).
It did not fail alone, and memcheck found nothing on it alone. The fault surfaced at the backward's
first kernel load, so an earlier kernel of the call raised it.

This runs that call `--iters` times with one kernel path forced per family (`--fwd`, `--bwd`) and
a synchronize after each forward and each backward. It prints one line per step and a final
`RESULT ok` or `RESULT error at <step>: <error>` (an illegal address among them). With `--blocking`, CUDA_LAUNCH_BLOCKING=1 is set
before CUDA starts, so the launch that faults raises, and its kernel is named by the last
`launch` line printed (`--trace`).

    python3 benchmarks/tools/ima_repro.py --fwd tma --bwd default --iters 3 [--blocking --trace]
    python3 benchmarks/tools/ima_repro.py --switch ws_doc_desc=shared   # the Gluon backward as it was
                                        # before session 61 (only the entry's descriptors)
"""
from __future__ import annotations

import argparse
import os
import sys

FWD = {  # forward paths of the packed-document call (tests/gpu/test_gpu_grid.py's names)
    "default": None,
    "pointer": dict(block_m=64, block_n=64, num_warps=4, num_stages=2),
    "tma": dict(block_m=64, block_n=64, num_warps=4, num_stages=2, tma=True),
}
BWD = {
    "default": None,
    "pointer": (64, 64, 4, 2, 64, 64, 4, 2, {}),
    "tma": (64, 64, 4, 2, 128, 64, 8, 3, {"tma": True}),
    # both Gluon passes, forced where a tuned winner or another bucket's default would pick otherwise
    "gluon": "WS_BWD_DEFAULT",  # attngen.families.bwd_config's, hd128's default
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fwd", choices=sorted(FWD), default="default")
    ap.add_argument("--bwd", choices=sorted(BWD), default="default")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--docs", type=int, default=20_000)
    ap.add_argument("--dense", action="store_true",
                    help="a dense call instead (B4 H32 S4096 hd128 causal, host descriptors only): the "
                         "control for the packed documents' kernels, which make descriptors in the kernel")
    ap.add_argument("--dense-shape", default="4,32,4096", metavar="B,H,S",
                    help="the dense call's batch, heads and length (20000,8,64: as many programs as "
                         "the packed case, each as short)")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run through the interpreter (TRITON_INTERPRET=1)")
    ap.add_argument("--blocking", action="store_true", help="CUDA_LAUNCH_BLOCKING=1 (set before CUDA starts)")
    ap.add_argument("--trace", action="store_true", help="print each kernel launch's name before it runs")
    ap.add_argument("--switch", action="append", default=[],
                    help="NAME=VALUE: a codegen option the backward modules are rendered with (e.g. "
                         "ws_doc_desc=shared: the Gluon backward's old per-document descriptors)")
    args = ap.parse_args()
    if args.blocking:
        os.environ["CUDA_LAUNCH_BLOCKING"] = "1"
    import contextlib

    import torch

    import attngen
    from attngen.configs import BwdConfig, FwdConfig
    from attngen.kernels import launch as launch_mod
    from attngen.runtime import api
    from attngen.runtime.dispatch import forced_config

    if args.trace:  # name every launch on its way out (the raw launcher and Triton's JIT both)
        for cls in (launch_mod.Launch, launch_mod.CompiledLaunch):
            call = cls.run if cls is launch_mod.Launch else cls.__call__

            def traced(self, *a, _call=call, **k):
                fn = getattr(self, "fn", None)
                print(f"launch {getattr(fn, '__name__', fn)} grid={getattr(self, 'grid', '?')}", flush=True)
                return _call(self, *a, **k)

            setattr(cls, "run" if cls is launch_mod.Launch else "__call__", traced)
    if args.switch:  # the backward modules rendered with the options, in place of the built ones
        import tempfile
        from pathlib import Path

        from attngen.codegen.render import render
        from attngen.runtime import loader

        opts = dict(sw.split("=", 1) for sw in args.switch)
        built, tmp = loader.load, Path(tempfile.mkdtemp(prefix="ima-variant-"))

        def load(spec):
            if spec.family != "bwd":
                return built(spec)
            path = tmp / f"{spec.uri}__{'_'.join(f'{k}-{v}' for k, v in opts.items())}.py"
            if not path.exists():
                path.write_text(render(spec, options=opts))
            return loader.load_path(path)

        loader.load = load
    forced = {}
    if FWD[args.fwd] is not None:
        forced["fwd"] = FwdConfig(**FWD[args.fwd])
    if isinstance(BWD[args.bwd], str):
        from attngen.families import bwd_config

        forced["bwd"] = getattr(bwd_config, BWD[args.bwd])
    elif BWD[args.bwd] is not None:
        *nums, kw = BWD[args.bwd]
        forced["bwd"] = BwdConfig(*nums, **kw)
    dev, L, H, D = args.device, 64, 8, 128
    sync = torch.cuda.synchronize if dev != "cpu" else (lambda: None)
    T = args.docs * L
    g = torch.Generator(device=dev).manual_seed(20)
    shape = (*map(int, args.dense_shape.split(",")), D) if args.dense else (T, H, D)
    q, k, v, dout = (torch.randn(shape, device=dev, generator=g).to(torch.bfloat16) for _ in range(4))
    cu = torch.arange(0, T + 1, L, dtype=torch.int32, device=dev)
    leaves = [t.requires_grad_(True) for t in (q, k, v)]
    print(f"fwd={args.fwd} bwd={args.bwd} switch={args.switch} "
          f"docs={'dense ' + args.dense_shape if args.dense else args.docs} "
          f"blocking={args.blocking} "
          f"free={torch.cuda.mem_get_info()[0] / 2**30 if dev != 'cpu' else 0:.1f} GiB", flush=True)
    scope = forced_config(**forced) if forced else contextlib.nullcontext()
    step = "start"
    try:
        with scope:
            for it in range(args.iters):
                api.clear_plans()
                step = f"iter {it} forward"
                out = (attngen.attention(*leaves, causal=True) if args.dense
                       else attngen.attention_varlen(*leaves, cu, cu, L, L, causal=True))
                sync()
                print(step, "ok", flush=True)
                step = f"iter {it} backward"
                grads = torch.autograd.grad(out, leaves, dout)
                sync()
                assert all(torch.isfinite(x).all() for x in grads), "a gradient is not finite"
                print(step, "ok", flush=True)
                del out, grads
    except Exception as e:  # noqa: BLE001 - the point is to report it
        print(f"RESULT error at {step}: {type(e).__name__}: {str(e).splitlines()[0][:300]}", flush=True)
        return 1
    print("RESULT ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
