"""Write benchmarks/results/INDEX.md: every file in benchmarks/results/ with what it shows, the
commit and date of the run, and the documents that cite it.

    python3 benchmarks/tools/results_index.py          # rewrite the index
    python3 benchmarks/tools/results_index.py --check  # exit 1 when it is stale or a file is cited nowhere
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
INDEX = RESULTS / "INDEX.md"
DOCS = ["README.md", "docs/*.md", "benchmarks/README.md", "tuning_db/README.md", "attngen/**/*.py", "tests/**/*.py"]
KINDS = [  # filename pattern -> what such a file shows
    ("h200_bench_*", "`attngen bench` run: TFLOP/s of attngen beside the peers, one JSON row per case and mode"),
    ("h200_ab_*", "A/B run of kernel or config variants (benchmarks/tools/*_ab.py)"),
    ("h200_sweep*", "config sweep on the H200 (tiles, warps, stages): TFLOP/s per config"),
    ("h200_gpu_*", "GPU test suite run (tests/gpu): log or per-case summary"),
    ("gpu_correctness_grid*", "the GPU correctness grid (tests/gpu/test_gpu_grid.py): records or sanitizer summary"),
    ("h200_tune_*", "`attngen tune` run or tuner comparison on the H200"),
    ("h200_launch_overhead*", "host time per call (benchmarks/launch_overhead.py)"),
    ("h200_edges*", "edge shapes: long sequences, many documents (benchmarks/edges_bench.py)"),
    ("cpu_*", "CPU-side measurement (interpreter noise, CPU test runs)"),
    ("fp8_accuracy*", "fp8 accuracy report: RMSE against float64 on outlier inputs (`attngen bench --mode fp8 --accuracy`)"),
    ("*", "H200 measurement"),
]


def citations() -> dict[str, list[str]]:
    """file name -> the documents citing it (by name, stem, or a pattern such as name_*_2026.json)."""
    texts = {}
    for pattern in DOCS:
        for p in REPO.glob(pattern):
            if "results" not in p.parts:
                texts[str(p.relative_to(REPO))] = p.read_text(errors="ignore")
    tokens = re.compile(r"[\w.*…{},-]*(?:h200|cpu|gpu|fp8)_[\w.*…{},-]+")
    pats = set()
    for doc, text in texts.items():
        for tok in tokens.findall(text):
            tok = tok.strip(".,)`'\"").replace("…", "*")
            brace = re.search(r"\{([^}]*)\}", tok)
            for t in ([tok[:brace.start()] + x + tok[brace.end():] for x in brace.group(1).split(",")]
                      if brace else [tok]):
                pats.add((t, doc))
    out = {}
    for f in sorted(p.name for p in RESULTS.iterdir() if p.name != INDEX.name):
        stem = f.rsplit(".", 1)[0]
        out[f] = sorted({doc for pat, doc in pats
                         if pat in (f, stem) or fnmatch.fnmatch(f, pat) or fnmatch.fnmatch(stem, pat)})
    return out


def describe(name: str) -> tuple[str, str, str]:
    """(what, commit, date) of a results file."""
    what = next(text for pat, text in KINDS if fnmatch.fnmatch(name, pat))
    date = (re.search(r"\d{4}-\d{2}-\d{2}", name) or [""])[0]
    commit = ""
    if name.endswith(".json"):
        try:
            data = json.loads((RESULTS / name).read_text())
        except ValueError:
            data = {}
        if isinstance(data, dict):
            commit = str(data.get("git_commit") or data.get("commit") or "")[:12]
            note = data.get("git_commit_note") or ""
            tree = re.search(r"tree ([0-9a-f]{7,})", note) or re.search(r'"tree": "([0-9a-f]+)"', json.dumps(data.get("runs", "")))
            if tree:
                commit = tree.group(1)
    return what, commit, date


def render(cited: dict[str, list[str]]) -> str:
    lines = ["# benchmarks/results: index", "",
             "Every file here, what it shows, the commit of the run (where the file records it; the device",
             "copy of a tree can record its base commit plus local changes) and its date, and the documents",
             "that cite it. Written by `python3 benchmarks/tools/results_index.py`; a file cited nowhere",
             "leaves the tree (git history keeps it).", "",
             "| file | what it shows | commit | date | cited in |", "| --- | --- | --- | --- | --- |"]
    for f, docs in cited.items():
        what, commit, date = describe(f)
        lines.append(f"| `{f}` | {what} | {commit or '-'} | {date or '-'} | {', '.join(docs) or '**nowhere**'} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true")
    args = p.parse_args(argv)
    cited = citations()
    text = render(cited)
    if args.check:
        uncited = [f for f, docs in cited.items() if not docs]
        stale = not INDEX.exists() or INDEX.read_text() != text
        for f in uncited:
            print(f"cited nowhere: benchmarks/results/{f}", file=sys.stderr)
        if stale:
            print("benchmarks/results/INDEX.md is stale: run python3 benchmarks/tools/results_index.py", file=sys.stderr)
        return 1 if uncited or stale else 0
    INDEX.write_text(text)
    print(f"wrote {INDEX.relative_to(REPO)} ({len(cited)} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
