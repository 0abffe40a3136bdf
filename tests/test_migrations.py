"""Schema migrations (docs/migrations.md): every table under version control, a database from release 0.1.0
upgrades to head without losing an event and still verifies, and nothing patches a database behind the code.

The release fixture (tests/fixtures/release-0.1.0/) is a workspace that release made; every test works on a copy.
The CLI runs in its own processes, as a user runs it (tests/cli_support.py).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from taskkernel.coordinator import schema
from taskkernel.kernel.background import BackgroundJobs
from taskkernel.kernel.reasons import KernelError
from taskkernel.kernel.store import version
from taskkernel.kernel.store.db import Database
from taskkernel.kernel.store.schema import metadata as core_metadata
from tests.cli_support import CLI, Run, cli_env, run, taskkernel
from tests.conftest import fresh_pg_schema
from tests.schema_shape import describe

RELEASE = Path(__file__).resolve().parent / "fixtures" / "release-0.1.0"
BASELINE, HEAD = version.BASELINE, version.HEAD
CREATE = ('{"type":"create_task","idempotency_key":"%s","payload":{"sender":"ADMIN","recipient":"PM",'
          '"subject":"%s"}}')


def release_workspace(tmp_path: Path) -> Path:
    """A copy of the release 0.1.0 workspace, its private files as private as `init` made them."""
    root = tmp_path / "release"
    shutil.copytree(RELEASE, root)
    (root / ".taskkernel").chmod(0o700)
    for f in (root / ".taskkernel").iterdir():
        f.chmod(0o600)
    return root


def sqlite_url(root: Path) -> str:
    return f"sqlite:///{root / '.taskkernel' / 'kernel.db'}"


def events(url: str) -> list[tuple[Any, ...]]:
    """Every event's position, stream, version, type and hash, read without taskkernel."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.exec_driver_sql(
                "SELECT global_pos, stream_id, stream_version, event_type, hash FROM events ORDER BY global_pos")]
    finally:
        engine.dispose()


def shape(url: str) -> dict[str, Any]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return describe(conn)
    finally:
        engine.dispose()


def without_version_table(found: dict[str, Any]) -> dict[str, Any]:
    return {key: [row for row in rows if version.VERSION_TABLE not in row[:3]] for key, rows in found.items()}


def snapshot(dialect: str) -> dict[str, Any]:
    return json.loads((RELEASE / f"schema.{dialect}.json").read_text())


def stamp_of(url: str) -> list[str]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            if not sa.inspect(conn).has_table(version.VERSION_TABLE):
                return []
            return list(conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalars())
    finally:
        engine.dispose()


@pytest.fixture
def other_url(any_url: str, tmp_path: Path) -> Iterator[str]:
    """A second empty database on the same backend as ``any_url``."""
    if any_url.startswith("sqlite"):
        yield f"sqlite:///{tmp_path / 'other.db'}"
        return
    yield from fresh_pg_schema()


# -- the revisions ------------------------------------------------------------------------------------------------
def test_the_core_lists_alembics_revisions_in_order() -> None:
    scripts = ScriptDirectory.from_config(schema.alembic_config())
    history = [s.revision for s in reversed(list(scripts.walk_revisions()))]
    assert tuple(history) == version.REVISIONS
    assert scripts.get_current_head() == HEAD == schema.HEAD
    for s in scripts.walk_revisions():
        assert Path(s.path).name == f"{s.revision}.py"


def test_the_baseline_builds_exactly_what_release_0_1_made(any_url: str) -> None:
    db = Database(any_url)
    assert schema.status(db) == (None, HEAD)
    schema.upgrade(db, BASELINE)
    db.dispose()
    assert without_version_table(shape(any_url)) == snapshot(sa.make_url(any_url).get_backend_name())
    assert stamp_of(any_url) == [BASELINE]


def test_the_migrations_build_exactly_what_the_table_modules_create(any_url: str, other_url: str) -> None:
    """Head by the migrations (from nothing) and head by create_all + stamp (how `init` makes a database) are
    one schema: every column, type, default, constraint, index, and the version table itself."""
    migrated, created = Database(any_url), Database(other_url)
    assert schema.ensure(created) == (HEAD, HEAD)  # first: the migrations' run names PostgreSQL's index options
    before, after = schema.upgrade(migrated)
    assert (before.current, after.current, after.behind) == (None, HEAD, False)
    with migrated.read() as conn:
        assert compare_metadata(MigrationContext.configure(conn), schema.target_metadata(conn.dialect.name)) == []
    migrated.dispose()
    created.dispose()
    assert shape(any_url) == shape(other_url)
    assert stamp_of(any_url) == stamp_of(other_url) == [HEAD]


