"""What every reader and writer of the tuning database agrees on, in pure Python: the schema
version, the table names, the URL of a location, and the errors (one line each, no traceback).

The runtime's read side (attngen.db.winners) imports this module and the stdlib sqlite3 only;
models.py defines the same tables with SQLAlchemy.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

SCHEMA_VERSION = 1  # bump with a step in migrations.STEPS
EXPORT_FORMAT = "attngen-tuning-db"  # the "format" of `attngen db export` JSON

# attngen's tables carry a prefix: Optuna keeps its studies in the same database (one storage URL
# for `attngen tune` and `optuna-dashboard`) and owns names like "trials" and "version_info".
PREFIX = "attngen_"
SCHEMA_VERSIONS = PREFIX + "schema_versions"
DEVICES = PREFIX + "devices"
KERNELS = PREFIX + "kernels"
SHAPE_BUCKETS = PREFIX + "shape_buckets"
TRIALS = PREFIX + "trials"
WINNERS = PREFIX + "winners"
TABLES = (SCHEMA_VERSIONS, DEVICES, KERNELS, SHAPE_BUCKETS, TRIALS, WINNERS)

STATUSES = ("ok", "failed", "invalid")  # a trial's status; only "ok" trials can win


class TuningDBError(RuntimeError):
    """A tuning database that cannot be used; the message is one line and names the location."""


class DatabaseMissing(TuningDBError):
    pass


class CorruptDatabase(TuningDBError):
    pass


class SchemaMismatch(TuningDBError):
    """Not an attngen database, or one of a schema this attngen cannot read or write."""


class UnreachableDatabase(TuningDBError):
    pass


_URL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")


def is_url(location: str) -> bool:
    return bool(_URL_RE.match(location))


def to_url(location: str | Path) -> str:
    """A file path becomes an absolute sqlite:/// URL; a URL stays as it is."""
    text = str(location)
    if is_url(text):
        return text
    return "sqlite:///" + str(Path(text).expanduser().resolve())


def sqlite_path(url: str) -> Path | None:
    """The file of a sqlite URL (None for another database, or an in-memory one)."""
    m = re.match(r"^sqlite(\+\w+)?:///(.*)$", url)
    if not m:
        return None
    path = m.group(2).split("?", 1)[0]
    if not path or path == ":memory:":
        return None
    return Path(path)


def redact(url: str) -> str:
    """The URL with its password replaced, for messages."""
    return re.sub(r"(://[^:/@]+:)[^@]*@", r"\1***@", url)


def one_line(exc: BaseException | str, limit: int = 300) -> str:
    """The first line of an error (driver messages span several), shortened."""
    text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    line = text[0] if text else type(exc).__name__
    return line if len(line) <= limit else line[:limit - 3] + "..."


_BUCKET_RE = re.compile(r"q(\d+)_k(\d+)_bh(\d+)")


def bucket_fields(key: str) -> tuple[int, int, int]:
    """(seqlen_q, seqlen_k, batch_heads) of a bucket key "q4096_k4096_bh64" (the db layer stores
    and sorts keys without importing the tuning package; attngen.buckets validates them)."""
    m = _BUCKET_RE.fullmatch(key)
    if not m:
        raise ValueError(f"shape bucket {key!r}: expected q<Sq>_k<Sk>_bh<B*H>")
    return tuple(int(x) for x in m.groups())


def config_json(config: dict) -> str:
    """The one text form of a config (sorted keys, no spaces): stored, compared and exported."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"))
