"""`attngen bench`: forward and forward+backward TFLOP/s of attngen against cuDNN, FA2 and
FlexAttention, all measured in one process, written as JSON, printed as a table, and drawn as bars
(`--plot FILE.png`; `--plot FILE.png --from RESULTS.json` redraws a saved run without a GPU).

One concern per module, as in tritonbench:

* cases.py     -- the benchmark shapes and their exact FLOP counts (conventions there);
* providers.py -- one table of providers (attngen, attngen-sm80 = the sm80 kernel family forced on
  a Hopper GPU, cuDNN, FA2, FlexAttention), each bound to a case or refusing it with a reason;
* run.py       -- measuring one case and mode across providers (timing, output checks), never
  raising for a provider's failure: a provider that cannot run records why instead of a number;
* report.py    -- the table, the JSON (with GPU name and library versions), reading it back;
* plot.py      -- the picture, from that JSON (matplotlib, optional: `pip install 'attngen[plot]'`).

Imports nothing optional: no optuna, no sqlalchemy, no matplotlib (unless drawing), no jinja2
(unless a kernel must be rendered).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from attngen.bench.cases import (CASES, CASES_BY_NAME, DTYPE_NAMES, DTYPES, FWDBWD_FLOP_FACTOR, MODES,
                                 Case, case_flops, forward_flops, pick)
from attngen.bench.providers import (PROVIDERS, PROVIDERS_BY_NAME, REFERENCE, Inputs, Prepared, Provider,
                                     Unsupported)
from attngen.bench.report import (ResultsError, format_table, header, load_results, results,
                                  write_json)
from attngen.bench.run import (OUT_TOLERANCE, TIMING, Row, do_bench_timer, make_inputs, make_step,
                               run_case)

__all__ = [
    "CASES", "CASES_BY_NAME", "DTYPE_NAMES", "DTYPES", "FWDBWD_FLOP_FACTOR", "MODES", "Case",
    "case_flops", "forward_flops", "PROVIDERS", "PROVIDERS_BY_NAME", "REFERENCE",
    "Inputs", "Prepared", "Provider", "Unsupported", "ResultsError", "format_table", "header",
    "load_results", "results", "write_json", "OUT_TOLERANCE", "TIMING", "Row", "do_bench_timer",
    "make_inputs", "make_step", "run_case", "add_arguments", "main",
]

# measuring options, with their defaults: --from measures nothing, so it takes none of them
_MEASURING = {"mode": "fwd", "cases": None, "providers": None, "out": None, "dtype": "bf16", "quick": False}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mode", choices=("fwd", "fwdbwd", "both", "decode", "fp8", "prefill-paged", "mods"), default="fwd",
                   help="forward only, forward+backward, or both (TFLOP/s); decode: one query token on a "
                        "KV cache, GB/s of K and V read (attngen.bench.decode); fp8: the fp8 forward "
                        "beside bf16 and cuDNN fp8 (attngen.bench.fp8); prefill-paged: chunked prefill on a "
                        "paged KV cache beside the dense varlen prefill, TFLOP/s (attngen.bench.prefill_paged); "
                        "mods: expression kernels (masks, score modifications, sinks) beside FlexAttention and "
                        "SDPA on a dense mask (attngen.bench.mods; --cases names its rows) (default: fwd)")
    p.add_argument("--cases", default=None,
                   help=f"comma-separated case names (default: all): {', '.join(CASES_BY_NAME)}")
    p.add_argument("--providers", default=None,
                   help=f"comma-separated providers (default: all): {', '.join(PROVIDERS_BY_NAME)}")
    p.add_argument("--out", default=None, help="write the results as JSON to this file (default: print them only)")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="bf16", help="element type (default: bf16)")
    p.add_argument("--quick", action="store_true",
                   help="short warmup/rep (%(q)s ms) for smoke runs" % {
                       "q": "/".join(map(str, TIMING["quick"].values()))})
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="also draw the results: grouped TFLOP/s bars per case and provider, with "
                        "attngen's ratio to cuDNN and FlexAttention (needs matplotlib: "
                        "pip install 'attngen[plot]'; default: no plot)")
    p.add_argument("--from", dest="from_json", default=None, metavar="RESULTS.json",
                   help="with --plot: measure nothing, draw this results file (of --out) instead; "
                        "needs no GPU (default: measure)")
    p.add_argument("--accuracy", default=None, metavar="FILE.json",
                   help="with --mode fp8: also write the accuracy report (RMSE against float64 on outlier "
                        "inputs: bf16, fp8 with and without rotation, fp8 with per-tensor scales; default: none)")


def _fail(msg: str, code: int) -> int:
    print(f"attngen bench: {msg}", file=sys.stderr)
    return code


def _redraw(args: argparse.Namespace) -> int:
    from attngen.bench import plot

    if not args.plot:
        return _fail("--from only redraws a results file: give --plot FILE.png too", 2)
    given = [f"--{k}" for k, default in _MEASURING.items() if getattr(args, k, default) != default]
    if given:
        return _fail(f"--from measures nothing, so {', '.join(given)} do(es) not apply", 2)
    try:
        doc = load_results(args.from_json)
        path = plot.save(doc, args.plot)
    except plot.MissingMatplotlib as exc:
        return _fail(str(exc), 1)
    except (ResultsError, plot.PlotError) as exc:
        return _fail(str(exc), 2)
    print(f"wrote {path} (from {args.from_json})")
    return 0


def main(args: argparse.Namespace) -> int:
    if args.mode == "fp8":
        from attngen.bench import fp8

        return fp8.main_args(args)
    if getattr(args, "accuracy", None):
        return _fail("--accuracy goes with --mode fp8", 2)
    if args.mode == "decode":
        from attngen.bench import decode

        return decode.main_args(args)
    if args.mode == "prefill-paged":
        from attngen.bench import prefill_paged

        return prefill_paged.main_args(args)
    if args.mode == "mods":
        from attngen.bench import mods

        return mods.main_args(args)
    if getattr(args, "from_json", None):
        return _redraw(args)
    plot_path = getattr(args, "plot", None)
    try:
        cases = pick(args.cases, CASES_BY_NAME, "case")
        providers = pick(args.providers, PROVIDERS_BY_NAME, "provider")
    except ValueError as exc:
        return _fail(str(exc), 2)
    if plot_path:  # before a long run, not after it
        from attngen.bench import plot

        try:
            plot.check_target(plot_path)
        except plot.MissingMatplotlib as exc:
            return _fail(str(exc), 1)
        except plot.PlotError as exc:
            return _fail(str(exc), 2)
    if not torch.cuda.is_available():
        return _fail("needs a CUDA GPU (torch.cuda.is_available() is False); "
                     "`--plot FILE.png --from RESULTS.json` draws a saved run without one", 1)
    device = torch.device("cuda")
    dtype = DTYPES[args.dtype]
    modes = MODES if args.mode == "both" else (args.mode,)
    timing = TIMING["quick" if args.quick else "full"]
    head = header(device, dtype, args.quick, providers)
    out = Path(args.out) if args.out else None
    print(f"attngen bench on {head['gpu']}: torch {head['torch']}, triton {head['triton']}, "
          f"{args.dtype}, modes {', '.join(modes)}", flush=True)

    def timer(step):
        return do_bench_timer(step, timing["warmup_ms"], timing["rep_ms"])

    rows: list[Row] = []
    for mode in modes:
        for case in cases:
            rows.append(run_case(case, mode, providers, dtype, device, timer,
                                 log=lambda s: print(s, flush=True)))
            if out is not None:
                write_json(out, head, rows)  # after every row: a cut-short run keeps what it had
    print()
    print(format_table(rows, providers))
    if out is not None:
        print(f"\nwrote {out}")
    if plot_path:
        from attngen.bench import plot

        print(f"wrote {plot.save(results(head, rows), plot_path)}")
    return 0
