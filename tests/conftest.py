"""Shared fixtures: a fresh SQLite database per test and, when a server is reachable, a fresh PostgreSQL schema.

PostgreSQL tests make their schemas in one database per test process (each pytest-xdist worker has its own):
TASKKERNEL_TEST_PG_URL when set, used as given (never created or dropped); otherwise a throwaway database
``taskkernel_test_<pid>_<random>`` that the process creates on the local server (PG_SERVER, through its
maintenance database) the first time a test asks for PostgreSQL, and drops when the session ends, failed or not.
A fresh machine with the server running therefore runs them with no setup.

Without a usable server they skip, except under TASKKERNEL_REQUIRE_PG=1, where it fails them. The skip says what
is missing and how to fix it; every such skip has the same reason at the same place, so pytest's summary folds
them into one line, and the reason is also printed once at the end of the run (by the controller under
pytest-xdist, whose workers do not write to the terminal).

The tests never write into the user's own state folder: XDG_STATE_HOME (where the CLI logs a traceback when it
has no workspace) points into pytest's temporary folder for the whole session.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import threading
import time
import uuid
import warnings
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from taskkernel.kernel.store.db import Database, with_pg_schema

PG_URL_ENV = "TASKKERNEL_TEST_PG_URL"
PG_SERVER = "postgresql+psycopg://postgres@127.0.0.1:5432"  # where the throwaway databases are made
MAINTENANCE_DBS = ("postgres", "template1")  # connected to for CREATE/DROP DATABASE: the first that exists
THROWAWAY_PREFIX = "taskkernel_test_"  # then the creating process's pid, the time it was made, a random part
STAMPED = re.compile(re.escape(THROWAWAY_PREFIX) + r"\d+_(\d+)_[0-9a-f]{6}")
STALE_AFTER_S = 24 * 3600  # a throwaway database this old was left by a killed run: the next run drops it
START_HINT = "start it (`sudo systemctl start postgresql`, or `pg_ctlcluster <version> main start`)"

_PG_URL: str | None = None  # this process's database, while the session has one
_PG_REASON: str | None = None  # why PostgreSQL tests cannot run in this process


class PgUnavailable(Exception):
    """What is missing for the PostgreSQL tests, and how to fix it (the message)."""


def pg_base_url() -> str:
    """URL of this session's PostgreSQL test database (the ``pg_database`` fixture must have made it)."""
    if _PG_URL is None:
        raise RuntimeError("no PostgreSQL test database yet: request the pg_url (or pg_database) fixture first")
    return _PG_URL


def _where(url: sa.URL) -> str:
    return f"{url.host or 'localhost'}:{url.port or 5432}"


def _explain(exc: BaseException, url: sa.URL, *, explicit: bool) -> PgUnavailable:
    """The driver's failure to reach ``url``, as what is missing and how to fix it."""
    cause = getattr(exc, "orig", None) or exc  # the driver's error, without SQLAlchemy's "Background" link
    detail = " ".join(str(cause).split())  # one line: the driver's message spans several
    low, where, user = detail.lower(), _where(url), url.username or "(default user)"
    other = (f"fix {PG_URL_ENV} (now {url.render_as_string()}), or unset it so the tests make a throwaway "
             f"database on {_where(sa.make_url(PG_SERVER))}" if explicit
             else f"set {PG_URL_ENV} to a database on a reachable server")
    if isinstance(cause, ModuleNotFoundError):
        return PgUnavailable(f"the PostgreSQL driver is not installed ({detail}): run `make setup`")
    if "connection refused" in low or "no such file or directory" in low:
        return PgUnavailable(f"PostgreSQL not reachable at {where} (connection refused): {START_HINT}, or {other}")
    if "timeout" in low or "timed out" in low:
        return PgUnavailable(f"PostgreSQL not reachable at {where} (no answer within 3 s): check the host and "
                             f"port, or {other}")
    if "could not translate host name" in low or "name or service not known" in low:
        return PgUnavailable(f"PostgreSQL host {url.host!r} unknown: {other}")
    if "authentication failed" in low or "no password supplied" in low or "pg_hba.conf" in low:
        return PgUnavailable(f"PostgreSQL at {where} refused user {user} ({detail}): allow it in pg_hba.conf, "
                             f"set PGPASSWORD, or {other}")
    if explicit and f'database "{url.database}" does not exist' in low:
        return PgUnavailable(
            f"database {url.database} does not exist at {where} ({PG_URL_ENV}): create it (`createdb -h "
            f"{url.host or 'localhost'} -p {url.port or 5432} -U {user} {url.database}`), or unset {PG_URL_ENV} "
            "so the tests make a throwaway database of their own")
    return PgUnavailable(f"PostgreSQL at {where} unusable ({type(cause).__name__}: {detail}): {other}")


