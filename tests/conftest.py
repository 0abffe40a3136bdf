"""Shared fixtures: a fresh SQLite database per test and, when reachable, a fresh PostgreSQL schema.

PostgreSQL tests read TASKKERNEL_TEST_PG_URL (default: the local server's taskkernel_test database).
Without a reachable server they skip with the reason shown, except under TASKKERNEL_REQUIRE_PG=1,
where an unreachable server fails them.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from taskkernel.kernel.store.db import Database, with_pg_schema

DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/taskkernel_test"


def pg_base_url() -> str:
    return os.environ.get("TASKKERNEL_TEST_PG_URL", DEFAULT_PG_URL)


def _pg_unavailable_reason() -> str | None:
    try:
        eng = sa.create_engine(pg_base_url(), connect_args={"connect_timeout": 3})
        with eng.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
        eng.dispose()
        return None
    except Exception as exc:  # noqa: BLE001 - any failure means "not reachable"
        return f"PostgreSQL not reachable at {pg_base_url()}: {exc.__class__.__name__}: {exc}"


_PG_REASON: str | None | bool = False  # False = not probed yet


def require_pg() -> None:
    """Skip (or fail under TASKKERNEL_REQUIRE_PG=1) when PostgreSQL is not reachable."""
    global _PG_REASON
    if _PG_REASON is False:
        _PG_REASON = _pg_unavailable_reason()
    if _PG_REASON:
        if os.environ.get("TASKKERNEL_REQUIRE_PG") == "1":
            pytest.fail(f"TASKKERNEL_REQUIRE_PG=1 but {_PG_REASON}")
        pytest.skip(str(_PG_REASON))


@pytest.fixture
def pg_url() -> Iterator[str]:
    """URL of a fresh, empty PostgreSQL schema, dropped after the test."""
    require_pg()
    schema = f"t_{uuid.uuid4().hex[:16]}"
    admin = sa.create_engine(pg_base_url())
    with admin.begin() as conn:
        conn.exec_driver_sql(f"CREATE SCHEMA {schema}")
    try:
        yield with_pg_schema(pg_base_url(), schema)
    finally:
        with admin.begin() as conn:
            conn.exec_driver_sql(f"DROP SCHEMA {schema} CASCADE")
        admin.dispose()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'kernel.db'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def any_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Both backends: the test body runs once on each."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'kernel.db'}"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def sqlite_db(sqlite_url: str) -> Iterator[Database]:
    db = Database(sqlite_url)
    yield db
    db.dispose()


@pytest.fixture
def any_db(any_url: str) -> Iterator[Database]:
    db = Database(any_url)
    yield db
    db.dispose()
