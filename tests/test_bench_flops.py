"""`attngen.bench` on the CPU: exact FLOP counts against brute-force mask counting, the case
table, the harness's never-crash contract (with stand-in providers), and the CLI wiring."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest
import torch

from attngen import bench
from attngen.problem import attended_pairs
from attngen.cli import make_parser

WINDOWS = [(-1, -1), (0, 0), (3, 0), (2, 5), (-1, 4), (6, -1), (0, -1), (40, 40)]


def brute_pairs(sq: int, sk: int, causal: bool, window: tuple[int, int], top_left: bool) -> int:
    """Count allowed (i, j) one by one, straight from flash-attn's rule."""
    left, right = window
    if causal:
        right = 0
    n = 0
    for i in range(sq):
        d = i if top_left else i + sk - sq  # the key on this query's diagonal
        for j in range(sk):
            if (left < 0 or j >= d - left) and (right < 0 or j <= d + right):
                n += 1
    return n


def mask_count(seqlen: int, doc_lens: tuple[int, ...], causal: bool, window: int) -> int:
    """Count the True entries of the (seqlen, seqlen) mask -- same document, causal, window --
    built 256 query rows at a time."""
    doc = torch.repeat_interleave(torch.arange(len(doc_lens)), torch.tensor(doc_lens))
    j = torch.arange(seqlen)[None, :]
    n = 0
    for r0 in range(0, seqlen, 256):
        i = torch.arange(r0, min(seqlen, r0 + 256))[:, None]
        keep = doc[i] == doc[j]
        if causal or window > 0:
            keep &= j <= i
        if window > 0:
            keep &= i - j < window
        n += int(keep.sum())
    return n


