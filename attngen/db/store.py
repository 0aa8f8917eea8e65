"""Open a tuning database, one session context manager, and the queries (a fixed vocabulary:
find_*, find_or_add_*, add_*, offer_*, where_*, count_*).

Concurrency. Several `attngen tune` processes may write one database at once: SQLite in WAL mode on
one machine (write transactions start with BEGIN IMMEDIATE, so a writer waits for the lock instead of
failing half-way; busy timeout 60 s), PostgreSQL across machines. No write reads-then-writes
unguarded: rows that must be unique are added with INSERT ... ON CONFLICT DO NOTHING and read back,
and a winner is offered with one INSERT ... ON CONFLICT DO UPDATE ... WHERE the new time is lower,
so two writers can neither lose the better winner nor add a second one (the unique constraint on
kernel x device class x bucket holds in any case).
"""

from __future__ import annotations

import fnmatch
import json
import sqlite3
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import sqlalchemy
from sqlalchemy import event, func, inspect, insert, select, text
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session

from attngen._version import __version__
from attngen.db import migrations, schema
from attngen.db.models import (Base, DeviceModel, KernelModel, SchemaVersionModel, ShapeBucketModel,
                               TrialModel, WinnerModel)

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


def _sqlite_events(engine: sqlalchemy.Engine, mode: str) -> None:
    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn, _record):
        dbapi_conn.isolation_level = None  # transactions are begun below, not by the driver
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_S * 1000}")
        cur.execute("PRAGMA foreign_keys = ON")
        if mode != "read" and cur.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            cur.execute("PRAGMA journal_mode = WAL")  # readers never block the writers
        cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn):
        # a writer takes the write lock up front: a deferred transaction that read first could not
        # upgrade once another writer committed, and would fail instead of waiting
        conn.exec_driver_sql("BEGIN" if mode == "read" else "BEGIN IMMEDIATE")


class Store:
    """One tuning database. mode "read": never writes (nor migrates); "write": an existing attngen
    database, migrated to this schema if older; "create": also creates the schema in an empty
    database (or a missing SQLite file)."""

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


# ---------------------------------------------------------------------------------------------
# Rows that must be unique: added at most once, whoever races.

def _find_or_add(s: Session, model, keys: dict, values: dict):
    row = s.scalars(select(model).filter_by(**keys)).first()
    if row is not None:
        return row
    dialect = s.get_bind().dialect.name
    if dialect in ("sqlite", "postgresql"):
        ins = _dialect_insert(dialect)(model.__table__).values(**keys, **values).on_conflict_do_nothing()
        s.execute(ins)
    else:  # pragma: no cover - other databases: a savepoint around a plain insert
        try:
            with s.begin_nested():
                s.add(model(**keys, **values))
        except IntegrityError:
            pass
    return s.scalars(select(model).filter_by(**keys)).one()


def _dialect_insert(dialect: str):
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return sqlite_insert


DEVICE_FIELDS = ("device_class", "gpu_name", "capability", "driver", "cuda_version", "torch_version",
                 "triton_version")


def find_or_add_device(s: Session, info: dict) -> DeviceModel:
    """`info`: DEVICE_FIELDS -> str (attngen.devices.DeviceInfo.as_record())."""
    return _find_or_add(s, DeviceModel, {k: str(info[k]) for k in DEVICE_FIELDS}, {})


def find_or_add_kernel(s: Session, uri: str, template_hash: str, family: str, spec: dict) -> KernelModel:
    return _find_or_add(s, KernelModel, {"uri": uri, "template_hash": template_hash},
                        {"family": family, "spec_json": json.dumps(spec, sort_keys=True)})


def find_or_add_bucket(s: Session, key: str) -> ShapeBucketModel:
    """`key`: a ShapeBucket.key (q4096_k4096_bh64)."""
    sq, sk, bh = schema.bucket_fields(key)
    return _find_or_add(s, ShapeBucketModel, {"key": key},
                        {"seqlen_q": sq, "seqlen_k": sk, "batch_heads": bh})


# ---------------------------------------------------------------------------------------------
# Trials and winners

