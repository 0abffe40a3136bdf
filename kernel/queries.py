"""Reads of the task read model that scale: one page at a time, or every task streamed in constant memory.

Pages are keyed on ``task_id`` (keyset pagination: ``WHERE task_id > :after ORDER BY task_id LIMIT n``), never on
an offset, so page 1000 costs what page 1 costs and a task created or moved meanwhile never shifts the others.
With a state the query reads ``WHERE state = :state AND task_id > :after ORDER BY task_id``: an index on
``tasks(state, task_id)`` serves it as one range scan; without, the primary key does. A page is the first ``limit``
rows of that order and a cursor naming where it ended. The cursor is opaque (URL-safe base64 of a small JSON
object): it carries the filters it was made for, so a cursor from another listing is refused with a clear error
instead of silently continuing a different one. Order is task id order: creation day, then the sequence as text
(``TASK-20250101-1000`` sorts before ``TASK-20250101-999``; ids keep at least three digits).

Besides ``state`` and ``role`` (the recipient), a listing may ask for the tasks a role drives (``driver``: the
task's ``authority.driver``, its recipient unless the task names another), the tasks a role decides
(``done_authority``; with state ``review``: waiting for that role's review), one tree (``root``), one task's
children (``parent``) or one risk level (``risk``). The authority and risk filters read the stored document
(JSON in SQL, on SQLite and PostgreSQL alike); every other filter is a column. A cursor carries every filter it
was made with.

``state`` also takes ``blocked``, which is not a lifecycle state: the active tasks whose document says they are
blocked (``blocked`` set by the fold, kernel/model/task.py); ``active`` then means active and not blocked. Both read
``state = 'active'`` (the ``(state, task_id)`` index) and test ``blocked.report_id`` in the stored document, JSON in
SQL as for the authority filters; a document stored before the field existed lacks it and counts as not blocked.
The state and the path are constants in those statements (``blocked_now``), so a partial index on the blocked
tasks can serve them. ``state_counts`` counts every lifecycle state in one statement from the ``(state, task_id)``
index (the board's columns), reading no document.

The listed fields of a task are TASK_LIST_FIELDS, taken from its stored document. ``task_document`` and
``task_history`` read one task for `task show` without building the command kernel (a read needs no roles,
guards or effect rules); ``recorded_patch`` reads the patch a done report recorded for `task diff`, proven against
the hash in the report's event (``read_patch``, which the board can share).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Generator, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from taskkernel.kernel.canonical import canonical_json, sha256_hex
from taskkernel.kernel.history import history_entry
from taskkernel.kernel.model.task import TaskState, task_stream
from taskkernel.kernel.model.upcasters import task_upcasters
from taskkernel.kernel.store.db import Database
from taskkernel.kernel.store.events import EventStore, RecordedEvent
from taskkernel.kernel.store.schema import BLOCKED_INDEX, tasks

TASK_LIST_FIELDS = ("task_id", "state", "revision", "round", "sender", "recipient", "subject", "priority",
                    "risk_level", "parent", "root", "thread_key", "blocked")
DEFAULT_LIMIT = 50
MAX_LIMIT = 1000  # a page is held in memory; more than this is a stream (iter_tasks)
BATCH = 1000  # rows per fetch when streaming
STATE_ORDER = tuple(s.value for s in TaskState)  # inbox, active, review, done, archive
STATES = frozenset(STATE_ORDER)
BLOCKED = "blocked"  # a listing state, not a lifecycle one: active tasks whose latest report of the round is blocked
LIST_STATES = (*STATE_ORDER, BLOCKED)  # what ``state`` accepts, in the order errors name them
_CURSOR_VERSION = 1


class TaskQueryError(ValueError):
    """A listing the caller cannot have as asked: a cursor that is not one, or is from another listing; an unknown
    state; a limit out of range. The message says what to do (the CLI reports it as a usage error)."""


class TaskPage(NamedTuple):
    rows: list[dict[str, Any]]  # TASK_LIST_FIELDS of each task, in task id order
    next_cursor: str | None  # pass as ``after`` for the next page; None: this was the last page


def task_row(doc_text: str | bytes) -> dict[str, Any]:
    """The listed fields of a stored task document (a field the document lacks is null)."""
    return row_of(orjson.loads(doc_text))


def row_of(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The listed fields of a task document."""
    return {k: doc.get(k) for k in TASK_LIST_FIELDS}


