"""Print an `attngen bench` JSON next to an earlier run's (e.g. the committed
benchmarks/results/h200_bench_both_docs_2026-12-01.json): the same peers measured in two runs show
how far runs drift, and attngen's numbers sit beside both.

    python3 benchmarks/tools/compare.py RESULTS.json ANCHORS.json
"""

from __future__ import annotations

import json
import sys


def _rows(path: str) -> dict[tuple[str, str], dict]:
    data = json.load(open(path))
    rows = data["rows"] if isinstance(data, dict) else data
    out = {}
    for r in rows:
        vals = r["tflops"] if isinstance(r.get("tflops"), dict) else {
            k: r[k] for k in ("cudnn", "fa2", "flex") if k in r}
        out[(r["case"], r["mode"])] = vals
    return out


def _cell(v) -> str:
    return f"{v:8.1f}" if isinstance(v, (int, float)) else f"{'-':>8}"


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    ours, anchors = _rows(argv[0]), _rows(argv[1])
    peers = ("cudnn", "fa2", "flex")
    print(f"{'case':<18} {'mode':<7} {'attngen':>8}" + "".join(
        f"{p:>8}{p + '@anc':>10}" for p in peers))
    for key, vals in ours.items():
        anc = anchors.get(key, {})
        print(f"{key[0]:<18} {key[1]:<7} {_cell(vals.get('attngen'))}" + "".join(
            f"{_cell(vals.get(p))}  {_cell(anc.get(p))}" for p in peers))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
