"""`attngen bench --mode prefill-paged` on the CPU: a small case through the same plumbing the GPU
run takes (both providers bound to one case's values, outputs compared, TFLOP/s from the exact
pair count), in Triton's interpreter with a fixed timer; and the command's argument errors."""

from __future__ import annotations

import json

import pytest
import torch

from attngen.bench import prefill_paged as bp
from attngen.problem import attended_pairs


def test_case_flops_count_every_sequence_exactly():
    c = bp.PrefillCase(2, 100, 300, 4, 2, 32, decodes=3)
    assert c.lens == ([100, 100, 1, 1, 1], [300] * 5)
    pairs = 2 * attended_pairs(100, 300, causal=True) + 3 * 300
    assert c.flops == 4 * 4 * 32 * pairs
    assert c.name == "2x100-ctx300+3dec-gqa4/2-hd32"
    assert len({x.name for x in bp.CASES}) == len(bp.CASES)


def test_run_on_the_cpu_measures_both_providers(tmp_path):
    case = bp.PrefillCase(2, 24, 56, 4, 2, 32, decodes=1)
    out = tmp_path / "r.json"
    with torch.no_grad():
        doc = bp.run([case], dtype=torch.float16, out=str(out), device="cpu", timer=lambda fn: (fn(), 1e-4)[1])
    (row,) = doc["rows"]
    assert row["notes"] == {}, row["notes"]  # the paged output matches the dense varlen one
    assert set(row["TFLOPs"]) == set(bp.PROVIDERS)
    assert row["TFLOPs"]["attngen-paged"] == round(case.flops / 1e-4 / 1e9, 2)
    assert row["paged/varlen"] == 1.0 and row["paged64/varlen"] == 1.0
    assert json.loads(out.read_text())["rows"][0]["case"] == case.name


@pytest.mark.parametrize("argv,code,text", [
    (["--cases", "nope"], 2, "unknown case: nope"),
    (["--providers", "cudnn"], 2, "unknown provider: cudnn"),
    (["--dtype", "fp16"], 2, "bf16"),
    (["--plot", "x.png"], 2, "JSON only"),
])
def test_command_errors(argv, code, text, capsys):
    from attngen.cli import main

    assert main(["bench", "--mode", "prefill-paged", *argv]) == code
    assert text in capsys.readouterr().err
