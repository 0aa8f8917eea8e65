"""Reporting: the results as a table and as JSON (with the GPU name and library versions). The
JSON is what `attngen bench --plot` draws (attngen/bench/plot.py)."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Sequence

import torch

from attngen.bench.cases import DTYPE_NAMES
from attngen.bench.providers import REFERENCE, Provider, is_attngen
from attngen.bench.run import OUT_TOLERANCE, TIMING, Row, fmt_value, ratio_pairs


# the table's word for a reason string, by its prefix
_SHORT = {"skipped": "skip", "refused": "refused", "not available": "n/a", "error": "error",
          "-": "-"}


def _ratio_cell(x: float | None, width: int) -> str:
    return f"{'-' if x is None else format(x, '.2f'):>{width}}"


def _abbrev(name: str) -> str:
    """attngen -> a, attngen-sm80 -> a-sm80 (ratio column labels); peers keep their names."""
    return "a" + name[len(REFERENCE):] if is_attngen(name) else name


def format_table(rows: Sequence[Row], providers: Sequence[Provider]) -> str:
    names = [p.name for p in providers]
    pairs = [(a, b) for a, b in ratio_pairs(names) if a in names]
    labels = [f"{_abbrev(a)}/{_abbrev(b)}" for a, b in pairs]
    widths = [max(9, len(n) + 1) for n in names]
    ratio_widths = [max(9, len(lb) + 1) for lb in labels]
    head = (f"{'case':<18} {'mode':<7}" + "".join(f"{n:>{w}}" for n, w in zip(names, widths))
            + "".join(f"{lb:>{w}}" for lb, w in zip(labels, ratio_widths)))
    variants = [f"; {_abbrev(n)} = {n}" for n in names if is_attngen(n) and n != REFERENCE]
    title = f"TFLOP/s (ratio = attngen / peer{''.join(variants)})"
    lines = [title, head, "-" * len(head)]
    reasons = []
    for r in rows:
        cells = []
        for n, width in zip(names, widths):
            v = r.tflops.get(n, "-")
            if isinstance(v, str):
                if v != "-":
                    reasons.append(f"{r.case.name} {r.mode} {n}: {v}")
                v = _SHORT.get(v.split(":")[0], "error")
            flag = "!" if r.check_ok.get(n) is False else ""
            cells.append(f"{fmt_value(v) + flag:>{width}}")
        ratios = r.ratios()
        cells += [_ratio_cell(ratios.get(f"{a}/{b}"), w) for (a, b), w in zip(pairs, ratio_widths)]
        lines.append(f"{r.case.name:<18} {r.mode:<7}" + "".join(cells))
    if any(ok is False for r in rows for ok in r.check_ok.values()):
        lines.append("! = output differs from the reference by more than "
                     f"{OUT_TOLERANCE[rows[0].dtype]} (see max_abs_diff)")
    if reasons:
        lines += ["", "not measured:"] + [f"  {s}" for s in reasons]
    return "\n".join(lines)


def git_commit() -> str | None:
    """The checkout's commit ("+ local changes" when the tree differs from it); None outside a
    git checkout (an installed package, a device copy without .git)."""
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5, cwd=here).stdout.strip()
        if not sha:
            return None
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], timeout=5, cwd=here).returncode
        return sha + (" (+ local changes)" if dirty == 1 else "")
    except (OSError, subprocess.SubprocessError):
        return None


def header(device: torch.device, dtype: torch.dtype, quick: bool,
           providers: Sequence[Provider]) -> dict:
    import triton

    from attngen import __version__

    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    cap = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    return {
        "gpu": gpu,
        "capability": f"{cap[0]}.{cap[1]}" if cap else None,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if device.type == "cuda" else None,
        "attngen": __version__,
        "git_commit": git_commit(),
        "python": sys.version.split()[0],
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "dtype": DTYPE_NAMES[dtype],
        "timing": {**TIMING["quick" if quick else "full"], "return_mode": "median",
                   "function": "triton.testing.do_bench"},
        "flops": "forward 2*(Dqk+Dv)*B*Hq*pairs; pairs = Sq*Sk (full), Sq*Sk/2 (causal), exact "
                 "count (sliding window, documents); fwdbwd = 3.5 x forward",
        "providers": {p.name: p.label for p in providers},
    }


def results(head: dict, rows: Sequence[Row]) -> dict:
    """The results document: the header's fields and "rows" (what write_json writes)."""
    return {**head, "rows": [r.as_json() for r in rows]}


def write_json(path: Path, head: dict, rows: Sequence[Row]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(results(head, rows), indent=1) + "\n")
    os.replace(tmp, path)


class ResultsError(ValueError):
    """A results file that cannot be read back; the message names the file and what is wrong."""


def load_results(path: str | Path) -> dict:
    """A results JSON written by `attngen bench --out`, checked enough to draw: every row has a
    case, a mode and a "tflops" mapping of provider -> number (or the reason it has none)."""
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ResultsError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ResultsError(f"{path}: not valid JSON ({exc})") from None
    rows = doc.get("rows") if isinstance(doc, dict) else None
    if not isinstance(rows, list) or not rows:
        raise ResultsError(f"{path}: no 'rows' list: not a results file of `attngen bench --out`")
    for i, row in enumerate(rows):
        ok = (isinstance(row, dict) and isinstance(row.get("case"), str) and isinstance(row.get("mode"), str)
              and isinstance(row.get("tflops"), dict)
              and all(isinstance(v, (int, float, str)) and not isinstance(v, bool)
                      for v in row["tflops"].values()))
        if not ok:
            raise ResultsError(f"{path}: row {i}: needs 'case', 'mode' and 'tflops' (provider -> "
                               "TFLOP/s, or why it was not measured)")
    return doc
