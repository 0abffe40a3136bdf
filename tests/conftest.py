"""Shared fixtures: a fresh SQLite database per test and, when reachable, a fresh PostgreSQL schema.

PostgreSQL tests read TASKKERNEL_TEST_PG_URL (default: the local server's taskkernel_test database).
Without a reachable server they skip, except under TASKKERNEL_REQUIRE_PG=1, where an unreachable server
fails them. A run shows why once: every such skip has the same short reason at the same place, so pytest's
summary folds them into one line, and the full reason is printed once at the end of the run (by the
controller under pytest-xdist, whose workers do not write to the terminal).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Generator, Iterator
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
        cause = getattr(exc, "orig", None) or exc  # the driver's error, without SQLAlchemy's "Background" link
        detail = " ".join(str(cause).split())  # one line: the driver's message spans several
        return f"PostgreSQL not reachable at {pg_base_url()}: {type(cause).__name__}: {detail}"


PG_SKIPPED = "PostgreSQL not reachable (see the note above)"  # the one skip reason every PostgreSQL test shows
_PG_REASON: str | None | bool = False  # False = not probed yet


def require_pg() -> None:
    """Skip (or fail under TASKKERNEL_REQUIRE_PG=1) when PostgreSQL is not reachable."""
    global _PG_REASON
    if _PG_REASON is False:
        _PG_REASON = _pg_unavailable_reason()
    if _PG_REASON:
        if os.environ.get("TASKKERNEL_REQUIRE_PG") == "1":
            pytest.fail(f"TASKKERNEL_REQUIRE_PG=1 but {_PG_REASON}")
        pytest.skip(PG_SKIPPED)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A PostgreSQL skip is reported at require_pg, not at each test, so the summary folds them all into one
    line; the full reason travels with the report (to the controller, under pytest-xdist)."""
    report = yield
    skipped = call.excinfo.value if call.excinfo is not None else None
    if report.skipped and isinstance(skipped, pytest.skip.Exception) and skipped.msg == PG_SKIPPED:
        report.longrepr = (__file__, require_pg.__code__.co_firstlineno, f"Skipped: {PG_SKIPPED}")
        report.pg_unreachable = str(_PG_REASON)  # type: ignore[attr-defined]
    return report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The reason PostgreSQL tests were skipped, once per run (before the short summary that points here)."""
    reasons: dict[str, int] = {}
    for report in terminalreporter.stats.get("skipped", []):
        if reason := getattr(report, "pg_unreachable", None):
            reasons[reason] = reasons.get(reason, 0) + 1
    if reasons:
        terminalreporter.section("PostgreSQL", sep="-")
        for reason, count in reasons.items():
            terminalreporter.write_line(f"{count} test(s) skipped: {reason}")
        terminalreporter.write_line("Set TASKKERNEL_TEST_PG_URL to a reachable server, or TASKKERNEL_REQUIRE_PG=1 "
                                    "to fail instead of skipping.")


def fresh_pg_schema() -> Iterator[str]:
    """URL of a fresh, empty PostgreSQL schema, dropped when the generator closes."""
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
def pg_url() -> Iterator[str]:
    """URL of a fresh, empty PostgreSQL schema, dropped after the test."""
    require_pg()
    yield from fresh_pg_schema()


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