def add_trial(s: Session, *, kernel: KernelModel, device: DeviceModel, bucket: ShapeBucketModel,
              config: dict, status: str, shape: dict, time_ms: float | None = None,
              tflops: float | None = None, error: str | None = None, study_name: str | None = None,
              optuna_trial: int | None = None, is_default: bool = False, uid: str | None = None,
              created_at: float | None = None) -> TrialModel:
    if status not in schema.STATUSES:
        raise ValueError(f"trial status must be one of {schema.STATUSES}, got {status!r}")
    if status == "ok" and not (time_ms is not None and time_ms > 0):
        raise ValueError(f"an ok trial needs a time > 0, got {time_ms!r}")
    row = TrialModel(uid=uid or uuid.uuid4().hex, kernel_id=kernel.id, device_id=device.id,
                     bucket_id=bucket.id, study_name=study_name, optuna_trial=optuna_trial,
                     config_json=schema.config_json(config), is_default=is_default, status=status,
                     time_ms=time_ms if status == "ok" else None,
                     tflops=tflops if status == "ok" else None, error=error,
                     shape_json=json.dumps(shape, sort_keys=True),
                     created_at=time.time() if created_at is None else created_at)
    s.add(row)
    s.flush()
    return row


def offer_winner(s: Session, trial: TrialModel, device_class: str, default_time_ms: float | None,
                 default_tflops: float | None, updated_at: float | None = None) -> bool:
    """Make `trial` the winner of its (kernel, device class, bucket) unless an equal or faster one
    is there; one atomic statement. Only ok trials can win. True when it became the winner."""
    if trial.status != "ok":
        raise ValueError(f"trial {trial.uid} has status {trial.status!r}; only ok trials can win")
    values = dict(kernel_id=trial.kernel_id, device_class=device_class, bucket_id=trial.bucket_id,
                  trial_id=trial.id, config_json=trial.config_json, time_ms=trial.time_ms,
                  tflops=trial.tflops, default_time_ms=default_time_ms, default_tflops=default_tflops,
                  updated_at=time.time() if updated_at is None else updated_at)
    dialect = s.get_bind().dialect.name
    if dialect in ("sqlite", "postgresql"):
        table = WinnerModel.__table__
        ins = _dialect_insert(dialect)(table).values(**values)
        keep = ("kernel_id", "device_class", "bucket_id")
        update = {k: getattr(ins.excluded, k) for k in values if k not in keep}
        update["default_time_ms"] = func.coalesce(ins.excluded.default_time_ms, table.c.default_time_ms)
        update["default_tflops"] = func.coalesce(ins.excluded.default_tflops, table.c.default_tflops)
        stmt = ins.on_conflict_do_update(index_elements=list(keep), set_=update,
                                         where=ins.excluded.time_ms < table.c.time_ms)
        if dialect == "postgresql":  # rowcount is not reliable through every driver there
            changed = s.execute(stmt.returning(table.c.id)).first() is not None
        else:
            changed = s.execute(stmt).rowcount > 0
        s.expire_all()
        return changed
    return _offer_winner_generic(s, values)  # pragma: no cover


def _offer_winner_generic(s: Session, values: dict) -> bool:  # pragma: no cover - not sqlite/pg
    keys = {k: values[k] for k in ("kernel_id", "device_class", "bucket_id")}
    row = s.scalars(select(WinnerModel).filter_by(**keys).with_for_update()).first()
    if row is None:
        try:
            with s.begin_nested():
                s.add(WinnerModel(**values))
            return True
        except IntegrityError:
            row = s.scalars(select(WinnerModel).filter_by(**keys).with_for_update()).one()
    if values["time_ms"] < row.time_ms:
        for k, v in values.items():
            if v is not None or k not in ("default_time_ms", "default_tflops"):
                setattr(row, k, v)
        return True
    return False


def find_winner(s: Session, kernel_id: int, device_class: str, bucket_id: int) -> WinnerModel | None:
    return s.scalars(select(WinnerModel).filter_by(kernel_id=kernel_id, device_class=device_class,
                                                   bucket_id=bucket_id)).first()


def _trials_of(kernel_id: int, device_class: str, bucket_id: int):
    return (select(TrialModel).join(DeviceModel, TrialModel.device_id == DeviceModel.id)
            .where(TrialModel.kernel_id == kernel_id, TrialModel.bucket_id == bucket_id,
                   DeviceModel.device_class == device_class))


