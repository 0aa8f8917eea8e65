"""`attngen` command line: thin; parses, calls library functions, returns an exit code."""

from __future__ import annotations

import argparse
import sys

from attngen.spec import SpecError


def _cmd_build(args: argparse.Namespace) -> int:
    from attngen import env
    from attngen.codegen.build import build
    from attngen.codegen.render import CodegenError

    # the defaults are the repository's specs/ and generated/ together, wherever this runs from:
    # a specs/ folder in the current directory must not prune the repository's generated/
    targets = args.specs or [env.REPO_ROOT / "specs"]
    try:
        report = build(targets, out_dir=args.out, check=args.check)
    except (SpecError, CodegenError) as exc:
        print(f"attngen build: {len(getattr(exc, 'problems', [1]))} problem(s), nothing written:",
              file=sys.stderr)
        print(str(exc), file=sys.stderr)
        return 2
    out = args.out or "generated"
    if args.check:
        if report.stale:
            for f in report.written:
                print(f"stale: {out}/{f} (would be written)")
            for f in report.removed:
                print(f"stale: {out}/{f} (would be removed)")
            print(f"attngen build --check: {out}/ is out of date; run `attngen build "
                  f"{' '.join(map(str, targets))}`", file=sys.stderr)
            return 1
        print(f"{out}/ is up to date ({len(report.unchanged)} files)")
        return 0
    for f in report.written:
        print(f"wrote   {out}/{f}")
    for f in report.removed:
        print(f"removed {out}/{f}")
    print(f"{len(report.written)} written, {len(report.unchanged)} unchanged, "
          f"{len(report.removed)} removed")
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from attngen import bench

    return bench.main(args)


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="attngen", description="attention kernel generator")
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="render spec files into Triton modules in generated/")
    b.add_argument("specs", nargs="*", help="spec files or folders (default: the repository's specs/)")
    b.add_argument("--out", default=None, help="output folder (default: generated/)")
    b.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 if the output folder is stale")
    b.set_defaults(func=_cmd_build)
    try:
        from attngen import bench
    except ImportError:  # pragma: no cover - bench arrives with its own module
        bench = None
    if bench is not None:
        bench.add_arguments(sub.add_parser("bench", help="forward/backward TFLOP/s against peers (GPU)"))
        sub.choices["bench"].set_defaults(func=_cmd_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
