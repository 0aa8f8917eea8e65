"""`attngen` command line: thin; parses, calls library functions, returns an exit code.

Every sub-command is one row of COMMANDS: its name, a one-line help, a function that adds its
arguments to its parser and one that runs it and returns the exit code. Adding a sub-command is
adding a row. A command's arguments are added when that command is used (or its help shown), so
`attngen`, `attngen --version` and a command's usage import neither torch nor triton.

The contract every command keeps (tests/test_cli_contract.py): exit 0 when done; 1 when the machine
lacks what the command needs (a GPU, matplotlib) or `build --check` finds the output stale; 2 for a
usage error or bad input (a spec file, a database, a path), with one message naming the argument,
file or field, never a traceback. `attngen` alone prints the usage and exits 0 (asking what the tool
can do is not an error); a command group alone (`attngen db`) prints its usage and exits 2.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from attngen._version import __version__


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows `(default: X)` after an option's help unless the help already says its default, the
    option is a flag, or its default is None (such options say what happens without them)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if ("default" in text or action.nargs == 0 or action.default is None or action.default is False
                or action.default == argparse.SUPPRESS):
            return text
        return super()._get_help_string(action)


class CommandParser(argparse.ArgumentParser):
    """attngen's parsers: arguments added on first use (`add_arguments`), an unknown choice answered
    with the closest known one, and the help formatter above."""

    def __init__(self, *args, add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
                 **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        self._add_arguments = add_arguments

    def _complete(self) -> None:
        if self._add_arguments is not None:
            add, self._add_arguments = self._add_arguments, None
            add(self)

    def parse_known_args(self, args=None, namespace=None):
        self._complete()
        return super().parse_known_args(args, namespace)

    def format_usage(self) -> str:
        self._complete()
        return super().format_usage()

    def format_help(self) -> str:
        self._complete()
        return super().format_help()

    def error(self, message: str):
        bad = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
        if bad:
            known = re.findall(r"'([^']*)'", bad[2])
            close = difflib.get_close_matches(bad[1], known, n=1)
            if close:
                message += f"; did you mean '{close[0]}'?"
        super().error(message)


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int] | None  # None: a group of sub-commands (`attngen db`)


# --------------------------------------------------------------------------------------------------
# build


def _build_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("specs", nargs="*",
                   help="spec files or folders (default: the checkout's specs/; required when "
                        "attngen is an installed package)")
    p.add_argument("--out", default=None,
                   help="output folder (default: $ATTNGEN_GENERATED_DIR, else the checkout's "
                        "generated/, else <user cache>/generated for an installed package)")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 if the output folder is stale")
    p.add_argument("--prune", action="store_true",
                   help="also remove every kernel in the output folder that this build does not make "
                        "(by default only kernels of the given spec files are ever removed)")


def _shown(path: Path) -> str:
    """`path` relative to the current folder when it is inside it, else absolute."""
    absolute = Path(os.path.abspath(path))
    try:
        return absolute.relative_to(Path.cwd()).as_posix()
    except ValueError:
        return absolute.as_posix()


def _run_build(args: argparse.Namespace) -> int:
    from attngen import env
    from attngen.codegen.build import BuildError, build
    from attngen.codegen.render import CodegenError
    from attngen.spec import SpecError

    targets = args.specs
    if not targets:
        # the checkout's specs/ and generated/ together, wherever this runs from: a specs/ folder
        # in the current directory must not prune the checkout's generated/
        default = env.default_specs_dir()
        if default is None:
            print("attngen build: name the spec files or folders to build, e.g. `attngen build "
                  "my_specs/`: this attngen is an installed package, not a source checkout, so "
                  f"there is no specs/ folder to build by default (it runs from {env.PACKAGE_DIR})",
                  file=sys.stderr)
            return 2
        targets = [default]
    out_dir = Path(args.out) if args.out else env.build_dir()
    try:
        report = build(targets, out_dir=out_dir, check=args.check, prune=args.prune)
    except (SpecError, CodegenError) as exc:
        print(f"attngen build: {len(getattr(exc, 'problems', [1]))} problem(s), nothing written:",
              file=sys.stderr)
        print(str(exc), file=sys.stderr)
        return 2
    except BuildError as exc:
        print(f"attngen build: {exc}; nothing written", file=sys.stderr)
        return 2
    out = (args.out or _shown(out_dir)).rstrip("/")
    if args.check:
        if report.stale:
            for f in report.written:
                print(f"stale: {out}/{f} (would be written)")
            for f in report.removed:
                print(f"stale: {out}/{f} (would be removed: {report.why_removed[f]})")
            print(f"attngen build --check: {out}/ is out of date; run `attngen build "
                  f"{' '.join(map(str, args.specs or targets))}`", file=sys.stderr)
            return 1
        print(f"{out}/ is up to date ({len(report.unchanged)} files)")
        return 0
    for f in report.written:
        print(f"wrote   {out}/{f}")
    for f in report.removed:
        print(f"removed {out}/{f} ({report.why_removed[f]})")
    kept = f", {len(report.kept)} kept (from spec files not in this build)" if report.kept else ""
    print(f"{len(report.written)} written, {len(report.unchanged)} unchanged, "
          f"{len(report.removed)} removed{kept}")
    if args.out and Path(args.out).resolve() not in [d.resolve() for d in env.generated_dirs()]:
        print(f"(attngen.attention() loads kernels from {', '.join(map(str, env.generated_dirs()))}; "
              f"run with ATTNGEN_GENERATED_DIR={os.path.abspath(out_dir)} for it to load these)")
    return 0


# --------------------------------------------------------------------------------------------------
# bench


def _bench_arguments(p: argparse.ArgumentParser) -> None:
    from attngen import bench

    bench.add_arguments(p)


def _run_bench(args: argparse.Namespace) -> int:
    from attngen import bench

    return bench.main(args)


# --------------------------------------------------------------------------------------------------

def _runtime():
    from attngen.runtime import commands

    return commands


def _tuning():
    from attngen.tuning import commands  # `tune` and `db` (attngen/tuning/commands.py)

    return commands


COMMANDS: tuple[Command, ...] = (
    Command("build", "render spec files into stamped Triton modules",
            _build_arguments, _run_build),
    Command("bench", "TFLOP/s against cuDNN, FA2, FlexAttention (GPU); plot results",
            _bench_arguments, _run_bench),
    Command("warmup", "compile kernels for given shape buckets ahead of time",
            lambda p: _runtime().warmup_arguments(p), lambda a: _runtime().run_warmup(a)),
    Command("explain", "show the kernel, config and bucket a call uses, and why",
            lambda p: _runtime().explain_arguments(p), lambda a: _runtime().run_explain(a)),
    Command("tune", "tune launch configs on this GPU into the tuning database",
            lambda p: _tuning().tune_arguments(p), lambda a: _tuning().run_tune(a)),
    Command("db", "show, export, import, migrate, compare the tuning database",
            lambda p: _tuning().db_arguments(p), None),
)


def make_parser() -> argparse.ArgumentParser:
    p = CommandParser(
        prog="attngen", usage="attngen [-h] [--version] <command> [options]",
        description="Attention kernels generated from a YAML spec language into Triton.",
        epilog="`attngen <command> --help` shows a command's options.")
    p.add_argument("--version", action="version", version=f"attngen {__version__}")
    sub = p.add_subparsers(dest="command", title="commands", metavar="<command>", required=True,
                           parser_class=CommandParser)
    for cmd in COMMANDS:
        cp = sub.add_parser(cmd.name, prog=f"attngen {cmd.name}", help=cmd.help, description=cmd.help,
                            add_arguments=cmd.add_arguments)
        cp.set_defaults(func=cmd.run or functools.partial(_group_usage, cp))
    return p


def _group_usage(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """A command group named without one of its commands: its usage and commands, exit 2."""
    print(parser.format_help(), end="", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = make_parser()
    if not argv:
        print(parser.format_help(), end="")
        return 0
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version (0) and usage errors (2): an exit code, not a raise
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