def find_default_trial(s: Session, kernel_id: int, device_id: int, bucket_id: int) -> TrialModel | None:
    """The latest measurement of the default config on this very device (GPU and software)."""
    return s.scalars(select(TrialModel).where(
        TrialModel.kernel_id == kernel_id, TrialModel.device_id == device_id,
        TrialModel.bucket_id == bucket_id, TrialModel.is_default.is_(True),
        TrialModel.status != "invalid").order_by(TrialModel.created_at.desc())).first()


def find_trial_by_config(s: Session, kernel_id: int, device_class: str, bucket_id: int,
                         config_json: str) -> TrialModel | None:
    """An earlier measurement of this config in the device class (another worker's, or a previous
    run's): the tuner reuses it instead of measuring again."""
    return s.scalars(_trials_of(kernel_id, device_class, bucket_id)
                     .where(TrialModel.config_json == config_json)
                     .order_by(TrialModel.created_at)).first()


def _measured(kernel_id: int, device_class: str, bucket_id: int, study_name: str | None, what):
    q = (select(what).select_from(TrialModel).join(DeviceModel, TrialModel.device_id == DeviceModel.id)
         .where(TrialModel.kernel_id == kernel_id, TrialModel.bucket_id == bucket_id,
                DeviceModel.device_class == device_class, TrialModel.status != "invalid"))
    if study_name is not None:
        q = q.where(TrialModel.study_name == study_name)
    return q


def count_measured(s: Session, kernel_id: int, device_class: str, bucket_id: int,
                   study_name: str | None = None) -> int:
    """Distinct configs that went to the GPU (ok or failed) for this kernel x class x bucket."""
    return s.scalar(_measured(kernel_id, device_class, bucket_id, study_name,
                              func.count(func.distinct(TrialModel.config_json))))


def where_measured_configs(s: Session, kernel_id: int, device_class: str, bucket_id: int,
                           study_name: str | None = None) -> list[str]:
    """The distinct config_json of those configs."""
    return list(s.scalars(_measured(kernel_id, device_class, bucket_id, study_name,
                                    TrialModel.config_json).distinct()))


@dataclass(frozen=True)
class WinnerRow:
    uri: str
    template_hash: str
    family: str
    device_class: str
    bucket: str
    config: dict
    time_ms: float
    tflops: float | None
    default_time_ms: float | None
    default_tflops: float | None
    trial_uid: str
    gpu_name: str
    spec: dict = field(default_factory=dict)  # the kernel's KernelSpec fields, as stored

    @property
    def gain(self) -> float | None:
        """Speed-up over the default config (0.07 = 7 % faster), None when the default is unknown."""
        if not self.default_time_ms:
            return None
        return self.default_time_ms / self.time_ms - 1.0


def where_winners(s: Session, uri_pattern: str | None = None, device_class: str | None = None) -> list[WinnerRow]:
    q = (select(WinnerModel, KernelModel, ShapeBucketModel, TrialModel, DeviceModel)
         .join(KernelModel, WinnerModel.kernel_id == KernelModel.id)
         .join(ShapeBucketModel, WinnerModel.bucket_id == ShapeBucketModel.id)
         .join(TrialModel, WinnerModel.trial_id == TrialModel.id)
         .join(DeviceModel, TrialModel.device_id == DeviceModel.id))
    if device_class:
        q = q.where(WinnerModel.device_class == device_class)
    out = []
    for w, k, b, t, d in s.execute(q).all():
        if uri_pattern and not fnmatch.fnmatchcase(k.uri, uri_pattern):
            continue
        out.append(WinnerRow(k.uri, k.template_hash, k.family, w.device_class, b.key,
                             json.loads(w.config_json), w.time_ms, w.tflops, w.default_time_ms,
                             w.default_tflops, t.uid, d.gpu_name, json.loads(k.spec_json)))
    out.sort(key=lambda r: (r.uri, r.device_class, schema.bucket_fields(r.bucket), r.template_hash))
    return out


