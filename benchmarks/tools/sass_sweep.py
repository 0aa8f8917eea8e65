"""Compile, on any machine (no GPU: Triton's own ptxas, attngen.bench.probe), the sm90 kernels of
every config the dispatcher can choose, and check each launch's SASS for uniform registers read
where no path wrote them (attngen.bench.probe.undefined_uniform_reads: the ptxas bug behind the fp8
prologue's illegal addresses at 4 warps). The configs: the GPU grid's forced paths
(tests/gpu/test_gpu_grid.py's FWD_PATHS / BWD_PATHS), the shipped winners' configs and the packed
documents' kernels at head dims 64, 96, 128 and 256 under the three masks; the fp8 family's Gluon
and Triton configs (with the prologue the runtime launches) at every qk width class from 16 to 256;
the defaults and pointer / TMA fallbacks at the other head dims (8 ... 224); and the decode family's
defaults and shipped winners at hd64 / 128 / 256, one and four query rows, a contiguous or paged
cache in bf16 or e4m3, split and not. A config a spec cannot take is recorded as its InvalidConfig
and skipped.

    python3 benchmarks/tools/sass_sweep.py OUT.json [--workers 2]    # about 25 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import subprocess
import sys
from multiprocessing import Pool
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def cfg_str(cfg) -> str:
    """A config as the probe's --config text: its leading int fields, then every field off its default
    (tma always, for the bf16 families: the probe's own default is TMA on)."""
    nums, named = [], []
    for f in dataclasses.fields(cfg):
        val = getattr(cfg, f.name)
        if f.default is dataclasses.MISSING:
            nums.append(str(val))
        elif f.name == "tma" and type(cfg).__name__ != "Fp8Config":
            named.append(f"tma={val}")
        elif val != f.default:
            named.append(f"{f.name}={val}")
    return ",".join(nums + named)


def jobs() -> list[tuple]:
    from attngen.configs import FwdConfig
    from attngen.families import bwd, fwd, fwd_fp8
    from attngen.spec import KernelSpec
    from tests.gpu.test_gpu_grid import BWD_PATHS, FWD_PATHS

    out = []
    fwd_cfgs = sorted({cfg_str(c) for p in FWD_PATHS for c in p.configs})
    bwd_cfgs = sorted({cfg_str(c) for p in BWD_PATHS for c in p.configs})
    for hd in (64, 96, 128, 256):
        for mask in ("none", "causal", "sliding_window"):
            out += [("fwd", hd, mask, 1, c, False) for c in fwd_cfgs]
            out += [("bwd", hd, mask, 1, c, False) for c in bwd_cfgs]
    # the shipped winners' forward configs not among the paths (tuning_db/attngen.sqlite, sm90)
    for c in ("128,128,4,3,tma=True,consumers=2,pair_tiles=True", "64,64,4,2,tma=True,consumers=1,pair_tiles=True",
              "64,64,4,3,tma=True,lazy_rescale=True", "64,128,4,1,tma=True"):
        for hd, mask in ((128, "causal"), (128, "sliding_window"), (256, "causal"), (256, "sliding_window")):
            out.append(("fwd", hd, mask, 4 if hd == 128 else 2, c, False))
    for hd in (64, 128):  # packed documents: the persistent Gluon kernel and the Triton one
        out.append(("fwd", hd, "causal", 4, cfg_str(fwd.WS_DOCS), True))
        out.append(("fwd", hd, "causal", 4, cfg_str(FwdConfig(64, 64, 4, 2, tma=True)), True))
    fp8 = [fwd_fp8.WS_FP8_DEFAULT, fwd_fp8.WS_FP8_DEFAULT_WIDE, fwd_fp8.Fp8Config(64, 128, 4, 2, consumers=1),
           fwd_fp8.Fp8Config(128, 128, 4, 4, consumers=2), fwd_fp8.Fp8Config(128, 128, 4, 3, consumers=2),
           fwd_fp8.Fp8Config(64, 64, 4, 3), fwd_fp8.Fp8Config(128, 64, 8, 3), fwd_fp8.Fp8Config(64, 64, 4, 3, precise_acc=True)]
    for hd in (16, 32, 48, 64, 80, 96, 112, 128, 160, 192, 256):
        for mask in ("none", "causal", "sliding_window"):
            out += [("fwd_fp8", hd, mask, 1, cfg_str(c), False) for c in fp8]
    for hd in (8, 16, 32, 48, 80, 112, 160, 192, 224):  # the other head dims: defaults and fallbacks
        for mask in ("none", "causal"):
            s = KernelSpec("fwd", "bf16", "sm90", hd, hd, 1, mask)
            for c in sorted({cfg_str(fwd.default_fwd_config(s, "cuda", n)) for n in (256, 2048, 16384)}
                            | {"64,64,4,2,tma=False", "64,64,4,3,tma=True"}):
                out.append(("fwd", hd, mask, 1, c, False))
            sb = KernelSpec("bwd", "bf16", "sm90", hd, hd, 1, mask)
            for c in sorted({cfg_str(bwd.default_bwd_config(sb, "cuda")), "64,64,4,2,64,64,4,2,tma=False"}):
                out.append(("bwd", hd, mask, 1, c, False))
    decode = {"128,8,2,0", "64,4,3,0", "64,2,3,0", "32,4,2,0",  # the defaults (decode.py)
              "64,2,4,0", "32,2,3,1", "32,2,3,0", "32,4,3,0", "64,2,3,32", "64,4,2,8", "64,4,3,32"}  # winners
    for hd in (64, 128, 256):
        for layout in ("contiguous", "paged", "contiguous-e4m3", "paged-e4m3"):
            for sq in (1, 4):
                out += [("decode", hd, "causal", 4, c, f"{layout}-q{sq}") for c in sorted(decode)]
    return out


def run_decode(job: tuple) -> list[dict]:
    """The decode launches (the split kernel, and the combine where the call splits) of one job."""
    import math
    import tempfile

    import torch

    from attngen.bench.probe import probe
    from attngen.families import decode as fd
    from attngen.kernels.common import MaskArgs
    from attngen.runtime import loader
    from attngen.spec import KernelSpec

    _, hd, mask, gqa, cfg_text, variant = job
    layout, sq = variant.rsplit("-q", 1)
    sq = int(sq)
    spec = KernelSpec("decode", "bf16", "sm90", hd, hd, gqa, mask)
    mod = loader.load(spec)
    B, hkv, cap, page = 2, 2, 4096, 16
    hq = hkv * gqa
    cfg = fd.DecodeConfig(*[int(x) for x in cfg_text.split(",")])
    cdt = torch.float8_e4m3fn if layout.endswith("e4m3") else torch.bfloat16
    paged = layout.startswith("paged")
    q = torch.empty(B, sq, hq, hd, dtype=torch.bfloat16)
    k = torch.empty((B * cap // page, page, hkv, hd) if paged else (B, cap, hkv, hd), dtype=cdt)
    table = torch.zeros(B, cap // page, dtype=torch.int32) if paged else None
    descale = torch.ones(B, hkv) if cdt != torch.bfloat16 else None
    n, split_len = fd.splits(cfg, B, hkv, cap, 132)
    ops, lps = fd.partial_shapes(B, hkv, n, fd.rows_tile(gqa, sq), hd)
    launches = fd.decode_launches(mod, spec, q, k, k, torch.empty(B, sq, hq, hd, dtype=torch.bfloat16),
                                  torch.empty(B, hq, sq), torch.empty(ops), torch.empty(lps),
                                  MaskArgs(1 / math.sqrt(hd), 0.0, -1, 0, False), cfg, n, split_len,
                                  cache_seqlens=torch.full((B,), cap - sq, dtype=torch.int32), block_table=table,
                                  new_len=sq, k_descale=descale, v_descale=descale, use_pdl=True)
    tmp = Path(tempfile.mkdtemp(prefix="attngen_sweep_"))
    return [probe(la, tmp, None, la.fn.__name__) for la in launches]


def run_probe(job: tuple) -> list[dict]:
    """The probe's launches of one fwd / bwd / fwd_fp8 job (its reports, as --json prints them)."""
    from attngen.bench import probe

    fam, hd, mask, gqa, cfg, varlen = job
    args = [fam, "--hd", str(hd), "--mask", mask, "--gqa", str(gqa), "--config", cfg, "--json"]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        probe.main(args + (["--varlen"] if varlen else []))
    return json.loads(buf.getvalue().strip().splitlines()[-1])


def run(job: tuple) -> dict:
    fam, hd, mask, gqa, cfg, variant = job
    try:
        reports = run_decode(job) if fam == "decode" else run_probe(job)
    except Exception as exc:  # noqa: BLE001 -- a config a spec cannot take is recorded
        reports = [{"error": f"{type(exc).__name__}: {str(exc)[:200]}"}]
    return {"family": fam, "hd": hd, "mask": mask, "gqa": gqa, "config": cfg,
            ("variant" if fam == "decode" else "varlen"): variant,
            "launches": [{k: r[k] for k in ("kernel", "num_warps", "undefined_uniform_reads") if k in r}
                         if "error" not in r else {"kernel": r.get("kernel"), "error": r["error"]} for r in reports]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    import triton

    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    version = subprocess.run([str(ptxas), "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
    todo = jobs()
    with Pool(args.workers) as pool:
        rows = pool.map(run, todo, chunksize=1)
    compiled = [la for r in rows for la in r["launches"] if "error" not in la]
    flagged = [dict(r, launches=[la for la in r["launches"] if la.get("undefined_uniform_reads")])
               for r in rows if any(la.get("undefined_uniform_reads") for la in r["launches"])]
    doc = {"what": __doc__.split("\n\n")[0].replace("\n", " "), "commit": commit, "triton": triton.__version__,
           "ptxas": version, "configs": len(rows), "configs_invalid": sum(any("error" in la for la in r["launches"])
                                                                        for r in rows),
           "launches_compiled": len(compiled), "launches_flagged": sum(len(f["launches"]) for f in flagged),
           "flagged": flagged, "rows": rows}
    Path(args.out).write_text(json.dumps(doc, indent=1))
    print(json.dumps({k: doc[k] for k in ("commit", "ptxas", "configs", "configs_invalid", "launches_compiled",
                                          "launches_flagged")}))
    return 1 if flagged else 0


if __name__ == "__main__":
    sys.exit(main())