def shown_state(row: Mapping[str, Any]) -> str:
    """The state as people read it: ``blocked`` for an active task that is blocked, ``review (blocked)`` for a
    task in review whose driver reported blocked since it was submitted, else the lifecycle state."""
    if not row.get("blocked"):
        return str(row["state"])
    return BLOCKED if row["state"] == TaskState.ACTIVE.value else f"{row['state']} ({BLOCKED})"


def task_document(db: Database, task_id: str) -> dict[str, Any] | None:
    """A task's stored document (its current state), or None if no such task exists."""
    with db.read() as conn:
        raw = conn.execute(sa.select(tasks.c.doc).where(tasks.c.task_id == task_id)).scalar()
    return orjson.loads(raw) if raw else None


def event_reader() -> EventStore:
    """An event store that reads events upcast to the current schema, exactly as the kernel reads them."""
    return EventStore(task_upcasters())


def task_history(db: Database, task_id: str) -> list[RecordedEvent]:
    """A task's events in stream order, upcast to the current schema."""
    with db.read() as conn:
        return event_reader().read_stream(conn, task_stream(task_id))


def task_show_document(db: Database, task_id: str) -> dict[str, Any] | None:
    """The document of `task show` (and of the web API's ``GET /api/tasks/{id}``): the stored document, its
    ``blocked`` (null for a document stored before the field existed), each report with its ``body`` (the stored
    document keeps only the report's facts; a reviewer needs what it says, read from its event) and its
    ``history``; None: no such task."""
    doc = task_document(db, task_id)
    if doc is None:
        return None
    events = task_history(db, task_id)
    bodies = {report_id: ev.data.get("body") or "" for ev in events if (report_id := _report_of(ev)) is not None}
    reports = [{**r, "body": bodies.get(r["report_id"], "")} for r in doc.get("reports", ())]
    return {**doc, "reports": reports, "blocked": doc.get("blocked"),
            "history": [history_entry(ev) for ev in events]}


def _report_of(ev: RecordedEvent) -> str | None:
    """The report id an event adds to the task's reports (a report, or an imported REPORT record), else None."""
    if ev.type == "report_submitted":
        return str(ev.data["report_id"])
    if ev.type == "record_attached" and ev.data.get("kind") == "report":
        return str(ev.data["record_id"])
    return None


class RecordedPatch(NamedTuple):
    """The patch a done report recorded, read back and proven against the hash in its event (`task diff`)."""

    task_id: str
    round: int
    report_id: str
    patch: bytes
    patch_sha256: str
    files: list[dict[str, Any]]


class PatchRefused(NamedTuple):
    """Why no patch is shown: ``code`` is one of PATCH_REFUSALS, ``message`` says what is wrong and what to do."""

    code: str
    message: str


# task_not_found: no such task; no_diff: no done report (of that round) recorded a diff; patch_missing: the file the
# diff names is gone, unreadable or outside the evidence folder; patch_mismatch: its bytes are not the recorded ones.
PATCH_REFUSALS = ("task_not_found", "no_diff", "patch_missing", "patch_mismatch")


def read_patch(root: Path, evidence: Path, diff: Mapping[str, Any]) -> bytes | PatchRefused:
    """The bytes of the patch a report's ``diff`` names (relative to the workspace ``root``), only from under the
    ``evidence`` folder and only if they hash to the ``patch_sha256`` the report recorded: a patch file edited
    since is refused, never shown as what was reviewed."""
    if "patch" not in diff:
        return PatchRefused("no_diff", f"the report recorded no patch ({diff.get('error') or 'no diff was taken'})")
    path = (root / diff["patch"]).resolve()
    if not path.is_relative_to(evidence.resolve()):
        return PatchRefused("patch_missing", f"{diff['patch']} is not under the evidence folder {evidence}")
    try:
        data = path.read_bytes()
    except OSError as exc:
        return PatchRefused("patch_missing", f"cannot read {diff['patch']}: {exc.strerror or exc}")
    if sha256_hex(data) != diff.get("patch_sha256"):
        return PatchRefused("patch_mismatch", f"{diff['patch']} no longer matches the SHA-256 the report recorded "
                                              f"({diff.get('patch_sha256')}): it was changed after the report")
    return data


