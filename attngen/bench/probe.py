"""Compile sm90 kernels on any machine (no GPU: Triton's own ptxas) and report what the compiler
made of them: registers, spilled bytes, shared memory, and how each wgmma takes its A operand
(shared memory or registers). A kernel change can be looked at before it costs device time.

    TRITON_INTERPRET=0 python3 -m attngen.bench.probe fwd --hd 128 --mask causal --config 64,64,4,3
    TRITON_INTERPRET=0 python3 -m attngen.bench.probe fwd_fp8 --hd 128 --mask none --config 128,128,4,3,consumers=2
    TRITON_INTERPRET=0 python3 -m attngen.bench.probe fwd_fp8 --hd 96 --config 64,64,4,3 --prologue-warps 4
    TRITON_INTERPRET=0 python3 -m attngen.bench.probe bwd --hd 256 --mask causal \
        --config 32,64,4,2,64,64,4,2 --also split_dkdv=True
    ... --switch name=value   (a codegen option, attngen.codegen.render.template_context)
    ... --dump DIR            (ttgir, ptx and sass of every launch)
    TRITON_INTERPRET=0 python3 -m attngen.bench.probe --batch RUNS.json   (or - for stdin)

--batch: several probes in one process (one start-up of torch and Triton). FILE holds a JSON list of
argument lists; the last stdout line is a JSON list of one entry each, in order: its reports (as
--json prints them), or {"error": text} where it could not run (arguments refused, an exception
while making its launches). Exit status 1 when any entry is an error or holds a launch's error.

The launches are the launcher's own (attngen.families.fwd / bwd on small CPU tensors), so the
probe compiles exactly the specialization the runtime would run, with tensor descriptors where
the config asks for TMA.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import traceback
from collections import Counter
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "0")

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from attngen.codegen.render import render  # noqa: E402
from attngen.spec.expr import ParamDecl  # noqa: E402
from attngen.families.bwd import bwd_launches  # noqa: E402
from attngen.kernels.common import MaskArgs, mask_kind  # noqa: E402
from attngen.families.fwd import fwd_launches  # noqa: E402
from attngen.kernels.descriptors import make_descriptors  # noqa: E402
from attngen.runtime import loader  # noqa: E402
from attngen.spec import KernelSpec  # noqa: E402
from attngen.configs import BwdConfig, FwdConfig  # noqa: E402
from attngen.families import fwd_fp8  # noqa: E402
from attngen.families.fwd_fp8 import Fp8Config  # noqa: E402
from attngen.bench.sass import main_loop, undefined_uniform_reads  # noqa: E402,F401 (named here as before)
from attngen.bench.ptx import unfenced_barrier_inits, unfenced_descriptor_loads, uninvalidated_barriers  # noqa: E402


def parse_config(text: str, cls: type = FwdConfig):
    """--config M,N,W,S[,...][,field=value...]: the config class's leading int fields (tiles, warps,
    stages; a BwdConfig also its dQ pass's), TMA on, then other fields by name."""
    parts = text.split(",")
    nums = [int(p) for p in parts if "=" not in p]
    cfg = cls(*nums) if cls.__name__ == "Fp8Config" else cls(*nums, tma=True)
    for item in (p for p in parts if "=" in p):
        name, val = item.split("=", 1)
        value = {"True": True, "False": False}[val] if val in ("True", "False") else int(val)
        cfg = dataclasses.replace(cfg, **{name: value})
    return cfg


DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int32: "i32",
          torch.int64: "i64", torch.float8_e4m3fn: "fp8e4nv"}