def test_a_state_pages_in_task_id_order_from_one_index(sqlite_url: str) -> None:
    """Revision 2: `WHERE state = ? AND task_id > ? ORDER BY task_id` reads one index range, in order."""
    db = Database(sqlite_url)
    schema.ensure(db)
    with db.read() as conn:
        plan = " ".join(str(r[-1]) for r in conn.exec_driver_sql(
            "EXPLAIN QUERY PLAN SELECT task_id, doc FROM tasks WHERE state = 'inbox' AND task_id > 'TASK-1' "
            "ORDER BY task_id LIMIT 50"))
    db.dispose()
    assert "ix_tasks_state_task_id" in plan and "TEMP B-TREE" not in plan, plan


def test_every_revision_goes_down_again_and_back_up(any_url: str) -> None:
    """downgrade() is kept correct (docs/migrations.md): down to nothing leaves an empty version table, which
    reads as an empty database, and opening it builds head again."""
    from alembic import command

    db = Database(any_url)
    schema.upgrade(db)
    at_head = shape(any_url)
    with db.write() as uow:
        command.downgrade(schema.alembic_config(uow.conn), "base")
    assert db.schema_version().tables == {version.VERSION_TABLE} and schema.status(db) == (None, HEAD)
    assert schema.ensure(db) == (HEAD, HEAD)
    db.dispose()
    assert shape(any_url) == at_head


# -- opening a database -------------------------------------------------------------------------------------------
def test_a_database_created_on_open_is_stamped_at_head_and_filled_in_at_head(sqlite_url: str) -> None:
    """Code that builds a Database directly (tests, tools) still creates tables on open; the first creation
    stamps the database at head, so it is never mistaken for an older one later."""
    db = Database(sqlite_url)
    db.create_schema(core_metadata)
    assert schema.status(db) == (HEAD, HEAD)
    future = sa.MetaData()
    sa.Table("added_later", future, sa.Column("id", sa.Integer, primary_key=True))
    db.create_schema(future)  # at head: a missing table is created
    assert "added_later" in db.schema_version().tables
    db.dispose()


def test_nothing_patches_a_database_behind_or_ahead_of_the_code(tmp_path: Path) -> None:
    root = release_workspace(tmp_path)
    url = sqlite_url(root)
    before = shape(url)
    db = Database(url)
    with pytest.raises(KernelError, match="schema_behind: .*taskkernel db upgrade"):
        BackgroundJobs(db)  # release 0.1.0 never made this table in that workspace: it is not made now either
    with pytest.raises(KernelError, match="schema_behind"):
        schema.require_current(db)
    assert shape(url) == before  # not stamped, nothing created

    schema.ensure(db)  # adopted: stamped at the baseline, the table it lacked made as that release made it
    assert schema.status(db) == (BASELINE, HEAD) and schema.status(db).behind
    future = sa.MetaData()
    sa.Table("added_later", future, sa.Column("id", sa.Integer, primary_key=True))
    with pytest.raises(KernelError, match="schema_behind"):
        db.create_schema(future)
    assert "added_later" not in db.schema_version().tables

    with db.write() as uow:
        version.stamp(uow.conn, "9999_from_the_future")
    found = schema.status(db)
    assert found.ahead and not found.behind
    for attempt in (lambda: db.create_schema(future), lambda: schema.require_current(db), lambda: schema.upgrade(db)):
        with pytest.raises(KernelError, match="schema_ahead"):
            attempt()
    assert stamp_of(url) == ["9999_from_the_future"]
    db.dispose()


