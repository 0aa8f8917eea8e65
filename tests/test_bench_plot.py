"""`attngen bench --plot`: the bars and the ratios written on them are the results file's numbers
(checked on the committed H200 runs), `--from` redraws without a GPU, and every way it can go wrong
says so. matplotlib is in the `test` extra, so CI runs these."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch

from attngen import bench
from attngen.cli import main
from attngen.env import REPO_ROOT

RESULTS = REPO_ROOT / "benchmarks" / "results"
COMMITTED = [RESULTS / "h200_bench_fwd_2026-11-30.json", RESULTS / "h200_bench_fwdbwd_2026-11-30.json"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def drawn(fig) -> tuple[dict[str, float], dict[str, str]]:
    """(bar gid -> height, text gid -> text) over every panel of a figure."""
    bars, texts = {}, {}
    for ax in fig.axes:
        bars.update({p.get_gid(): p.get_height() for p in ax.patches if p.get_gid()})
        texts.update({t.get_gid(): t.get_text() for t in ax.texts if t.get_gid()})
    return bars, texts


def expected(doc: dict) -> tuple[dict[str, float], dict[str, str]]:
    """What the figure must show, straight from the results file."""
    bars, texts = {}, {}
    for row in doc["rows"]:
        ours = row["tflops"]["attngen"]
        for prov, v in row["tflops"].items():
            if is_number(v):
                bars[f"{row['case']}/{prov}"] = v
                if prov in ("cudnn", "flex") and is_number(ours):
                    texts[f"{row['case']}/{prov}/ratio"] = f"{ours / v:.2f}×"
            else:
                texts[f"{row['case']}/{prov}/missing"] = "n/a"
    return bars, texts


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.stem)
def test_bars_and_ratios_are_the_results_numbers(path):
    pytest.importorskip("matplotlib")
    from attngen.bench import plot

    doc = bench.load_results(path)
    fig = plot.figure(doc)
    assert len(fig.axes) == 1
    assert fig.axes[0].get_ylabel() == "TFLOP/s"
    assert [t.get_text().split("\n")[0] for t in fig.axes[0].get_xticklabels()] == [
        r["case"] for r in doc["rows"]]
    bars, texts = drawn(fig)
    want_bars, want_texts = expected(doc)
    assert bars == pytest.approx(want_bars)
    assert texts == want_texts
    # the committed runs do have cuDNN/Flex ratios and unmeasured slots to show
    assert any(k.endswith("/cudnn/ratio") for k in texts) and any(k.endswith("/flex/ratio") for k in texts)
    assert any(k.endswith("/missing") for k in texts)


def test_both_modes_in_one_file_give_two_panels():
    pytest.importorskip("matplotlib")
    from attngen.bench import plot

    fwd, fwdbwd = (bench.load_results(p) for p in COMMITTED)
    doc = {**fwd, "rows": fwdbwd["rows"] + fwd["rows"]}  # modes out of order on purpose
    fig = plot.figure(doc)
    assert [ax.get_title().split(":")[0] for ax in fig.axes] == ["forward", "forward + backward"]
    assert all("NVIDIA H200, bf16" in ax.get_title() for ax in fig.axes)


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.stem)
def test_cli_redraws_a_committed_run_without_a_gpu(path, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from matplotlib.image import imread

    out = tmp_path / "sub" / "plot.png"
    rc = main(["bench", "--plot", str(out), "--from", str(path)])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert f"wrote {out} (from {path})" in cap.out
    data = out.read_bytes()
    assert data.startswith(PNG_MAGIC)
    height, width = imread(out).shape[:2]
    assert width > height > 300
    # the same results give the same bytes (no date or version stamped in the file)
    again = tmp_path / "again.png"
    assert main(["bench", "--plot", str(again), "--from", str(path)]) == 0
    assert again.read_bytes() == data


def readme_plots() -> list[tuple[Path, Path]]:
    """(results JSON, committed PNG) for every image in README.md drawn from a results file beside it."""
    images = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", (REPO_ROOT / "README.md").read_text())
    return [(png.with_suffix(".json"), png) for png in (REPO_ROOT / p for p in images)
            if png.with_suffix(".json").exists()]


# mean |difference| of the RGBA values in [0, 1], for another matplotlib / FreeType drawing text
# edges a little differently. Measured: the redraw equals the committed PNG byte for byte
# (matplotlib 3.11); set against the PNGs of the other committed H200 runs it differs by 0.004 to
# 0.014, with the tallest bar 5 % higher by 0.004, with all text un-antialiased by 0.0035.
MAX_MEAN_DIFF = 0.003


def test_readme_plot_is_a_redraw_of_its_committed_results(tmp_path, capsys):
    """The README's benchmark picture is what `attngen bench --plot FILE --from JSON` draws from
    the committed results beside it: same size, pixels within MAX_MEAN_DIFF."""
    pytest.importorskip("matplotlib")
    from matplotlib.image import imread

    pairs = readme_plots()
    assert [p.name for _, p in pairs] == ["h200_bench_both_docs_2026-12-01.png"], pairs
    for results, committed in pairs:
        out = tmp_path / committed.name
        assert main(["bench", "--plot", str(out), "--from", str(results)]) == 0, capsys.readouterr().err
        want, got = imread(committed), imread(out)
        assert got.shape == want.shape, f"{committed.name}: redrawn {got.shape}, committed {want.shape}"
        diff = float(abs(got.astype("float64") - want.astype("float64")).mean())
        assert diff < MAX_MEAN_DIFF, (f"{committed.name}: the redraw from {results.name} differs by "
                                      f"{diff:.4f} per pixel on average (at most {MAX_MEAN_DIFF})")


def test_plot_of_a_measured_run_draws_what_it_measured(tmp_path):
    """The path `attngen bench --plot` takes after measuring: rows -> results document -> figure,
    here with stand-in providers on the CPU."""
    pytest.importorskip("matplotlib")
    from attngen.bench import plot

    def sdpa(case, x, mode):
        return bench.Prepared(lambda: torch.nn.functional.scaled_dot_product_attention(
            x.q, x.k, x.v, is_causal=case.causal), (x.q, x.k, x.v), x.dout)

    def refuses(case, x, mode):
        raise bench.Unsupported("skipped: not this one")

    providers = (bench.Provider("attngen", "stand-in", sdpa), bench.Provider("cudnn", "stand-in", sdpa),
                 bench.Provider("flex", "refuses", refuses))
    times = iter([1e-6, 4e-6, 2e-6, 2e-6])
    rows = [bench.run_case(bench.Case(name, 1, 2, 2, 16, 16, causal=True), "fwd", providers, torch.float16,
                           torch.device("cpu"), timer=lambda step: (step(), next(times))[1])
            for name in ("one", "two")]
    head = bench.header(torch.device("cpu"), torch.float16, True, providers)
    doc = json.loads(json.dumps(bench.results(head, rows)))  # what --out writes
    bars, texts = drawn(plot.figure(doc))
    assert bars == pytest.approx(expected(doc)[0]) and len(bars) == 4
    assert texts == {"one/cudnn/ratio": "4.00×", "two/cudnn/ratio": "1.00×",
                     "one/flex/missing": "n/a", "two/flex/missing": "n/a"}
    assert plot.save(doc, tmp_path / "run.svg").read_text().lstrip().startswith("<?xml")


def test_sm80_family_bars_beside_attngen():
    """A run with attngen-sm80 (here: a committed run with that column added) draws its bars and
    its missing slots, in the legend under its own name; the ratios on the peers stay attngen's."""
    pytest.importorskip("matplotlib")
    from attngen.bench import plot

    doc = bench.load_results(COMMITTED[0])
    rows = [{**r, "tflops": {"attngen": r["tflops"]["attngen"],
                             "attngen-sm80": 300.0 if i % 2 else "skipped: same kernels as attngen on this GPU",
                             **{k: v for k, v in r["tflops"].items() if k != "attngen"}}}
            for i, r in enumerate(doc["rows"])]
    doc = {**doc, "providers": {"attngen": "x", "attngen-sm80": "y", **doc["providers"]}, "rows": rows}
    fig = plot.figure(doc)
    bars, texts = drawn(fig)
    want_bars, want_texts = expected(doc)
    assert bars == pytest.approx(want_bars) and texts == want_texts
    assert sum(k.endswith("/attngen-sm80") for k in bars) == len(rows) // 2
    assert sum(k.endswith("/attngen-sm80/missing") for k in texts) == len(rows) - len(rows) // 2
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend == ["attngen", "attngen sm80 family", "cuDNN", "FA2", "FlexAttention"]


