"""Export / import of a tuning database as JSON, by natural keys (ids never leave it): `attngen db
export` / `attngen db import`, each in a session of attngen.db.store.Store."""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from attngen.db import schema
from attngen.db.models import DeviceModel, KernelModel, ShapeBucketModel, TrialModel, WinnerModel
from attngen.db.queries import (DEVICE_FIELDS, add_trial, find_or_add_bucket, find_or_add_device,
                                find_or_add_kernel, offer_winner)


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
