"""Reads that scale (issue 11, item 7): paged and streamed task listings (kernel/queries.py), and a verify that
streams (kernel/projections.py, kernel/verify.py). Memory is asserted structurally, never by measuring it: the
rebuild holds one stream, the comparison one batch, and every large read goes through a streaming cursor. Speed
lives in bench/reads.py."""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import event

from taskkernel.kernel import projections
from taskkernel.kernel.projections import (
    PROJECTION_AHEAD,
    PROJECTION_DRIFT,
    RebuiltTask,
    compare_tasks,
    fold_streams,
    iter_rebuilt_tasks,
    rebuild_tasks,
)
from taskkernel.kernel.queries import (
    MAX_LIMIT,
    TASK_LIST_FIELDS,
    TaskQueryError,
    encode_cursor,
    iter_tasks,
    page_tasks,
)
from taskkernel.kernel.store.db import Database
from taskkernel.kernel.verify import VerifyReport, verify
from tests.kernel_harness import DEV, PM, Harness

SHAPES = ("inbox", "active", "review", "done", "archive")


@pytest.fixture
def h(any_db: Database) -> Harness:
    return Harness(any_db)


def interleaved_tasks(h: Harness, n: int) -> list[str]:
    """``n`` tasks for PM and DEV in every state, their commands interleaved: all creates, then every task's first
    step, then every task's second step, …, so no task's events are contiguous in the log."""
    ids = [str(h.create(recipient=("PM", "DEV")[i % 2], subject=f"task {i}").task_id) for i in range(n)]
    steps = {"inbox": [], "active": ["claim"], "review": ["claim", "report", "submit"],
             "done": ["claim", "report", "submit", "approve"],
             "archive": ["claim", "report", "submit", "approve", "archive"]}
    plans = [steps[SHAPES[i % len(SHAPES)]] for i in range(n)]
    for step in range(max(len(p) for p in plans)):
        for i, tid in enumerate(ids):
            if step >= len(plans[i]):
                continue
            driver = PM if i % 2 == 0 else DEV
            kind = plans[i][step]
            if kind == "report":
                r = h.report(tid, driver)
            elif kind == "archive":
                r = h.cmd("archive", tid, payload={"reason": "finished"})
            elif kind == "approve":
                r = h.cmd("approve", tid)
            else:
                r = h.cmd(kind, tid, driver)
            assert r.status == "accepted", (tid, kind, r)
    return ids


def listed(h: Harness, tid: str) -> dict[str, Any]:
    doc = h.kernel.task(tid)
    assert doc is not None
    return {k: doc[k] for k in TASK_LIST_FIELDS}


def all_pages(db: Database, limit: int, after: str | None = None, **filters: Any) -> list[list[dict[str, Any]]]:
    pages = []
    while True:
        page = page_tasks(db, limit=limit, after=after, **filters)
        pages.append(page.rows)
        if page.next_cursor is None:
            return pages
        after = page.next_cursor


