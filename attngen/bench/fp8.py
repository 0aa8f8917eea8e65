"""`attngen bench --mode fp8`: the fp8 forward (TFLOP/s) beside the bf16 kernels and cuDNN, and the
accuracy report (`--accuracy`: RMSE against float64 on outlier inputs).

Every row measures, in one process on the same bf16 tensors: attngen's fp8 forward with the
rotation (`attngen-fp8`: attention(..., precision="fp8"), the quantization prologue's time
included), the Triton kernel instead of the warp-specialized one (`attngen-fp8-triton`) and the
same with its dots' partial sums promoted to fp32 every 32 products (`attngen-fp8-precise`:
precise_acc on), without the rotation (`attngen-fp8-norot`), the fp8 kernel alone on tensors
quantized beforehand (`attngen-fp8-kernel`: attention_fp8), attngen's bf16 forward (`attngen`),
cuDNN's bf16 SDPA (`cudnn`), cuDNN's fp8 SDPA through the nvidia-cudnn-frontend package
(`cudnn-fp8`: e4m3 Q, K, V with per-tensor descales quantized beforehand, output e4m3; "skip" when
the package is not installed) and a plain Triton fp8 kernel without block scales (`triton-fp8`:
attngen.bench.triton_fp8_peer, per-tensor scales, quantized beforehand). Time: median of
triton.testing.do_bench; FLOPs: 4 x B x H x D x (attended pairs).
"""

from __future__ import annotations

import json
import math
import platform
import sys
from dataclasses import dataclass

import torch

from attngen.bench.run import BUSY_MS, TIMING, with_discarded_first
from attngen.devices import busy_gpu

PROVIDERS = ("attngen-fp8", "attngen-fp8-triton", "attngen-fp8-precise", "attngen-fp8-norot", "attngen-fp8-kernel",
             "attngen", "cudnn", "cudnn-fp8", "triton-fp8")


@dataclass(frozen=True)
class Fp8Case:
    seqlen: int
    causal: bool
    head_dim: int = 128
    batch: int = 1
    heads: int = 16

    @property
    def name(self) -> str:
        s = f"{self.seqlen // 1024}k" if self.seqlen >= 1024 else str(self.seqlen)
        return f"{'causal' if self.causal else 'full'}-hd{self.head_dim}-{s}"

    @property
    def flops(self) -> float:
        s = self.seqlen
        pairs = s * (s + 1) / 2 if self.causal else s * s
        return 4.0 * self.batch * self.heads * self.head_dim * pairs


CASES = [Fp8Case(s, c) for c in (False, True) for s in (512, 1024, 2048, 4096, 8192, 16384)]
CASES += [Fp8Case(s, c, 256) for c in (False, True) for s in (4096, 16384)]


def _cudnn_fp8(q8, k8, v8, descales, causal: bool, scale: float):
    """cuDNN's fp8 SDPA (nvidia-cudnn-frontend) on (B, H, S, D) e4m3 tensors with per-tensor
    descales (q, k, v), P scaled by 2^8 before its e4m3 rounding (as attngen's kernels do) and an
    e4m3 output with scale 1: a callable returning the output."""
    import cudnn

    B, H, S, D = q8.shape
    fp8, f32 = cudnn.data_type.FP8_E4M3, cudnn.data_type.FLOAT
    graph = cudnn.pygraph(io_data_type=fp8, intermediate_data_type=f32, compute_data_type=f32)
    tq = graph.tensor(name="q", dim=list(q8.shape), stride=list(q8.stride()), data_type=fp8)
    tk = graph.tensor(name="k", dim=list(k8.shape), stride=list(k8.stride()), data_type=fp8)
    tv = graph.tensor(name="v", dim=list(v8.shape), stride=list(v8.stride()), data_type=fp8)
    dev = q8.device
    values = {"descale_q": descales[0], "descale_k": descales[1], "descale_v": descales[2],
              "descale_s": torch.tensor(1 / 256, device=dev), "scale_s": torch.tensor(256.0, device=dev),
              "scale_o": torch.tensor(1.0, device=dev)}
    values = {n: t.float().reshape(1, 1, 1, 1).contiguous() for n, t in values.items()}
    scalars = {n: graph.tensor(name=n, dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=f32) for n in values}
    res = graph.sdpa_fp8(q=tq, k=tk, v=tv, **scalars, attn_scale=scale, is_inference=True,
                         use_causal_mask=causal, name="sdpa_fp8")
    o, amaxes = res[0], [t for t in res[2:] if t is not None]
    out = torch.empty(B, H, S, D, dtype=torch.float8_e4m3fn, device=dev)
    o.set_output(True).set_dim(list(out.shape)).set_stride(list(out.stride())).set_data_type(fp8)
    bufs = []
    for a in amaxes:
        a.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(f32)
        bufs.append((a, torch.empty(1, 1, 1, 1, device=dev)))
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    graph.check_support()
    graph.build_plans()
    ws = torch.empty(graph.get_workspace_size(), dtype=torch.uint8, device=dev)
    pack = {tq: q8, tk: k8, tv: v8, o: out, **{scalars[n]: t for n, t in values.items()}, **dict(bufs)}

    def run():
        graph.execute(pack, ws)
        return out
    return run