def recorded_patch(db: Database, root: Path, evidence: Path, task_id: str,
                   round_: int | None = None) -> RecordedPatch | PatchRefused:
    """The patch of the done report of round ``round_`` of a task (default: the latest round whose done report
    recorded a diff), read from its event (the whole file list, not the document's first files) and proven by
    ``read_patch``. A round with several done reports (reported again before submitting) shows the last."""
    events = task_history(db, task_id)
    if not events:
        return PatchRefused("task_not_found", f"{task_id} does not exist (see `taskkernel task list`)")
    done = [ev.data for ev in events if ev.type == "report_submitted" and ev.data.get("status") == "done"
            and ev.data.get("diff") and (round_ is None or ev.data.get("round") == round_)]
    if round_ is None:
        done = [d for d in done if "patch" in d["diff"]] or done
    if not done:
        which = f"in round {round_}" if round_ is not None else "in any round"
        return PatchRefused("no_diff", f"{task_id} has no done report with a recorded diff {which} (a diff is "
                                       "recorded for a role with isolation = \"worktree\")")
    report = done[-1]
    data = read_patch(root, evidence, report["diff"])
    if isinstance(data, PatchRefused):
        return data
    return RecordedPatch(task_id, int(report["round"]), str(report["report_id"]), data,
                         str(report["diff"]["patch_sha256"]), list(report["diff"].get("files", ())))


EXTRA_FILTERS = ("driver", "done_authority", "root", "parent", "risk")  # named in a cursor only when set


def _filters(state: str | None, role: str | None, extra: Mapping[str, str | None] | None = None
             ) -> dict[str, str | None]:
    if state is not None and state not in LIST_STATES:
        raise TaskQueryError(f"{state!r} is not a task state; choose one of {', '.join(LIST_STATES)}")
    unknown = sorted(set(extra or {}) - set(EXTRA_FILTERS))
    if unknown:
        raise TypeError(f"unknown task filter(s): {', '.join(unknown)}")
    return {"state": state, "role": role, **{k: v for k, v in (extra or {}).items() if v is not None}}


def _describe(filters: Mapping[str, str | None]) -> str:
    shown = [f"{name} {value}" for name, value in filters.items() if value is not None]
    return "all tasks" if not shown else "tasks with " + " and ".join(shown)


def encode_cursor(last_task_id: str, state: str | None = None, role: str | None = None,
                  **extra: str | None) -> str:
    body = canonical_json({"v": _CURSOR_VERSION, "after": last_task_id, **_filters(state, role, extra)})
    return base64.urlsafe_b64encode(body.encode("utf-8")).decode("ascii").rstrip("=")


def decode_cursor(cursor: str, state: str | None = None, role: str | None = None, **extra: str | None) -> str:
    """The task id a cursor continues after; TaskQueryError if it is not a cursor or belongs to other filters."""
    wanted = _filters(state, role, extra)
    try:
        body = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("utf-8"))
        after = body["after"]
        made_for = {"state": body["state"], "role": body["role"], **{k: body[k] for k in EXTRA_FILTERS if k in body}}
        if body["v"] != _CURSOR_VERSION or not isinstance(after, str):
            raise ValueError("unknown cursor version")
    except (ValueError, KeyError, TypeError, binascii.Error, UnicodeDecodeError, AttributeError):
        raise TaskQueryError(f"{cursor[:40]!r} is not a cursor this listing printed; start again without "
                             "a cursor") from None
    if made_for != wanted:
        raise TaskQueryError(f"this cursor continues a listing of {_describe(made_for)}, not of "
                             f"{_describe(wanted)}: repeat the filters it was made with, or start again without "
                             "a cursor")
    return after


