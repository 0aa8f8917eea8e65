"""Schema migrations: one step per version, run in the writer's transaction.

STEPS[v] takes a database at schema v to v + 1 (a function of the SQLAlchemy Connection). A
database older than schema.SCHEMA_VERSION is brought up to date when a writer opens it (`attngen
tune`, `attngen db import`, `attngen db migrate`); readers never migrate, they ask for it. Version 1
is the first schema, so there are no steps yet; adding a column later means: bump
schema.SCHEMA_VERSION, change models.py, and add STEPS[1] that alters existing tables to match.
"""

from __future__ import annotations

from typing import Callable

from sqlalchemy import Connection, text

from attngen.db import schema

STEPS: dict[int, Callable[[Connection], None]] = {}


def migrate(conn: Connection, current: int, where: str, steps=None) -> int:
    """Run the steps from `current` up to schema.SCHEMA_VERSION inside the caller's transaction
    (a failing step rolls everything back with it); returns the new version."""
    steps = STEPS if steps is None else steps
    target = schema.SCHEMA_VERSION
    for v in range(current, target):
        if v not in steps:
            raise schema.SchemaMismatch(f"{where}: schema {current} is older than {target} and no "
                                        f"migration step leads from {v} to {v + 1}")
        steps[v](conn)
        conn.execute(text(f"UPDATE {schema.SCHEMA_VERSIONS} SET version = :v WHERE id = 1"),
                     {"v": v + 1})
    return target
