"""The decode kernel's main loop as the compiler makes it for sm90, on any machine (Triton's own
ptxas, no GPU): registers and the loop's SASS instruction count (attngen.bench.probe.main_loop)
for hd128 GQA 4 (32 / 8 heads), bf16, B2 KV4k, the layout's default config.

    TRITON_INTERPRET=0 python3 benchmarks/tools/decode_sass.py paged     # or: dense
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
from pathlib import Path

import torch

from attngen.families import decode as fd
from attngen.kernels.common import MaskArgs
from attngen.runtime import loader
from attngen.spec import KernelSpec
from attngen.bench import probe as pb


paged = sys.argv[1] == "paged"
B, HQ, HKV, D, S, page = 2, 32, 8, 128, 4096, 16
spec = KernelSpec("decode", "bf16", "sm90", D, D, HQ // HKV, "causal", False, False)
mod = loader.load(spec)
dt = torch.bfloat16
q = torch.randn(B, 1, HQ, D, dtype=dt)
if paged:
    kc = torch.randn(B * S // page, page, HKV, D, dtype=dt)
    bt = torch.arange(B * S // page, dtype=torch.int32).reshape(B, -1)
else:
    kc = torch.randn(B, S, HKV, D, dtype=dt)
    bt = None
vc = torch.randn_like(kc)
seqlens = torch.full((B,), S - 1, dtype=torch.int32)
cfg = fd.layout_default(spec, "cuda", paged, False)
n, split_len = fd.splits(cfg, B, HKV, S, 132)
out, lse = torch.empty(B, 1, HQ, D, dtype=dt), torch.empty(B, HQ, 1)
ps, ls = fd.partial_shapes(B, HKV, n, fd.rows_tile(HQ // HKV, 1), D)
op, lp = torch.empty(ps), torch.empty(ls)
flags = torch.zeros(fd.NUM_FLAGS, dtype=torch.int32)
tmp = Path(tempfile.mkdtemp())
for la in fd.decode_launches(mod, spec, q, kc, vc, out, lse, op, lp, MaskArgs(1 / math.sqrt(D), 0.0, -1, 0, False),
                             cfg, n, split_len, seqlens, bt, 0, flags=flags):
    if la.fn.__name__ != "_attn_decode":
        continue
    r = pb.probe(la, tmp, None, "d")
    print(json.dumps({k: r[k] for k in ("kernel", "registers", "spilled", "main_loop") if k in r} | {"cfg": str(cfg)}))