def _engine(url: sa.URL) -> sa.Engine:
    return sa.create_engine(url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool,
                            connect_args={"connect_timeout": 3})


def _check(url_text: str) -> None:
    """Raise PgUnavailable unless TASKKERNEL_TEST_PG_URL answers."""
    url = sa.make_url(url_text)
    try:
        with _engine(url).connect() as conn:
            conn.exec_driver_sql("SELECT 1")
    except Exception as exc:  # noqa: BLE001 - any failure means "not usable", explained
        raise _explain(exc, url, explicit=True) from exc


def _maintenance(server: sa.URL) -> sa.Engine:
    """An autocommit engine on the server's maintenance database (PgUnavailable when there is none to reach)."""
    for name in MAINTENANCE_DBS:
        url = server.set(database=name)
        engine = _engine(url)
        try:
            with engine.connect() as conn:
                conn.exec_driver_sql("SELECT 1")
            return engine
        except Exception as exc:  # noqa: BLE001 - explained below
            engine.dispose()
            if f'database "{name}" does not exist' in str(exc) and name != MAINTENANCE_DBS[-1]:
                continue
            raise _explain(exc, url, explicit=False) from exc
    raise AssertionError("unreachable")


def _drop_stale(conn: sa.Connection, now: int) -> None:
    """Drop the throwaway databases of runs that could not drop their own (killed) a day or more ago, when
    nothing is connected to them."""
    names = conn.execute(sa.text("SELECT datname FROM pg_database WHERE datname LIKE :prefix"),
                         {"prefix": THROWAWAY_PREFIX.replace("_", r"\_") + "%"}).scalars().all()
    for name in names:
        made = STAMPED.fullmatch(name)
        if made and now - int(made[1]) > STALE_AFTER_S:
            with contextlib.suppress(sa.exc.DBAPIError):  # in use, or not ours to drop: left alone
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}"')  # refused while anyone is connected


def create_throwaway_database(server_url: str = PG_SERVER) -> str:
    """Create an empty database with a fresh name on the server; its URL (PgUnavailable says why it could not)."""
    server = sa.make_url(server_url)
    now = int(time.time())
    name = f"{THROWAWAY_PREFIX}{os.getpid()}_{now}_{secrets.token_hex(3)}"
    engine = _maintenance(server)
    try:
        with engine.connect() as conn:
            _drop_stale(conn, now)
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    except Exception as exc:  # noqa: BLE001 - explained
        cause = getattr(exc, "orig", None) or exc
        user = server.username or "(default user)"
        raise PgUnavailable(
            f"PostgreSQL at {_where(server)} did not let user {user} create a test database ({type(cause).__name__}: "
            f"{' '.join(str(cause).split())}): grant it (`ALTER ROLE {user} CREATEDB` as a superuser), or set "
            f"{PG_URL_ENV} to an existing database") from exc
    finally:
        engine.dispose()
    return server.set(database=name).render_as_string(hide_password=False)


