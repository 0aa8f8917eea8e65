"""The first attention calls of a fresh process, decomposed (issue 49). On the GPU machine, from
the repository root:

    python3 benchmarks/tools/first_call.py --out benchmarks/results/h200_first_call_<date>.json

Each run is a fresh subprocess that times (a) `import torch`, `import attngen` (its public
functions: the runtime, triton), the CUDA context, the inputs; (b) the first forward call and the
first backward, each split by attngen.bench.startup into Triton's compile (its stages; ptxas
inside the cubin stage; the triton_key() hash inside the compile), the C modules Triton builds or
loads (launchers, its driver's utilities; the C compiler's share), module loads into the GPU,
the packs' loading, attngen's kernel resolution (spec, module, config from the tuning database),
and the rest (Triton's JIT binding, planning, the launches and the kernels); then a second
forward and backward (nothing left to compile). Before them, torch's own first backward (a tiny
one, no attention: torch imports sympy there, 2.2 s on the H100 machine) is timed apart. Settings, each --repeats times, interleaved:

  cold    empty Triton cache (TRITON_CACHE_DIR) and attngen cache (ATTNGEN_CACHE_DIR)
  warm    a new process on the Triton cache the cold run filled
  packed  empty caches, with a pack of the same shape (built once by `attngen warmup SPEC
          --backward --pack FILE`, timed) in ATTNGEN_PACKS
  shipped empty caches, no ATTNGEN_PACKS: the packs shipped in attngen/packs/ (only where there
          are some; the other settings switch them off with ATTNGEN_SHIPPED_PACKS=0)

Writes one JSON: GPU, versions, commit, the shape, the pack (bytes per kind, build time), every
run and the medians; prints a table of the medians. `--device cpu` is a smoke run of the tool
itself through Triton's interpreter (nothing compiles, no pack, no packed setting).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # this checkout's attngen, whatever is installed
SETTINGS = ("cold", "warm", "packed", "shipped")
SPEC = """\
kernels:
  - name: first_call
    head_dim: {d}
    num_q_heads: {hq}
    num_kv_heads: {hkv}
    mask: {mask}
    dtypes: {dtype}
    targets: [sm80, sm90]
    families: [fwd, bwd]
"""


def child(args) -> None:
    """One fresh process's numbers, as JSON into args.child."""
    t = time.perf_counter()
    import torch
    out = {"import_torch_s": time.perf_counter() - t}
    t = time.perf_counter()
    import attngen
    attention = attngen.attention  # the runtime, its torch ops, triton
    out["import_attngen_s"] = time.perf_counter() - t

    from attngen.bench.startup import StartupProbe, compiled_anything
    from attngen.runtime import packs

    probe = StartupProbe().install()
    dev = args.device
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    t = time.perf_counter()
    if dev == "cuda":
        torch.cuda.init()
        torch.empty(1, device=dev)
        sync()
    out["cuda_init_s"] = time.perf_counter() - t
    B, hq, hkv, S, D = args.shape
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    t = time.perf_counter()
    torch.manual_seed(0)
    q = torch.randn(B, hq, S, D, device=dev, dtype=dt, requires_grad=True)
    k, v = (torch.randn(B, hkv, S, D, device=dev, dtype=dt, requires_grad=True) for _ in range(2))
    dout = torch.randn(B, hq, S, D, device=dev, dtype=dt)
    sync()
    out["inputs_s"] = time.perf_counter() - t
    # torch's own first backward with a given gradient imports sympy (torch.autograd._make_grads ->
    # torch.fx.experimental.symbolic_shapes): every model's first backward pays it, attention or not
    t = time.perf_counter()
    w = torch.ones(2, device=dev, requires_grad=True)
    (w * 2).backward(torch.ones(2, device=dev))
    sync()
    out["torch_first_backward_s"] = time.perf_counter() - t
    profiles = {}
    for n in ("", "_2"):
        for phase in ("forward", "backward"):
            prof = _profiler(args) if not n else None
            with probe.phase(phase + n):
                if prof:
                    prof.enable()
                if phase == "forward":
                    o = attention(q, k, v, causal=args.causal)
                else:
                    o.backward(dout)
                sync()
                if prof:
                    prof.disable()
            if prof:
                profiles[phase] = _profile_text(prof)
    if args.profile:
        Path(args.profile).write_text("".join(f"===== first {p}\n{t}\n" for p, t in profiles.items()))
    probe.uninstall()
    out["phases"] = probe.summary()
    out["compiled"] = {p: compiled_anything(row) for p, row in out["phases"].items()}
    out["packs"] = [r.as_dict() for r in packs.loaded()]
    Path(args.child).write_text(json.dumps(out, indent=1))


