"""Measurement only: what the per-document V descriptor costs the Gluon packed-document forward.
The shipped module against a variant rendered from it with V through a host descriptor from the
document's first row (the rows a tile reads past its document's end are then the next document's:
NOT isolated, so not a kernel to ship), on 1 x 8192, 8 x 1024 and 8 uneven documents (GQA 32/8,
hd128, causal), one tile per program or pairs; dense GQA S8192 for scale. Outputs of the two are
compared (finite inputs: they must be equal).

    python3 benchmarks/varlen_host_v.py OUT.json
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import tempfile
from pathlib import Path

import torch
import triton

from attngen.codegen.render import render
from attngen.kernels.common import MaskArgs
from attngen.kernels.fwd import _ws_views, attn_fwd, fwd_launches
from attngen.kernels.launch import tma_descriptors
from attngen.runtime import loader
from attngen.spec import KernelSpec
from attngen.tuning.space import WS_DEFAULT

T, H, HKV, D = 8192, 32, 8, 128
DOCS = ([8192], [1024] * 8, [3000, 1500, 1000, 900, 700, 500, 300, 292])


def host_v_variant(spec: KernelSpec):
    """`spec`'s module with the in-kernel V descriptor replaced by a host descriptor `desc_v`."""
    src = render(spec)
    a = src.index("    desc_v = tma.make_tensor_descriptor(")
    b = src.index("\n", src.index("V.dtype.element_ty))", a))
    src = src[:a] + src[b + 1:]
    src = src.replace("    desc_q, desc_k, V, Out,", "    desc_q, desc_k, desc_v, V, Out,", 1)
    assert src.count("desc_v, [off_b, kv_row, j * BLOCK_N,") == 1
    src = src.replace("desc_v, [off_b, kv_row, j * BLOCK_N,", "desc_v, [off_b, kv_row, k_row0 + j * BLOCK_N,")
    path = Path(tempfile.mkdtemp()) / "host_v.py"
    path.write_text(src)
    return loader.load_path(path)


def main(out_path: str) -> None:
    spec = KernelSpec("fwd", "bf16", "sm90", D, D, H // HKV, "causal", varlen=True)
    mod, var = loader.load(spec), host_v_variant(spec)
    margs = MaskArgs(scale=1 / math.sqrt(D), softcap=0.0, window_left=1 << 30, window_right=0,
                     align_top_left=False)
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(T, HKV, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    out, lse = torch.empty_like(q), torch.empty(H, T, device="cuda")
    rows = []
    for lens in DOCS:
        cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device="cuda")
        flops = sum(4 * H * n * n / 2 * D for n in lens)
        for pair, bn in ((False, 128), (True, 128), (True, 64)):
            cfg = dataclasses.replace(WS_DEFAULT, block_n=bn, pair_tiles=pair)
            (la,) = fwd_launches(mod, spec, q, k, v, out, lse, margs, cfg, cu, cu, max(lens))
            views, blocks = _ws_views(mod, cfg, q, k, v, out, True)
            descs = {n: d for n, d in tma_descriptors(views, blocks).items()
                     if n.startswith(("desc_q", "desc_k", "desc_v"))}
            lv = dataclasses.replace(la, fn=var._attn_fwd_ws, descriptors=descs, values=dict(la.values))
            res, outs = {}, []
            for name, launch in (("shipped", la), ("host_v", lv)):
                out.fill_(float("nan"))
                launch.run()
                torch.cuda.synchronize()
                outs.append(out.clone())
                ms = triton.testing.do_bench(launch.run, warmup=25, rep=100, return_mode="median")
                res[name] = round(flops / ms / 1e9, 1)
            res["same_out"] = bool(torch.equal(outs[0], outs[1])) and bool(torch.isfinite(outs[0]).all())
            rows.append({"lens": lens[:3], "pair": pair, "block_n": bn, **res})
            print(rows[-1], flush=True)
    dspec = KernelSpec("fwd", "bf16", "sm90", D, D, H // HKV, "causal")
    dq = q.view(1, T, H, D).transpose(1, 2)
    dk, dv = (t.view(1, T, HKV, D).transpose(1, 2) for t in (k, v))
    dout = torch.empty(1, H, T, D, device="cuda", dtype=torch.bfloat16)
    dlse = torch.empty(1, H, T, device="cuda")
    for pair in (False, True):
        cfg = dataclasses.replace(WS_DEFAULT, pair_tiles=pair)
        ms = triton.testing.do_bench(lambda: attn_fwd(loader.load(dspec), dspec, dq, dk, dv, dout, dlse, margs, cfg),
                                     warmup=25, rep=100, return_mode="median")
        rows.append({"dense_gqa_8192_pair": pair, "tflops": round(4 * H * T * T / 2 * D / ms / 1e9, 1)})
        print(rows[-1], flush=True)
    with open(out_path, "w") as fh:
        json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