# -- the release 0.1.0 workspace, through the CLI ----------------------------------------------------------------
def test_a_release_0_1_workspace_upgrades_to_head_without_losing_an_event(tmp_path: Path) -> None:
    root = release_workspace(tmp_path)
    url = sqlite_url(root)
    logged = events(url)
    assert len(logged) == 17

    current = run("db", "current", cwd=root)
    assert current.code == 0, current.err
    assert current.json == {"status": "ok", "current": BASELINE, "head": HEAD, "behind": True, "ahead": False}
    assert stamp_of(url) == [BASELINE]  # recognised as the baseline and stamped, not recreated
    assert events(url) == logged

    for refused in (run("submit", cwd=root, stdin=CREATE % ("k1", "too early")), run("up", "--once", cwd=root)):
        assert refused.code == 2, refused.out + refused.err
        assert refused.json["reason"] == "schema_behind"
        assert "taskkernel db upgrade" in refused.json["message"]
    assert events(url) == logged
    assert run("verify", cwd=root).code == 0  # reading and proving still work on the older schema

    upgraded = run("db", "upgrade", cwd=root)
    assert upgraded.code == 0, upgraded.err
    assert upgraded.json == {"status": "ok", "from": BASELINE, "to": HEAD, "head": HEAD, "upgraded": True}
    assert events(url) == logged  # every event, its position and its hash
    verified = run("verify", cwd=root)
    assert (verified.code, verified.json["events"], verified.json["head"]["position"]) == (0, 17, 17), verified.out

    again = run("db", "upgrade", cwd=root)
    assert (again.code, again.json["upgraded"], again.json["to"]) == (0, False, HEAD)
    assert run("db", "current", cwd=root).json["behind"] is False

    created = run("submit", cwd=root, stdin=CREATE % ("k2", "after the upgrade"))
    assert (created.code, created.json["status"]) == (0, "accepted"), created.out + created.err
    assert run("up", "--once", cwd=root).code == 0
    assert events(url)[:17] == logged
    assert run("verify", cwd=root).code == 0


def test_the_upgraded_release_database_is_the_schema_a_new_one_gets(tmp_path: Path) -> None:
    root = release_workspace(tmp_path)
    assert run("db", "upgrade", cwd=root).code == 0
    fresh = tmp_path / "fresh"
    assert run("init", str(fresh), cwd=tmp_path).code == 0
    assert shape(sqlite_url(root)) == shape(sqlite_url(fresh))


def test_only_the_owner_upgrades_and_anyone_may_ask(tmp_path: Path) -> None:
    root = release_workspace(tmp_path)
    dev = taskkernel("token", "issue", "DEV", cwd=root)
    assert dev.returncode == 0, dev.stderr
    token = {"TASKKERNEL_TOKEN": dev.stdout.strip()}
    refused = taskkernel("db", "upgrade", cwd=root, env=token)
    assert refused.returncode == 2
    assert json.loads(refused.stdout)["reason"] == "role_not_authorized"
    asked = taskkernel("db", "current", cwd=root, env=token)
    assert asked.returncode == 0 and json.loads(asked.stdout)["behind"] is True
    assert stamp_of(sqlite_url(root)) == [BASELINE]


def test_a_new_workspace_is_at_head(tmp_path: Path) -> None:
    root = tmp_path / "new"
    assert run("init", str(root), cwd=tmp_path).code == 0
    current = run("db", "current", cwd=root)
    assert current.json == {"status": "ok", "current": HEAD, "head": HEAD, "behind": False, "ahead": False}
    assert run("db", "upgrade", cwd=root).json["upgraded"] is False