def drop_throwaway_database(url_text: str) -> None:
    """Drop a database create_throwaway_database made, ending any session still connected to it."""
    url = sa.make_url(url_text)
    engine = _maintenance(url)
    try:
        with engine.connect() as conn:
            if conn.dialect.server_version_info >= (13,):
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{url.database}" WITH (FORCE)')
            else:
                conn.execute(sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                     "WHERE datname = :name AND pid <> pg_backend_pid()"), {"name": url.database})
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{url.database}"')
    finally:
        engine.dispose()


def _interrupt_on_sigterm() -> signal.Handlers | None:
    """A run stopped by SIGTERM (`timeout`, a cancelled CI job: to every process of the run) ends as Ctrl-C ends
    it, tearing down, so its throwaway database is dropped too; the handler it replaces, or None if it left it."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        return None

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"stopped by signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)
    return signal.SIG_DFL


def _unavailable(reason: str) -> None:
    """Skip (or fail under TASKKERNEL_REQUIRE_PG=1) a test that needs PostgreSQL: the one place every such skip
    is reported at."""
    if os.environ.get("TASKKERNEL_REQUIRE_PG") == "1":
        pytest.fail(f"TASKKERNEL_REQUIRE_PG=1 but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """URL of this process's PostgreSQL test database: TASKKERNEL_TEST_PG_URL as given, else a throwaway one,
    dropped when the session ends. Its failure (a skip or, under TASKKERNEL_REQUIRE_PG=1, an error) is cached by
    pytest: the server is asked once per process."""
    global _PG_URL, _PG_REASON
    explicit = os.environ.get(PG_URL_ENV)
    url: str | None = None
    try:
        if explicit:
            _check(explicit)
        url = explicit or create_throwaway_database()
    except PgUnavailable as exc:
        _PG_REASON = str(exc)
    if url is None:  # outside the except block: the report is the reason, not the driver's traceback
        _unavailable(str(_PG_REASON))
        return
    _PG_URL = url
    restore = None if explicit else _interrupt_on_sigterm()
    try:
        yield url
    finally:
        _PG_URL = None
        if restore is not None:
            signal.signal(signal.SIGTERM, restore)
        if not explicit:
            try:
                drop_throwaway_database(url)
            except Exception as exc:  # noqa: BLE001 - the run's outcome stands; say what is left behind
                made = sa.make_url(url)
                warnings.warn(f"could not drop the test database {made.database} ({exc}); drop it with `dropdb -h "
                              f"{made.host} -p {made.port or 5432} -U {made.username} {made.database}`", stacklevel=1)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A PostgreSQL skip is reported at _unavailable, not at each test, so the summary folds them all into one
    line; the reason travels with the report (to the controller, under pytest-xdist)."""
    report = yield
    skipped = call.excinfo.value if call.excinfo is not None else None
    if report.skipped and isinstance(skipped, pytest.skip.Exception) and _PG_REASON and skipped.msg == _PG_REASON:
        report.longrepr = (__file__, _unavailable.__code__.co_firstlineno, f"Skipped: {_PG_REASON}")
        report.pg_unreachable = _PG_REASON  # type: ignore[attr-defined]
    return report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Why PostgreSQL tests were skipped, once per run (before the short summary)."""
    reasons: dict[str, int] = {}
    for report in terminalreporter.stats.get("skipped", []):
        if reason := getattr(report, "pg_unreachable", None):
            reasons[reason] = reasons.get(reason, 0) + 1
    if reasons:
        terminalreporter.section("PostgreSQL", sep="-")
        for reason, count in reasons.items():
            terminalreporter.write_line(f"{count} test(s) skipped: {reason}")
        terminalreporter.write_line("TASKKERNEL_REQUIRE_PG=1 makes them fail instead of skipping.")


@pytest.fixture(scope="session", autouse=True)
def _private_state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The user's own state folder is not the tests': the CLIs they start log there when they have no
    workspace."""
    state = tmp_path_factory.mktemp("xdg-state")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_STATE_HOME", str(state))
        yield state


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
def pg_url(pg_database: str) -> Iterator[str]:
    """URL of a fresh, empty PostgreSQL schema, dropped after the test."""
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
