"""The runtime's read side of the tuning database: which tuned config serves a kernel on a device
class for a shape bucket.

Cheap to import and to call: no optuna, no SQLAlchemy for the default SQLite file (the stdlib
sqlite3 opens it read-only), no torch. The databases are read once per process, on the first
lookup, into a dict; every later lookup is a dict access (plus `nearest` over the kernel's few tuned
buckets). Which: env.tuning_db_layers() -- the user's database overlaying the shipped one (a
bucket the user tuned is served from the user's, every other from the shipped), or ATTNGEN_DB
alone. No database there: every lookup is None and the runtime's default tables serve. A database that exists but cannot be used (corrupt, another program's, a newer or older
schema, an unreachable server) raises schema.TuningDBError with a one-line message on every lookup:
tuned configs are never silently dropped, and a broken file is never silently half-used.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import threading
import warnings
from pathlib import Path

from attngen import env
from attngen.db import schema
from attngen.families import family as family_of
from attngen import configs as space
from attngen.buckets import ShapeBucket, nearest, parse_bucket
from attngen.devices import lineage

TuningDBError = schema.TuningDBError

_QUERY = (f"SELECT k.uri, k.template_hash, k.family, w.device_class, b.key, w.config_json, "
          f"w.time_ms, w.default_time_ms "
          f"FROM {schema.WINNERS} w "
          f"JOIN {schema.KERNELS} k ON w.kernel_id = k.id "
          f"JOIN {schema.SHAPE_BUCKETS} b ON w.bucket_id = b.id")

# (uri, device_class) -> [(bucket, template_hash, family, config dict, gain over the default,
# (origin, where) of the database)], the user's rows before the shipped ones
_Table = dict[tuple[str, str], list[tuple[ShapeBucket, str, str, dict, float | None, tuple[str, str]]]]

# A winner that beats the default config of its study by less than this is measurement noise (the
# same kernel and config moves by 1-5 % between H200 runs, benchmarks/README.md): the bucket keeps
# the default table's config, which the A/Bs that picked it measured with more care
MIN_GAIN = 0.02

_lock = threading.Lock()
_table: _Table | None = None
_error: TuningDBError | None = None
_warned: set[str] = set()


def lookup(uri: str, kernel_hash: str, device_class: str, bucket: ShapeBucket) -> dict | None:
    """The winning config (field -> value, as dataclasses.asdict of the family's config) of kernel
    `uri` on `device_class` for `bucket`; the nearest tuned bucket's when this one was not tuned;
    None when nothing usable was tuned for this uri and device class.

    Winners tuned on another version of the kernel (the hash they were stored with -- the kernels
    table's template_hash column, which holds the generated module's KERNEL_HASH -- differs from
    `kernel_hash`) are ignored, with one warning per uri; so are configs whose fields no longer fit the config class.
    A bucket whose winner beat the default by less than MIN_GAIN is served by the default table
    (None), and so are the untuned buckets nearest to it."""
    found = find(uri, kernel_hash, device_class, bucket)
    return found[0] if found is not None else None


def find(uri: str, kernel_hash: str, device_class: str,
         bucket: ShapeBucket) -> tuple[dict, str, str, str] | None:
    """lookup()'s config with the database and class it came from: (config, origin, where,
    class); origin is "user", "shipped" or "ATTNGEN_DB" (env.tuning_db_layers). A GPU model's
    class (devices.lineage: h200, then h100) is read before its parent's: a bucket either tuned
    has the most specific class's winner, and the nearest tuned bucket is sought over both."""
    table = _load()
    rows = [(*r, cls) for cls in lineage(device_class) for r in table.get((uri, cls), ())]
    if not rows:
        return None
    fresh: dict[ShapeBucket, tuple[dict, str, str, str] | None] = {}
    stale = []
    for b, h, family, cfg, gain, (origin, where), cls in rows:
        if b in fresh:  # an earlier database (the user's) or class (the model's) has this bucket
            continue
        if h != kernel_hash:
            stale.append((h, where))
            continue
        if gain is not None and gain < MIN_GAIN:
            fresh[b] = None
            continue
        try:
            fresh[b] = (dataclasses.asdict(space.config_from_dict(family_of(family).config, cfg)), origin,
                        where, cls)
        except (ValueError, KeyError) as exc:
            _warn_once(uri, f"attngen: ignoring the tuned {uri} config for {b.key} in "
                            f"{where}: it does not fit this attngen ({exc})")
    if stale and not fresh:
        _warn_once(uri, f"attngen: ignoring {len(stale)} tuned config(s) of {uri} in {stale[0][1]}: "
                        f"tuned on kernel hash {stale[0][0]}, the kernel now has {kernel_hash} "
                        f"(retune with `attngen tune`); using the default configs")
    if not fresh:
        return None
    near = bucket if bucket in fresh else nearest(bucket, fresh)
    if near is None or fresh[near] is None:
        return None
    cfg, origin, where, cls = fresh[near]
    return dict(cfg), origin, where, cls


def reset() -> None:
    """Forget what was read (tests; or after pointing ATTNGEN_DB elsewhere)."""
    global _table, _error
    with _lock:
        _table, _error = None, None
        _warned.clear()


