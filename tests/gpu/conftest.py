"""GPU tests: skipped without CUDA; each correctness test adds a record, and the session writes them
as JSON to $ATTNGEN_GPU_SUMMARY when that is set (benchmarks/run_gpu.sh sets it)."""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
RECORDS: list[dict] = []
SUMMARY_ENV = "ATTNGEN_GPU_SUMMARY"


def pytest_collection_modifyitems(config, items):
    if "gpu_full" not in (config.getoption("markexpr", "") or ""):
        full = pytest.mark.skip(reason="the full correctness grid runs with -m gpu_full")
        for item in items:
            if item.get_closest_marker("gpu_full"):
                item.add_marker(full)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def gpu_records() -> list[dict]:
    return RECORDS


def _environment() -> dict:
    import triton

    info = {"torch": torch.__version__, "triton": triton.__version__,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
        info["capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
    else:
        info["gpu"] = None
    return info


def _merge_grid_results(exitstatus) -> None:
    """The correctness grid's records (test_gpu_grid.py: one JSONL file per xdist worker) merged
    into $ATTNGEN_GRID_RESULTS."""
    path = os.environ.get("ATTNGEN_GRID_RESULTS")
    if not path:
        return
    parts = sorted(Path(path).parent.glob(Path(path).name + ".*.jsonl"))
    records = [json.loads(line) for p in parts for line in p.read_text().splitlines() if line]
    if not records:
        return
    records.sort(key=lambda r: (r["path"], r["head_dim"], r["dtype"], r["sq"], r["sk"]))
    Path(path).write_text(json.dumps({**_environment(), "exitstatus": int(exitstatus), "cases": len(records),
                                      "failed": sum(not r["passed"] for r in records),
                                      "records": records}, indent=1) + "\n")
    for p in parts:
        p.unlink()


def pytest_sessionfinish(session, exitstatus):
    if getattr(session.config, "workerinput", None) is None:
        _merge_grid_results(exitstatus)
    path = os.environ.get(SUMMARY_ENV)
    if not path or getattr(session.config, "workerinput", None) is not None:  # xdist workers: no
        return
    failed = [r for r in RECORDS if not r["passed"]]
    summary = {**_environment(), "exitstatus": int(exitstatus), "ran": len(RECORDS),
               "failed": len(failed), "max_ratio_to_torch": max(
                   (r["ratio_to_torch"] for r in RECORDS if r.get("ratio_to_torch") is not None),
                   default=None),
               "seconds": round(sum(r["seconds"] for r in RECORDS), 1), "records": RECORDS}
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=1) + "\n")
