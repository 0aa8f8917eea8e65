"""`attngen tune` and `attngen db show|export|import|migrate|compare`: argument parsing and printing
only; the work is in attngen.tuning (tuner, compare) and attngen.db.store. A problem the user must fix (a GPU
outside the profile, a corrupt or newer database, an unreachable server, a bad export) is one line
on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import argparse
import json
import sys

from attngen.db import schema
from attngen.spec import FAMILIES
from attngen.buckets import parse_bucket
from attngen.devices import AUTO, DEVICE_CHOICES, PROFILES, canonical


class _DeviceChoices(tuple):
    """--device's choices: the profiles' names and aliases, auto, and the sm<cc> class of any sm80+
    GPU no profile holds (sm100, sm120: devices.own_class); usage errors list the first ones."""

    def __contains__(self, name) -> bool:
        try:
            canonical(name)
        except (ValueError, TypeError):
            return False
        return True


def tune_arguments(t: argparse.ArgumentParser) -> None:
    """`attngen tune`'s arguments (a row of attngen.cli.COMMANDS)."""
    t.description = ("Optuna over the launch-config space of each kernel, one study per (kernel, "
                     "device class, shape bucket); winners go to the tuning database the runtime reads.")
    t.add_argument("--device", default=AUTO, choices=_DeviceChoices(DEVICE_CHOICES), metavar="CLASS",
                   help="device class to tune for: auto (the GPU's own), "
                        + ", ".join(f"{p.arch}{' / ' + p.name if p.name != p.arch else ''} "
                                    f"({p.gpus}; the {p.target} kernels)" for p in PROFILES.values())
                        + ", or sm<cc> of a newer GPU (sm100, sm120: the sm80 kernels)")
    t.add_argument("--spec", dest="specs", action="append", default=[], metavar="FILE",
                   help="spec file or folder (repeatable; default: the checkout's specs/, or the "
                        "specs an installed attngen ships)")
    t.add_argument("--shapes", type=_buckets, default=None, metavar="BUCKETS",
                   help="comma-separated shape buckets, e.g. q4096_k4096_bh64,q1024_k1024_bh128 "
                        "(default: Sq = Sk in 1k..16k, batch x heads = 1x and 4x the entry's heads)")
    t.add_argument("--trials", type=int, default=20,
                   help="distinct configs to measure per study, all workers and earlier runs "
                        "together (default 20)")
    t.add_argument("--timeout", type=float, default=None, metavar="S",
                   help="stop after S seconds (the trial in flight finishes; default: no limit)")
    t.add_argument("--storage", default=None, metavar="URL",
                   help="database path or SQLAlchemy URL; Optuna's studies go there too (default: "
                        "$ATTNGEN_DB, else $ATTNGEN_TUNING_DB, else a checkout's "
                        "tuning_db/attngen.sqlite or an installed attngen's user database)")
    t.add_argument("--resume", action="store_true", help="continue studies that already ran")
    t.add_argument("--workers", type=int, default=1, metavar="N",
                   help="N tuning processes on one storage, one per GPU (sharing GPUs when fewer)")
    t.add_argument("--compile-workers", type=int, default=None, metavar="N",
                   help="processes that compile a study's configs before it measures them "
                        "(default: the CPU cores but two, at most 8; 0: compile one by one)")
    t.add_argument("--sampler", choices=("tpe", "grid"), default="tpe",
                   help="tpe (seeded; default) or grid (exhaustive over the space)")
    t.add_argument("--family", dest="families", action="append", choices=tuple(FAMILIES),
                   help="kernel family (repeatable; default every family)")
    t.add_argument("--kernels", default=None, metavar="GLOB",
                   help="only kernels whose uri matches, e.g. 'attn_fwd_bf16_*' (default: all)")
    t.add_argument("--fix", dest="fixed", action="append", default=[], type=_fix, metavar="FIELD=VALUE",
                   help="pin a config field to one value (repeatable), e.g. atomic_dq=false for a "
                        "deterministic backward, tma=false; a pinned space is its own study")
    t.add_argument("--seed", type=int, default=0, help="sampler and input seed (default 0)")
    t.add_argument("--quiet", action="store_true", help="print only the summary and errors")
    # set by `--workers` for its child processes, and by tests:
    t.add_argument("--worker", type=_worker, default=None, help=argparse.SUPPRESS)
    t.add_argument("--gpu", type=int, default=0, help=argparse.SUPPRESS)
    t.add_argument("--timer", dest="timer_ref", default=None, help=argparse.SUPPRESS)
    t.add_argument("--probe", dest="probe_ref", default=None, help=argparse.SUPPRESS)


