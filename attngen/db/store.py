"""Open a tuning database: `Store`, its one session context manager. The queries (a fixed
vocabulary: find_*, find_or_add_*, add_*, offer_*, where_*, count_*) live in queries.py, the JSON
export / import in transfer.py; this module names them too, so a caller imports one module
(`from attngen.db import store as dbs`).

Concurrency. Several `attngen tune` processes may write one database at once: SQLite in WAL mode on
one machine (write transactions start with BEGIN IMMEDIATE, so a writer waits for the lock instead of
failing half-way; busy timeout 60 s), PostgreSQL across machines. No write reads-then-writes
unguarded: rows that must be unique are added with INSERT ... ON CONFLICT DO NOTHING and read back,
and a winner is offered with one INSERT ... ON CONFLICT DO UPDATE ... WHERE the new time is lower,
so two writers can neither lose the better winner nor add a second one (the unique constraint on
kernel x device class x bucket holds in any case).
"""

from __future__ import annotations

import sqlite3
import time
from contextlib import contextmanager
from typing import Iterator

import sqlalchemy
from sqlalchemy import event, inspect, insert, select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from attngen import env
from attngen._version import __version__
from attngen.db import migrations, schema
from attngen.db.models import (Base, DeviceModel, KernelModel, SchemaVersionModel, ShapeBucketModel,
                               TrialModel, WinnerModel)
from attngen.db.queries import (DEVICE_FIELDS, WinnerRow, add_trial, count_measured, find_default_trial,
                                find_or_add_bucket, find_or_add_device, find_or_add_kernel, find_trial_by_config,
                                find_winner, offer_winner, where_measured_configs, where_trials, where_winners)
from attngen.db.transfer import ImportReport, export_data, import_data

# the models, queries and transfer functions are named here too: callers import this module alone
__all__ = ["Store", "MODES", "BUSY_TIMEOUT_S", "Base", "DeviceModel", "KernelModel", "SchemaVersionModel",
           "ShapeBucketModel", "TrialModel", "WinnerModel", "DEVICE_FIELDS", "WinnerRow", "add_trial",
           "count_measured", "find_default_trial", "find_or_add_bucket", "find_or_add_device",
           "find_or_add_kernel", "find_trial_by_config", "find_winner", "offer_winner",
           "where_measured_configs", "where_trials", "where_winners", "ImportReport", "export_data",
           "import_data"]

MODES = ("read", "write", "create")
_PG_LOCK = 0x617474_6E67656E  # pg_advisory_xact_lock key while creating or migrating the schema
BUSY_TIMEOUT_S = 60


def _translate(exc: BaseException, where: str) -> schema.TuningDBError | None:
    """The one-line error for a driver failure, None when it is not about the database itself."""
    orig = getattr(exc, "orig", exc)
    msg = schema.one_line(orig)
    low = msg.lower()
    if isinstance(orig, sqlite3.DatabaseError) and ("not a database" in low or "malformed" in low):
        return schema.CorruptDatabase(f"{where}: not a readable SQLite database ({msg})")
    if isinstance(orig, sqlite3.OperationalError) and "unable to open" in low:
        return schema.UnreachableDatabase(f"{where}: cannot open ({msg})")
    if isinstance(exc, sqlalchemy.exc.OperationalError) and not isinstance(orig, sqlite3.Error):
        return schema.UnreachableDatabase(f"{where}: cannot connect ({msg})")
    if isinstance(orig, sqlite3.OperationalError) and "locked" in low:
        return schema.TuningDBError(f"{where}: still locked by another process after "
                                    f"{BUSY_TIMEOUT_S} s ({msg})")
    return None


def _make_engine(url: str, mode: str, where: str) -> sqlalchemy.Engine:
    path = schema.sqlite_path(url)
    try:
        if url.startswith("sqlite"):
            if path is not None and mode == "read":
                url = f"sqlite:///file:{path}?mode=ro&uri=true"
            engine = sqlalchemy.create_engine(url, connect_args={"timeout": BUSY_TIMEOUT_S})
            _sqlite_events(engine, mode)
        else:
            kwargs = {"pool_pre_ping": True}
            if url.startswith(("postgresql", "postgres")):
                kwargs["connect_args"] = {"connect_timeout": 10}
            engine = sqlalchemy.create_engine(url, **kwargs)
    except (sqlalchemy.exc.ArgumentError, sqlalchemy.exc.NoSuchModuleError, ValueError) as exc:
        raise schema.TuningDBError(f"{where}: not a usable database URL ({schema.one_line(exc)})") from None
    except ModuleNotFoundError as exc:
        raise schema.TuningDBError(f"{where}: needs the Python driver {exc.name!r} (for PostgreSQL: "
                                   f"pip install 'psycopg[binary]')") from None
    return engine


