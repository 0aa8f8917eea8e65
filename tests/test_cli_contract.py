"""The contract every `attngen` command keeps (attngen/cli.py): exit 0 done, 1 the machine lacks what
the command needs (a GPU, matplotlib), 2 a usage error or bad input -- one message, never a
traceback; clean usage lines; help with every option explained and its default shown; a command
group alone prints its usage; `--version` without torch; "did you mean" for a mistyped command.

Every command of the parser tree has rows in CASES (a test fails when a new command has none)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attngen.cli import CommandParser, main, make_parser
from attngen.env import REPO_ROOT

HAS_GPU = torch.cuda.is_available()
RESULTS = REPO_ROOT / "benchmarks" / "results" / "h200_bench_both_docs_2026-12-01.json"
TINY_SPEC = """\
kernels:
  - name: tiny
    head_dim: 32
    gqa_ratio: 1
    mask: none
    dtypes: fp16
    targets: sm80
    families: fwd
"""


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(path, parser) of every command and command group under `parser`, depth first."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if isinstance(sub, CommandParser):
                    sub.format_help()  # adds a command's arguments (added on first use)
                yield (*path, name), sub
                yield from commands(sub, (*path, name))


ALL = [" ".join(path) for path, _ in commands(make_parser())]


def is_group(parser: argparse.ArgumentParser) -> bool:
    return any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)


@pytest.fixture
def files(tmp_path, monkeypatch):
    """Inputs for the rows: good and bad spec files, a JSON that is no export, a fresh database."""
    monkeypatch.chdir(REPO_ROOT)
    (tmp_path / "tiny.yaml").write_text(TINY_SPEC)
    (tmp_path / "bad.yaml").write_text(TINY_SPEC.replace("head_dim: 32", "head_dims: 32"))
    (tmp_path / "notes.json").write_text(json.dumps({"hello": 1}))
    shutil.copy(REPO_ROOT / "tuning_db" / "attngen.sqlite", tmp_path / "shipped.sqlite")
    assert main(["db", "export", "--winners-only", "--out", str(tmp_path / "shipped.json")]) == 0
    return tmp_path


# (argv, exit code, text in stdout + stderr); {tmp} is the `files` folder. A row marked "gpu" expects
# what a machine without a GPU does, one marked "plot" needs matplotlib.
CASES = [
    (["build", "specs/llama.yaml", "--check"], 0, "is up to date"),
    (["build", "{tmp}/tiny.yaml", "--out", "{tmp}/out"], 0, "written"),
    (["build", "{tmp}/bad.yaml", "--out", "{tmp}/out"], 2, "did you mean 'head_dim'?"),
    (["build", "{tmp}/none.yaml"], 2, "none.yaml"),
    (["bench", "--quick"], 1, "needs a CUDA GPU"),
    (["bench", "--cases", "nope"], 2, "nope"),
    (["bench", "--plot", "{tmp}/p.png", "--from", str(RESULTS)], 0, "wrote"),
    (["bench", "--plot", "{tmp}/p.png", "--from", "{tmp}/notes.json"], 2, "notes.json"),
    (["warmup", "specs/llama.yaml"], 1, "needs a CUDA GPU"),
    (["warmup", "{tmp}/bad.yaml", "--device", "cpu"], 2, "head_dims"),
    (["warmup", "{tmp}/tiny.yaml", "--device", "cpu", "--pack", "{tmp}/x.pack"], 2, "--pack holds compiled GPU kernels"),
    (["explain", "--shape", "1,2,2,64,64,64", "--device", "cuda"], 1, "needs a CUDA GPU"),
    (["explain", "--shape", "1,2,2,64,64,64"], 0, '"device_class": "cpu"'),
    (["explain", "--shape", "1,2,2"], 2, "B,Hq,Hkv,Sq,Sk,D"),
    (["explain", "--shape", "1,2,3,64,64,64", "--device", "cpu"], 2, "KV heads"),
    (["tune"], 1, "needs a CUDA GPU"),
    (["tune", "--device", "sm75"], 2, "invalid choice: 'sm75'"),
    (["tune", "--shapes", "q4096"], 2, "--shapes"),
    (["db"], 2, "usage: attngen db "),
    (["db", "show"], 0, "winners in"),
    (["db", "show", "--storage", "{tmp}/none.sqlite"], 2, "no tuning database here"),
    (["db", "export", "--winners-only", "--out", "{tmp}/export.json"], 0, "wrote"),
    (["db", "export", "--storage", "{tmp}/none.sqlite"], 2, "none.sqlite"),
    (["db", "import", "{tmp}/shipped.json", "--storage", "{tmp}/new.sqlite"], 0, "imported"),
    (["db", "import", "{tmp}/notes.json", "--storage", "{tmp}/new.sqlite"], 2, "notes.json"),
    (["db", "import", "{tmp}/notes.json", "--storage", "{tmp}/no/such/x.sqlite"], 2, "no such folder"),
    (["db", "migrate", "--storage", "{tmp}/new.sqlite"], 2, "no tuning database here"),
    (["db", "migrate", "--storage", "{tmp}/shipped.sqlite"], 0, "(current)"),
    (["db", "compare", "--exhaustive", "{tmp}/a.sqlite", "--search", "{tmp}/b.sqlite"], 2, "a.sqlite"),
    (["db", "compare", "--exhaustive", "{tmp}/shipped.sqlite", "--search", "{tmp}/shipped.sqlite",
      "--seeds", "1", "--out", "{tmp}/compare.json"], 0, "gap"),
    (["db", "compare"], 2, "--exhaustive"),
]
GPU_ROWS = {"needs a CUDA GPU"}  # what these rows expect holds on a machine without a GPU


def _ids(case) -> str:
    argv, code, _ = case
    return f"{' '.join(a.replace('{tmp}/', '') for a in argv)} -> {code}"


def test_every_command_has_rows():
    """A row that exits 0 or 1 and one that exits 2, for every command; groups: the group alone."""
    for name in ALL:
        rows = [c for a, c, _ in CASES if " ".join(a).startswith(name) and
                not any(" ".join(a).startswith(o) for o in ALL if o != name and o.startswith(name + " "))]
        assert 2 in rows, f"`attngen {name}`: no row with a usage error or bad input"
        sub = dict(commands(make_parser()))[tuple(name.split())]
        if not is_group(sub):
            assert {0, 1} & set(rows), f"`attngen {name}`: no row that runs it"


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_exit_codes_and_messages(case, files, capsys):
    argv, code, text = case
    if text in GPU_ROWS and HAS_GPU:
        pytest.skip("expects a machine without a GPU")
    if "--plot" in argv and code == 0:
        pytest.importorskip("matplotlib")
    rc = main([a.replace("{tmp}", str(files)) for a in argv])
    out = capsys.readouterr()
    both = out.out + out.err
    assert rc == code, both
    assert text in both, both
    assert "Traceback" not in both
    if code:
        assert out.err.strip(), "a failing command says why on stderr"


@pytest.mark.parametrize("name", ALL)
def test_help_shows_a_clean_usage_and_every_default(name, capsys):
    parser = dict(commands(make_parser()))[tuple(name.split())]
    assert main([*name.split(), "--help"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"usage: attngen {name} ["), text
    assert "<command> [options]" not in text.splitlines()[0]
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) or action.help == argparse.SUPPRESS:
            continue
        what = f"`attngen {name}` {'/'.join(action.option_strings) or action.dest}"
        assert action.help, f"{what}: no help"
        if action.option_strings and action.nargs != 0 and not action.required:
            shown = parser.formatter_class(prog="x")._get_help_string(action) % vars(action)
            assert "default" in shown, f"{what}: its help does not say the default: {shown!r}"


def test_a_command_group_alone_prints_its_usage(capsys):
    for name, parser in commands(make_parser()):
        if is_group(parser):
            assert main(list(name)) == 2
            err = capsys.readouterr().err
            assert err.startswith(f"usage: attngen {' '.join(name)} "), err
            for sub in next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices:
                assert f"\n    {sub} " in err, f"{sub} missing from:\n{err}"


@pytest.mark.parametrize("argv, guess", [(["buidl"], "build"), (["db", "shwo"], "show"),
                                         (["tune", "--device", "h10"], "h100")])
def test_a_mistyped_choice_gets_a_did_you_mean(argv, guess, capsys):
    assert main(argv) == 2
    assert f"did you mean '{guess}'?" in capsys.readouterr().err


def _fresh(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)


def test_version_imports_no_torch_and_is_quick(tmp_path):
    """`attngen --version` imports neither torch nor triton nor any other heavy package, and neither
    do the usage and a command's help (a fresh process). Quick is counted, not timed: the modules
    `--version` imports (22 in 15 ms on the development machine; a wall-clock bound failed now and
    then on a loaded 2-core CI machine) stay under 60."""
    proc = _fresh("import sys\n"
                  "before = set(sys.modules)\n"
                  "from attngen.cli import main\n"
                  "code = main(['--version'])\n"
                  "new = len(set(sys.modules) - before)\n"
                  "codes = (code, main([]), main(['db', 'show', '--help']))\n"
                  "heavy = [m for m in ('torch', 'triton', 'numpy', 'jinja2', 'sqlalchemy', 'optuna')\n"
                  "         if m in sys.modules]\n"
                  "print(codes, heavy, new)\n", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("attngen ")
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("(0, 0, 0) [] "), proc.stdout
    assert int(last.rsplit(" ", 1)[1]) < 60, f"--version imported {last.rsplit(' ', 1)[1]} modules"


def test_the_console_entry_point_is_main():
    tomllib = pytest.importorskip("tomllib")
    with open(REPO_ROOT / "pyproject.toml", "rb") as fh:
        assert tomllib.load(fh)["project"]["scripts"]["attngen"] == "attngen.cli:main"
