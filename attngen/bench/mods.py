"""`attngen bench --mode mods` (GPU): expression kernels beside FlexAttention (the same mask_mod /
score_mod; its block mask built outside the timing, flex_attention under torch.compile) on the
issue's rows, forward and forward+backward, TFLOP/s counting only the pairs the mask keeps, and a
cross-check of outputs and gradients against Flex on each row. Beside them SDPA's cuDNN and
memory-efficient backends where a dense mask can say the row (sdpa_peers: the mask as booleans,
an additive score modification as a float bias; built outside the timing; rows with sinks have
none): what a user without a mask language runs.

    attngen bench --mode mods [--cases NAME,...] [--quick] --out FILE.json
    python3 -m attngen.bench.mods --out FILE.json [--quick] [--rows NAME,...]
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import torch

ROWS = [
    # name, B, Hq, Hkv, S, D, kind
    ("alibi_causal_8k", 1, 32, 32, 8192, 128, "alibi"),
    ("gpt_oss_20b_swa128_sinks_8k", 1, 64, 8, 8192, 64, "gpt_oss"),
    ("gpt_oss_20b_swa128_sinks_32k", 1, 64, 8, 32768, 64, "gpt_oss"),
    ("llama4_chunked8192_32k", 1, 40, 8, 32768, 128, "chunked"),
    ("prefix_lm_1k_of_8k", 2, 8, 4, 8192, 256, "prefix"),
    ("t5_bias_2k", 4, 12, 12, 2048, 64, "t5"),
    ("document_window_8k", 1, 32, 8, 8192, 128, "doc_window"),
    ("documents8_causal_8k", 1, 32, 8, 8192, 128, "docs"),
]


def _mods(kind: str, B: int, H: int, S: int, device):
    """(mask_mod, score_mod, sinks or None, flex score_mod needs sinks handled?)."""
    if kind == "alibi":
        slopes = torch.tensor([2 ** (-8 * (i + 1) / H) for i in range(H)], device=device)
        return (lambda b, h, q, k: k <= q), (lambda s, b, h, q, k: s - slopes[h] * (q - k).abs()), None
    if kind == "gpt_oss":
        sinks = torch.randn(H, device=device)
        return (lambda b, h, q, k: (k <= q) & (q - k < 128)), None, sinks
    if kind == "chunked":
        return (lambda b, h, q, k: (k <= q) & (q // 8192 == k // 8192)), None, None
    if kind == "prefix":
        pl = torch.tensor([1024, 700][:B], dtype=torch.int32, device=device)
        return (lambda b, h, q, k: (k <= q) | (k < pl[b])), None, None
    if kind == "t5":
        bias = torch.randn(H, 32, device=device) * 0.5

        def bucket(rel):
            ret = torch.where(rel > 0, 16, 0)
            n = rel.abs()
            large = torch.clamp(8 + (torch.log(torch.clamp(n, min=1) / 8.0) / math.log(16.0) * 8.0).floor().to(torch.int32), max=15)
            return ret + torch.where(n < 8, n, large)

        return None, (lambda s, b, h, q, k: s + bias[h, bucket(k - q)]), None
    if kind == "doc_window":
        doc = (torch.arange(S, device=device) // 1500).to(torch.int32)
        return (lambda b, h, q, k: (doc[q] == doc[k]) & (k <= q) & (q - k < 512)), None, None
    if kind == "docs":  # eight documents of 1024 packed in one sequence, ids gathered per position
        doc = (torch.arange(S, device=device) // 1024).to(torch.int32)
        return (lambda b, h, q, k: (doc[q] == doc[k]) & (k <= q)), None, None
    raise ValueError(kind)


def _kept(mask_mod, B, H, S, device) -> int:
    if mask_mod is None:
        return B * H * S * S
    total = 0
    ks = torch.arange(S, device=device)
    for b in range(B):
        for q0 in range(0, S, 1024):
            qs = torch.arange(q0, min(S, q0 + 1024), device=device)[:, None]
            total += int(mask_mod(torch.tensor(b, device=device), torch.tensor(0, device=device), qs, ks[None, :]).sum())
    return total * H


def _dense_mask(mask_mod, score_mod, B: int, H: int, S: int, device):
    """SDPA's attn_mask saying the row: the mask as booleans (B or 1, 1, S, S); with a score
    modification, the float bias it adds (B or 1, H, S, S; bf16, -inf where masked). None where the
    modification is not additive (score_mod(s) - s depends on s)."""
    bs = torch.arange(B, device=device)[:, None, None, None]
    hs = torch.arange(H, device=device)[None, :, None, None]
    ks = torch.arange(S, device=device)[None, None, None, :]
    if score_mod is not None:
        z = torch.zeros((), device=device)
        q0 = torch.arange(min(S, 64), device=device)[None, None, :, None]
        if not torch.allclose(score_mod(z + 4.0, bs, hs, q0, ks) - 4.0, score_mod(z, bs, hs, q0, ks), atol=1e-5):
            return None
    shape = (B, 1 if score_mod is None else H, S, S)
    out = torch.empty(shape, device=device, dtype=torch.bool if score_mod is None else torch.bfloat16)
    for q0 in range(0, S, 1024):  # row blocks: the broadcast index grids of a whole 32k row set are large
        qs = torch.arange(q0, min(S, q0 + 1024), device=device)[None, None, :, None]
        keep = mask_mod(bs, hs[:, :1], qs, ks) if mask_mod is not None else torch.ones((), dtype=torch.bool, device=device)
        if score_mod is None:
            out[:, :, q0:q0 + qs.shape[2]] = keep
        else:
            bias = score_mod(torch.zeros((), device=device), bs, hs, qs, ks).float()
            out[:, :, q0:q0 + qs.shape[2]] = torch.where(keep, bias, float("-inf")).to(out.dtype)
    if out.shape[0] > 1 and bool((out == out[:1]).all()):
        out = out[:1]
    return out


# SDPA backends timed where a dense mask says the row (SDPBackend names)
SDPA_PEERS = ("CUDNN_ATTENTION", "EFFICIENT_ATTENTION")


def sdpa_peers(q, k, v, g, mask, call_ref, fl_f: float, fl_fb: float) -> dict:
    """Forward and forward+backward ms of SDPA on `mask` per backend of SDPA_PEERS, with the max
    difference from attngen's output (call_ref); a backend that refuses the call is recorded.
    K / V of GQA rows are given expanded to the query heads where a backend takes no enable_gqa
    (the expansion outside the timing, its gradient's reduction left out)."""
    import triton
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    out = {}
    gqa = q.shape[1] != k.shape[1]
    for name in SDPA_PEERS:
        backend = getattr(SDPBackend, name)
        key = name.split("_")[0].lower()
        try:
            with sdpa_kernel([backend]):
                try:
                    f = lambda: sdpa(q, k, v, attn_mask=mask, enable_gqa=gqa)  # noqa: E731
                    o = f()
                    note = None
                except RuntimeError:
                    if not gqa:
                        raise
                    r = q.shape[1] // k.shape[1]
                    ke = k.detach().repeat_interleave(r, 1).requires_grad_(True)
                    ve = v.detach().repeat_interleave(r, 1).requires_grad_(True)
                    f = lambda: sdpa(q, ke, ve, attn_mask=mask)  # noqa: E731
                    o = f()
                    note = "K / V expanded to the query heads outside the timing"
                out[f"sdpa_{key}_max_diff"] = (o.float() - call_ref.float()).abs().max().item()
                with torch.no_grad():
                    t_f = triton.testing.do_bench(f, warmup=25, rep=100)
                leaves = [x for x in (q, k, v) if x.requires_grad] if note is None else [q, ke, ve]
                t_fb = triton.testing.do_bench(lambda: torch.autograd.grad(f(), leaves, g), warmup=10, rep=60)
            out.update({f"sdpa_{key}_fwd_ms": t_f, f"sdpa_{key}_fwdbwd_ms": t_fb,
                        f"sdpa_{key}_fwd_tflops": fl_f / t_f * 1e-9, f"sdpa_{key}_fwdbwd_tflops": fl_fb / t_fb * 1e-9})
            if note:
                out[f"sdpa_{key}_note"] = note
        except Exception as e:  # noqa: BLE001 -- a backend that cannot run the row is recorded
            out[f"sdpa_{key}_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        torch.cuda.empty_cache()
    return out


def run(quick: bool = False, only=None) -> dict:
    import triton
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    import attngen

    dev = torch.device("cuda")
    # every row's mask / score_mod, with and without grad, is a graph of its own: without room for
    # them Dynamo stops compiling and Flex falls back to its unfused eager path (a first run hit
    # the limit of 8 and timed that path)
    torch._dynamo.config.recompile_limit = 256
    torch._dynamo.config.accumulated_recompile_limit = 4096
    flex = torch.compile(flex_attention, dynamic=False)
    rows = []
    todo = [r for r in ROWS if r[0] in only] if only else (ROWS[:3] if quick else ROWS)
    for name, B, Hq, Hkv, S, D, kind in todo:
        torch.manual_seed(0)
        q = torch.randn(B, Hq, S, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(B, Hkv, S, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(B, Hkv, S, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
        mask_mod, score_mod, sinks = _mods(kind, B, Hq, S, dev)
        row = {"name": name, "B": B, "Hq": Hq, "Hkv": Hkv, "S": S, "D": D}
        try:
            pairs = _kept(mask_mod, B, Hq, S, dev)
            row["kept_fraction"] = pairs / (B * Hq * S * S)
            fl_f, fl_fb = 4 * pairs * D, 4 * pairs * D * 3.5
            call = lambda: attngen.attention(q, k, v, mask_mod=mask_mod, score_mod=score_mod, sinks=sinks)  # noqa: E731
            out = call()
            g = torch.randn_like(out)
            ga = torch.autograd.grad(out, (q, k, v), g)
            fb = lambda f: lambda: torch.autograd.grad(f(), (q, k, v), g)  # noqa: E731
            with torch.no_grad():
                t_a = triton.testing.do_bench(call, warmup=25, rep=100)
            t_ab = triton.testing.do_bench(fb(call), warmup=10, rep=60)
            row.update({"attngen_fwd_ms": t_a, "attngen_fwdbwd_ms": t_ab, "attngen_fwd_tflops": fl_f / t_a * 1e-9,
                        "attngen_fwdbwd_tflops": fl_fb / t_ab * 1e-9})
        except Exception as e:  # a row that fails is recorded, the run goes on
            row["error"] = f"{type(e).__name__}: {str(e)[:400]}"
            print(json.dumps(row), flush=True)
            rows.append(row)
            torch.cuda.empty_cache()
            continue
        try:  # Flex on its own: a row it cannot compile keeps attngen's and SDPA's numbers
            bm = create_block_mask(mask_mod, B, None, S, S, device=dev) if mask_mod is not None else None

            def fcall():
                if sinks is None:
                    return flex(q, k, v, score_mod=score_mod, block_mask=bm, enable_gqa=Hq != Hkv)
                o, lse = flex(q, k, v, score_mod=score_mod, block_mask=bm, enable_gqa=Hq != Hkv, return_lse=True)
                # sinks through an LSE correction after the kernel (what HF / vLLM do with Flex)
                w = torch.sigmoid(lse - sinks[None, :, None])
                return (o.float() * w[..., None]).to(o.dtype)

            ref = fcall()
            row["max_diff_vs_flex"] = (out.float() - ref.float()).abs().max().item()
            gf = torch.autograd.grad(ref, (q, k, v), g)
            row["grad_max_diff_vs_flex"] = max((a.float() - b.float()).abs().max().item() for a, b in zip(ga, gf))
            row["grad_max_ref"] = max(b.float().abs().max().item() for b in gf)
            with torch.no_grad():
                t_f = triton.testing.do_bench(fcall, warmup=25, rep=100)
            t_fb = triton.testing.do_bench(fb(fcall), warmup=10, rep=60)
            row.update({"flex_fwd_ms": t_f, "flex_fwdbwd_ms": t_fb, "flex_fwd_tflops": fl_f / t_f * 1e-9,
                        "flex_fwdbwd_tflops": fl_fb / t_fb * 1e-9, "ratio_fwd": t_f / t_a, "ratio_fwdbwd": t_fb / t_ab})
        except Exception as e:  # noqa: BLE001 -- recorded beside attngen's numbers
            row["flex_error"] = f"{type(e).__name__}: {str(e)[:400]}"
        torch.cuda.empty_cache()
        try:
            mask = None if sinks is not None else _dense_mask(mask_mod, score_mod, B, Hq, S, dev)
            if mask is not None:
                row.update(sdpa_peers(q, k, v, g, mask, out, fl_f, fl_fb))
                del mask
            else:
                row["sdpa"] = "no dense mask says the row (sinks)"
        except Exception as e:  # noqa: BLE001 -- the dense mask itself (memory): recorded
            row["sdpa_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        print(json.dumps(row), flush=True)
        rows.append(row)
        torch.cuda.empty_cache()
    return {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "rows": rows}


def _rows(names: str) -> tuple[list, str | None]:
    """(the row names asked for, an error naming the unknown ones or None)."""
    only = [r for r in (names or "").split(",") if r]
    unknown = sorted(set(only) - {r[0] for r in ROWS})
    if unknown:
        return only, f"unknown {', '.join(unknown)} (known: {', '.join(r[0] for r in ROWS)})"
    return only, None


def _write(res: dict, path: str) -> None:
    with open(path, "w") as fh:
        json.dump(res, fh, indent=1)


def main_args(args) -> int:
    """`attngen bench --mode mods [--cases ROW,...] [--quick] --out F`: exit 0 done, 1 no GPU, 2 bad
    arguments."""
    def fail(msg, code):
        print(f"attngen bench --mode mods: {msg}", file=sys.stderr)
        return code

    if getattr(args, "from_json", None) or getattr(args, "plot", None) or args.providers:
        return fail("--plot / --from / --providers: this mode times every peer and writes JSON only (--out)", 2)
    if args.dtype != "bf16":
        return fail("its rows are bf16 (--dtype bf16)", 2)
    if not args.out:
        return fail("--out FILE.json is required", 2)
    only, err = _rows(args.cases)
    if err:
        return fail(f"--cases: {err}", 2)
    if not torch.cuda.is_available():
        return fail("needs a CUDA GPU (torch.cuda.is_available() is False)", 1)
    _write(run(args.quick, only), args.out)
    print(f"wrote {args.out}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rows", default="", help="comma-separated row names (default: all)")
    a = ap.parse_args(argv)
    only, err = _rows(a.rows)
    if err:
        ap.error(f"--rows: {err}")
    _write(run(a.quick, only), a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