@pytest.mark.parametrize("sq,sk", [(1, 1), (5, 5), (16, 16), (17, 33), (33, 17), (1, 9), (9, 1)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("top_left", [False, True])
def test_attended_pairs_matches_brute_force(sq, sk, causal, top_left):
    for window in WINDOWS:
        got = attended_pairs(sq, sk, causal, window, top_left)
        want = brute_pairs(sq, sk, causal, window, top_left)
        assert got == want, (f"attended_pairs({sq}, {sk}, causal={causal}, window={window}, "
                             f"top_left={top_left}) = {got}, brute force counts {want}")


def test_full_and_causal_convention():
    case = bench.Case("t", 2, 4, 2, 64, 32)
    full = 4 * 2 * 4 * 64 * 64 * 32
    assert bench.forward_flops(case) == full
    causal = bench.Case("t", 2, 4, 2, 64, 32, causal=True)
    assert bench.forward_flops(causal) == full / 2, "plain causal counts half of Sq*Sk (convention)"
    assert bench.case_flops(causal, "fwdbwd") == 3.5 * full / 2


@pytest.mark.parametrize("seqlen,window", [(1, 1), (7, 3), (64, 1), (64, 16), (64, 64), (64, 100)])
def test_sliding_window_counts_exactly(seqlen, window):
    case = bench.Case("t", 3, 4, 1, seqlen, 16, causal=True, window=window)
    assert case.window_size == (window - 1, 0)
    pairs = mask_count(seqlen, (seqlen,), True, window)
    assert bench.forward_flops(case) == 4 * 3 * 4 * 16 * pairs


@pytest.mark.parametrize("seqlen,docs,causal,window", [
    (64, 8, True, -1), (61, 4, True, -1), (64, 3, False, -1), (50, 5, True, 4), (9, 9, True, -1)])
def test_documents_count_exactly(seqlen, docs, causal, window):
    case = bench.Case("t", 2, 8, 2, seqlen, 64, causal=causal, window=window, docs=docs)
    assert sum(case.doc_lens) == seqlen and len(case.doc_lens) == docs
    assert max(case.doc_lens) - min(case.doc_lens) <= 1
    pairs = mask_count(seqlen, case.doc_lens, causal, window)
    assert bench.forward_flops(case) == 4 * 2 * 8 * 64 * pairs


@pytest.mark.parametrize("name", ["swa1024-8k", "docs8-causal-8k"])
def test_benchmark_masks_count_exactly(name):
    case = bench.CASES_BY_NAME[name]
    pairs = mask_count(case.seqlen, case.doc_lens, case.causal, case.window)
    per_pair = 4 * case.batch * case.heads_q * case.head_dim
    assert bench.forward_flops(case) == per_pair * pairs


# the head-dim cases: name -> (B, Hq, Hkv, S, D), all causal, and their forward FLOPs written out
HEAD_DIM_CASES = {"causal-hd256-4k": (2, 16, 16, 4096, 256), "causal-hd192-4k": (4, 16, 16, 4096, 192),
                  "causal-hd96-4k": (4, 32, 32, 4096, 96), "causal-hd80-4k": (4, 32, 32, 4096, 80)}
HEAD_DIM_FLOPS = {"causal-hd256-4k": 274_877_906_944, "causal-hd192-4k": 412_316_860_416,
                  "causal-hd96-4k": 412_316_860_416, "causal-hd80-4k": 343_597_383_680}


def test_case_table():
    names = [c.name for c in bench.CASES]
    assert len(set(names)) == len(names)
    # the anchors' case names (benchmarks compare row by row), then the head-dim cases
    assert names == ["full", "causal", "causal-16k", "gqa4-causal-8k", "swa1024-8k",
                     "docs8-causal-8k", "causal-hd64-4k", *HEAD_DIM_CASES]
    for c in bench.CASES:
        assert c.heads_q % c.heads_kv == 0, c
        assert c.seqlen % max(c.docs, 1) == 0, c
    swa = bench.CASES_BY_NAME["swa1024-8k"]
    assert (swa.window_size, swa.heads_q, swa.heads_kv, swa.seqlen) == ((1023, 0), 32, 8, 8192)
    assert [p.name for p in bench.PROVIDERS] == ["attngen", "attngen-sm80", "cudnn", "fa2", "flex"]


@pytest.mark.parametrize("name", HEAD_DIM_CASES)
def test_head_dim_cases_count_flops_on_their_head_dim(name):
    case = bench.CASES_BY_NAME[name]
    B, H, Hkv, S, D = HEAD_DIM_CASES[name]
    assert (case.batch, case.heads_q, case.heads_kv, case.seqlen, case.head_dim) == (B, H, Hkv, S, D)
    assert case.causal and case.window == -1 and case.docs == 0
    fwd = 2 * (D + D) * B * H * S * S / 2  # causal: half of Sq*Sk, on the case's own head dim
    assert fwd == HEAD_DIM_FLOPS[name]
    assert bench.forward_flops(case) == fwd, name
    assert bench.case_flops(case, "fwdbwd") == 3.5 * fwd, name


def test_default_and_picked_cases():
    """No --cases: every case, the head-dim ones included; --cases picks by name."""
    assert bench.pick(None, bench.CASES_BY_NAME, "case") == list(bench.CASES)
    picked = bench.pick("causal-hd80-4k, full", bench.CASES_BY_NAME, "case")
    assert [c.name for c in picked] == ["causal-hd80-4k", "full"]


# ---- the harness, with stand-in providers on the CPU ---------------------------------------------


def _math_provider(scale_out: float = 1.0):
    def prepare(case, x, mode):
        def forward():
            out = torch.nn.functional.scaled_dot_product_attention(
                x.q, x.k, x.v, is_causal=case.causal, enable_gqa=case.heads_q != case.heads_kv)
            return out * scale_out

        return bench.Prepared(forward, (x.q, x.k, x.v), x.dout)

    return prepare


def _refuses(case, x, mode):
    raise bench.Unsupported("skipped: not this one")


def _breaks(case, x, mode):
    raise RuntimeError("kaboom\nsecond line")


FAKE = (bench.Provider("attngen", "reference stand-in", _math_provider()),
        bench.Provider("cudnn", "refuses", _refuses),
        bench.Provider("fa2", "breaks", _breaks),
        bench.Provider("flex", "half as fast, wrong by 2x", _math_provider(2.0)))


@pytest.mark.parametrize("mode", bench.MODES)
def test_run_case_records_reasons_and_ratios(mode):
    case = bench.Case("tiny", 1, 4, 2, 32, 16, causal=True)
    times = iter([1e-6, 2e-6])  # ms: big enough TFLOP/s for the tiny case to round well
    row = bench.run_case(case, mode, FAKE, torch.float16, torch.device("cpu"),
                         timer=lambda step: (step(), next(times))[1])
    flops = bench.case_flops(case, mode)
    assert row.tflops["attngen"] == round(flops / 1e-9 / 1e12, 1)
    assert row.tflops["cudnn"] == "skipped: not this one"
    assert row.tflops["fa2"] == "error: RuntimeError: kaboom"
    assert set(row.ms) == {"attngen", "flex"}
    assert row.check_ref == "attngen"
    diffs = row.max_abs_diff["flex"]
    assert set(diffs) == ({"out"} if mode == "fwd" else {"out", "dq", "dk", "dv"})
    assert diffs["out"] > 0 and row.check_ok["flex"] is False
    ratios = row.as_json()["ratios"]
    assert ratios["attngen/cudnn"] is None and ratios["attngen/fa2"] is None
    assert ratios["attngen/flex"] == pytest.approx(2.0, rel=1e-2)
    table = bench.format_table([row], FAKE)
    assert "tiny" in table and "kaboom" in table and "not this one" in table


def test_ratios():
    case = bench.Case("t", 1, 1, 1, 8, 16)
    row = bench.Row(case, "fwd", torch.bfloat16, 1.0,
                    tflops={"attngen": 300.0, "cudnn": 600.0, "fa2": "skipped: x", "flex": 150.0})
    assert row.ratios() == {"attngen/cudnn": 0.5, "attngen/fa2": None, "attngen/flex": 2.0}


def test_sm80_family_ratios_and_table():
    """attngen-sm80 gets a column and its own ratios to the peers; attngen's keys stay."""
    case = bench.Case("t", 1, 1, 1, 8, 16)
    row = bench.Row(case, "fwd", torch.bfloat16, 1.0,
                    tflops={"attngen": 300.0, "attngen-sm80": 240.0, "cudnn": 600.0,
                            "fa2": "skipped: x", "flex": 150.0})
    assert row.ratios() == {"attngen/attngen-sm80": 1.25, "attngen/cudnn": 0.5, "attngen/fa2": None,
                            "attngen/flex": 2.0, "attngen-sm80/cudnn": 0.4, "attngen-sm80/fa2": None,
                            "attngen-sm80/flex": 1.6}
    lines = bench.format_table([row], bench.PROVIDERS).splitlines()
    head = lines[1].split()
    assert head == ["case", "mode", "attngen", "attngen-sm80", "cudnn", "fa2", "flex", "a/a-sm80",
                    "a/cudnn", "a/fa2", "a/flex", "a-sm80/cudnn", "a-sm80/fa2", "a-sm80/flex"]
    assert lines[3].split() == ["t", "fwd", "300.0", "240.0", "600.0", "skip", "150.0", "1.25",
                                "0.50", "-", "2.00", "0.40", "-", "1.60"]
    assert all(len(line) <= len(lines[1]) for line in lines[2:4])  # columns line up


def test_sm80_provider_skips_where_it_would_duplicate_attngen():
    """Off Hopper (here: the CPU, whose kernels are the sm80 family) attngen-sm80 records why it
    has no number instead of measuring attngen twice."""
    case = bench.Case("tiny", 1, 2, 2, 16, 16, causal=True)
    providers = (FAKE[0], bench.PROVIDERS_BY_NAME["attngen-sm80"])
    row = bench.run_case(case, "fwd", providers, torch.float16, torch.device("cpu"),
                         timer=lambda step: (step(), 1e-6)[1])
    assert row.tflops["attngen-sm80"] == "skipped: same kernels as attngen on this GPU (the sm80 family is its own)"
    assert row.ratios()["attngen/attngen-sm80"] is None


# ---- CLI -----------------------------------------------------------------------------------------


def test_cli_parses_bench_arguments():
    args = make_parser().parse_args(["bench", "--mode", "both", "--cases", "full,causal",
                                     "--out", "x.json", "--dtype", "fp16", "--quick"])
    assert (args.mode, args.cases, args.out, args.dtype, args.quick) == (
        "both", "full,causal", "x.json", "fp16", True)
    assert args.func is not None
    args = make_parser().parse_args(["bench", "--plot", "p.png", "--from", "r.json"])
    assert (args.plot, args.from_json) == ("p.png", "r.json")


def test_cli_rejects_unknown_case(capsys):
    args = argparse.Namespace(mode="fwd", cases="full,nope", providers=None, out=None,
                              dtype="bf16", quick=True)
    assert bench.main(args) == 2
    assert "nope" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU exit")
def test_cli_without_gpu_exits_1(capsys):
    args = make_parser().parse_args(["bench", "--quick"])
    assert bench.main(args) == 1
    assert "CUDA" in capsys.readouterr().err


def test_bench_imports_no_optional_dependencies():
    code = ("import sys, attngen.bench, attngen.cli; attngen.cli.make_parser(); "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('optuna', 'sqlalchemy', 'matplotlib')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, f"importing attngen.bench pulled in {res.stdout} {res.stderr}"



def test_the_decode_and_fp8_benches_run_their_first_case_twice_and_keep_the_second():
    from attngen.bench.run import with_discarded_first

    assert with_discarded_first(["a", "b"]) == [("a", False), ("a", True), ("b", True)]
    assert with_discarded_first(iter(["a"])) == [("a", False), ("a", True)]
    assert with_discarded_first([]) == []