def doc_text(path: tuple[str, ...], postgres: bool) -> sa.ColumnElement[Any]:
    """A field (``<a>.<b>``) of a task's stored document, as text (NULL when absent or null):
    ``CAST(doc AS JSON) #>> '{a,b}'`` on PostgreSQL, ``json_extract(doc, '$.a.b')`` on SQLite (where a CAST to JSON
    would be numeric). The path is written into the statement, not bound: an index on the expression (or one whose
    WHERE names it) serves only a query that names it exactly, constant included."""
    if not all(part.isidentifier() for part in path):
        raise ValueError(f"not a document path: {path!r}")
    if postgres:
        field: sa.ColumnElement[str] = sa.literal_column(f"'{{{','.join(path)}}}'")
        return sa.cast(tasks.c.doc, sa.JSON).op("#>>", return_type=sa.Text)(field)
    return sa.func.json_extract(tasks.c.doc, sa.literal_column(f"'$.{'.'.join(path)}'"))


def blocked_now(postgres: bool, blocked: bool = True) -> sa.ColumnElement[bool]:
    """The listing state ``blocked`` (active, its document's ``blocked`` set), or with ``blocked=False`` the
    listing state ``active`` (active and not blocked). The state is a constant in the statement, as the path is
    (``doc_text``): a partial index on the blocked tasks (``state = 'active' AND <marker> IS NOT NULL``) then serves
    the blocked listing without reading every active task's document."""
    marker = doc_text(("blocked", "report_id"), postgres)
    active = tasks.c.state == sa.literal_column(f"'{TaskState.ACTIVE.value}'")
    return sa.and_(active, marker.is_not(None) if blocked else marker.is_(None))


def _authority(name: str, postgres: bool) -> sa.ColumnElement[Any]:
    """The task's ``authority.<name>`` read from its stored document."""
    return doc_text(("authority", name), postgres)


def _where(q: sa.Select[Any], filters: Mapping[str, str | None], db: Database) -> sa.Select[Any]:
    postgres = db.is_postgres
    state = filters.get("state")
    if state in (BLOCKED, TaskState.ACTIVE.value):
        q = q.where(blocked_now(postgres, blocked=state == BLOCKED))
        # without statistics SQLite may rank the partial index no better than the state index: name it (when the
        # database has it: a reader of a store before migration 0009 lists without it)
        if state == BLOCKED and not postgres and db.sqlite_index_exists(BLOCKED_INDEX):
            q = q.with_hint(tasks, f"INDEXED BY {BLOCKED_INDEX}", "sqlite")
    elif state is not None:
        q = q.where(tasks.c.state == state)
    if filters.get("role") is not None:
        q = q.where(tasks.c.recipient == filters["role"])
    for column in ("root", "parent"):
        if filters.get(column) is not None:
            q = q.where(tasks.c[column] == filters[column])
    for name in ("driver", "done_authority"):
        if filters.get(name) is not None:
            q = q.where(_authority(name, postgres) == filters[name])
    if filters.get("risk") is not None:
        q = q.where(doc_text(("risk_level",), postgres) == filters["risk"])
    return q


def _query(filters: Mapping[str, str | None], after: str | None, db: Database) -> sa.Select[Any]:
    q = _where(sa.select(tasks.c.task_id, tasks.c.doc), filters, db)
    if after is not None:
        q = q.where(tasks.c.task_id > after)
    return q.order_by(tasks.c.task_id)


def count_tasks(db: Database, *, state: str | None = None, role: str | None = None, driver: str | None = None,
                done_authority: str | None = None, root: str | None = None, parent: str | None = None,
                risk: str | None = None) -> int:
    """How many tasks a listing with these filters holds in all (checked as in ``page_tasks``)."""
    filters = _filters(state, role, {"driver": driver, "done_authority": done_authority, "root": root,
                                     "parent": parent, "risk": risk})
    with db.read() as conn:
        return int(conn.execute(_where(sa.select(sa.func.count()).select_from(tasks), filters, db)).scalar_one())


def state_counts(db: Database, conn: Connection | None = None, /, *, role: str | None = None, root: str | None = None,
                 risk: str | None = None) -> dict[str, int]:
    """How many tasks each lifecycle state holds (``active`` with its blocked tasks), with these filters, in one
    statement of one count per state: each a range of the ``(state, task_id)`` index, which alone answers it
    without filters, so no count reads a task's document or the rest of the table."""
    filters = _filters(None, role, {"root": root, "risk": risk})
    per_state = [_where(sa.select(sa.func.count()).select_from(tasks).where(tasks.c.state == state), filters,
                        db).scalar_subquery() for state in STATE_ORDER]
    with _reading(db, conn) as c:
        return dict(zip(STATE_ORDER, map(int, c.execute(sa.select(*per_state)).one()), strict=True))