def signature(launch) -> tuple[dict, dict, dict]:
    """(signature, constexprs, attributes) of a Launch's kernel for ASTSource, from its bound
    values, specialized as Triton's JIT specializes a call (parameters outside the kernel's
    do_not_specialize list): an int equal to 1 becomes the constant 1, an int that is a multiple
    of 16 and a tensor whose address is carry tt.divisibility 16 (what lets the compiler prove
    contiguity and alignment, hence vector loads and stores)."""
    fn = launch.fn
    values = dict(launch.values)
    if launch.descriptors:
        values.update(make_descriptors(launch.descriptors, values))
    dns = set(getattr(fn, "do_not_specialize", None) or ())
    dns |= {fn.arg_names[i] for i in dns if isinstance(i, int)}
    sig, const, attrs = {}, {}, {}
    for i, (param, name) in enumerate(zip(fn.params, fn.arg_names)):
        val = values[name]
        if param.is_constexpr or val is None:
            sig[name] = "constexpr"
            const[name] = val
        elif isinstance(val, torch.Tensor):
            sig[name] = "*" + DTYPES[val.dtype]
            if val.data_ptr() % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(val, int) and not isinstance(val, bool) and name not in dns and val == 1:
            sig[name] = "constexpr"
            const[name] = 1
        elif type(val).__name__ == "TensorDescriptor":
            block = ",".join(str(b) for b in val.block_shape)
            layout = f",{val.layout!r}" if getattr(val, "layout", None) is not None else ""  # Gluon's
            sig[name] = f"tensordesc<{DTYPES[val.base.dtype]}[{block}]{layout}>"
        elif isinstance(val, bool):
            sig[name] = "i1"
        elif isinstance(val, int):
            sig[name] = "i32" if -(1 << 31) <= val < (1 << 31) else "i64"
            if name not in dns and val % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(val, float):
            sig[name] = "fp32"
        else:
            raise TypeError(f"{fn.__name__}.{name}: cannot type {type(val).__name__}")
    return sig, const, attrs


def ptxas_report(ptx: str, tmp: Path) -> dict:
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    src = tmp / "k.ptx"
    src.write_text(ptx)
    res = subprocess.run([str(ptxas), "-v", "--gpu-name", "sm_90a", str(src), "-o", str(tmp / "k.o")],
                         capture_output=True, text=True)
    text = res.stdout + res.stderr
    out = {}
    m = re.search(r"Used (\d+) registers", text)
    out["registers"] = int(m.group(1)) if m else None
    m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    out["spill_stores"], out["spill_loads"] = (int(m.group(1)), int(m.group(2))) if m else (None, None)
    return out