def test_a_database_a_newer_release_upgraded_is_refused_not_touched(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    assert run("init", str(root), cwd=tmp_path).code == 0
    url = sqlite_url(root)
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE alembic_version SET version_num = '0999_newer'")
    engine.dispose()
    current = run("db", "current", cwd=root)
    assert (current.code, current.json["ahead"], current.json["behind"]) == (0, True, False)
    for refused in (run("db", "upgrade", cwd=root), run("submit", cwd=root, stdin=CREATE % ("k", "x"))):
        assert (refused.code, refused.json["reason"]) == (2, "schema_ahead"), refused.out + refused.err
    assert stamp_of(url) == ["0999_newer"]


def test_processes_opening_and_upgrading_one_release_database_together_do_it_once(tmp_path: Path) -> None:
    root = release_workspace(tmp_path)
    logged = events(sqlite_url(root))
    jobs = [["db", "upgrade"]] * 3 + [["db", "current"]] * 3
    procs = [subprocess.Popen([*CLI, *args], cwd=root, env=cli_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for args in jobs]
    done = [Run(p.wait(180), p.stdout.read() if p.stdout else "", p.stderr.read() if p.stderr else "")
            for p in procs]
    for args, r in zip(jobs, done, strict=True):
        assert r.code == 0, (args, r.out, r.err)
    assert sum(r.json["upgraded"] for r in done[:3]) == 1
    assert stamp_of(sqlite_url(root)) == [HEAD]
    assert events(sqlite_url(root)) == logged
    assert run("verify", cwd=root).code == 0


# -- PostgreSQL ---------------------------------------------------------------------------------------------------
def test_a_release_0_1_postgresql_database_upgrades_without_losing_an_event(tmp_path: Path, pg_url: str) -> None:
    """A PostgreSQL workspace as release 0.1.0 left it (the schema its snapshot shows, no version table):
    made here by taking a workspace of this code back to the baseline and removing the stamp."""
    root = tmp_path / "ws"
    made = taskkernel("init", str(root), cwd=tmp_path, env={"TASKKERNEL_DB": pg_url})
    assert made.returncode == 0, made.stderr
    for i in range(3):
        assert run("submit", cwd=root, stdin=CREATE % (f"k{i}", f"task {i}")).code == 0
    assert run("up", "--once", cwd=root).code == 0
    db = Database(pg_url)
    with db.write() as uow:
        from alembic import command

        command.downgrade(schema.alembic_config(uow.conn), BASELINE)
        version.version_table.drop(uow.conn)
    db.dispose()
    assert shape(pg_url) == snapshot("postgresql")
    logged = events(pg_url)
    assert len(logged) >= 3

    assert run("db", "current", cwd=root).json["behind"] is True
    refused = run("submit", cwd=root, stdin=CREATE % ("k9", "too early"))
    assert (refused.code, refused.json["reason"]) == (2, "schema_behind")
    upgraded = run("db", "upgrade", cwd=root)
    assert upgraded.json == {"status": "ok", "from": BASELINE, "to": HEAD, "head": HEAD, "upgraded": True}
    assert events(pg_url) == logged
    assert run("verify", cwd=root).code == 0
    assert run("db", "upgrade", cwd=root).json["upgraded"] is False
    db = Database(pg_url)
    with db.read() as conn:
        assert compare_metadata(MigrationContext.configure(conn), schema.target_metadata(conn.dialect.name)) == []
    db.dispose()


def test_a_task_blocked_before_the_upgrade_is_listed_blocked_after_it(tmp_path: Path) -> None:
    """0004: a document stored before the fold derived `blocked` gets it from its events, so `task list --state
    blocked` lists the task and verify finds no drift; other documents are left as they were."""
    ws = tmp_path / "ws"
    assert taskkernel("init", str(ws), cwd=tmp_path).returncode == 0
    made = [json.loads(run("task", "create", "--to", "DEV", "--subject", s, cwd=ws).out)["task_id"]
            for s in ("stuck", "fine")]
    for task_id, status in zip(made, ("blocked", "in_progress"), strict=True):
        assert run("task", "claim", task_id, cwd=ws).code == 0
        assert run("task", "report", task_id, "--status", status, "--body", f"{status}\nmore", cwd=ws).code == 0
    url = sqlite_url(ws)
    with sa.create_engine(url).begin() as conn:  # as release 0003 stored them: no `blocked` key
        for task_id, text in conn.exec_driver_sql("SELECT task_id, doc FROM tasks").all():
            doc = json.loads(text)
            doc.pop("blocked")
            conn.exec_driver_sql("UPDATE tasks SET doc = ? WHERE task_id = ?", (json.dumps(doc), task_id))
        conn.exec_driver_sql(f"UPDATE {version.VERSION_TABLE} SET version_num = '0003_run_outcomes'")
        conn.exec_driver_sql("DROP TABLE worktrees")  # 0005's table: release 0003 had none
        conn.exec_driver_sql("DROP TABLE task_aliases")  # 0007's
        for table in ("run_events", "input_deliveries", "run_interrupts", "agent_sessions"):  # 0008's
            conn.exec_driver_sql(f"DROP TABLE {table}")
        conn.exec_driver_sql("DROP INDEX ix_tasks_blocked")  # 0009's
        conn.exec_driver_sql("DROP TABLE sign_ins")  # 0010's
        conn.exec_driver_sql("DROP TABLE hosts")  # 0011's
        for column in ("failed_at", "retried_by", "retried_at"):  # 0006's columns
            conn.exec_driver_sql(f"ALTER TABLE outbox DROP COLUMN {column}")
    assert run("db", "upgrade", cwd=ws).code == 0
    assert stamp_of(url) == [HEAD]
    blocked = json.loads(run("task", "list", "--state", "blocked", cwd=ws).out)
    assert [(t["task_id"], t["blocked"]["reason"]) for t in blocked] == [(made[0], "blocked")]
    assert run("verify", cwd=ws).code == 0
    with sa.create_engine(url).connect() as conn:
        other = json.loads(conn.exec_driver_sql("SELECT doc FROM tasks WHERE task_id = ?", (made[1],)).scalar())
    assert "blocked" not in other