def _warn_once(uri: str, message: str) -> None:
    if uri not in _warned:
        _warned.add(uri)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def _load() -> _Table:
    global _table, _error
    if _table is not None:
        return _table
    with _lock:
        if _error is not None:
            raise _error
        if _table is None:
            try:
                table: _Table = {}
                for origin, location in env.tuning_db_layers():
                    for key, rows in _read(location, origin).items():
                        table.setdefault(key, []).extend(rows)
                _table = table
            except TuningDBError as exc:
                _error = exc
                raise
    return _table


def _read(location: str, origin: str) -> _Table:
    url = schema.to_url(location)
    where = schema.redact(url) if schema.sqlite_path(url) is None else str(schema.sqlite_path(url))
    path = schema.sqlite_path(url)
    if path is not None:
        if not path.exists():
            return {}
        rows = _read_sqlite(path)
    elif url.startswith("sqlite"):
        raise TuningDBError(f"{url}: an in-memory database holds no tuned configs")
    else:
        rows = _read_sqlalchemy(url)
    table: _Table = {}
    for uri, template_hash, family, device_class, key, config_json, time_ms, default_ms in rows:
        try:
            b = parse_bucket(key)
            cfg = json.loads(config_json)
        except ValueError as exc:
            raise schema.CorruptDatabase(f"{where}: winner of {uri} has a bad bucket or config "
                                         f"({exc})") from None
        gain = default_ms / time_ms - 1.0 if default_ms and time_ms and time_ms > 0 else None
        table.setdefault((uri, device_class), []).append((b, template_hash, family, cfg, gain, (origin, where)))
    return table


def _check_version(version_rows: list, where: str) -> None:
    if len(version_rows) != 1 or not isinstance(version_rows[0][0], int):
        raise schema.CorruptDatabase(f"{where}: {schema.SCHEMA_VERSIONS} must hold one version row")
    v = version_rows[0][0]
    if v > schema.SCHEMA_VERSION:
        raise schema.SchemaMismatch(f"{where}: schema {v} was written by a newer attngen; this one "
                                    f"reads schemas up to {schema.SCHEMA_VERSION} (upgrade attngen)")
    if v < schema.SCHEMA_VERSION:
        raise schema.SchemaMismatch(f"{where}: schema {v} is older than {schema.SCHEMA_VERSION}; "
                                    f"run `attngen db migrate`")


def _read_sqlite(path: Path) -> list:
    where = str(path)
    con = None
    try:
        try:
            con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
            names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        except sqlite3.OperationalError:
            # a WAL-mode file in a folder we cannot write (an installed package): no -shm can be
            # made; with no -wal file beside it the file alone is the whole database
            if con is not None:
                con.close()
            if Path(str(path) + "-wal").exists():
                raise
            con = sqlite3.connect(f"{path.resolve().as_uri()}?immutable=1", uri=True)
            names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if schema.SCHEMA_VERSIONS not in names:
            raise schema.SchemaMismatch(f"{where}: not an attngen tuning database (no "
                                        f"{schema.SCHEMA_VERSIONS} table)")
        _check_version(con.execute(f"SELECT version FROM {schema.SCHEMA_VERSIONS}").fetchall(), where)
        return con.execute(_QUERY).fetchall()
    except sqlite3.DatabaseError as exc:
        msg = schema.one_line(exc)
        if "not a database" in msg or "malformed" in msg:
            raise schema.CorruptDatabase(f"{where}: not a readable SQLite database ({msg})") from None
        raise TuningDBError(f"{where}: cannot read the tuning database ({msg})") from None
    finally:
        if con is not None:
            con.close()


def _read_sqlalchemy(url: str) -> list:
    where = schema.redact(url)
    try:
        import sqlalchemy
    except ImportError:
        raise TuningDBError(f"{where}: reading a non-SQLite tuning database needs sqlalchemy "
                            f"(pip install sqlalchemy), or point ATTNGEN_DB at a SQLite file") from None
    try:
        engine = sqlalchemy.create_engine(url)
    except Exception as exc:  # bad URL, missing driver
        raise TuningDBError(f"{where}: not a usable database URL ({schema.one_line(exc)})") from None
    try:
        with engine.connect() as conn:
            names = set(sqlalchemy.inspect(conn).get_table_names())
            if schema.SCHEMA_VERSIONS not in names:
                raise schema.SchemaMismatch(f"{where}: not an attngen tuning database (no "
                                            f"{schema.SCHEMA_VERSIONS} table)")
            _check_version(conn.execute(sqlalchemy.text(
                f"SELECT version FROM {schema.SCHEMA_VERSIONS}")).fetchall(), where)
            return [tuple(r) for r in conn.execute(sqlalchemy.text(_QUERY)).fetchall()]
    except sqlalchemy.exc.OperationalError as exc:
        raise schema.UnreachableDatabase(f"{where}: cannot connect ({schema.one_line(exc)})") from None
    except sqlalchemy.exc.DBAPIError as exc:
        raise TuningDBError(f"{where}: cannot read the tuning database ({schema.one_line(exc)})") from None
    finally:
        engine.dispose()
