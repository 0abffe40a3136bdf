"""The board's front page costs the same at any size of the tasks table (issue 29, goal 5): the page runs a fixed
number of statements, none reads the tasks table through, and each column's count comes from the
``(state, task_id)`` index alone, never from a task's document. Plans and statement counts, not timings
(bench/serve.py measures the times: GET / at 1,000 and 10,000 tasks in one run)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa

from taskkernel.coordinator.web.reads import Filters, board
from taskkernel.kernel.queries import BLOCKED, page_tasks
from taskkernel.kernel.store.db import Database
from taskkernel.kernel.store.schema import BLOCKED_INDEX
from tests.kernel_harness import DEV, Harness

STATE_INDEX = "ix_tasks_state_task_id"


def fill(h: Harness, copies: int) -> str:
    """``copies`` times: a task in each column, one of them blocked and one a high-risk review; the first root."""
    first = ""
    for i in range(copies):
        tasks = {state: str(h.create(recipient="DEV", subject=f"{state} {i}",
                                     risk_level="high" if state == "review" else "low").task_id)
                 for state in ("inbox", "active", "blocked", "review", "done", "archive")}
        for state, task_id in tasks.items():
            if state != "inbox":
                h.drive_to(task_id, "active" if state == "blocked" else state, driver=DEV)
        assert h.report(tasks["blocked"], DEV, status="blocked").status == "accepted"
        first = first or tasks["inbox"]
    return first


@contextmanager
def statements(db: Database) -> Iterator[list[tuple[str, Any]]]:
    """Every statement the database runs meanwhile, with its parameters."""
    seen: list[tuple[str, Any]] = []

    def note(conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool) -> None:
        seen.append((statement, params))

    sa.event.listen(db.engine, "before_cursor_execute", note)
    try:
        yield seen
    finally:
        sa.event.remove(db.engine, "before_cursor_execute", note)


def task_reads(db: Database, filters: Filters) -> list[tuple[str, list[str]]]:
    """Each statement of the board that reads the tasks table, with SQLite's plan (one line per step)."""
    with statements(db) as seen:
        board(db, None, filters)
    with db.read() as conn:
        return [(sql, [row[3] for row in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}", params)])
                for sql, params in seen if re.search(r"\bFROM tasks\b", sql)]


def shape(sql: str) -> str:
    """A statement with its IN list's length left out."""
    return re.sub(r"IN \((\?, )*\?\)", "IN (...)", sql)


def test_the_front_page_reads_the_tasks_table_through_indexes_only(sqlite_db: Database) -> None:
    h = Harness(sqlite_db)
    root = fill(h, 2)
    for filters in (Filters(), Filters(role="DEV"), Filters(risk="high"), Filters(root=root)):
        for sql, plan in task_reads(sqlite_db, filters):
            # a scan of the blocked tasks' partial index reads only them; any other scan reads the whole table
            assert not any(re.match(rf"SCAN tasks\b(?! USING INDEX {BLOCKED_INDEX}$)", step) for step in plan), (
                filters, sql, plan)
    (counts, plan), = [(sql, plan) for sql, plan in task_reads(sqlite_db, Filters()) if "count(" in sql]
    searches = [step for step in plan if "tasks" in step]
    assert searches == [f"SEARCH tasks USING COVERING INDEX {STATE_INDEX} (state=?)"] * 5, counts
    assert "json_extract" not in counts


def test_the_front_page_runs_as_many_statements_at_any_size(sqlite_db: Database) -> None:
    """Ten times the tasks, the same reads of the tasks table: one for the counts, a page per column (two for the
    active one: its blocked tasks, then the others), who decides the reviews shown."""
    h = Harness(sqlite_db)
    fill(h, 1)
    small = [shape(sql) for sql, _ in task_reads(sqlite_db, Filters())]
    fill(h, 9)
    assert [shape(sql) for sql, _ in task_reads(sqlite_db, Filters())] == small and len(small) == 8
    shown = board(sqlite_db, None, Filters())
    assert {state: column["count"] for state, column in shown.items()} == {
        "inbox": 10, "active": 20, "review": 10, "done": 10, "archive": 10}
    assert [bool(t["blocked"]) for t in shown["active"]["tasks"]] == [True] * 10 + [False] * 10


def test_the_blocked_tasks_are_found_without_reading_every_active_task(sqlite_db: Database) -> None:
    h = Harness(sqlite_db)
    fill(h, 2)
    blocked = [plan for sql, plan in task_reads(sqlite_db, Filters()) if "IS NOT NULL" in sql]
    assert blocked and all(STATE_INDEX not in step for plan in blocked for step in plan), blocked


def test_a_store_before_the_blocked_index_still_lists_its_blocked_tasks(sqlite_db: Database) -> None:
    """A reader that does not check the schema (`task list`, `inbox`) on a store not yet upgraded to 0009 lists the
    blocked tasks without the index instead of failing with `no such index`."""
    h = Harness(sqlite_db)
    fill(h, 1)
    listed = page_tasks(sqlite_db, state=BLOCKED).rows
    assert listed and all(t["blocked"] for t in listed)
    with sqlite_db.write() as uow:
        uow.conn.exec_driver_sql(f"DROP INDEX {BLOCKED_INDEX}")
    older = Database(sqlite_db.engine.url.render_as_string(hide_password=False))
    assert page_tasks(older, state=BLOCKED).rows == listed
    assert not any("INDEXED BY" in sql for sql, _ in task_reads(older, Filters()))