def page_tasks(db: Database, conn: Connection | None = None, /, *, state: str | None = None, role: str | None = None,
               limit: int = DEFAULT_LIMIT, after: str | None = None, driver: str | None = None,
               done_authority: str | None = None, root: str | None = None, parent: str | None = None,
               risk: str | None = None) -> TaskPage:
    """One page of tasks in task id order: those in ``state``, addressed to ``role`` (the recipient), driven by
    ``driver``, decided by ``done_authority``, of the tree ``root``, children of ``parent`` and of risk level
    ``risk``, when given, after the cursor ``after`` (a ``next_cursor`` of the same listing). At most ``limit`` rows
    (1 to MAX_LIMIT) and the cursor of the next page, or None when no task follows. Read in ``conn``'s transaction
    when given (several reads, one snapshot), else in one of its own."""
    if not 1 <= limit <= MAX_LIMIT:
        raise TaskQueryError(f"a page holds 1 to {MAX_LIMIT} tasks, not {limit}; list them all as a stream instead")
    extra = {"driver": driver, "done_authority": done_authority, "root": root, "parent": parent, "risk": risk}
    filters, after_id = _start(state, role, after, extra)
    with _reading(db, conn) as c:
        found = c.execute(_query(filters, after_id, db).limit(limit + 1)).all()
    rows = [task_row(doc) for _, doc in found[:limit]]
    more = len(found) > limit
    return TaskPage(rows, encode_cursor(found[limit - 1][0], state, role, **extra) if more else None)


@contextmanager
def _reading(db: Database, conn: Connection | None) -> Iterator[Connection]:
    """The caller's connection (its transaction), or a read transaction of its own."""
    if conn is not None:
        yield conn
        return
    with db.read() as own:
        yield own


def iter_tasks(db: Database, state: str | None = None, role: str | None = None, *, after: str | None = None,
               batch: int = BATCH, driver: str | None = None, done_authority: str | None = None,
               root: str | None = None, parent: str | None = None) -> Generator[dict[str, Any], None, None]:
    """Every task of the listing, in task id order, streamed: one read snapshot and a cursor fetching ``batch``
    rows at a time (server-side on PostgreSQL), so memory does not grow with the store. The read transaction
    stays open until the iterator is exhausted or closed: wrap it in ``contextlib.closing`` when you may stop
    early. Filters and ``after`` as in ``page_tasks``, checked at the call (TaskQueryError), before any read."""
    extra = {"driver": driver, "done_authority": done_authority, "root": root, "parent": parent}
    filters, after_id = _start(state, role, after, extra)
    return _stream(db, filters, after_id, batch, task_row)


def iter_documents(db: Database, state: str | None = None, *, batch: int = BATCH, driver: str | None = None,
                   done_authority: str | None = None) -> Generator[dict[str, Any], None, None]:
    """The whole stored document of every task of the listing (as ``iter_tasks`` streams its rows), for a read
    that needs more than the listed fields (`taskkernel inbox`: a task's authority and risk)."""
    filters, _ = _start(state, None, None, {"driver": driver, "done_authority": done_authority})
    return _stream(db, filters, None, batch, orjson.loads)


def _start(state: str | None, role: str | None, after: str | None, extra: Mapping[str, str | None]
           ) -> tuple[dict[str, str | None], str | None]:
    """Check the filters and the cursor; the filters and the task id to continue after."""
    filters = _filters(state, role, extra)
    return filters, decode_cursor(after, state, role, **extra) if after is not None else None


def _stream(db: Database, filters: Mapping[str, str | None], after_id: str | None, batch: int,
            convert: Callable[[str], dict[str, Any]]) -> Generator[dict[str, Any], None, None]:
    with db.read() as conn:
        result = conn.execute(_query(filters, after_id, db).execution_options(yield_per=batch))
        try:
            for _, doc in result:
                yield convert(doc)
        finally:
            result.close()
