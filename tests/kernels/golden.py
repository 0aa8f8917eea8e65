"""Golden outputs: a fixed sample of each output tensor, stored as JSON under tests/golden/.

A template change that moves any sampled value by more than two units in the last place of the
output dtype fails. Regenerate deliberately with ATTNGEN_UPDATE_GOLDEN=1 (and review the diff).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

GOLDEN_DIR = Path(__file__).resolve().parent.parent / "golden"
SAMPLES = 256
ULP = {torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7, torch.float32: 2.0 ** -20}


def _sample(t: torch.Tensor, key: str) -> tuple[list[int], list[float]]:
    flat = t.detach().reshape(-1).float().cpu()
    g = torch.Generator().manual_seed(sum(map(ord, key)))
    idx = torch.randint(0, flat.numel(), (min(SAMPLES, flat.numel()),), generator=g)
    return idx.tolist(), [float(x) for x in flat[idx].tolist()]


def check(family: str, uri: str, case: str, tensors: dict[str, torch.Tensor]) -> None:
    path = GOLDEN_DIR / family / f"{uri}.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    update = os.environ.get("ATTNGEN_UPDATE_GOLDEN") == "1"
    if update:
        data[case] = {}
    if case not in data:
        raise AssertionError(f"no golden values for {uri} / {case} in {path}; "
                             f"run with ATTNGEN_UPDATE_GOLDEN=1 to record them")
    for name, t in tensors.items():
        idx, vals = _sample(t, f"{uri}/{case}/{name}")
        if update:
            data[case][name] = {"dtype": str(t.dtype), "index": idx, "value": vals}
            continue
        want = data[case][name]
        assert want["index"] == idx, f"{uri}/{case}/{name}: tensor shape changed since the golden run"
        got_t, want_t = torch.tensor(vals, dtype=torch.float64), torch.tensor(want["value"], dtype=torch.float64)
        same_inf = torch.isinf(got_t) == torch.isinf(want_t)
        fin = torch.isfinite(want_t)
        tol = 2 * ULP[t.dtype] * want_t[fin].abs() + 1e-6
        bad = (got_t[fin] - want_t[fin]).abs() > tol
        if not same_inf.all() or bad.any() or torch.isnan(got_t).any():
            k = int(bad.nonzero()[0]) if bad.any() else 0
            raise AssertionError(
                f"{uri}/{case}/{name}: differs from the golden output ({int(bad.sum())} of "
                f"{len(vals)} samples beyond 2 ulp; e.g. {got_t[fin][k]:.6g} vs {want_t[fin][k]:.6g})")
    if update:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=0, sort_keys=True) + "\n")
