"""hd256 launch-config probe on the GPU (forward and deterministic backward, bf16 causal
B2 H16 S4096): the source of the hd256 defaults in attngen/tuning/space.py. Failing configs are
recorded with their error. Run: OUT=dir PYTHONPATH=. python3 benchmarks/sweep_hd256.py"""
import json, math, os, torch, triton
from attngen.kernels.fwd import attn_fwd
from attngen.kernels.bwd import attn_bwd
from attngen.kernels.common import MaskArgs
from attngen.runtime import loader
from attngen.spec import KernelSpec
from attngen.tuning.space import FwdConfig, BwdConfig
d, b, h, s = 256, 2, 16, 4096
spec = KernelSpec("fwd", "bf16", "sm90", d, d, 1, "causal")
mod, bmod = loader.load(spec), loader.load(spec.replace(family="bwd"))
q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
dout = torch.randn_like(q); out = torch.empty_like(q); lse = torch.empty(b, h, s, device="cuda")
m = MaskArgs(1 / math.sqrt(d), 0.0, 1 << 30, 0, False)
ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
fl = 4 * b * h * s * s * d / 2
rows = []
def t(fn):
    fn(); torch.cuda.synchronize(); return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")
for bm, bn, w, st in [(64,32,4,2),(64,64,4,2),(64,64,8,2),(128,32,8,2),(128,64,8,2),(64,32,4,3),(64,64,8,3),(128,64,8,1),(64,128,8,2),(32,64,4,2)]:
    cfg = FwdConfig(bm, bn, w, st)
    try:
        ms = t(lambda: attn_fwd(mod, spec, q, k, v, out, lse, m, cfg))
        rows.append({"kind": "fwd", **cfg.as_dict(), "tflops": fl / ms / 1e9, "err": (out.float() - ref.float()).abs().max().item()})
    except Exception as e:
        rows.append({"kind": "fwd", **cfg.as_dict(), "error": str(e)[:150]})
    print(rows[-1], flush=True)
attn_fwd(mod, spec, q, k, v, out, lse, m, FwdConfig(64, 32, 4, 2))
dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
for c in [(32,64,4,1,64,32,4,1),(32,64,4,2,64,32,4,2),(64,64,8,1,64,64,8,1),(32,64,8,2,64,32,8,2),(64,32,4,1,64,32,4,1),(32,32,4,2,32,32,4,2),(64,64,8,2,64,64,8,2),(32,128,8,1,128,32,8,1)]:
    cfg = BwdConfig(*c)
    bspec = spec.replace(family="bwd")
    try:
        ms = t(lambda: attn_bwd(bmod, bspec, q, k, v, out, dout, lse, dq, dk, dv, m, cfg, True))
        rows.append({"kind": "bwd", **cfg.as_dict(), "tflops": 2.5 * fl / ms / 1e9})
    except Exception as e:
        rows.append({"kind": "bwd", **cfg.as_dict(), "error": str(e)[:150]})
    print(rows[-1], flush=True)
json.dump({"gpu": torch.cuda.get_device_name(), "shape": [b, h, s, d], "rows": rows}, open(os.environ["OUT"] + "/sweep_hd256.json", "w"), indent=1)
