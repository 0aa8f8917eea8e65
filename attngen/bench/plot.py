"""`attngen bench --plot`: grouped bars of TFLOP/s per case and provider, one panel per mode, drawn
from the results document that `attngen bench --out` writes (report.results / load_results). On the
cuDNN and FlexAttention bars stands attngen's ratio to them (attngen TFLOP/s / theirs); a provider
that was not measured gets "n/a" in its slot. Files from before a provider existed (e.g. without
attngen-sm80) draw the providers they have.

Needs matplotlib, an optional dependency (`pip install 'attngen[plot]'`); only this module imports
it, and only when drawing. No pyplot: a Figure of its own, so no global backend state changes.
"""

from __future__ import annotations

from pathlib import Path

from attngen.bench.cases import MODES
from attngen.bench.providers import REFERENCE

RATIO_PEERS = ("cudnn", "flex")  # attngen's ratio to these is written on their bars
NAMES = {"attngen": "attngen", "attngen-sm80": "attngen sm80 family", "cudnn": "cuDNN", "fa2": "FA2",
         "flex": "FlexAttention"}
COLORS = {"attngen": "#d62728", "attngen-sm80": "#ff9896", "cudnn": "#1f77b4", "fa2": "#9e9e9e",
          "flex": "#2ca02c"}
MODE_TITLES = {"fwd": "forward", "fwdbwd": "forward + backward"}
# what makes a file's bytes depend on the day it was drawn, per format
_NO_STAMP = {"png": {"Software": None}, "svg": {"Date": None}, "pdf": {"CreationDate": None}}


class PlotError(RuntimeError):
    """Cannot draw as asked (the message says why)."""


class MissingMatplotlib(PlotError):
    pass


def _figure_class():
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise MissingMatplotlib("drawing needs matplotlib, an optional dependency: "
                                "pip install 'attngen[plot]' (or pip install matplotlib)") from None
    return Figure


def check_target(path: str | Path) -> str:
    """Fail early (before a long run) when matplotlib is missing or cannot write `path`'s format.
    Returns the format."""
    fmt = Path(path).suffix.lower().lstrip(".")
    supported = _figure_class()().canvas.get_supported_filetypes()
    if fmt not in supported:
        raise PlotError(f"{path}: cannot tell the image format from the file name (matplotlib writes "
                        f"{', '.join('.' + f for f in sorted(supported))})")
    return fmt


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def providers_of(results: dict) -> list[str]:
    """The providers in the header's order, then any only the rows name."""
    names = list(results.get("providers") or {})
    for row in results["rows"]:
        names += [n for n in row["tflops"] if n not in names]
    return names


def modes_of(results: dict) -> list[str]:
    found = {row["mode"] for row in results["rows"]}
    return [m for m in MODES if m in found] + sorted(found - set(MODES))


def _case_label(row: dict) -> str:
    shape = ""
    if all(k in row for k in ("B", "H", "Hkv", "N", "D")):
        heads = f"H{row['H']}" if row["H"] == row["Hkv"] else f"H{row['H']}/{row['Hkv']}"
        shape = f"\nB{row['B']} {heads} N{row['N']} D{row['D']}"
    return row["case"] + shape


def figure(results: dict):
    """A matplotlib Figure of `results`. Each bar's gid is "<case>/<provider>", each ratio text's
    "<case>/<provider>/ratio", each "n/a" text's "<case>/<provider>/missing"."""
    Figure = _figure_class()
    from matplotlib.patches import Patch

    modes = modes_of(results)
    providers = providers_of(results)
    per_mode = {m: [r for r in results["rows"] if r["mode"] == m] for m in modes}
    widest = max(len(rows) for rows in per_mode.values())
    fig = Figure(figsize=(max(7.0, 1.45 * widest + 1.5), 4.3 * len(modes)), layout="constrained")
    axes = fig.subplots(len(modes), 1, squeeze=False)[:, 0]
    width = 0.84 / len(providers)
    for ax, mode in zip(axes, modes):
        rows = per_mode[mode]
        values = [v for r in rows for v in r["tflops"].values() if _is_number(v)]
        top = max(values, default=1.0) or 1.0
        for j, prov in enumerate(providers):
            for i, row in enumerate(rows):
                x = i - 0.42 + width * (j + 0.5)
                v, ours = row["tflops"].get(prov), row["tflops"].get(REFERENCE)
                if not _is_number(v):
                    t = ax.text(x, top * 0.01, "n/a", rotation=90, ha="center", va="bottom",
                                fontsize=7, color="0.45")
                    t.set_gid(f"{row['case']}/{prov}/missing")
                    continue
                (bar,) = ax.bar(x, v, width * 0.95, color=COLORS.get(prov, f"C{j}"))
                bar.set_gid(f"{row['case']}/{prov}")
                if prov in RATIO_PEERS and _is_number(ours) and v > 0:
                    t = ax.text(x, v + top * 0.012, f"{ours / v:.2f}×", ha="center", va="bottom",
                                fontsize=7.5)
                    t.set_gid(f"{row['case']}/{prov}/ratio")
        ax.set_xticks(range(len(rows)), [_case_label(r) for r in rows], fontsize=8)
        ax.set_xlim(-0.55, len(rows) - 0.45)
        ax.set_ylim(0, top * 1.2)
        ax.set_ylabel("TFLOP/s")
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
        ax.set_title(f"{MODE_TITLES.get(mode, mode)}: {results.get('gpu', '?')}, "
                     f"{results.get('dtype', '?')}", fontsize=11)
        ax.legend(handles=[Patch(color=COLORS.get(p, f"C{j}"), label=NAMES.get(p, p))
                           for j, p in enumerate(providers)], fontsize=8, ncols=len(providers),
                  loc="upper right")
    peers = " and ".join(NAMES.get(p, p) for p in RATIO_PEERS if p in providers)
    versions = ", ".join(f"{k} {results[k]}" for k in ("attngen", "torch", "triton") if results.get(k))
    when = str(results.get("date", ""))[:10]
    fig.suptitle(f"attngen bench ({versions}{', ' + when if when else ''}); on the {peers} bars: "
                 "attngen's TFLOP/s ÷ theirs", fontsize=9)
    return fig


def save(results: dict, path: str | Path) -> Path:
    """Draw `results` into `path` (format from the suffix; the same results give the same bytes)."""
    fmt = check_target(path)
    fig = figure(results)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130, metadata=_NO_STAMP.get(fmt))
    return path