def where_trials(s: Session, uri: str | None = None, bucket: str | None = None,
                 device_class: str | None = None, study_name: str | None = None) -> list[dict]:
    q = (select(TrialModel, KernelModel, ShapeBucketModel, DeviceModel)
         .join(KernelModel, TrialModel.kernel_id == KernelModel.id)
         .join(ShapeBucketModel, TrialModel.bucket_id == ShapeBucketModel.id)
         .join(DeviceModel, TrialModel.device_id == DeviceModel.id))
    if uri:
        q = q.where(KernelModel.uri == uri)
    if bucket:
        q = q.where(ShapeBucketModel.key == bucket)
    if device_class:
        q = q.where(DeviceModel.device_class == device_class)
    if study_name:
        q = q.where(TrialModel.study_name == study_name)
    q = q.order_by(TrialModel.created_at, TrialModel.uid)
    return [dict(uid=t.uid, uri=k.uri, template_hash=k.template_hash, family=k.family,
                 spec=json.loads(k.spec_json), bucket=b.key, device_class=d.device_class,
                 config=json.loads(t.config_json), status=t.status, time_ms=t.time_ms,
                 tflops=t.tflops, error=t.error, is_default=t.is_default, study_name=t.study_name,
                 optuna_trial=t.optuna_trial)
            for t, k, b, d in s.execute(q).all()]


# ---------------------------------------------------------------------------------------------
# Export / import (JSON): the whole database by natural keys, ids never leave it.

def export_data(s: Session, winners_only: bool = False, kernels_glob: str | None = None) -> dict:
    """kernels_glob: only the kernels whose uri matches (fnmatch), their trials and winners, and
    the devices and buckets those use."""
    devices = s.scalars(select(DeviceModel)).all()
    kernels = s.scalars(select(KernelModel)).all()
    buckets = s.scalars(select(ShapeBucketModel)).all()
    if kernels_glob is not None:
        kernels = [k for k in kernels if fnmatch.fnmatchcase(k.uri, kernels_glob)]
        kept = [k.id for k in kernels]
        used = s.execute(select(TrialModel.device_id, TrialModel.bucket_id)
                         .where(TrialModel.kernel_id.in_(kept)).distinct()).all()
        devices = [d for d in devices if d.id in {u[0] for u in used}]
        buckets = [b for b in buckets if b.id in {u[1] for u in used}]
    dev_key = {d.id: tuple(getattr(d, f) for f in DEVICE_FIELDS) for d in devices}
    dev_list = sorted(set(dev_key.values()))
    dev_index = {k: i for i, k in enumerate(dev_list)}
    ker_key = {k.id: (k.uri, k.template_hash) for k in kernels}
    ker_rows = sorted(kernels, key=lambda k: (k.uri, k.template_hash))
    ker_index = {(k.uri, k.template_hash): i for i, k in enumerate(ker_rows)}
    bucket_key = {b.id: b.key for b in buckets}
    winners = s.scalars(select(WinnerModel)).all()
    trial_q = select(TrialModel)
    if kernels_glob is not None:
        winners = [w for w in winners if w.kernel_id in kept]
        trial_q = trial_q.where(TrialModel.kernel_id.in_(kept))
    if winners_only:
        trial_q = trial_q.where(TrialModel.id.in_([w.trial_id for w in winners]))
    trials = s.scalars(trial_q).all()
    trial_uid = {t.id: t.uid for t in s.scalars(select(TrialModel).where(
        TrialModel.id.in_([w.trial_id for w in winners]))).all()}
    return {
        "format": schema.EXPORT_FORMAT,
        "schema_version": schema.SCHEMA_VERSION,
        "devices": [dict(zip(DEVICE_FIELDS, d)) for d in dev_list],
        "kernels": [{"uri": k.uri, "template_hash": k.template_hash, "family": k.family,
                     "spec": json.loads(k.spec_json)} for k in ker_rows],
        "shape_buckets": sorted((b.key for b in buckets), key=schema.bucket_fields),
        "trials": [{"uid": t.uid, "kernel": ker_index[ker_key[t.kernel_id]],
                    "device": dev_index[dev_key[t.device_id]], "bucket": bucket_key[t.bucket_id],
                    "study_name": t.study_name, "optuna_trial": t.optuna_trial,
                    "config": json.loads(t.config_json), "is_default": t.is_default,
                    "status": t.status, "time_ms": t.time_ms, "tflops": t.tflops, "error": t.error,
                    "shape": json.loads(t.shape_json), "created_at": t.created_at}
                   for t in sorted(trials, key=lambda t: (t.created_at, t.uid))],
        "winners": sorted(({"kernel": ker_index[ker_key[w.kernel_id]], "device_class": w.device_class,
                            "bucket": bucket_key[w.bucket_id], "trial": trial_uid[w.trial_id],
                            "config": json.loads(w.config_json), "time_ms": w.time_ms,
                            "tflops": w.tflops, "default_time_ms": w.default_time_ms,
                            "default_tflops": w.default_tflops, "updated_at": w.updated_at}
                           for w in winners),
                          key=lambda w: (w["kernel"], w["device_class"], schema.bucket_fields(w["bucket"]))),
    }


