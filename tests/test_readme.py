"""The README stays true: its snippet runs (on the CPU, through Triton's interpreter), its set-up
commands are CI's, its main job works, its benchmark table is the committed results, its images
exist."""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import subprocess
import sys

import pytest

from attngen.cli import main
from attngen.env import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text()


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every ``` block, in order."""
    return re.findall(r"^```(\w*)\n(.*?)^```$", text, flags=re.S | re.M)


def setup_section() -> str:
    start = README.index("## Set-up and main job")
    return README[start:README.index("\n## ", start + 1)]


def snippet(marker: str) -> str:
    start = README.index(f"<!-- snippet: {marker} -->")
    lang, body = fenced_blocks(README[start:])[0]
    assert lang == "python"
    return body


def test_snippet_runs_on_this_machine(tmp_path):
    """A fresh process, as a user would run it: not in the repository, nothing set up by pytest."""
    script = tmp_path / "snippet.py"
    script.write_text(snippet("cpu"))
    env = {**os.environ, "ATTNGEN_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("TRITON_INTERPRET", None)  # attngen decides, as for a user
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.fullmatch(r"attngen \S+: all close on (cpu|cuda)", proc.stdout.strip().splitlines()[-1]), proc.stdout


def test_set_up_commands_are_what_ci_runs():
    (lang, setup), (lang2, tests) = fenced_blocks(README[README.index("## Set-up and main job"):])[:2]
    assert (lang, lang2) == ("bash", "bash")
    steps = [s.strip() for s in setup.strip().split("&&")]
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    # the same torch pin and package install as CI (CI adds -q)
    assert steps[0].startswith("python3 -m pip install torch==") and steps[0].replace(
        "pip install", "pip install -q") in ci, steps[0]
    assert steps[1] == 'python3 -m pip install -e ".[test]"' and 'python3 -m pip install -q -e ".[test]"' in ci
    assert steps[2] == "attngen build specs/llama.yaml"
    assert tests.strip() == "python3 -m pytest -q -n 2 tests"
    assert "\n" + tests.strip() + "\n" in ci


def test_main_job_needs_no_writing_in_a_fresh_clone(monkeypatch, capsys):
    """`attngen build specs/llama.yaml` from the clone: generated/ already holds its kernels."""
    monkeypatch.chdir(REPO_ROOT)
    monkeypatch.delenv("ATTNGEN_GENERATED_DIR", raising=False)
    rc = main(["build", "specs/llama.yaml", "--check"])
    out = capsys.readouterr()
    assert rc == 0, out.out + out.err
    assert out.out.startswith("generated/ is up to date")


def half_up(x: float) -> int:
    return math.floor(x + 0.5)


def test_benchmark_table_is_the_committed_results():
    run = json.loads((REPO_ROOT / "benchmarks/results/h200_bench_both_docs_2026-12-01.json").read_text())
    lines = README[README.index("## Results"):].splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("| case"))
    table = []  # the first table after the heading (later tables are other views)
    for line in lines[first + 2:]:
        if not line.startswith("| "):
            break
        table.append(line)
    providers = ("attngen", "attngen-sm80", "cudnn", "fa2", "flex")

    def cells(row: dict) -> str:
        return " / ".join(str(half_up(row["tflops"][p])) if isinstance(row["tflops"][p], float) else "–"
                          for p in providers)

    fwd = [r for r in run["rows"] if r["mode"] == "fwd"]
    fwdbwd = [r for r in run["rows"] if r["mode"] == "fwdbwd"]
    want = [f"`{a['case']}` | {cells(a)} | {cells(b)}" for a, b in zip(fwd, fwdbwd, strict=True)]
    got = [" | ".join(c.strip() for c in line.strip("|").split("|")) for line in table]
    assert got == want


@pytest.mark.parametrize("doc", ["docs/benchmarks.md", "benchmarks/README.md"])
def test_case_tables_are_the_bench_cases(doc):
    """Both case tables list every `attngen bench` case, in order, with its shape."""
    from attngen.bench import CASES

    text = (REPO_ROOT / doc).read_text()
    rows = re.findall(r"^\| `([\w-]+)` \| (\d+) \| (\d+)/(\d+) \| (\d+) \| (\d+) \|", text, flags=re.M)
    got = [(name, *map(int, nums)) for name, *nums in rows]
    assert got == [(c.name, c.batch, c.heads_q, c.heads_kv, c.seqlen, c.head_dim) for c in CASES]


def test_images_exist():
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", README)
    assert any(p.endswith("h200_bench_both_docs_2026-12-01.png") for p in images)
    for path in images:
        data = (REPO_ROOT / path).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n"), path


def test_version_is_explained():
    assert "`attngen --version`" in README


def test_bare_command_output_is_what_it_prints(tmp_path):
    """The set-up section shows what `attngen` alone prints, and it is the real output (a fresh
    process, at argparse's usual 80 columns), the exit status 0."""
    section = setup_section()
    lang, shown = fenced_blocks(section[section.index("<!-- output: attngen -->"):])[0]
    env = {**os.environ, "COLUMNS": "80", "NO_COLOR": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("FORCE_COLOR", None)
    proc = subprocess.run([sys.executable, "-m", "attngen.cli"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert lang == "text"

    def lines(text: str) -> list[str]:
        return [line.rstrip() for line in text.strip("\n").splitlines()]

    assert lines(shown) == lines(proc.stdout), "README's `attngen` output is stale:\n" + proc.stdout


def test_install_commands_pin_a_torch_the_project_allows():
    """The CPU-index and CUDA-index commands of the set-up section pin a torch version that
    pyproject.toml's requirement allows, each from PyTorch's own index."""
    from packaging.requirements import Requirement

    pyproject = (REPO_ROOT / "pyproject.toml").read_text()
    allowed = Requirement(re.search(r'^\s*"(torch[<>=!~ ][^"]*)",', pyproject, flags=re.M)[1]).specifier
    section = setup_section()
    pins = re.findall(r"pip install torch==(\S+) --index-url https://download\.pytorch\.org/whl/(\w+)", section)
    assert {index == "cpu" for _, index in pins} == {True, False}, pins  # a CPU and a CUDA command
    for version, index in pins:
        assert version in allowed, f"torch=={version} ({index}) is outside pyproject's torch{allowed}"
        assert index == "cpu" or re.fullmatch(r"cu\d+", index), index


def cli_table() -> set[tuple[str, ...]]:
    """The commands the README's command table names: the words after `attngen` up to the first
    argument, option or placeholder."""
    start = README.index("<!-- cli-table -->")
    rows = list(itertools.takewhile(lambda line: line.startswith("|"), README[start:].splitlines()[1:]))
    assert len(rows) > 2, "no command table after <!-- cli-table -->"
    out = set()
    for row in rows[2:]:
        cell = re.fullmatch(r"\| `attngen ([^`]*)` \|.*", row)
        assert cell, f"a command-table row that names no `attngen ...` command: {row}"
        words = []
        for word in cell[1].split():
            if not re.fullmatch(r"[a-z]+", word):
                break
            words.append(word)
        out.add(tuple(words))
    return out


def test_the_cli_table_is_every_command():
    """Every command the README's table names exists, and every command (each sub-command of a
    group) is in the table."""
    import argparse

    from attngen.cli import make_parser

    def leaves(parser, path=()):
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            yield path
        for action in subs:
            for name, sub in action.choices.items():
                sub.format_help()  # a command adds its arguments (and sub-commands) on first use
                yield from leaves(sub, (*path, name))

    commands = set(leaves(make_parser()))
    table = cli_table()
    assert table - commands == set(), f"the README's table names commands attngen lacks: {table - commands}"
    assert commands - table == set(), f"commands missing from the README's table: {commands - table}"


def test_the_environment_table_is_every_variable_attngen_reads():
    """docs/runtime.md's table of environment variables lists every ATTNGEN_* name the package
    uses, and no other."""
    used = set()
    for path in (REPO_ROOT / "attngen").rglob("*.py"):
        used |= set(re.findall(r"\bATTNGEN_[A-Z0-9_]+\b", path.read_text()))
    doc = (REPO_ROOT / "docs" / "runtime.md").read_text()
    table = set(re.findall(r"^\| `(ATTNGEN_[A-Z0-9_]+)` \|", doc, flags=re.M))
    assert used, "no ATTNGEN_* variable found in attngen/"
    assert table == used, f"in the code, not the table: {used - table}; in the table, not the code: {table - used}"
    assert "docs/runtime.md" in README, "the README links the table"


def test_every_result_file_the_docs_cite_is_committed():
    """A result file named in the README or docs/ (by path or by its name alone) is in
    benchmarks/results/ or, for an A/B run, benchmarks/ab/."""
    have = {p.name for folder in ("results", "ab") for p in (REPO_ROOT / "benchmarks" / folder).iterdir()}
    docs = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
    cited = 0
    for doc in docs:
        for name in re.findall(r"\b((?:h200|cpu|gpu)_[\w.\-]+?\.(?:json|log|png|txt))\b", doc.read_text()):
            cited += 1
            assert name in have, f"{doc.relative_to(REPO_ROOT)} cites {name}, which benchmarks/results/ and ab/ lack"
    assert cited > 50, cited  # the README's results and docs/benchmarks.md cite dozens


def test_a_result_file_cited_by_path_is_in_that_folder():
    """A result file cited by its path (benchmarks/results/NAME or benchmarks/ab/NAME) in the
    README, docs/ or benchmarks/README.md is in that folder: A/B runs live in benchmarks/ab/."""
    docs = [REPO_ROOT / "README.md", REPO_ROOT / "benchmarks" / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
    cited = 0
    for doc in docs:
        for folder, name in re.findall(r"\bbenchmarks/(results|ab)/([\w.\-]+?\.(?:json|log|png|txt))\b", doc.read_text()):
            cited += 1
            assert (REPO_ROOT / "benchmarks" / folder / name).is_file(), \
                f"{doc.relative_to(REPO_ROOT)} cites benchmarks/{folder}/{name}, which is not there"
    assert cited > 10, cited