def test_missing_matplotlib_is_a_clear_error(tmp_path, monkeypatch, capsys):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    out = tmp_path / "plot.png"
    for argv in (["bench", "--plot", str(out), "--from", str(COMMITTED[0])],
                 ["bench", "--plot", str(out), "--quick"]):  # checked before measuring
        assert main(argv) == 1, argv
        err = capsys.readouterr().err
        assert "needs matplotlib" in err and "pip install 'attngen[plot]'" in err, err
    assert not out.exists()


def test_bad_requests_exit_2_naming_what(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{not json")
    no_rows = tmp_path / "empty.json"
    no_rows.write_text('{"gpu": "x", "rows": []}')
    bad_row = tmp_path / "row.json"
    bad_row.write_text('{"rows": [{"case": "c", "mode": "fwd", "tflops": {"a": [1]}}]}')
    png = str(tmp_path / "p.png")
    cases = [
        (["--from", str(COMMITTED[0])], "give --plot FILE.png too"),
        (["--plot", png, "--from", str(tmp_path / "nope.json")], f"{tmp_path / 'nope.json'}: cannot read"),
        (["--plot", png, "--from", str(bad_json)], f"{bad_json}: not valid JSON"),
        (["--plot", png, "--from", str(no_rows)], f"{no_rows}: no 'rows' list"),
        (["--plot", png, "--from", str(bad_row)], f"{bad_row}: row 0: needs 'case', 'mode' and 'tflops'"),
        (["--plot", png, "--from", str(COMMITTED[0]), "--cases", "full", "--quick"],
         "--from measures nothing, so --cases, --quick do(es) not apply"),
        (["--plot", str(tmp_path / "p.nope"), "--from", str(COMMITTED[0])],
         f"{tmp_path / 'p.nope'}: cannot tell the image format"),
        (["--plot", str(tmp_path / "p.nope"), "--quick"], "cannot tell the image format"),
    ]
    for argv, words in cases:
        assert main(["bench", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert words in err, (argv, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json", "empty.json", "row.json"]
