"""The tuning database's tables (SQLAlchemy). One class per table, `<Thing>Model`, plural table
names with attngen's prefix, and every uniqueness rule written as a named constraint.

    devices        one row per GPU + software stack that measured something (device class, GPU
                   name, compute capability, driver, CUDA, torch and triton versions)
    kernels        one row per (kernel uri, kernel hash): a changed kernel is another kernel (the
                   template_hash column holds the generated module's KERNEL_HASH, its content hash)
    shape_buckets  one row per bucket key (q4096_k4096_bh64)
    trials         every measured or rejected config: status ok / failed / invalid, time, error
    winners        the best ok trial per (kernel, device class, bucket), with the default's time
    schema_versions  one row: the schema version (schema.SCHEMA_VERSION)
"""

from __future__ import annotations

from sqlalchemy import (Boolean, CheckConstraint, Float, ForeignKey, Integer, String, Text,
                        UniqueConstraint)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from attngen.db import schema


class Base(DeclarativeBase):
    pass


class SchemaVersionModel(Base):
    __tablename__ = schema.SCHEMA_VERSIONS
    __table_args__ = (CheckConstraint("id = 1", name="attngen_schema_versions_one_row"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version: Mapped[int] = mapped_column(Integer, nullable=False)
    written_by: Mapped[str] = mapped_column(String(32), nullable=False)  # attngen version


class DeviceModel(Base):
    __tablename__ = schema.DEVICES
    __table_args__ = (UniqueConstraint("device_class", "gpu_name", "capability", "driver",
                                       "cuda_version", "torch_version", "triton_version",
                                       name="attngen_devices_unique"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    device_class: Mapped[str] = mapped_column(String(16), nullable=False)  # devices.PROFILES key
    gpu_name: Mapped[str] = mapped_column(String(128), nullable=False)
    capability: Mapped[str] = mapped_column(String(8), nullable=False)  # "9.0"
    driver: Mapped[str] = mapped_column(String(32), nullable=False)
    cuda_version: Mapped[str] = mapped_column(String(32), nullable=False)
    torch_version: Mapped[str] = mapped_column(String(64), nullable=False)
    triton_version: Mapped[str] = mapped_column(String(64), nullable=False)


class KernelModel(Base):
    __tablename__ = schema.KERNELS
    __table_args__ = (UniqueConstraint("uri", "template_hash", name="attngen_kernels_unique"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    uri: Mapped[str] = mapped_column(String(128), nullable=False, index=True)
    template_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    family: Mapped[str] = mapped_column(String(16), nullable=False)
    spec_json: Mapped[str] = mapped_column(Text, nullable=False)  # KernelSpec.as_dict()


class ShapeBucketModel(Base):
    __tablename__ = schema.SHAPE_BUCKETS
    __table_args__ = (UniqueConstraint("key", name="attngen_shape_buckets_unique"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(64), nullable=False)
    seqlen_q: Mapped[int] = mapped_column(Integer, nullable=False)
    seqlen_k: Mapped[int] = mapped_column(Integer, nullable=False)
    batch_heads: Mapped[int] = mapped_column(Integer, nullable=False)


class TrialModel(Base):
    __tablename__ = schema.TRIALS
    __table_args__ = (
        UniqueConstraint("uid", name="attngen_trials_unique"),
        CheckConstraint("status IN ('ok', 'failed', 'invalid')", name="attngen_trials_status"),
        CheckConstraint("status <> 'ok' OR time_ms > 0", name="attngen_trials_ok_has_time"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    uid: Mapped[str] = mapped_column(String(32), nullable=False)  # stable across export/import
    kernel_id: Mapped[int] = mapped_column(ForeignKey(f"{schema.KERNELS}.id"), nullable=False, index=True)
    device_id: Mapped[int] = mapped_column(ForeignKey(f"{schema.DEVICES}.id"), nullable=False)
    bucket_id: Mapped[int] = mapped_column(ForeignKey(f"{schema.SHAPE_BUCKETS}.id"), nullable=False)
    study_name: Mapped[str | None] = mapped_column(String(400))
    optuna_trial: Mapped[int | None] = mapped_column(Integer)  # the Optuna trial number
    config_json: Mapped[str] = mapped_column(Text, nullable=False)  # schema.config_json
    is_default: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False)
    status: Mapped[str] = mapped_column(String(16), nullable=False)
    time_ms: Mapped[float | None] = mapped_column(Float)  # median of do_bench
    tflops: Mapped[float | None] = mapped_column(Float)
    error: Mapped[str | None] = mapped_column(Text)
    shape_json: Mapped[str] = mapped_column(Text, nullable=False)  # the shape that was measured
    created_at: Mapped[float] = mapped_column(Float, nullable=False)  # Unix time


class WinnerModel(Base):
    __tablename__ = schema.WINNERS
    __table_args__ = (UniqueConstraint("kernel_id", "device_class", "bucket_id",
                                       name="attngen_winners_unique"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kernel_id: Mapped[int] = mapped_column(ForeignKey(f"{schema.KERNELS}.id"), nullable=False)
    device_class: Mapped[str] = mapped_column(String(16), nullable=False)
    bucket_id: Mapped[int] = mapped_column(ForeignKey(f"{schema.SHAPE_BUCKETS}.id"), nullable=False)
    trial_id: Mapped[int] = mapped_column(ForeignKey(f"{schema.TRIALS}.id"), nullable=False)
    config_json: Mapped[str] = mapped_column(Text, nullable=False)
    time_ms: Mapped[float] = mapped_column(Float, nullable=False)
    tflops: Mapped[float | None] = mapped_column(Float)
    default_time_ms: Mapped[float | None] = mapped_column(Float)  # the default config, same device
    default_tflops: Mapped[float | None] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float, nullable=False)