def _triton_call(q, k, v, causal: bool, precise: bool):
    """attention(..., precision="fp8") through the Triton kernel, its dots' partial sums promoted to
    fp32 every 32 products (precise) or not: the config the runtime picks, or the Triton kernel's
    default when that is the Gluon kernel's (which has no promotion)."""
    import dataclasses

    import attngen
    from attngen.families.fwd_fp8 import Fp8Config, triton_fp8_config
    from attngen.runtime import dispatch
    from attngen.spec import KernelSpec

    cfg = Fp8Config(**attngen.explain(q, k, v, causal=causal, precision="fp8")["config"])
    if cfg.consumers:
        spec = KernelSpec("fwd_fp8", "fp8_e4m3", "sm90", q.shape[-1], v.shape[-1], q.shape[1] // k.shape[1],
                          "causal" if causal else "none")
        cfg = triton_fp8_config(spec)
    cfg = dataclasses.replace(cfg, precise_acc=precise)

    def run():
        with dispatch.forced_config(fwd_fp8=cfg):
            return attngen.attention(q, k, v, causal=causal, precision="fp8")
    return run


def _per_tensor_e4m3(x):
    """(e4m3 tensor, fp32 descale) with one descale per tensor."""
    d = x.float().abs().amax() / 448.0
    return (x.float() / d).to(torch.float8_e4m3fn), d


def _providers(case: Fp8Case, device, seed: int = 0):
    import attngen
    from torch.nn.attention import SDPBackend, sdpa_kernel

    g = torch.Generator(device=device).manual_seed(seed)
    shape = (case.batch, case.heads, case.seqlen, case.head_dim)
    q, k, v = (torch.randn(shape, generator=g, device=device, dtype=torch.bfloat16) for _ in range(3))
    scale = 1.0 / math.sqrt(case.head_dim)
    out = {
        "attngen-fp8": lambda: attngen.attention(q, k, v, causal=case.causal, precision="fp8"),
        "attngen-fp8-triton": _triton_call(q, k, v, case.causal, False),
        "attngen-fp8-precise": _triton_call(q, k, v, case.causal, True),
        "attngen-fp8-norot": lambda: attngen.attention(q, k, v, causal=case.causal, precision="fp8", rotate=False),
        "attngen": lambda: attngen.attention(q, k, v, causal=case.causal),
    }
    (q8, qd), (k8, kd), (v8, vd) = (_per_tensor_e4m3(x) for x in (q, k, v))
    qds, kds, vds = (d.reshape(1, 1).expand(case.batch, case.heads).contiguous() for d in (qd, kd, vd))
    out["attngen-fp8-kernel"] = lambda: attngen.attention_fp8(q8, k8, v8, qds, kds, vds, causal=case.causal)

    def sdpa():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=case.causal)
    out["cudnn"] = sdpa
    try:
        out["cudnn-fp8"] = _cudnn_fp8(q8, k8, v8, (qd, kd, vd), case.causal, scale)
    except ImportError:
        out["cudnn-fp8"] = None
    from attngen.bench.triton_fp8_peer import make_call

    out["triton-fp8"] = make_call(q, k, v, case.causal)
    return out


def run(cases, quick: bool = False, providers=None, out: str | None = None) -> dict:
    import triton
    from triton.testing import do_bench

    device = torch.device("cuda")
    timing = TIMING["quick" if quick else "full"]
    rows = []
    doc = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "python": platform.python_version(), "dtype": "bf16 inputs, e4m3 operands",
           "timing": {**timing, "return_mode": "median", "function": "triton.testing.do_bench"},
           "first_case": "run once unrecorded before the rows (the first case timed in a process read low)",
           "flops": "4 x B x H x D x attended pairs (causal: S(S+1)/2)", "rows": rows}
    for case, keep in with_discarded_first(cases):
        bound = _providers(case, device)
        names = [n for n in bound if providers is None or n in providers]
        row = {"case": case.name, "B": case.batch, "H": case.heads, "S": case.seqlen, "D": case.head_dim,
               "causal": case.causal, "flops": case.flops, "ms": {}, "tflops": {}, "notes": {}}
        busy_gpu(device)
        ref = None
        with torch.no_grad():
            for name in names:
                if bound[name] is None:
                    row["notes"][name] = "skip: nvidia-cudnn-frontend is not installed"
                    continue
                try:
                    o = bound[name]().float()
                    torch.cuda.synchronize()
                    if ref is None:
                        ref = o
                    elif (o - ref).abs().max().item() > 0.25:
                        row["notes"][name] = f"output differs from {names[0]}'s by {(o - ref).abs().max().item():.3g}"
                    busy_gpu(device, BUSY_MS)  # its clocks back up after the first (compiling) call
                    ms = do_bench(bound[name], warmup=timing["warmup_ms"], rep=timing["rep_ms"], return_mode="median")
                except Exception as exc:  # a provider that cannot take the case: recorded, not fatal
                    row["notes"][name] = f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
                    continue
                row["ms"][name] = round(ms, 4)
                row["tflops"][name] = round(case.flops / ms / 1e9, 1)
        for peer in ("cudnn-fp8", "cudnn", "attngen"):
            if "attngen-fp8" in row["tflops"] and peer in row["tflops"]:
                row[f"attngen-fp8/{peer}"] = round(row["tflops"]["attngen-fp8"] / row["tflops"][peer], 3)
        if not keep:  # the discarded first pass
            continue
        rows.append(row)
        print(json.dumps({k: row[k] for k in ("case", "tflops", "notes")}), flush=True)
        if out:
            with open(out, "w") as f:
                json.dump(doc, f, indent=1)
    return doc


