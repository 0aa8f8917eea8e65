"""How far the golden samples move on this CPU, measured against the golden bound (CPU only).

Runs the golden-checked kernel tests (tests/kernels/test_fwd.py::test_fwd_kernel and
test_bwd.py::test_bwd_kernel: the same kernels, cases, seeds and configs) in this process, with
ATTNGEN_GOLDEN_DUMP collecting every checked sample, and compares each sample with a reference
value through tests/kernels/golden.py's own bound (with the golden file's recorded error). Per
kernel and tensor it reports, over all cases and samples, the worst

    dev / bound                 what the golden check tests (> 1 fails)
    dev / err                   dev against the kernel's recorded max error (float64 reference)
    (dev - ulp term)+ / err     the part beyond golden.py's value-relative ulp term, against err
                                (what golden.py's FRACTION must stay above)

where dev = |value - reference value|, for two references:

    vs_golden     the committed golden sample: everything that moved it since it was recorded
                  (kernel changes that the bound let through, and the CPU)
    vs_baseline   the same sample from another run of this script (--baseline, e.g. with numpy's
                  AVX-512 paths on): the CPU's rounding alone, the noise the bound must survive

    python3 benchmarks/tools/golden_noise.py --out on.json --samples on.jsonl
    NPY_DISABLE_CPU_FEATURES="AVX512F AVX512CD AVX512_SKX AVX512_CLX AVX512_CNL AVX512_ICL AVX512_SPR" \\
        python3 benchmarks/tools/golden_noise.py --out off.json --baseline on.jsonl

--kernels takes URI substrings (comma-separated) to run a subset; the JSON lists what ran.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import tests.conftest  # noqa: E402,F401  (the tests' set-up, first: the interpreter on and patched)
import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402

from tests.kernels import golden, test_bwd, test_fwd  # noqa: E402

TESTS = {"fwd": (test_fwd.KERNELS, test_fwd.test_fwd_kernel),
         "bwd": (test_bwd.KERNELS, test_bwd.test_bwd_kernel)}
AVX512 = ("AVX512F", "AVX512CD", "AVX512_SKX", "AVX512_CLX", "AVX512_CNL", "AVX512_ICL", "AVX512_SPR")
RATIOS = ("max_dev_over_bound", "max_dev_over_err", "max_dev_beyond_ulp_over_err")


def cpu_environment() -> dict:
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as feats
    except ImportError:  # numpy < 2
        from numpy.core._multiarray_umath import __cpu_features__ as feats
    cpuinfo = Path("/proc/cpuinfo")
    model = next((ln.split(":", 1)[1].strip() for ln in cpuinfo.read_text().splitlines()
                  if ln.startswith("model name")), None) if cpuinfo.exists() else None
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                                check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = None
    return {"cpu": model or platform.processor(),
            "NPY_DISABLE_CPU_FEATURES": os.environ.get("NPY_DISABLE_CPU_FEATURES", ""),
            "numpy_avx512_paths": {f: bool(feats.get(f)) for f in AVX512},
            "python": platform.python_version(), "numpy": np.__version__, "torch": torch.__version__,
            "triton": triton.__version__, "commit": commit}


def _key(rec: dict) -> tuple[str, str, str]:
    return rec["uri"], rec["case"], rec["tensor"]


def ratios(samples: list[dict], reference: dict[tuple[str, str, str], list[float]]) -> dict[str, dict[str, dict]]:
    """{uri: {tensor: worst ratios and the case of each}}: this run's samples against `reference`
    (the same samples' values from elsewhere), bounded as golden.compare bounds them."""
    recorded: dict[tuple[str, str], dict] = {}
    out: dict[str, dict[str, dict]] = {}
    for rec in samples:
        fam, uri = rec["family"], rec["uri"]
        if (fam, uri) not in recorded:
            recorded[fam, uri] = json.loads(golden.golden_path(fam, uri).read_text())
        want = recorded[fam, uri][rec["case"]][rec["tensor"]]
        dtype = getattr(torch, want["dtype"].removeprefix("torch."))
        got_t = torch.tensor(rec["value"], dtype=torch.float64)
        ref_t = torch.tensor(reference[_key(rec)], dtype=torch.float64)
        fin = torch.isfinite(ref_t) & torch.isfinite(got_t)
        dev = (got_t[fin] - ref_t[fin]).abs()
        err = want["err"]
        row = out.setdefault(uri, {}).setdefault(rec["tensor"], {
            "dtype": want["dtype"], "fraction": golden.FRACTION[dtype], "cases": 0, "samples": 0,
            "samples_moved": 0, "max_dev": 0.0, **{k: 0.0 for k in RATIOS}, "worst_case": {}})
        row["cases"] += 1
        row["samples"] += int(fin.sum())
        row["samples_moved"] += int((dev > 0).sum())
        if not dev.numel() or not float(dev.max()) > 0:
            continue
        row["max_dev"] = max(row["max_dev"], float(dev.max()))
        beyond_ulp = (dev - golden.sample_bound(dtype, 0.0, ref_t[fin])).clamp(min=0)
        here = {"max_dev_over_bound": float((dev / golden.sample_bound(dtype, err, ref_t[fin])).max()),
                "max_dev_over_err": float(dev.max()) / err if err > 0 else math.inf,
                "max_dev_beyond_ulp_over_err": float(beyond_ulp.max()) / err if err > 0 else math.inf}
        for k, v in here.items():
            if v > row[k]:
                row[k], row["worst_case"][k] = v, rec["case"]
    return out


def summary(kernels: dict[str, dict], against: str) -> dict[str, dict]:
    """The worst of each ratio over all kernels, for fp16/bf16 outputs and for the fp32 LSE."""
    out: dict[str, dict] = {}
    for uri, ent in kernels.items():
        for tensor, row in ent.get(against, {}).items():
            group = "fp32 (lse)" if row["dtype"] == "torch.float32" else "fp16/bf16"
            s = out.setdefault(group, {"fraction": row["fraction"],
                                       **{k: {"value": 0.0, "at": None} for k in RATIOS}})
            for k in RATIOS:
                if row[k] > s[k]["value"]:
                    s[k] = {"value": row[k], "at": f"{uri}/{row['worst_case'][k]}/{tensor}"}
    return out


def run_tests(families: list[str], wanted: list[str], dump: Path) -> dict[str, dict]:
    """Every selected kernel's golden-checked test, its samples appended to `dump`."""
    os.environ["ATTNGEN_GOLDEN_DUMP"] = str(dump)
    runs = {}
    for fam in families:
        kernels, test = TESTS[fam]
        for spec, path in kernels:
            if wanted and not any(w in spec.uri for w in wanted):
                continue
            t0 = time.perf_counter()
            try:
                test(spec, path)
                failure = None
            except AssertionError as exc:  # a failed check ends that kernel's cases: report it
                failure = str(exc)
            runs[spec.uri] = {"family": fam, "seconds": round(time.perf_counter() - t0, 1),
                              "test_failure": failure}
            print(f"{spec.uri}: {runs[spec.uri]['seconds']} s"
                  f"{'  FAILED: ' + failure.splitlines()[0] if failure else ''}", flush=True)
    return runs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="JSON file to write")
    ap.add_argument("--families", default="fwd,bwd", help="fwd, bwd or both (default: both)")
    ap.add_argument("--kernels", default="", help="comma-separated URI substrings (default: every kernel)")
    ap.add_argument("--samples", type=Path, help="also keep this run's samples (JSON lines) here")
    ap.add_argument("--baseline", type=Path, help="another run's --samples file to compare with too")
    ap.add_argument("--note", default="", help="free text stored in the JSON (e.g. why a subset)")
    args = ap.parse_args(argv)
    if os.environ.get("ATTNGEN_UPDATE_GOLDEN") == "1":
        print("golden_noise: unset ATTNGEN_UPDATE_GOLDEN: this measures against the goldens, "
              "it must not rewrite them", file=sys.stderr)
        return 2
    wanted = [w for w in args.kernels.split(",") if w]
    families = [f for f in args.families.split(",") if f]
    unknown = [f for f in families if f not in TESTS]
    if unknown:
        print(f"golden_noise: --families: unknown {unknown} (known: {', '.join(TESTS)})", file=sys.stderr)
        return 2
    baseline = None
    if args.baseline:
        baseline = {_key(r): r["value"] for r in map(json.loads, args.baseline.read_text().splitlines())}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        dump = Path(tmp) / "samples.jsonl"
        dump.touch()
        runs = run_tests(families, wanted, dump)
        samples = [json.loads(line) for line in dump.read_text().splitlines()]
        if args.samples:
            args.samples.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(dump, args.samples)
    seconds = time.perf_counter() - t0
    goldens = {}
    for rec in samples:
        if _key(rec) not in goldens:
            data = json.loads(golden.golden_path(rec["family"], rec["uri"]).read_text())
            for case, tensors in data.items():
                for tensor, want in tensors.items():
                    goldens[rec["uri"], case, tensor] = want["value"]
    vs = {"vs_golden": ratios(samples, goldens)}
    if baseline is not None:
        missing = [k for k in map(_key, samples) if k not in baseline]
        if missing:
            print(f"golden_noise: {args.baseline} lacks {len(missing)} of this run's samples, e.g. "
                  f"{'/'.join(missing[0])}", file=sys.stderr)
            return 2
        vs["vs_baseline"] = ratios(samples, baseline)
    kernels = {uri: {**run, **{k: v.get(uri, {}) for k, v in vs.items()}} for uri, run in runs.items()}
    doc = {"what": "max |sample - reference sample| per kernel and tensor against tests/kernels/golden.py's "
                   "bound and the kernel's recorded error; references: the committed golden (vs_golden) "
                   "and another run's samples (vs_baseline)",
           "command": shlex.join(["python3", "benchmarks/tools/golden_noise.py", *(sys.argv[1:] if argv is None else argv)]),
           "environment": cpu_environment(), "baseline": str(args.baseline) if args.baseline else None,
           "subset": wanted or None, "families": families, "note": args.note or None,
           "seconds": round(seconds, 1), "summary": {k: summary(kernels, k) for k in vs}, "kernels": kernels}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    for against in vs:
        print(f"\n{against}:\n{'kernel/tensor':60s} {'dev/bound':>10s} {'dev/err':>9s} {'beyond-ulp/err':>15s}")
        for uri, ent in kernels.items():
            for tensor, row in ent[against].items():
                print(f"{uri + '/' + tensor:60s} {row['max_dev_over_bound']:10.3g} "
                      f"{row['max_dev_over_err']:9.3g} {row['max_dev_beyond_ulp_over_err']:15.3g}")
        for group, s in doc["summary"][against].items():
            print(f"worst {group} (FRACTION {s['fraction']}): " + ", ".join(
                f"{k} {v['value']:.3g} at {v['at']}" for k, v in s.items() if k != "fraction"))
    failed = [u for u, r in runs.items() if r["test_failure"]]
    print(f"wrote {args.out} ({len(runs)} kernels, {seconds:.0f} s"
          f"{', test failures: ' + ', '.join(failed) if failed else ''})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