def probe(launch, tmp: Path, dump: Path | None, tag: str) -> dict:
    sig, const, attrs = signature(launch)
    if getattr(launch.fn, "is_gluon", lambda: False)():
        from triton.experimental.gluon._runtime import GluonASTSource

        src = GluonASTSource(launch.fn, sig, const, attrs)
    else:
        src = ASTSource(launch.fn, sig, const, attrs)
    ck = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=launch.options)
    ptx = ck.asm["ptx"]
    rep = {"kernel": launch.fn.__name__, "num_warps": launch.num_warps, "num_stages": launch.num_stages,
           "shared_bytes": ck.metadata.shared, **ptxas_report(ptx, tmp)}
    # the global scratch each program gets (Triton's launcher allocates grid x this; kernel-made
    # descriptors live there)
    rep["global_scratch_bytes"] = int(getattr(ck.metadata, "global_scratch_size", 0) or 0)
    wgmma = re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)\.\S+\s+\{[^}]*\},\s*(\{|%rd)", ptx)
    rep["wgmma"] = sorted({f"{shape} A from {'registers' if a == '{' else 'shared'}" for shape, a in wgmma})
    # the operand types of each wgmma ("f32.bf16.bf16", "f32.e4m3.e4m3", ...)
    rep["wgmma_types"] = sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m\d+n\d+k\d+\.(\S+?)\s", ptx)))
    # how many wgmma groups a wait leaves in flight in the PTX (the Gluon kernels: 1, P.V during
    # the softmax; where ptxas puts its waits in the SASS: main_loop's waits_before_ex2)
    rep["wait_groups"] = sorted({int(n) for n in re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", ptx)})
    # byte permutes: an 8-bit register tensor unpacked into bytes and packed again (a layout change
    # of fp8 data, or one carried over a loop)
    rep["byte_permutes"] = len(re.findall(r"\bprmt\.b32\b", ptx))
    # global stores by width (st.global.b8 ... v4.b32): a byte store where 16 bytes were possible
    # (a store whose contiguity or mask the compiler cannot prove) shows here
    rep["global_stores"] = dict(sorted(Counter(re.findall(r"\bst\.global\.((?:v\d\.)?b\d+)", ptx)).items()))
    # global atomic adds by operand ("v2.f32": two fp32 adds in one instruction), atom and red alike
    rep["global_atomics"] = dict(sorted(Counter(re.findall(r"\b(?:atom|red)\.global\.(?:\w+\.)*?add\.(?:noftz\.)?((?:v\d\.)?[fbsu]\d+)", ptx)).items()))
    # global atomics in program order as "scope.semantics.op" ("gpu.acq_rel.add": a release of this
    # program's earlier stores, an acquire of others'), and the global loads that bypass L1 (.cg)
    rep["atomic_ops"] = [".".join(m) for m in re.findall(r"\batom\.global\.(\w+)\.(\w+)\.(\w+)\.", ptx)]
    rep["cg_loads"] = len(re.findall(r"\bld\.global\.cg\.", ptx))
    # programmatic dependent launch: the launch attribute, and the grid-dependency instructions
    # in the PTX in their order ("wait": before reading the previous kernel's outputs,
    # "launch_dependents": the next kernel may start), with the line of the first global read
    rep["launch_pdl"] = bool(getattr(ck.metadata, "launch_pdl", False))
    rep["griddepcontrol"] = re.findall(r"griddepcontrol\.(\w+)", ptx)
    lines = ptx.splitlines()
    first = {name: next((i for i, line in enumerate(lines) if re.search(pat, line)), None)
             for name, pat in (("wait", r"griddepcontrol\.wait"),
                               ("read", r"\bld\.global|cp\.async\.bulk\.tensor\.\w+\.shared::cluster\.global"))}
    rep["wait_before_reads"] = first["read"] is None or (first["wait"] is not None and first["wait"] < first["read"])
    # the reads ahead of the first wait, by kind (a kernel that quantizes Q itself reads the caller's
    # q and the rotation, no output of the kernel before it, by TMA before waiting)
    ahead = lines[:first["wait"]] if first["wait"] is not None else lines
    rep["reads_before_wait"] = {"ld.global": sum(bool(re.search(r"\bld\.global", x)) for x in ahead),
                                "tma": sum(bool(re.search(r"cp\.async\.bulk\.tensor\.\w+\.shared::cluster\.global", x))
                                           for x in ahead)}
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    cubin = tmp / "k.cubin"
    cubin.write_bytes(ck.asm["cubin"])
    sass = subprocess.run([str(cuobjdump), "-sass", str(cubin)], capture_output=True, text=True).stdout
    rep["main_loop"] = main_loop(sass)
    rep["undefined_uniform_reads"] = undefined_uniform_reads(sass)
    # TMA copies through a descriptor the kernel made that the issuing warp never acquired
    rep["unfenced_descriptor_loads"] = unfenced_descriptor_loads(ptx)
    rep["unfenced_barrier_inits"] = unfenced_barrier_inits(ptx)
    rep["uninvalidated_barriers"] = uninvalidated_barriers(ptx)
    if dump:
        dump.mkdir(parents=True, exist_ok=True)
        for ext in ("ttgir", "ptx"):
            (dump / f"{tag}.{ext}").write_text(ck.asm[ext])
        (dump / f"{tag}.sass").write_text(sass)
    return rep


def module_for(spec: KernelSpec, switch: dict, tmp: Path):
    if not switch:
        return loader.load(spec)
    path = tmp / f"{spec.uri}__probe.py"
    path.write_text(render(spec, options=switch))
    return loader.load_path(path)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="--batch FILE: several probes in one process (the module's doc)")
    ap.add_argument("family", choices=("fwd", "bwd", "fwd_fp8"))
    ap.add_argument("--hd", type=int, default=128)
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    ap.add_argument("--mask", default="causal", choices=("none", "causal", "sliding_window"))
    ap.add_argument("--gqa", type=int, default=1)
    ap.add_argument("--varlen", action="store_true", help="packed documents (fwd, bwd: two of 1024 tokens)")
    ap.add_argument("--config", required=True, help="M,N,W,S (bwd: M,N,W,S,dqM,dqN,dqW,dqS)")
    ap.add_argument("--also", action="append", default=[], help="config field=value (tma=True is implied)")
    ap.add_argument("--switch", action="append", default=[], help="codegen option name=value")
    ap.add_argument("--prologue-warps", type=int, default=0,
                    help="fwd_fp8: the one-launch prologue's warps (default: fwd_fp8.quant_warps, as the runtime)")
    ap.add_argument("--mask-expr", default="", help="a mask expression (the spec's mask becomes none)")
    ap.add_argument("--score-expr", default="", help="a score modification")
    ap.add_argument("--param", action="append", default=[],
                    help="NAME:SHAPE:DTYPE[:learnable], SHAPE b / h / ints joined by x (e.g. bias:hx32:fp32:learnable)")
    ap.add_argument("--sinks", action="store_true", help="learned sinks")
    ap.add_argument("--dump", default=None)
    ap.add_argument("--json", action="store_true", help="one JSON list of the reports on stdout instead of text")
    return ap


def launches_for(args: argparse.Namespace) -> tuple[KernelSpec, object, dict, list, Path]:
    """(spec, config, codegen switches, the launches to compile, a temporary folder) of one probe's
    parsed arguments."""
    cls = {"fwd": FwdConfig, "bwd": BwdConfig, "fwd_fp8": Fp8Config}[args.family]
    cfg = parse_config(",".join([args.config, *args.also]), cls)
    switch = dict(s.split("=", 1) for s in args.switch)
    kdtype = "fp8_e4m3" if args.family == "fwd_fp8" else args.dtype
    decls = []
    for p in args.param:
        name, shape, pdt, *learn = p.split(":")
        dims = tuple(d if d in ("b", "h") else int(d) for d in shape.split("x")) if shape else ()
        decls.append(ParamDecl(name, dims, pdt, bool(learn)))
    spec = KernelSpec(args.family, kdtype, "sm90", args.hd, args.hd, args.gqa,
                      "none" if args.mask_expr else args.mask, varlen=args.varlen, mask_expr=args.mask_expr,
                      score_expr=args.score_expr, params=tuple(decls), sinks=args.sinks)
    tmp = Path(tempfile.mkdtemp(prefix="attngen_probe_"))
    mod = module_for(spec, switch, tmp)

    dt = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    B, Hkv, S, D = 1, 2, 2048 if args.varlen else 512, args.hd  # packed: two documents of 1024 tokens
    Hq = Hkv * args.gqa
    q = torch.empty(B, Hq, S, D, dtype=dt)
    k, v = torch.empty(B, Hkv, S, D, dtype=dt), torch.empty(B, Hkv, S, D, dtype=dt)
    out, lse = torch.empty_like(q), torch.empty(B, Hq, S)
    extra = {f"XP_{d.name}": torch.zeros(*(B if s == "b" else Hq if s == "h" else s for s in d.shape),
                                         dtype=torch.int32 if d.dtype == "int32" else torch.float32) for d in decls}
    if args.sinks:
        extra["Sinks"] = torch.zeros(Hq)
    from attngen.spec.expr_terms import mask_node, run_params

    node = mask_node(spec)
    for name in (run_params(node) if node is not None else ()):  # P[q_idx] == P[kv_idx]: its runs
        from attngen.kernels.expr_buffers import run_bounds

        extra[f"XR_{name}"] = run_bounds(extra[f"XP_{name}"])
    if args.family == "bwd":  # the dQ pass's partial sums of learnable parameters, sinks' exact D
        from attngen.spec.expr_terms import grad_terms

        extra.update({f"XG{t.index}": torch.zeros(B * Hq * S * t.width) for t in grad_terms(spec)})
        if args.sinks:
            extra["XD"] = torch.empty(B, Hq, S)
    extra = extra or None
    causal = args.mask != "none" and not args.mask_expr
    wsz = (255, 0) if args.mask == "sliding_window" and not args.mask_expr else (-1, -1)
    _, wl, wr = mask_kind(causal, wsz)
    margs = MaskArgs(scale=1 / math.sqrt(D), softcap=0.0, window_left=wl, window_right=wr,
                     align_top_left=False)
    # the backward's dQ: with atomic_dq the fp32 buffer the dK/dV pass adds into (attn_bwd's dq_acc)
    dq_dtype = torch.float32 if args.family == "bwd" and cfg.atomic_dq else q.dtype
    if args.family == "fwd_fp8":  # the prologue (Q rotated, and not), then the attention launch (dense)
        # with programmatic dependent launch, as an sm90 GPU runs them (fwd_fp8.pdl)
        # and last the attention launch that quantizes Q itself (attention(precision="fp8")'s)
        bufs = fwd_fp8.alloc(fwd_fp8.buffers(spec, q, k, v, False), q.device)
        rot = fwd_fp8.rotation(fwd_fp8.qk_width(spec), fwd_fp8.ROTATION_SEED, dt, q.device)
        fa = (mod, spec, bufs["Q8"], bufs["K8"], bufs["Vt"], bufs["QScale"], bufs["KScale"], bufs["VScale"], out,
                lse, margs, cfg)
        launches = fwd_fp8.fp8_launches(*fa, gluon=True, use_pdl=True)
        fused = fwd_fp8.fp8_launches(*fa, gluon=True, use_pdl=True, q16=q, rot=rot)
        perm = fwd_fp8.key_order16(mod, launches)
        quant = fwd_fp8.quant_launches(mod, spec, q, k, v, bufs, rot, perm16=perm, use_pdl=True)
        # the runtime's prologue: one launch (_fp8_quant_qkv) at fwd_fp8.quant_warps, or --prologue-warps
        whole = fwd_fp8.prologue_launch(mod, spec, q, k, v, bufs, rot, perm16=perm, use_pdl=True)
        whole.num_warps = args.prologue_warps or whole.num_warps
        launches = [quant[0], quant[2], fwd_fp8.quant_launches(mod, spec, q, k, v, bufs, None, use_pdl=True)[0],
                    whole, *launches, *(fused if fwd_fp8.q_in_kernel(fused) else [])]
    elif args.family == "fwd" and args.varlen:
        packed = [t[0].transpose(0, 1).contiguous() for t in (q, k, v, out)]
        cu = torch.tensor([0, S // 2, S], dtype=torch.int32)
        launches = fwd_launches(mod, spec, *packed, torch.empty(Hq, S), margs, cfg, cu, cu, S // 2, gluon=True)
    elif args.family == "fwd":
        launches = fwd_launches(mod, spec, q, k, v, out, lse, margs, cfg, gluon=True, extra=extra)
    elif args.varlen:  # the backward over the same two packed documents
        pq, pk, pv, po = (t[0].transpose(0, 1).contiguous() for t in (q, k, v, out))
        plse = torch.empty(Hq, S)
        cu = torch.tensor([0, S // 2, S], dtype=torch.int32)
        launches = bwd_launches(mod, spec, pq, pk, pv, po, torch.empty_like(po), plse, torch.empty_like(plse),
                                torch.empty_like(pq, dtype=dq_dtype), torch.empty_like(pk), torch.empty_like(pv), margs, cfg,
                                bool(cfg.atomic_dq), cu, cu, S // 2, S // 2, gluon=True, extra=extra)[1:]
    else:
        launches = bwd_launches(mod, spec, q, k, v, out, torch.empty_like(out), lse, torch.empty_like(lse),
                                torch.empty_like(q, dtype=dq_dtype), torch.empty_like(k), torch.empty_like(v), margs, cfg,
                                bool(cfg.atomic_dq), gluon=True, extra=extra)[1:]
    return spec, cfg, switch, launches, tmp


def reports_of(launches: list, tmp: Path, dump: str | None):
    """Each launch's report (probe), in order; a launch that does not compile gives its error."""
    for i, launch in enumerate(launches):
        try:
            rep = probe(launch, tmp, Path(dump) if dump else None, f"{i}_{launch.fn.__name__}")
        except Exception as exc:  # noqa: BLE001 -- a probe reports, it does not stop
            if os.environ.get("ATTNGEN_PROBE_TRACE"):  # the whole chain of a compile error
                traceback.print_exception(exc)
            rep = {"kernel": launch.fn.__name__, "error": f"{type(exc).__name__}: {str(exc)[:400]}"}
        yield rep


def batch(argvs: list) -> list:
    """One entry per argument list (see --batch): its reports, or {"error": text} where it could not
    run (argparse's message, or the traceback's last 4000 characters)."""
    out = []
    for argv in argvs:
        if not (isinstance(argv, list) and all(isinstance(a, str) for a in argv)):
            out.append({"error": f"not a list of strings: {argv!r}"})
            continue
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                args = parser().parse_args(argv)
            _, _, _, launches, tmp = launches_for(args)
            try:
                out.append(list(reports_of(launches, tmp, args.dump)))
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        except SystemExit as exc:  # argparse refused the arguments
            out.append({"error": err.getvalue().strip() or f"SystemExit: {exc.code}"})
        except Exception:  # noqa: BLE001 -- one argument list failing does not stop the others
            out.append({"error": traceback.format_exc()[-4000:]})
    return out


def failed(entry) -> bool:
    """Whether a --batch entry (or a single run's reports) holds an error."""
    return isinstance(entry, dict) or any("error" in r for r in entry)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a == "--batch" or a.startswith("--batch=") for a in argv):
        bp = argparse.ArgumentParser(description="several probes in one process (this module's doc)")
        bp.add_argument("--batch", required=True, metavar="FILE", help="a JSON list of argument lists (-: stdin)")
        runs = bp.parse_args(argv).batch
        try:
            argvs = json.loads(sys.stdin.read() if runs == "-" else Path(runs).read_text())
        except ValueError as exc:
            bp.error(f"--batch {runs}: {exc}")
        if not isinstance(argvs, list):
            bp.error(f"--batch {runs}: not a JSON list of argument lists")
        entries = batch(argvs)
        print(json.dumps(entries))
        return 1 if any(failed(e) for e in entries) else 0
    args = parser().parse_args(argv)
    spec, cfg, switch, launches, tmp = launches_for(args)
    if not args.json:
        print(f"{spec.uri}  {cfg}  {switch or ''}")
    try:
        return _report(args, launches, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _report(args: argparse.Namespace, launches: list, tmp: Path) -> int:
    reports = []
    for rep in reports_of(launches, tmp, args.dump):
        reports.append(rep)
        if args.json:
            continue
        if "error" in rep:
            print(f"  {rep['kernel']}: {rep['error']}")
            continue
        print(f"  {rep['kernel']} w={rep['num_warps']} s={rep['num_stages']}: {rep['registers']} registers, "
              f"spills {rep['spill_stores']}/{rep['spill_loads']} B, shared {rep['shared_bytes']} B; "
              f"wgmma: {', '.join(rep['wgmma']) or 'none'}")
        if rep["unfenced_descriptor_loads"]:
            print(f"    TMA copies through a kernel-made descriptor this warp never acquired: "
                  f"{len(rep['unfenced_descriptor_loads'])} ({rep['unfenced_descriptor_loads'][0]})")
        if rep["unfenced_barrier_inits"]:
            print(f"    mbarrier initialisations not fenced for the copy engine: "
                  f"{len(rep['unfenced_barrier_inits'])} ({rep['unfenced_barrier_inits'][0]})")
        if rep["uninvalidated_barriers"]:
            print(f"    mbarriers never invalidated: {rep['uninvalidated_barriers']}")
        if rep["undefined_uniform_reads"]:
            print(f"    uniform registers read before any write: {', '.join(rep['undefined_uniform_reads'][:8])}")
        if rep["main_loop"]:
            ml = rep["main_loop"]
            print(f"    main loop: {ml['instructions']} instructions, {ml['wgmma']} wgmma, {ml['ex2']} ex2, "
                  f"{ml['bar_sync']} bar.sync, {ml['local_memory']} local-memory; {ml['waits_before_ex2']} of its "
                  f"{ml['waits']} wgmma waits before the first ex2")
    if args.json:
        print(json.dumps(reports))
    return 1 if failed(reports) else 0


if __name__ == "__main__":
    sys.exit(main())
