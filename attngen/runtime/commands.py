"""`attngen warmup` and `attngen explain`: the runtime's sub-commands (rows of cli.COMMANDS)."""

from __future__ import annotations

import argparse
import json
import sys

DTYPES = {"fp16": "float16", "bf16": "bfloat16"}


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def warmup_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("specs", nargs="+", help="spec files or folders: their entries' shapes are warmed")
    p.add_argument("--seqlens", type=_ints, default=[1024, 4096, 16384], metavar="S,S,...",
                   help="sequence lengths, one per shape bucket to compile (default: 1024,4096,16384)")
    p.add_argument("--batch", type=int, default=1, help="batch size of the warmed calls")
    p.add_argument("--backward", action="store_true", help="compile the backward kernels too")
    p.add_argument("--device", default="cuda",
                   help="cuda (needs a GPU) or cpu (Triton's interpreter)")
    p.add_argument("--pack", metavar="FILE", default=None,
                   help="also write a compiled-kernel pack of the kernels and launchers these calls "
                        "compile (compiled in a fresh temporary Triton cache); load it with "
                        "ATTNGEN_PACKS=FILE or attngen.load_pack(FILE) (needs --device cuda; default: no pack)")


def run_warmup(args: argparse.Namespace) -> int:
    import torch

    from attngen.spec import SpecError, load_specs

    try:
        files = load_specs(args.specs)
    except SpecError as exc:
        print(f"attngen warmup: {len(exc.problems)} problem(s):\n{exc}", file=sys.stderr)
        return 2
    if args.pack and not args.device.startswith("cuda"):
        print(f"attngen warmup: --pack holds compiled GPU kernels; --device {args.device} runs Triton's "
              "interpreter, which compiles none (use --device cuda)", file=sys.stderr)
        return 2
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("attngen warmup: --device cuda needs a CUDA GPU, and none is visible; `--device cpu` "
              "warms Triton's interpreter instead", file=sys.stderr)
        return 1
    if not args.pack:
        _warm(files, args)
        return 0
    from attngen.runtime import packwrite

    cap = packwrite.Capture()
    try:
        with cap:
            rows = _warm(files, args)
        built = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
        info = packwrite.write_pack(args.pack, cap, rows=rows, built=built)
    finally:
        cap.close()
    k, c = info["kernel"], info["c_module"]
    print(f"pack {args.pack}: {k['entries']} kernels ({k['bytes'] / 1024:.0f} KiB), {c['entries']} C modules "
          f"({c['bytes'] / 1024:.0f} KiB); {info['pack_bytes'] / 1024:.0f} KiB compressed")
    if not k["entries"]:
        print("attngen warmup: the pack holds no kernel: nothing was compiled in its cache (kernels this "
              "process had compiled before are not compiled again)", file=sys.stderr)
    return 0


def _warm(files, args) -> list[dict]:
    """Warm each entry's shapes, printing a line per call; the rows without their timings."""
    import torch

    from attngen.runtime.tools import warmup

    out = []
    for f in files:
        for e in f.entries:
            hq = e.num_q_heads or e.gqa_ratio
            hkv = e.num_kv_heads or 1
            inner = e.document_mask if e.mask == "document" else e.mask
            window = (e.window - 1, 0) if inner == "sliding_window" and e.window else (-1, -1)
            for dt in e.dtypes:
                if dt not in DTYPES:
                    continue
                rows = warmup(num_q_heads=hq, num_kv_heads=hkv, head_dim=e.head_dim_qk,
                              seqlens=args.seqlens, batch=args.batch,
                              dtype=getattr(torch, DTYPES[dt]), device=args.device,
                              causal=inner in ("causal", "sliding_window"), window_size=window,
                              softcap=e.softcap, backward=args.backward, varlen=e.mask == "document")
                for r in rows:
                    print(f"{e.name:<16} {dt:<5} S={r['seqlen']:<7} {r['bucket']:<20} {r['kernel']:<44} "
                          f"{r['config']}  {r['seconds']:.2f} s")
                    out.append({"entry": e.name, "dtype": dt, **{k: v for k, v in r.items() if k != "seconds"}})
    return out


def explain_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shape", type=_ints, required=True, metavar="B,Hq,Hkv,Sq,Sk,D",
                   help="batch, query heads, KV heads, query and key lengths, head dim")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="element type")
    p.add_argument("--causal", action="store_true", help="causal mask")
    p.add_argument("--window", type=_ints, default=[-1, -1], metavar="L,R",
                   help="sliding window, keys left and right of the query as flash-attn's "
                        "window_size (default: -1,-1, no window)")
    p.add_argument("--softcap", type=float, default=0.0, help="tanh softcapping; 0 is off")
    p.add_argument("--layout", choices=("bhsd", "bshd"), default="bhsd",
                   help="bhsd (SDPA's) or bshd (flash-attn's)")
    p.add_argument("--device", default="auto",
                   help="cuda (needs a GPU), cpu (Triton's interpreter) or auto: cuda when a GPU is "
                        "visible, else cpu")
    p.add_argument("--precision", choices=("default", "fp8"), default="default",
                   help="fp8: the fp8 family (attention(..., precision='fp8'))")
    p.add_argument("--no-rotate", dest="rotate", action="store_false",
                   help="with --precision fp8: no Hadamard rotation of Q and K")


def run_explain(args: argparse.Namespace) -> int:
    import torch

    from attngen.runtime.tools import explain

    if len(args.shape) != 6:
        print("attngen explain: --shape takes B,Hq,Hkv,Sq,Sk,D", file=sys.stderr)
        return 2
    B, hq, hkv, sq, sk, d = args.shape
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if str(args.device).startswith("cuda") and not torch.cuda.is_available():
        print("attngen explain: --device cuda needs a CUDA GPU (torch.cuda.is_available() is False); "
              "on this machine, `--device cpu` explains what Triton's interpreter would run",
              file=sys.stderr)
        return 1
    dt = getattr(torch, DTYPES[args.dtype])
    dims = ((B, hq, sq, d), (B, hkv, sk, d)) if args.layout == "bhsd" else ((B, sq, hq, d), (B, sk, hkv, d))
    try:  # shapes only: nothing is allocated or launched
        q = torch.empty(dims[0], dtype=dt, device=args.device)
        k = torch.empty(dims[1], dtype=dt, device=args.device)
        info = explain(q, k, k, causal=args.causal, window_size=tuple(args.window),
                       softcap=args.softcap, layout=args.layout,
                       precision=None if args.precision == "default" else args.precision, rotate=args.rotate)
    except (ValueError, RuntimeError) as exc:
        print(f"attngen explain: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(info, indent=1))
    return 0
