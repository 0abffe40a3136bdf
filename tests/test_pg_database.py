"""`make test` on a fresh machine: with the local PostgreSQL server up and no test database, the PostgreSQL tests
run in a throwaway database of their own, dropped afterwards (failed or not); without a usable server they skip
saying what is missing and how to fix it; and the tests keep out of the user's own state folder."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.cli_support import taskkernel
from tests.conftest import (
    PG_SERVER,
    PG_URL_ENV,
    THROWAWAY_PREFIX,
    PgUnavailable,
    create_throwaway_database,
    drop_throwaway_database,
)

ROOT = Path(__file__).resolve().parent.parent
RECORD = "TASKKERNEL_TEST_PG_RECORD"  # set by the tests below for the runs they start: where the inner test writes
FAIL = "TASKKERNEL_TEST_PG_FAIL"


@pytest.mark.parametrize("n", [1, 2])
def test_a_postgresql_test_runs_in_this_sessions_database(pg_url: str, n: int) -> None:
    """A PostgreSQL test like any other; started by the tests below, it also says where it ran (and may fail)."""
    engine = sa.create_engine(pg_url)
    try:
        with engine.connect() as conn:
            name = conn.exec_driver_sql("SELECT current_database()").scalar_one()
            assert conn.exec_driver_sql("SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()"
                                        ).scalar_one() == 0, "a fresh, empty schema"
    finally:
        engine.dispose()
    if PG_URL_ENV not in os.environ:
        assert name.startswith(f"{THROWAWAY_PREFIX}{os.getpid()}_"), "one throwaway database per test process"
    if record := os.environ.get(RECORD):
        with open(record, "a", encoding="utf-8") as fh:
            fh.write(f"{name}\n")
    assert os.environ.get(FAIL) != "1", "asked to fail"


def run_pytest(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """A pytest run of this file's PostgreSQL test as `make test` would start it on a fresh machine: no
    TASKKERNEL_TEST_PG_URL, and nothing of this run's pytest-xdist worker."""
    clean = {k: v for k, v in os.environ.items()
             if k not in (PG_URL_ENV, RECORD, FAIL, "PYTEST_CURRENT_TEST") and not k.startswith("PYTEST_XDIST_")}
    test = f"{Path(__file__).relative_to(ROOT)}::test_a_postgresql_test_runs_in_this_sessions_database"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
                           f"--basetemp={tmp_path / 'basetemp'}", test, *args],
                          cwd=ROOT, capture_output=True, text=True, env={**clean, **env}, timeout=300)


def databases() -> set[str]:
    engine = sa.create_engine(f"{PG_SERVER}/postgres", poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            return set(conn.exec_driver_sql("SELECT datname FROM pg_database").scalars())
    finally:
        engine.dispose()


@pytest.fixture
def local_server() -> None:
    """The local server, which a fresh machine's `make test` uses; these tests skip (or fail) without it."""
    try:
        drop_throwaway_database(create_throwaway_database())
    except PgUnavailable as exc:
        if os.environ.get("TASKKERNEL_REQUIRE_PG") == "1" and PG_URL_ENV not in os.environ:
            pytest.fail(f"TASKKERNEL_REQUIRE_PG=1 but {exc}", pytrace=False)
        pytest.skip(str(exc))


@pytest.mark.parametrize(("workers", "fail"), [(["-n", "2"], False), ([], True)],
                         ids=["xdist-passing", "one-process-failing"])  # as `make test` runs them; dropped anyway
def test_with_the_server_up_and_no_test_database_the_postgresql_tests_run(
        local_server: None, tmp_path: Path, workers: list[str], fail: bool) -> None:
    record = tmp_path / "databases.txt"
    r = run_pytest(tmp_path, *workers, TASKKERNEL_REQUIRE_PG="0", **{RECORD: str(record), FAIL: "1" if fail else "0"})
    summary = r.stdout.strip().splitlines()[-1]
    assert r.returncode == (1 if fail else 0), r.stdout + r.stderr
    assert summary.startswith("2 failed" if fail else "2 passed") and "skipped" not in summary, r.stdout
    made = set(record.read_text().split())
    assert made and all(name.startswith(THROWAWAY_PREFIX) for name in made), made
    if not workers:
        assert len(made) == 1, "one database per process, shared by its tests"
    assert not made & databases(), f"left behind: {made & databases()}"


def test_a_run_drops_what_killed_runs_left_a_day_ago_and_nothing_newer(local_server: None) -> None:
    now = int(time.time())
    stale, recent = f"{THROWAWAY_PREFIX}1_{now - 2 * 86400}_0a0a0a", f"{THROWAWAY_PREFIX}1_{now - 3600}_0b0b0b"
    engine = sa.create_engine(f"{PG_SERVER}/postgres", isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            for name in (stale, recent):
                conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        made = create_throwaway_database()
        drop_throwaway_database(made)
        assert stale not in databases() and recent in databases() and sa.make_url(made).database not in databases()
    finally:
        with engine.connect() as conn:
            for name in (stale, recent):
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}"')
        engine.dispose()


def test_an_unreachable_server_is_a_skip_that_says_what_is_missing_and_how_to_fix_it(tmp_path: Path) -> None:
    nowhere = "postgresql+psycopg://postgres@127.0.0.1:1/taskkernel_test"  # nothing listens on port 1
    r = run_pytest(tmp_path, **{PG_URL_ENV: nowhere, "TASKKERNEL_REQUIRE_PG": "0"})
    assert r.returncode == 0 and r.stdout.strip().splitlines()[-1].startswith("2 skipped"), r.stdout + r.stderr
    reason = ("PostgreSQL not reachable at 127.0.0.1:1 (connection refused): start it (`sudo systemctl start "
              "postgresql`, or `pg_ctlcluster <version> main start`), or fix TASKKERNEL_TEST_PG_URL")
    [line] = [line for line in r.stdout.splitlines() if line.startswith("SKIPPED")]
    assert line.startswith("SKIPPED [2] tests/conftest.py:") and reason in line, r.stdout
    assert "or unset it so the tests make a throwaway database on 127.0.0.1:5432" in line
    required = run_pytest(tmp_path, **{PG_URL_ENV: nowhere, "TASKKERNEL_REQUIRE_PG": "1"})
    assert required.returncode == 1 and "2 errors" in required.stdout.splitlines()[-1], required.stdout
    assert f"TASKKERNEL_REQUIRE_PG=1 but {reason}" in required.stdout


def test_the_tests_keep_out_of_the_users_state_folder(tmp_path: Path,
                                                      tmp_path_factory: pytest.TempPathFactory) -> None:
    state = Path(os.environ["XDG_STATE_HOME"])
    assert state.is_relative_to(tmp_path_factory.getbasetemp()), "where the CLI logs when it has no workspace"
    nowhere = "postgresql+psycopg://postgres@127.0.0.1:1/taskkernel"
    r = taskkernel("--db", nowhere, "task", "list", cwd=tmp_path)  # no workspace: a fault logged in the state folder
    assert r.returncode == 1 and "database_unreachable" in r.stdout, r.stdout + r.stderr
    assert "Traceback" in (state / "taskkernel" / "cli.log").read_text()
