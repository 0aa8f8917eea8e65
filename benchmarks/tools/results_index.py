"""Write the indexes of the committed runs: benchmarks/results/INDEX.md (benches, GPU test logs,
correctness grids, tuning runs) and benchmarks/ab/INDEX.md (A/B runs of kernel or config variants),
each listing every file of its folder with what it shows, the commit and date of the run, and the
documents that cite it.

    python3 benchmarks/tools/results_index.py          # rewrite both indexes
    python3 benchmarks/tools/results_index.py --check  # exit 1 when an index is stale, a file is cited
                                                       # nowhere, or an A/B run sits in benchmarks/results/
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
AB_RUN = "*_ab_*"  # how an A/B run is named (h200_ab_<what>_<date>.json); such files live in benchmarks/ab/
FOLDERS = {  # folder -> the opening of its index
    REPO / "benchmarks" / "results": [
        "Every file here (the committed runs the docs cite: benches, GPU test logs, correctness grids,",
        "tuning runs), what it shows, the commit of the run (where the file records it; the device",
        "copy of a tree can record its base commit plus local changes) and its date, and the documents",
        "that cite it. A/B runs of kernel or config variants live in `benchmarks/ab/` (its own INDEX.md).",
    ],
    REPO / "benchmarks" / "ab": [
        "Every A/B run here (kernel or config variants measured side by side in one process, by",
        "`benchmarks/tools/fwd_ab.py`, `bwd_ab.py`, `fp8_ab.py`; `varlen_ab.py`, removed, is in git at",
        "486282c), what it shows, the commit of the run (where the file records it; the device copy of",
        "a tree can record its base commit plus local changes) and its date, and the documents that cite it.",
    ],
}
INDEX = "INDEX.md"
DOCS = ["README.md", "docs/*.md", "benchmarks/README.md", "tuning_db/README.md", "attngen/**/*.py", "tests/**/*.py"]
KINDS = [  # filename pattern -> what such a file shows
    ("h[12]00_bench_*", "`attngen bench` run: TFLOP/s of attngen beside the peers, one JSON row per case and mode"),
    ("h[12]00_ab_*", "A/B run of kernel or config variants (benchmarks/tools/*_ab.py)"),
    ("h200_profile_fp8_*", "each fp8 bench row's kernels (GPU µs a call), host µs a call and bench µs, attngen fp8 beside cuDNN fp8 (benchmarks/tools/fp8_profile.py, removed: in git at 486282c)"),
    ("h200_sweep*", "config sweep on the H200 (tiles, warps, stages): TFLOP/s per config"),
    ("h[12]00_gpu_*", "GPU test suite run (tests/gpu): log or per-case summary"),
    ("gpu_correctness_grid*", "the GPU correctness grid (tests/gpu/test_gpu_grid.py): records or sanitizer summary"),
    ("h[12]00_tune_*", "`attngen tune` run or tuner comparison on the GPU the name says (h200_ / h100_)"),
    ("h200_launch_overhead*", "host time per call (benchmarks/launch_overhead.py)"),
    ("h200_edges*", "edge shapes: long sequences, many documents (benchmarks/edges_bench.py)"),
    ("*cp_scaling*", "context parallelism: tokens/s and TFLOP/s per GPU against the GPU count, attngen in torch's ring beside torch CP with SDPA (benchmarks/tools/cp_scaling.py)"),
    ("cpu_sass_*", "sm90 compiles on the CPU, every config the dispatcher can choose, checked for uniform registers read before any write (benchmarks/tools/sass_sweep.py)"),
    ("cpu_*", "CPU-side measurement (interpreter noise, CPU test runs)"),
    ("fp8_accuracy*", "fp8 accuracy report: RMSE against float64 on outlier inputs (`attngen bench --mode fp8 --accuracy`)"),
    ("h100_*", "H100 measurement"),
    ("*", "H200 measurement"),
]


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name != INDEX) if folder.is_dir() else []


def citations() -> dict[Path, dict[str, list[str]]]:
    """folder -> file name -> the documents citing it (by name, stem, or a pattern such as
    name_*_2026.json; a name alone finds the file in whichever folder holds it)."""
    texts = {}
    for pattern in DOCS:
        for p in REPO.glob(pattern):
            if not any(p.is_relative_to(folder) for folder in FOLDERS):
                texts[rel(p)] = p.read_text(errors="ignore")
    tokens = re.compile(r"[\w.*…{},-]*(?:h200|h100|cpu|gpu|fp8)_[\w.*…{},-]+")
    pats = set()
    for doc, text in texts.items():
        for tok in tokens.findall(text):
            tok = tok.strip(".,)`'\"").replace("…", "*")
            brace = re.search(r"\{([^}]*)\}", tok)
            for t in ([tok[:brace.start()] + x + tok[brace.end():] for x in brace.group(1).split(",")]
                      if brace else [tok]):
                pats.add((t, doc))
    out = {}
    for folder in FOLDERS:
        out[folder] = {}
        for f in files(folder):
            stem = f.rsplit(".", 1)[0]
            out[folder][f] = sorted({doc for pat, doc in pats
                                     if pat in (f, stem) or fnmatch.fnmatch(f, pat) or fnmatch.fnmatch(stem, pat)})
    return out


def describe(path: Path) -> tuple[str, str, str]:
    """(what, commit, date) of a results file."""
    name = path.name
    what = next(text for pat, text in KINDS if fnmatch.fnmatch(name, pat))
    date = (re.search(r"\d{4}-\d{2}-\d{2}", name) or [""])[0]
    commit = ""
    if name.endswith(".json"):
        try:
            data = json.loads(path.read_text())
        except ValueError:
            data = {}
        if isinstance(data, dict):
            commit = str(data.get("git_commit") or data.get("commit") or "")[:12]
            note = data.get("git_commit_note") or ""
            tree = re.search(r"tree ([0-9a-f]{7,})", note) or re.search(r'"tree": "([0-9a-f]+)"', json.dumps(data.get("runs", "")))
            if tree:
                commit = tree.group(1)
    return what, commit, date


def render(folder: Path, cited: dict[str, list[str]]) -> str:
    lines = [f"# {rel(folder)}: index", "", *FOLDERS[folder],
             "Written by `python3 benchmarks/tools/results_index.py`; a file cited nowhere leaves the tree",
             "(git history keeps it).", "",
             "| file | what it shows | commit | date | cited in |", "| --- | --- | --- | --- | --- |"]
    for f, docs in cited.items():
        what, commit, date = describe(folder / f)
        lines.append(f"| `{f}` | {what} | {commit or '-'} | {date or '-'} | {', '.join(docs) or '**nowhere**'} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true")
    args = p.parse_args(argv)
    cited = citations()
    bad = False
    for folder, names in cited.items():
        index = folder / INDEX
        text = render(folder, names)
        if not args.check:
            index.write_text(text)
            print(f"wrote {rel(index)} ({len(names)} files)")
            continue
        for f, docs in names.items():
            if not docs:
                bad = True
                print(f"cited nowhere: {rel(folder / f)}", file=sys.stderr)
        if not index.exists() or index.read_text() != text:
            bad = True
            print(f"{rel(index)} is stale: run python3 benchmarks/tools/results_index.py", file=sys.stderr)
    results = REPO / "benchmarks" / "results"
    for f in (fnmatch.filter(cited[results], AB_RUN) if args.check else []):
        bad = True
        print(f"an A/B run in benchmarks/results/: git mv benchmarks/results/{f} benchmarks/ab/", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
