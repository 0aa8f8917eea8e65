"""Fixtures for the tuning-database tests: a fresh SQLite file, and a fresh PostgreSQL database on
the server that ATTNGEN_TEST_PG_URL points at (.ci/run starts one on loopback and sets it; the
PostgreSQL tests skip only when it is unset). The URL's role needs CREATEDB: every test gets its
own database, dropped afterwards."""

from __future__ import annotations

import os
import uuid

import pytest

PG_ENV = "ATTNGEN_TEST_PG_URL"


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'tuning.sqlite'}"


@pytest.fixture
def pg_url():
    base = os.environ.get(PG_ENV)
    if not base:
        pytest.skip(f"{PG_ENV} is unset (no PostgreSQL server for this run)")
    import sqlalchemy

    name = f"attngen_t_{uuid.uuid4().hex[:12]}"
    admin = sqlalchemy.create_engine(base, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as c:
            c.exec_driver_sql(f'CREATE DATABASE "{name}"')
        url = sqlalchemy.engine.make_url(base).set(database=name).render_as_string(hide_password=False)
        yield url
    finally:
        with admin.connect() as c:
            c.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()