def run_tune(args: argparse.Namespace) -> int:
    return _cmd_tune(args)


def db_arguments(d: argparse.ArgumentParser) -> None:
    """`attngen db`'s sub-commands (a row of attngen.cli.COMMANDS)."""
    dsub = d.add_subparsers(dest="db_command", title="commands", metavar="<db command>")
    show = dsub.add_parser("show", help="the winners: kernel, bucket, config, TFLOP/s, gain over the default")
    _storage(show)
    show.add_argument("--kernels", default=None, metavar="GLOB", help="only kernels whose uri matches (default: all)")
    show.add_argument("--device", default=None, choices=DEVICE_CHOICES[1:], metavar="CLASS",
                      help=f"only this device class ({', '.join(DEVICE_CHOICES[1:])}; default: all)")
    show.set_defaults(func=_cmd_show)
    exp = dsub.add_parser("export", help="the database as JSON (to share results between machines)")
    _storage(exp)
    exp.add_argument("--out", default="-", metavar="FILE", help="output file (default: stdout)")
    exp.add_argument("--winners-only", action="store_true", help="leave out trials that did not win")
    exp.add_argument("--kernels", default=None, metavar="GLOB",
                     help="only kernels whose uri matches, their trials and winners (default: all)")
    exp.set_defaults(func=_cmd_export)
    imp = dsub.add_parser("import", help="merge a JSON export into the database (the faster winner stays)")
    imp.add_argument("file", help="a file written by `attngen db export`")
    _storage(imp)
    imp.set_defaults(func=_cmd_import)
    mig = dsub.add_parser("migrate", help="bring a database of an older schema up to date")
    _storage(mig)
    mig.set_defaults(func=_cmd_migrate)
    cmp_ = dsub.add_parser("compare", help="a search's winners against an exhaustive grid's best")
    cmp_.add_argument("--exhaustive", required=True, metavar="URL", help="database of a --sampler grid run")
    cmp_.add_argument("--search", required=True, metavar="URL", help="database of a --sampler tpe run")
    cmp_.add_argument("--seeds", type=int, default=20, help="replay seeds (default 20)")
    cmp_.add_argument("--out", default="-", metavar="FILE", help="JSON output (default: stdout)")
    cmp_.set_defaults(func=_cmd_compare)
    for action in dsub._choices_actions:  # each sub-command's help is its description too
        dsub.choices[action.dest].description = action.help


def _storage(p: argparse.ArgumentParser) -> None:
    p.add_argument("--storage", default=None, metavar="URL",
                   help="database path or SQLAlchemy URL (default: $ATTNGEN_DB, else the user's "
                        "database; `db show`: the user's over the shipped one)")