def _wal(cur) -> None:
    """Put the database in WAL mode (readers never block the writers). Several processes opening a
    new file at once race to switch it, and SQLite answers the losers "database is locked" at once,
    without waiting through its busy handler: they retry until BUSY_TIMEOUT_S has passed."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            if cur.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                cur.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc).lower() or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _sqlite_events(engine: sqlalchemy.Engine, mode: str) -> None:
    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn, _record):
        dbapi_conn.isolation_level = None  # transactions are begun below, not by the driver
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_S * 1000}")
        cur.execute("PRAGMA foreign_keys = ON")
        if mode != "read":
            _wal(cur)
        cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn):
        # a writer takes the write lock up front: a deferred transaction that read first could not
        # upgrade once another writer committed, and would fail instead of waiting
        conn.exec_driver_sql("BEGIN" if mode == "read" else "BEGIN IMMEDIATE")


class Store:
    """One tuning database. mode "read": never writes (nor migrates); "write": an existing attngen
    database, migrated to this schema if older; "create": also creates the schema in an empty
    database (or a missing SQLite file). The folder of a new SQLite file must exist, unless it is
    attngen's own place in the user cache (env.user_tuning_db_path): a mistyped path is an error,
    not a new tree of folders."""

    def __init__(self, location: str, mode: str = "read"):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.url = schema.to_url(location)
        self.where = schema.redact(self.url)
        self.mode = mode
        path = schema.sqlite_path(self.url)
        if path is not None:
            self.where = str(path)
            if not path.exists():
                if mode != "create":
                    raise schema.DatabaseMissing(f"{path}: no tuning database here (`attngen tune` "
                                                 f"writes one)")
                if not path.parent.is_dir() and path != env.user_tuning_db_path():
                    raise schema.TuningDBError(f"{path.parent}: no such folder for the database "
                                               f"{path.name} (create it first)")
                path.parent.mkdir(parents=True, exist_ok=True)
            elif path.is_dir():
                raise schema.TuningDBError(f"{path}: is a folder, not a database file")
        self.engine = _make_engine(self.url, mode, self.where)
        try:
            self._open()
        except BaseException:
            self.engine.dispose()
            raise

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @contextmanager
    def session(self) -> Iterator[Session]:
        """One transaction: commits when the block ends, rolls back on any exception (Ctrl-C too)."""
        s = Session(self.engine, expire_on_commit=False, autoflush=True)
        try:
            yield s
            s.commit()
        except BaseException as exc:
            s.rollback()
            err = _translate(exc, self.where) if isinstance(exc, (DBAPIError, sqlite3.Error)) else None
            if err is not None:
                raise err from None
            raise
        finally:
            s.close()

    # ---------------------------------------------------------------------------------------------
    def _open(self) -> None:
        try:
            with self.engine.connect() as conn, conn.begin():
                if self.dialect == "postgresql" and self.mode != "read":
                    conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_LOCK})
                self._check_schema(conn)
        except (DBAPIError, sqlite3.Error) as exc:
            err = _translate(exc, self.where)
            if err is None:
                raise
            raise err from None

    def _check_schema(self, conn: sqlalchemy.Connection) -> None:
        names = set(inspect(conn).get_table_names())
        if schema.SCHEMA_VERSIONS not in names:
            ours = sorted(n for n in names if n.startswith(schema.PREFIX))
            if ours:
                raise schema.CorruptDatabase(f"{self.where}: has attngen tables ({', '.join(ours)}) but "
                                             f"no {schema.SCHEMA_VERSIONS} table")
            if self.mode != "create":
                raise schema.SchemaMismatch(f"{self.where}: not an attngen tuning database (no "
                                            f"{schema.SCHEMA_VERSIONS} table)")
            Base.metadata.create_all(conn)
            conn.execute(insert(SchemaVersionModel).values(id=1, version=schema.SCHEMA_VERSION,
                                                           written_by=__version__))
            return
        try:
            rows = conn.execute(select(SchemaVersionModel.version)).all()
        except DBAPIError as exc:
            raise schema.CorruptDatabase(f"{self.where}: unreadable {schema.SCHEMA_VERSIONS} table "
                                         f"({schema.one_line(exc)})") from None
        if len(rows) != 1 or not isinstance(rows[0][0], int):
            raise schema.CorruptDatabase(f"{self.where}: {schema.SCHEMA_VERSIONS} must hold one "
                                         f"version row, holds {len(rows)}")
        version = rows[0][0]
        if version > schema.SCHEMA_VERSION:
            raise schema.SchemaMismatch(
                f"{self.where}: schema {version} was written by a newer attngen; attngen "
                f"{__version__} knows schemas up to {schema.SCHEMA_VERSION} (upgrade attngen)")
        if version < schema.SCHEMA_VERSION:
            if self.mode == "read":
                raise schema.SchemaMismatch(
                    f"{self.where}: schema {version} is older than this attngen's "
                    f"{schema.SCHEMA_VERSION}; run `attngen db migrate --storage {self.url}`")
            migrations.migrate(conn, version, self.where)
            names = set(inspect(conn).get_table_names())
        missing = [t for t in schema.TABLES if t not in names]
        if missing:
            raise schema.CorruptDatabase(f"{self.where}: schema {version} but table(s) "
                                         f"{', '.join(missing)} are missing")

    def schema_version(self) -> int:
        with self.session() as s:
            return s.scalar(select(SchemaVersionModel.version))

    def pack(self) -> bool:
        """SQLite only: checkpoint the WAL into the file and switch it back to a rollback journal,
        so the file alone is the database (what gets committed, or read from a read-only folder).
        Does nothing (returns False) while another process holds the database open."""
        path = schema.sqlite_path(self.url)
        if path is None:
            return False
        self.engine.dispose()
        try:
            con = sqlite3.connect(path, timeout=1.0, isolation_level=None)
            try:
                mode = con.execute("PRAGMA journal_mode = DELETE").fetchone()[0]
            finally:
                con.close()
        except sqlite3.Error:
            return False
        return mode.lower() == "delete"