def _profiler(args):
    if not args.profile:
        return None
    import cProfile

    return cProfile.Profile()


def _profile_text(prof, lines: int = 60) -> str:
    import io
    import pstats

    buf = io.StringIO()
    st = pstats.Stats(prof, stream=buf)
    st.sort_stats("cumulative").print_stats(lines)
    st.sort_stats("tottime").print_stats(lines // 2)
    return buf.getvalue()


def _env(triton_cache: Path, attngen_cache: Path, pack: Path | None, shipped: bool = False) -> dict:
    e = {k: v for k, v in os.environ.items() if k != "ATTNGEN_PACKS"}
    e.update(TRITON_CACHE_DIR=str(triton_cache), ATTNGEN_CACHE_DIR=str(attngen_cache), PYTHONUNBUFFERED="1",
             ATTNGEN_SHIPPED_PACKS="1" if shipped else "0")
    if pack is not None:
        e["ATTNGEN_PACKS"] = str(pack)
    return e


def run_child(args, tmp: Path, name: str, triton_cache: Path, attngen_cache: Path, pack=None,
              shipped: bool = False) -> dict:
    result = tmp / f"{name}.json"
    argv = [sys.executable, __file__, "--child", str(result), "--shape", ",".join(map(str, args.shape)),
            "--dtype", args.dtype, "--device", args.device] + ([] if args.causal else ["--no-causal"])
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
        argv += ["--profile", str(Path(args.profile) / f"{name}.txt")]
    t = time.perf_counter()
    res = subprocess.run(argv, env=_env(triton_cache, attngen_cache, pack, shipped), cwd=REPO, capture_output=True,
                         text=True, timeout=args.timeout)
    if res.returncode:
        sys.exit(f"{name}: exit {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr[-4000:]}")
    out = json.loads(result.read_text())
    out["process_s"] = time.perf_counter() - t
    return out


def build_pack(args, tmp: Path) -> dict:
    B, hq, hkv, S, D = args.shape
    spec = tmp / "first_call.yaml"
    spec.write_text(SPEC.format(d=D, hq=hq, hkv=hkv, mask="causal" if args.causal else "none", dtype=args.dtype))
    pack = tmp / "first_call.pack"
    argv = [sys.executable, "-c", "import sys; from attngen.cli import main; sys.exit(main(sys.argv[1:]))",
            "warmup", str(spec), "--seqlens", str(S), "--batch", str(B), "--backward", "--pack", str(pack)]
    t = time.perf_counter()
    res = subprocess.run(argv, env=_env(tmp / "pack_triton", tmp / "pack_attngen", None), cwd=REPO,
                         capture_output=True, text=True, timeout=args.timeout)
    if res.returncode:
        sys.exit(f"attngen warmup --pack: exit {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr[-4000:]}")
    import zipfile

    from attngen.runtime import packs, packwrite

    with zipfile.ZipFile(pack) as zf:
        manifest = packs.read_manifest(zf)
    return {"path": pack, "build_s": time.perf_counter() - t, "log": res.stdout.splitlines(),
            **packwrite.summary(manifest, pack.stat().st_size),
            "entries": [{"kind": e["kind"], "name": e["name"], "uri": (e.get("kernel") or {}).get("uri"),
                         "bytes": sum(r["size"] for r in e["files"])} for e in manifest["entries"]]}


KEYS = ("wall_s", "triton_compile_s", "ptxas_s", "triton_key_s", "c_modules_s", "c_compiler_s", "module_load_s",
        "pack_load_s", "attngen_resolve_s", "attngen_load_module_s", "other_s")


def medians(runs: list[dict]) -> dict:
    out = {k: statistics.median(r[k] for r in runs) for k in
           ("process_s", "import_torch_s", "import_attngen_s", "cuda_init_s", "inputs_s", "torch_first_backward_s")}
    for phase in ("forward", "backward", "forward_2", "backward_2"):
        out[phase] = {k: statistics.median(r["phases"][phase].get(k, 0.0) for r in runs) for k in KEYS}
    return out


def table(result: dict) -> str:
    med = result["median"]
    rows = [("", *med)]
    for k in ("process_s", "import_torch_s", "import_attngen_s", "cuda_init_s", "torch_first_backward_s"):
        rows.append((k, *(f"{m[k]:.3f}" for m in med.values())))
    for phase in ("forward", "backward", "forward_2"):
        for k in KEYS:
            rows.append((f"{phase}.{k}", *(f"{m[phase][k]:.3f}" for m in med.values())))
    width = max(len(r[0]) for r in rows)
    return "\n".join(f"{r[0]:<{width}}  " + "  ".join(f"{c:>8}" for c in r[1:]) for r in rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="1,32,8,4096,128", metavar="B,Hq,Hkv,S,D",
                   help="the call (default: Llama-3-8B's heads, one sequence of 4096)")
    p.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    p.add_argument("--no-causal", dest="causal", action="store_false")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: a smoke run of this tool through Triton's interpreter")
    p.add_argument("--repeats", type=int, default=3, help="runs of each setting, interleaved")
    p.add_argument("--timeout", type=int, default=600, help="seconds one subprocess may take")
    p.add_argument("--out", help="the JSON to write")
    p.add_argument("--profile", metavar="DIR", help="write a cProfile text of each process's first forward "
                   "and first backward into DIR (one file per run; the phases' times include the profiler's cost)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.shape = [int(x) for x in args.shape.split(",")]
    if args.child:
        return child(args)
    import torch

    from attngen import __version__
    from attngen.bench.report import git_commit

    with tempfile.TemporaryDirectory(prefix="attngen-first-call-") as name:
        tmp = Path(name)
        from attngen import env

        settings = SETTINGS[:3] if args.device == "cuda" else SETTINGS[:2]
        if args.device == "cuda" and env.shipped_packs():
            settings += ("shipped",)
        pack = build_pack(args, tmp) if "packed" in settings else {"path": Path("none")}
        runs = {s: [] for s in settings}
        for r in range(args.repeats):
            cold_t, cold_a = tmp / f"cold{r}_triton", tmp / f"cold{r}_attngen"
            runs["cold"].append(run_child(args, tmp, f"cold{r}", cold_t, cold_a))
            runs["warm"].append(run_child(args, tmp, f"warm{r}", cold_t, cold_a))
            if "packed" in runs:
                runs["packed"].append(run_child(args, tmp, f"packed{r}", tmp / f"packed{r}_triton",
                                                tmp / f"packed{r}_attngen", pack["path"]))
            if "shipped" in runs:
                runs["shipped"].append(run_child(args, tmp, f"shipped{r}", tmp / f"shipped{r}_triton",
                                                 tmp / f"shipped{r}_attngen", shipped=True))
        pack["path"] = pack["path"].name
    import triton

    gpu = args.device == "cuda"
    result = {"tool": "benchmarks/tools/first_call.py", "gpu": torch.cuda.get_device_name() if gpu else None,
              "capability": ".".join(map(str, torch.cuda.get_device_capability())) if gpu else None,
              "torch": torch.__version__,
              "triton": triton.__version__, "python": sys.version.split()[0], "attngen": __version__,
              "commit": git_commit(), "shape": dict(zip(("B", "Hq", "Hkv", "S", "D"), args.shape)),
              "dtype": args.dtype, "causal": args.causal, "repeats": args.repeats, "pack": pack,
              "median": {s: medians(r) for s, r in runs.items()}, "runs": runs}
    print(table(result))
    for s, rs in runs.items():
        print(f"compiled ({s}):", [r["compiled"] for r in rs])
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