@contextlib.contextmanager
def statements(db: Database) -> Iterator[list[tuple[str, Any, dict[str, Any], Any]]]:
    """Every statement run on ``db`` meanwhile: (SQL, parameters, execution options, driver cursor)."""
    seen: list[tuple[str, Any, dict[str, Any], Any]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        seen.append((statement, parameters, dict(context.execution_options), cursor))

    event.listen(db.engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(db.engine, "before_cursor_execute", record)


# -- paging -----------------------------------------------------------------------------------------------------

def test_pages_hold_every_task_once_in_task_id_order(h: Harness) -> None:
    ids = interleaved_tasks(h, 23)
    expected = [listed(h, tid) for tid in sorted(ids)]
    for limit in (1, 5, 23, 50):
        pages = all_pages(h.db, limit)
        assert all(len(p) == limit for p in pages[:-1]) and 1 <= len(pages[-1]) <= limit, limit
        assert [row for page in pages for row in page] == expected, limit
    assert list(iter_tasks(h.db)) == expected
    assert list(iter_tasks(h.db, batch=2)) == expected
    # the fields `task list` has always shown, then whether the task is blocked (issue 13)
    assert list(expected[0]) == ["task_id", "state", "revision", "round", "sender", "recipient", "subject",
                                 "priority", "risk_level", "parent", "root", "thread_key", "blocked"]


def test_a_full_last_page_says_there_is_no_next_one(h: Harness) -> None:
    for i in range(4):
        h.create(subject=f"t{i}")
    first = page_tasks(h.db, limit=2)
    second = page_tasks(h.db, limit=2, after=first.next_cursor)
    assert len(second.rows) == 2 and second.next_cursor is None  # no empty third page
    assert page_tasks(h.db, limit=4).next_cursor is None


def test_empty_store_and_empty_filter(h: Harness) -> None:
    assert page_tasks(h.db) == ([], None)
    assert list(iter_tasks(h.db)) == []
    h.create()
    assert page_tasks(h.db, state="done") == ([], None)
    assert page_tasks(h.db, role="nobody") == ([], None)


def test_filters_by_state_and_role(h: Harness) -> None:
    ids = interleaved_tasks(h, 20)
    docs = {tid: listed(h, tid) for tid in ids}
    for state, role in itertools.product((None, *SHAPES), (None, "PM", "DEV")):
        expected = [docs[t] for t in sorted(ids) if (state is None or docs[t]["state"] == state)
                    and (role is None or docs[t]["recipient"] == role)]
        rows = [row for page in all_pages(h.db, 3, state=state, role=role) for row in page]
        assert rows == expected, (state, role)
        assert list(iter_tasks(h.db, state, role, batch=2)) == expected, (state, role)


def test_keyset_pages_do_not_shift_when_tasks_change_meanwhile(h: Harness) -> None:
    ids = [str(h.create(subject=f"t{i}").task_id) for i in range(6)]
    first = page_tasks(h.db, limit=3)
    h.cmd("claim", ids[0], PM)  # a task already listed changes
    new = str(h.create(subject="late").task_id)  # a later id: it comes last
    rest = all_pages(h.db, 3, after=first.next_cursor)
    assert [r["task_id"] for r in first.rows] + [r["task_id"] for p in rest for r in p] == [*ids, new]


def test_a_cursor_continues_only_the_listing_it_came_from(h: Harness) -> None:
    interleaved_tasks(h, 10)
    cursor = page_tasks(h.db, state="active", limit=1).next_cursor
    assert cursor is not None
    page_tasks(h.db, state="active", after=cursor)  # the same listing continues
    others: list[dict[str, Any]] = [{}, {"state": "done"}, {"state": "active", "role": "PM"}]
    for other in others:
        with pytest.raises(TaskQueryError, match="this cursor continues a listing of tasks with state active, not "
                                                 "of (all tasks|tasks with state done|tasks with state active and "
                                                 "role PM)"):
            page_tasks(h.db, after=cursor, **other)
        with pytest.raises(TaskQueryError):
            iter_tasks(h.db, after=cursor, **other)  # refused at the call, before any read
    forged = base64.urlsafe_b64encode(b'{"after":"TASK-20250101-001","role":null,"state":null,"v":2}').decode()
    genuine = encode_cursor("TASK-20250101-001")
    assert json.loads(base64.urlsafe_b64decode(genuine + "=" * (-len(genuine) % 4))) == {
        "after": "TASK-20250101-001", "role": None, "state": None, "v": 1}  # the same, at another version
    for garbage in ("", "nope", "!!!!", "W10", "eyJ2IjoyfQ", forged):
        with pytest.raises(TaskQueryError, match="is not a cursor this listing printed"):
            page_tasks(h.db, after=garbage)


def test_arguments_out_of_range_are_refused(h: Harness) -> None:
    for limit in (0, -1, MAX_LIMIT + 1):
        with pytest.raises(TaskQueryError, match="a page holds 1 to"):
            page_tasks(h.db, limit=limit)
    with pytest.raises(TaskQueryError, match="'doing' is not a task state"):
        page_tasks(h.db, state="doing")
    with pytest.raises(TaskQueryError, match="is not a task state"):
        iter_tasks(h.db, "doing")


def test_a_page_is_one_range_scan_of_the_state_index(sqlite_db: Database) -> None:
    """The schema's index on tasks(state, task_id) (migration 0002) serves a page as one range scan: no sort of
    the tasks in that state, whatever their number."""
    h = Harness(sqlite_db)
    ids = interleaved_tasks(h, 6)
    cursor = page_tasks(sqlite_db, state="inbox", limit=1).next_cursor
    with statements(sqlite_db) as seen:
        page_tasks(sqlite_db, state="inbox", limit=1, after=cursor)
    sql, params = next((s, p) for s, p, _, _ in seen if "FROM tasks" in s)
    with sqlite_db.read() as conn:
        plan = " | ".join(r[3] for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql, params))
    assert "ix_tasks_state_task_id (state=? AND task_id>?)" in plan and "TEMP B-TREE" not in plan, plan
    assert ids  # the store is not empty


def test_iter_tasks_streams_through_a_cursor_of_one_batch(h: Harness) -> None:
    interleaved_tasks(h, 7)
    with statements(h.db) as seen:
        stream = iter_tasks(h.db, batch=3)
        assert seen == []  # nothing is read before the first row is asked for
        first = next(stream)
        assert first["task_id"] and len(list(stream)) == 6
    sql, _, options, cursor = next(s for s in seen if "FROM tasks" in s[0])
    assert options.get("yield_per") == 3, options
    if h.db.is_postgres:  # psycopg fetches from a server-side cursor instead of loading the whole result
        import psycopg
        assert isinstance(cursor, psycopg.ServerCursor), type(cursor)


def test_a_stream_closed_early_ends_its_read(h: Harness) -> None:
    interleaved_tasks(h, 5)
    pool = h.db.engine.pool
    idle = pool.checkedout()  # type: ignore[attr-defined]
    with contextlib.closing(iter_tasks(h.db, batch=2)) as stream:
        next(stream)
        assert pool.checkedout() == idle + 1  # type: ignore[attr-defined]
    assert pool.checkedout() == idle  # type: ignore[attr-defined]  # its read and its connection were given back


# -- verify, streaming ------------------------------------------------------------------------------------------

def stored_rows(db: Database) -> list[tuple[Any, ...]]:
    with db.read() as conn:
        return [tuple(r) for r in conn.exec_driver_sql("SELECT * FROM tasks ORDER BY task_id")]


def test_verify_across_batch_boundaries_with_interleaved_streams(h: Harness) -> None:
    ids = interleaved_tasks(h, 23)
    for batch in (1, 4, 23, 1000):
        report = verify(h.db, h.kernel.store, batch=batch)
        assert (report.ok, report.tasks, report.events) == (True, 23, h.event_count()), (batch, report.problems)
    with h.db.read() as conn:
        docs, last_pos = rebuild_tasks(h.kernel.store, conn)
        rebuilt = list(iter_rebuilt_tasks(h.kernel.store, conn, batch=2))
    assert sorted(docs) == sorted(ids) == [t.task_id for t in rebuilt]
    assert all(docs[t.task_id] == t.doc and last_pos[t.task_id] == t.last_pos for t in rebuilt)
    for tid in ids:
        assert docs[tid] == h.kernel.task(tid)


def test_verify_finds_a_missing_an_extra_and_a_changed_row_wherever_the_batches_fall(h: Harness) -> None:
    ids = sorted(interleaved_tasks(h, 13))
    before = stored_rows(h.db)
    missing, changed, columns = ids[0], ids[6], ids[12]
    with h.db.write() as uow:
        uow.conn.execute(sa.text("DELETE FROM tasks WHERE task_id = :t"), {"t": missing})
        uow.conn.execute(sa.text("UPDATE tasks SET doc = replace(doc, 'task 6', 'task six') WHERE task_id = :t"),
                         {"t": changed})
        uow.conn.execute(sa.text("UPDATE tasks SET recipient = 'QA' WHERE task_id = :t"), {"t": columns})
    for batch in (1, 5, 1000):
        report = verify(h.db, h.kernel.store, batch=batch)
        found = {p["task_id"]: p["detail"] for p in report.problems}
        assert report.reason == PROJECTION_DRIFT and report.tasks == 13, batch
        assert found == {missing: "task has events but no stored projection",
                         changed: "stored task document differs from the one rebuilt from events",
                         columns: "stored task columns differ from the rebuilt document"}, batch
        assert [p["position"] for p in report.problems] == sorted(p["position"] for p in report.problems)
    # a stored row the log holds no event of: projection_ahead, and --repair refuses
    with h.db.write() as uow:
        uow.conn.execute(sa.text("INSERT INTO tasks SELECT 'TASK-20200101-001', state, revision, round, parent, root,"
                                 " recipient, doc, last_pos FROM tasks WHERE task_id = :t"), {"t": ids[3]})
    report = verify(h.db, h.kernel.store, repair=True, batch=4)
    assert (report.reason, report.repaired) == (PROJECTION_AHEAD, 0)
    assert [p["task_id"] for p in report.problems if p["reason"] == PROJECTION_AHEAD] == ["TASK-20200101-001"]
    # once it is gone, the drift is repaired from the events, in batches, back to the rows the kernel wrote
    with h.db.write() as uow:
        uow.conn.execute(sa.text("DELETE FROM tasks WHERE task_id = 'TASK-20200101-001'"))
    with statements(h.db) as seen:
        report = verify(h.db, h.kernel.store, repair=True, batch=4)
    assert (report.ok, report.repaired, report.problems) == (True, 13, [])
    assert len([s for s, _, _, _ in seen if s.startswith("INSERT INTO tasks")]) == 4  # 13 rows, 4 per insert
    assert stored_rows(h.db) == before
    assert verify(h.db, h.kernel.store, batch=3).ok


def test_verify_finds_a_broken_chain_in_a_store_of_many_streams(h: Harness) -> None:
    interleaved_tasks(h, 9)
    with h.db.write() as uow:  # the fifth task's creation, rewritten in place
        uow.conn.execute(sa.text("UPDATE events SET data = replace(data, 'task 4', 'task four') WHERE global_pos = 5"))
    report = verify(h.db, h.kernel.store, repair=True, batch=2)
    assert (report.reason, report.first_broken_position, report.repaired) == ("hash_chain", 5, 0)
    assert [p["reason"] for p in report.problems] == ["hash_chain", PROJECTION_DRIFT]  # its task drifts from it


def test_a_stream_that_lost_its_creation_is_reported_not_raised(h: Harness) -> None:
    """A deleted event that a task's fold needs is a chain break, and its task is reported (projection_ahead: the
    log lost what the stored row saw), never a traceback; --repair refuses, and the row is kept."""
    ids = interleaved_tasks(h, 6)
    with h.db.read() as conn:
        created = conn.execute(sa.text("SELECT global_pos FROM events WHERE stream_id = :s AND stream_version = 1"),
                               {"s": f"task:{ids[2]}"}).scalar_one()
    with h.db.write() as uow:
        uow.conn.execute(sa.text("DELETE FROM events WHERE global_pos = :p"), {"p": created})
    before = stored_rows(h.db)
    report = verify(h.db, h.kernel.store, repair=True, batch=2)
    assert (report.reason, report.first_broken_position, report.repaired) == ("hash_chain", created, 0)
    ahead = [p for p in report.problems if p["reason"] == PROJECTION_AHEAD]
    assert [p["task_id"] for p in ahead] == [ids[2]] and "cannot be rebuilt from its events" in ahead[0]["detail"]
    assert "before task_created" in ahead[0]["detail"], ahead[0]["detail"]
    assert stored_rows(h.db) == before
    with h.db.read() as conn:
        assert ids[2] not in rebuild_tasks(h.kernel.store, conn)[0]


def test_the_fold_holds_one_stream_at_a_time(h: Harness) -> None:
    """Structural: each task is yielded as soon as its stream ends, having read at most one row of the next."""
    interleaved_tasks(h, 6)
    with h.db.read() as conn:
        rows = conn.execute(sa.text("SELECT global_pos, stream_id, stream_version, event_type, schema_version, "
                                    "data, recorded_at FROM events ORDER BY stream_id, stream_version")).all()
    consumed = 0

    def counting() -> Iterator[Any]:
        nonlocal consumed
        for r in rows:
            consumed += 1
            yield r

    ends = list(itertools.accumulate(len(list(g)) for _, g in itertools.groupby(rows, key=lambda r: r[1])))
    seen = [consumed for _ in fold_streams(h.kernel.store, counting())]
    assert seen == [end + 1 for end in ends[:-1]] + [ends[-1]]


def test_the_comparison_holds_one_batch_and_reads_through_streaming_cursors(h: Harness) -> None:
    interleaved_tasks(h, 11)
    pulled = 0
    with h.db.read() as conn, statements(h.db) as seen:
        def counting() -> Iterator[RebuiltTask]:
            nonlocal pulled
            for t in iter_rebuilt_tasks(h.kernel.store, conn, batch=3):
                pulled += 1
                seen.append(("pulled", pulled, {}, None))
                yield t

        comparison = compare_tasks(conn, counting(), batch=3)
    assert (comparison.tasks, comparison.drifts) == (11, [])
    lookups = [i for i, s in enumerate(seen) if s[0] != "pulled" and "tasks.task_id IN" in s[0]]
    assert len(lookups) == 4 and all(len(seen[i][1]) <= 3 for i in lookups)
    for k, at in enumerate(lookups, 1):  # the k-th lookup runs once the k-th batch is complete, before the next
        before = [s[1] for s in seen[:at] if s[0] == "pulled"]
        assert before[-1] == min(3 * k, 11), (k, before)
    reads = [s for s in seen if s[0] != "pulled" and ("ORDER BY events.stream_id" in s[0] or "NOT (EXISTS" in s[0])]
    assert len(reads) == 2 and all(options.get("yield_per") == 3 for _, _, options, _ in reads), reads
    if h.db.is_postgres:
        import psycopg
        assert all(isinstance(cursor, psycopg.ServerCursor) for _, _, _, cursor in reads)


def test_verify_reads_one_snapshot(any_db: Database) -> None:
    with any_db.snapshot() as conn:
        if any_db.is_postgres:
            assert conn.exec_driver_sql("SHOW transaction_isolation").scalar() == "repeatable read"
    if any_db.is_postgres:  # the pooled connection is given back as it was
        with any_db.read() as conn:
            assert conn.exec_driver_sql("SHOW transaction_isolation").scalar() == "read committed"


def test_problems_stay_in_position_order_and_found_order_within_one() -> None:
    report = VerifyReport()
    for i, pos in enumerate((5, 2, 5, 9, 2, 1)):
        report.add("projection", PROJECTION_DRIFT, pos, f"#{i}")
    assert [(p["position"], p["detail"]) for p in report.problems] == [
        (1, "#5"), (2, "#1"), (2, "#4"), (5, "#0"), (5, "#2"), (9, "#3")]
    assert json.loads(json.dumps(report.as_json()))["first_broken_position"] == 1


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
                    max_leaves=20))
@settings(max_examples=300, deadline=None)
def test_folding_reads_an_event_exactly_as_json_does(value: Any) -> None:
    """The fold's fast reader (orjson) gives what json.loads gives for every text json writes: integers of any
    width, NaN and infinities, lone surrogates included."""
    text = json.dumps(value)
    assert repr(projections._loads(text)) == repr(json.loads(text))