@dataclass
class ImportReport:
    trials_added: int = 0
    trials_known: int = 0
    winners_changed: int = 0
    winners_kept: int = 0


def import_data(s: Session, data: dict, source: str = "<json>") -> ImportReport:
    """Merge an export into this database: trials by uid (known ones are skipped), winners through
    offer_winner (the faster one stays). A malformed export is a TuningDBError naming what is wrong,
    and nothing is written (the caller's session rolls back)."""
    def bad(msg: str) -> schema.TuningDBError:
        return schema.TuningDBError(f"{source}: not an attngen tuning export: {msg}")

    if not isinstance(data, dict) or data.get("format") != schema.EXPORT_FORMAT:
        raise bad(f"'format' must be {schema.EXPORT_FORMAT!r}")
    version = data.get("schema_version")
    if not isinstance(version, int):
        raise bad("'schema_version' must be an integer")
    if version > schema.SCHEMA_VERSION:
        raise schema.SchemaMismatch(f"{source}: exported from schema {version}, newer than this "
                                    f"attngen's {schema.SCHEMA_VERSION} (upgrade attngen)")
    try:
        devices = [find_or_add_device(s, d) for d in data["devices"]]
        kernels = [find_or_add_kernel(s, k["uri"], k["template_hash"], k["family"], k["spec"])
                   for k in data["kernels"]]
        buckets = {key: find_or_add_bucket(s, key) for key in data["shape_buckets"]}
        report = ImportReport()
        by_uid: dict[str, TrialModel] = {}
        for t in data["trials"]:
            known = s.scalars(select(TrialModel).filter_by(uid=t["uid"])).first()
            if known is not None:
                report.trials_known += 1
                by_uid[t["uid"]] = known
                continue
            by_uid[t["uid"]] = add_trial(
                s, kernel=kernels[t["kernel"]], device=devices[t["device"]], bucket=buckets[t["bucket"]],
                config=t["config"], status=t["status"], shape=t["shape"], time_ms=t["time_ms"],
                tflops=t["tflops"], error=t["error"], study_name=t["study_name"],
                optuna_trial=t["optuna_trial"], is_default=bool(t["is_default"]), uid=t["uid"],
                created_at=t["created_at"])
            report.trials_added += 1
        for w in data["winners"]:
            trial = by_uid.get(w["trial"])
            if trial is None:
                raise bad(f"winner of {w['bucket']} names trial {w['trial']}, which is not in the file")
            kernel = kernels[w["kernel"]]
            if (trial.kernel_id, trial.bucket_id) != (kernel.id, buckets[w["bucket"]].id):
                raise bad(f"winner of {kernel.uri} {w['bucket']} names a trial of another kernel/bucket")
            if trial.status != "ok":
                raise bad(f"winner of {kernel.uri} {w['bucket']} names a trial with status {trial.status!r}")
            if offer_winner(s, trial, w["device_class"], w["default_time_ms"], w["default_tflops"],
                            updated_at=w["updated_at"]):
                report.winners_changed += 1
            else:
                report.winners_kept += 1
    except schema.TuningDBError:
        raise
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise bad(f"{type(exc).__name__}: {schema.one_line(exc)}") from None
    return report
