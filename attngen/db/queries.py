"""The tuning database's queries, a fixed vocabulary (find_*, find_or_add_*, add_*, offer_*,
where_*, count_*), each run in a session of attngen.db.store.Store. Rows that must be unique are
added with INSERT ... ON CONFLICT DO NOTHING and read back, and a winner is offered with one
INSERT ... ON CONFLICT DO UPDATE ... WHERE the new time is lower (store.py says why).
"""

from __future__ import annotations

import fnmatch
import json
import time
import uuid
from dataclasses import dataclass, field

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from attngen.db import schema
from attngen.db.models import DeviceModel, KernelModel, ShapeBucketModel, TrialModel, WinnerModel


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