# ------------------------------------------------------------------------------------------------
# accuracy: RMSE against float64 on FlashAttention-3's outlier inputs


def outlier_inputs(shape, seed: int, device):
    """N(0, 1) entries plus N(0, 100) (standard deviation 10) on 0.1 % of them, in bf16."""
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(shape, generator=g, device=device)
    hit = torch.rand(shape, generator=g, device=device) < 0.001
    return (x + hit * 10.0 * torch.randn(shape, generator=g, device=device)).to(torch.bfloat16)


def accuracy(seqlen: int = 2048, heads: int = 8, head_dims=(64, 128, 256), device="cuda") -> list[dict]:
    """{case, hd, causal, variant, rmse} for bf16, fp8 with rotation (and with its partial sums
    promoted to fp32 every 32 products), fp8 without rotation, fp8 with one descale per tensor
    without rotation (the baseline, cuDNN's fp8 quantization) and with it (Q and K rotated in
    PyTorch, then quantized per tensor), and cuDNN's fp8 SDPA on the per-tensor e4m3 inputs when
    nvidia-cudnn-frontend is installed."""
    import attngen
    from attngen.families.fwd_fp8_tuning import rotation_matrix
    from attngen.problem import attention_ref

    recs = []
    for hd in head_dims:
        for causal in (False, True):
            q, k, v = (outlier_inputs((1, heads, seqlen, hd), s, device) for s in (1, 2, 3))
            ref, _ = attention_ref(q, k, v, causal=causal)
            (q8, qd), (k8, kd), (v8, vd) = (_per_tensor_e4m3(x) for x in (q, k, v))
            per_tensor = [d.reshape(1, 1).expand(1, heads).contiguous() for d in (qd, kd, vd)]
            m = rotation_matrix(hd).to(device)
            (q8r, qdr), (k8r, kdr) = (_per_tensor_e4m3((x.double() @ m).float()) for x in (q, k))
            per_tensor_rot = [d.reshape(1, 1).expand(1, heads).contiguous() for d in (qdr, kdr, vd)]
            with torch.no_grad():
                outs = {"bf16": attngen.attention(q, k, v, causal=causal),
                        "fp8-rotate": attngen.attention(q, k, v, causal=causal, precision="fp8"),
                        "fp8-rotate-triton": _triton_call(q, k, v, causal, False)(),
                        "fp8-rotate-precise-acc": _triton_call(q, k, v, causal, True)(),
                        "fp8-norotate": attngen.attention(q, k, v, causal=causal, precision="fp8", rotate=False),
                        "fp8-per-tensor": attngen.attention_fp8(q8, k8, v8, *per_tensor, causal=causal),
                        "fp8-per-tensor-rotate": attngen.attention_fp8(q8r, k8r, v8, *per_tensor_rot, causal=causal)}
            try:
                outs["cudnn-fp8"] = _cudnn_fp8(q8, k8, v8, (qd, kd, vd), causal, 1.0 / math.sqrt(hd))().float()
            except ImportError:
                pass
            case = f"outliers-S{seqlen}-H{heads}"
            for variant, o in outs.items():
                rmse = (o.double() - ref.double()).pow(2).mean().sqrt().item()
                recs.append({"case": case, "hd": hd, "causal": causal, "variant": variant, "rmse": rmse})
    return recs


def _fail(msg: str, code: int) -> int:
    print(f"attngen bench --mode fp8: {msg}", file=sys.stderr)
    return code


def main_args(args) -> int:
    """`attngen bench --mode fp8 [--cases ...] [--providers ...] [--out F] [--quick]`; with
    --accuracy FILE also the accuracy records. Exit 0 done, 1 no GPU, 2 bad arguments."""
    from attngen.bench.cases import pick

    try:
        cases = pick(args.cases, {c.name: c for c in CASES}, "case")
        providers = pick(args.providers, {n: n for n in PROVIDERS}, "provider") if args.providers else None
    except ValueError as exc:
        return _fail(str(exc), 2)
    if not torch.cuda.is_available():
        return _fail("needs a CUDA GPU (torch.cuda.is_available() is False)", 1)
    if getattr(args, "accuracy", None):
        recs = accuracy()
        with open(args.accuracy, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "inputs": "N(0,1) + N(0,100) on 0.1% of entries",
                       "reference": "float64 attention of the bf16 inputs", "records": recs}, f, indent=1)
        print(f"wrote {args.accuracy}")
    run(cases, quick=args.quick, providers=providers, out=args.out)
    if args.out:
        print(f"wrote {args.out}")
    return 0
