"""Golden outputs: a fixed sample of each output tensor, stored as JSON under tests/golden/.

A golden file exists to catch a template change that moves results. It must not catch the
interpreter's rounding noise: Triton's interpreter runs on NumPy, whose fp32 reductions round
differently on CPUs with and without AVX-512, and a flip of one fp32 rounding inside a dot can move
an fp16/bf16 output by an ulp of the *terms* it summed (far more than an ulp of a small result).

So the bound comes from the kernel's own error. With every sample the recording run stores `err`,
the kernel's max |error| on that whole tensor against the float64 reference. A later run fails when
a sampled value moves by more than

    FRACTION[dtype] * err  +  1 ulp of the value (8 ulps for the fp32 LSE)

FRACTION sits between the two things it separates. benchmarks/tools/golden_noise.py measured the noise
on 22 of the 44 golden-checked kernels
(benchmarks/results/cpu_golden_noise_avx512_{on,off}_2026-12-02.json): numpy's AVX-512 paths on
vs off moved fp16/bf16 samples beyond one ulp of the value by at most 0.048 x err (FRACTION 0.5;
0.64 of the whole bound), and the fp32 LSE by up to 1.45 x err, inside its 8 ulps (its own error
is a few fp32 ulps of the row's largest score, the size of the noise: FRACTION 4). Against the
committed goldens, recorded before later template changes, samples sit at up to 0.79 of the bound.
A softmax scale off by 0.2 %, a diagonal key dropped, or dS scaled by 1.002 in the backward all
fail (tests/kernels/test_golden.py perturbs real generated kernels and checks that they fail).

Regenerate deliberately with ATTNGEN_UPDATE_GOLDEN=1 (and review the diff).
ATTNGEN_GOLDEN_DUMP=<file> appends every checked sample to <file> as JSON lines (family, uri,
case, tensor, value, err), which benchmarks/tools/golden_noise.py compares.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

GOLDEN_DIR = Path(__file__).resolve().parent.parent / "golden"
SAMPLES = 256
FRACTION = {torch.float16: 0.5, torch.bfloat16: 0.5, torch.float32: 4.0}
# the value-relative term: one ulp of fp16/bf16 outputs; eight of fp32 (the LSE, whose error
# against float64 is itself only a few fp32 ulps, and moved by up to 2 ulps across CPUs)
ULP = {torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7, torch.float32: 8 * 2.0 ** -23}


def _sample(t: torch.Tensor, key: str) -> tuple[list[int], list[float]]:
    flat = t.detach().reshape(-1).float().cpu()
    g = torch.Generator().manual_seed(sum(map(ord, key)))
    idx = torch.randint(0, flat.numel(), (min(SAMPLES, flat.numel()),), generator=g)
    return idx.tolist(), [float(x) for x in flat[idx].tolist()]


def golden_path(family: str, uri: str) -> Path:
    return GOLDEN_DIR / family / f"{uri}.json"


def sample_bound(dtype: torch.dtype, err: float, want: torch.Tensor) -> torch.Tensor:
    """How far each recorded value `want` may move: FRACTION[dtype] * err + ULP[dtype] * |want|."""
    return FRACTION[dtype] * err + ULP[dtype] * want.abs()


def compare(name: str, dtype: torch.dtype, vals: list[float], want: dict) -> str | None:
    """None when `vals` matches the recorded sample `want` within its bound, else the reason."""
    got_t = torch.tensor(vals, dtype=torch.float64)
    want_t = torch.tensor(want["value"], dtype=torch.float64)
    if torch.isnan(got_t).any():
        return f"{name}: NaN in the output"
    if not torch.equal(torch.isinf(got_t), torch.isinf(want_t)) or not torch.equal(
            got_t[torch.isinf(got_t)], want_t[torch.isinf(want_t)]):
        return f"{name}: infinities differ from the golden output"
    fin = torch.isfinite(want_t)
    bound = sample_bound(dtype, want["err"], want_t[fin])
    diff = (got_t[fin] - want_t[fin]).abs()
    bad = diff > bound
    if bad.any():
        k = int((diff - bound).argmax())
        return (f"{name}: differs from the golden output ({int(bad.sum())} of {len(vals)} samples "
                f"beyond {FRACTION[dtype]} x the kernel's error {want['err']:.3g} + ulps; worst "
                f"{got_t[fin][k]:.6g} vs {want_t[fin][k]:.6g})")
    return None


def check(family: str, uri: str, case: str, tensors: dict[str, torch.Tensor],
          errors: dict[str, float]) -> None:
    """`errors[name]`: the kernel's max |error| on that tensor against the float64 reference."""
    path = golden_path(family, uri)
    data = json.loads(path.read_text()) if path.exists() else {}
    update = os.environ.get("ATTNGEN_UPDATE_GOLDEN") == "1"
    dump = os.environ.get("ATTNGEN_GOLDEN_DUMP")
    if update:
        data[case] = {}
    if case not in data:
        raise AssertionError(f"no golden values for {uri} / {case} in {path}; "
                             f"run with ATTNGEN_UPDATE_GOLDEN=1 to record them")
    problems = []
    for name, t in tensors.items():
        key = f"{uri}/{case}/{name}"
        idx, vals = _sample(t, key)
        if update:
            data[case][name] = {"dtype": str(t.dtype), "index": idx, "value": vals,
                                "err": float(f"{errors[name]:.4g}")}
            continue
        want = data[case][name]
        if dump:
            with open(dump, "a") as fh:
                fh.write(json.dumps({"family": family, "uri": uri, "case": case, "tensor": name,
                                     "value": vals, "err": errors[name]}) + "\n")
        if want["index"] != idx:
            problems.append(f"{key}: tensor shape changed since the golden run")
            continue
        why = compare(key, t.dtype, vals, want)
        if why:
            problems.append(why)
    if problems:
        raise AssertionError("\n".join(problems))
    if update:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=0, sort_keys=True) + "\n")