def _buckets(text: str):
    try:
        return [parse_bucket(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _fix(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name.strip() or not value.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: expected FIELD=VALUE, e.g. atomic_dq=false")
    return name.strip(), value.strip()


def _worker(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected INDEX/COUNT") from None
    if not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"{text!r}: expected 0 <= INDEX < COUNT")
    return i, n


def _url(args, writing: bool = False) -> str:
    from attngen import env

    return schema.to_url(args.storage or env.tuning_db_url(writing))


def _fail(cmd: str, exc: BaseException) -> int:
    print(f"attngen {cmd}: {exc}", file=sys.stderr)
    return 2


def _cmd_tune(args: argparse.Namespace) -> int:
    from attngen.tuning import tuner
    from attngen.tuning.targets import NoDevice, TuneError, TuneOptions

    opts = TuneOptions(
        device=args.device, specs=args.specs, shapes=args.shapes, trials=args.trials,
        timeout=args.timeout, storage=args.storage, resume=args.resume, workers=args.workers,
        sampler=args.sampler, families=tuple(dict.fromkeys(args.families or FAMILIES)),
        kernels=args.kernels, fixed=dict(args.fixed), seed=args.seed, worker=args.worker, gpu=args.gpu,
        timer_ref=args.timer_ref, probe_ref=args.probe_ref, quiet=args.quiet,
        compile_workers=args.compile_workers)
    if args.workers < 1:
        return _fail("tune", "--workers must be >= 1")
    if args.compile_workers is not None and args.compile_workers < 0:
        return _fail("tune", "--compile-workers must be >= 0")
    try:
        return tuner.tune(opts)
    except NoDevice as exc:  # the machine lacks what tuning needs
        print(f"attngen tune: {exc}", file=sys.stderr)
        return 1
    except (TuneError, schema.TuningDBError) as exc:
        return _fail("tune", exc)


def _cmd_show(args: argparse.Namespace) -> int:
    """The winners of --storage, or of every database the runtime reads (env.tuning_db_layers):
    each row says which one it comes from, and a shipped winner under a user winner of the same
    kernel, device class and bucket is marked as overlaid."""
    from attngen import env
    from attngen.db import store as dbs

    layers = [("--storage", args.storage)] if args.storage else env.tuning_db_layers()
    rows, wheres = [], []
    try:
        for origin, location in layers:
            url = schema.to_url(location)
            path = schema.sqlite_path(url)
            if path is not None and not path.exists() and origin == "user":
                continue  # nobody tuned on this machine yet
            with dbs.Store(url, "read") as st, st.session() as s:
                rows += [(origin, r) for r in
                         dbs.where_winners(s, args.kernels, args.device and canonical(args.device))]
                wheres.append(f"{st.where} ({origin})")
    except schema.TuningDBError as exc:
        return _fail("db show", exc)
    where = " over ".join(wheres)
    if not rows:
        print(f"no tuned winners in {where}" + (" matching the filters" if args.kernels or args.device else ""))
        return 0
    from rich.console import Console
    from rich.table import Table

    from attngen.tuning.progress import config_text, unit
    from attngen.db.winners import MIN_GAIN

    current = {r.uri: _current_kernel_hash(r.spec) for _, r in rows}
    first: dict[tuple, str] = {}
    for origin, r in rows:
        first.setdefault((r.uri, r.device_class, r.bucket), origin)
    table = Table(title=f"{len(rows)} winners in {where}", title_justify="left",
                  caption=f"*: under {MIN_GAIN:.0%} over the default, which then serves the bucket; "
                          f"stale: tuned on another version of the kernel (its generated module's "
                          f"hash now differs), ignored by the runtime; re-tune; overlaid: a winner of "
                          f"the user's database serves this bucket instead; measured on: the GPU "
                          f"of the winning trial (an h100 winner also serves an H200 where h200 has none)")
    for col, just in (("kernel", "left"), ("device", "left"), ("bucket", "left"), ("config", "left"),
                      ("speed", "right"), ("default", "right"), ("gain", "right"), ("kernel hash", "left"),
                      ("measured on", "left"), ("from", "left")):
        table.add_column(col, justify=just, no_wrap=col != "config")
    for origin, r in rows:
        overlaid = first[(r.uri, r.device_class, r.bucket)] != origin
        table.add_row(r.uri, r.device_class, r.bucket, config_text(r.config, r.family),
                      f"{r.tflops:.1f} {unit(r.family)}" if r.tflops else "-",
                      f"{r.default_tflops:.1f}" if r.default_tflops else "-",
                      (f"{r.gain:+.1%}" + ("*" if r.gain < MIN_GAIN else "")) if r.gain is not None else "-",
                      r.template_hash + ("" if r.template_hash == current[r.uri] else " stale"),
                      r.gpu_name.removeprefix("NVIDIA "), origin + (" (overlaid)" if overlaid else ""))
    Console(width=max(180, Console().width), soft_wrap=False).print(table)
    return 0


def _current_kernel_hash(spec_fields: dict) -> str | None:
    """KERNEL_HASH of the module attngen renders now for a stored kernel spec; None when the
    stored spec is not one this attngen can render."""
    from attngen.codegen.hashing import stamped_kernel_hash
    from attngen.codegen.render import CodegenError, render
    from attngen.spec import KernelSpec

    try:
        return stamped_kernel_hash(render(KernelSpec(**spec_fields)))
    except (CodegenError, TypeError, ValueError):
        return None


def _cmd_export(args: argparse.Namespace) -> int:
    from attngen.db import store as dbs

    try:
        with dbs.Store(_url(args), "read") as st, st.session() as s:
            data = dbs.export_data(s, winners_only=args.winners_only, kernels_glob=args.kernels)
    except schema.TuningDBError as exc:
        return _fail("db export", exc)
    text = json.dumps(data, indent=1, sort_keys=False) + "\n"
    if args.out == "-":
        sys.stdout.write(text)
    else:
        try:
            with open(args.out, "w") as fh:
                fh.write(text)
        except OSError as exc:
            return _fail("db export", f"{args.out}: cannot write ({exc.strerror or exc})")
        print(f"wrote {len(data['winners'])} winners, {len(data['trials'])} trials to {args.out}",
              file=sys.stderr)
    return 0


def _cmd_import(args: argparse.Namespace) -> int:
    from attngen.db import store as dbs

    try:
        with open(args.file) as fh:
            data = json.load(fh)
    except OSError as exc:
        return _fail("db import", f"{args.file}: cannot read ({exc.strerror or exc})")
    except json.JSONDecodeError as exc:
        return _fail("db import", f"{args.file}: not JSON ({exc.msg} at line {exc.lineno})")
    try:
        with dbs.Store(_url(args, writing=True), "create") as st:
            with st.session() as s:
                rep = dbs.import_data(s, data, args.file)
            st.pack()
    except schema.TuningDBError as exc:
        return _fail("db import", exc)
    print(f"imported {args.file}: {rep.trials_added} trials added ({rep.trials_known} known), "
          f"{rep.winners_changed} winners set, {rep.winners_kept} kept (as fast or faster here)")
    return 0


def _cmd_migrate(args: argparse.Namespace) -> int:
    from attngen.db import store as dbs

    try:
        with dbs.Store(_url(args, writing=True), "write") as st:
            version = st.schema_version()
            where = st.where
    except schema.TuningDBError as exc:
        return _fail("db migrate", exc)
    print(f"{where}: schema {version} (current)")
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from attngen.tuning.compare import compare
    from attngen.tuning.targets import TuneError

    try:
        result = compare(args.exhaustive, args.search, seeds=args.seeds)
    except (TuneError, schema.TuningDBError) as exc:
        return _fail("db compare", exc)
    except KeyboardInterrupt:
        print("attngen db compare: interrupted, nothing written", file=sys.stderr)
        return 130
    text = json.dumps(result, indent=1) + "\n"
    if args.out == "-":
        sys.stdout.write(text)
    else:
        with open(args.out, "w") as fh:
            fh.write(text)
    for r in result["rows"]:
        gap = f"{r['gap']:+.1%}" if r["gap"] is not None else "n/a"
        print(f"{r['uri']} {r['bucket']}: search {r['search_measured']}/{r['exhaustive_measured']} "
              f"configs ({r['search_fraction']:.0%}), gap {gap}; replay TPE median gap "
              f"{r['replay']['tpe_with_default']['median_gap']:+.1%} (random "
              f"{r['replay']['random_from_scratch']['median_gap']:+.1%})", file=sys.stderr)
    return 0
