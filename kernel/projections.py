"""Read models rebuilt from events, and the comparison `taskkernel verify` makes against the stored ones.

Everything here streams: memory stays bounded by one task stream and one batch of tasks, whatever the size of the
store. Events are read in stream order, ``(stream_id, stream_version)``: the unique index on the pair serves that
order on both backends, and each task's events arrive together, so a task is folded, compared and dropped before
the next one starts. The read goes through the driver's streaming cursor (``yield_per``: a server-side cursor on
PostgreSQL, stepped rows on SQLite), so neither driver materialises the result. Stored rows are fetched per batch of
rebuilt tasks by primary key, which pairs the two sides without assuming that Python and the database order text
alike (a PostgreSQL collation need not be byte order); the stored rows no event backs are found by the database
itself (an anti-join on the same index)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from taskkernel.kernel.canonical import canonical_json
from taskkernel.kernel.model.task import apply
from taskkernel.kernel.store.events import EventStore
from taskkernel.kernel.store.schema import events, tasks

TASK_PREFIX = "task:"
# Tasks (and stored rows) held at once while comparing or repairing; rows per fetch from the event cursor.
BATCH = 1000


PROJECTION_DRIFT = "projection_drift"
# The stored task is ahead of its events (a higher revision or a later position than the log holds, or no events
# at all): the log may have lost events, so rebuilding from it would launder the loss. --repair refuses.
PROJECTION_AHEAD = "projection_ahead"


@dataclass(frozen=True)
class Drift:
    task_id: str
    position: int  # the task's last event position (where the projection should be; ahead: where it is)
    detail: str
    reason: str = PROJECTION_DRIFT


@dataclass(frozen=True, slots=True)
class RebuiltTask:
    task_id: str
    doc: dict[str, Any]  # empty when ``problem`` is set
    last_pos: int  # the position of the task's last event
    problem: str | None = None  # why its events do not fold into a task (e.g. its creation is missing)


@dataclass(frozen=True)
class Comparison:
    drifts: list[Drift]  # ordered by position
    tasks: int  # task streams rebuilt


_EVENT_COLUMNS = (events.c.global_pos, events.c.stream_id, events.c.stream_version, events.c.event_type,
                  events.c.schema_version, events.c.data, events.c.recorded_at)


def task_event_rows(conn: Connection, batch: int = BATCH) -> Iterator[Any]:
    """Every task event, ordered by stream then version, through a streaming cursor of ``batch`` rows."""
    q = (sa.select(*_EVENT_COLUMNS).where(events.c.stream_id.startswith(TASK_PREFIX, autoescape=True))
         .order_by(events.c.stream_id, events.c.stream_version))
    result = conn.execute(q.execution_options(yield_per=batch))  # this statement only
    try:
        yield from result
    finally:
        result.close()


def fold_streams(store: EventStore, rows: Iterable[Any]) -> Iterator[RebuiltTask]:
    """Fold rows ordered by stream into one task per stream, yielding each as soon as its stream ends: only one
    stream is held at a time. Rows of other streams are skipped (a case-insensitive LIKE lets ``TASK:…`` through).
    A stream whose events do not fold (its creation deleted, an event altered past reading) is yielded with the
    reason as ``problem``, never raised: verify reports it beside the chain break that explains it."""
    upcast = store.upcasters.upcast
    current: str | None = None
    doc: dict[str, Any] | None = None
    problem: str | None = None
    last_pos = 0
    for pos, stream_id, version, event_type, schema_v, data_text, recorded_at in rows:
        if not stream_id.startswith(TASK_PREFIX):
            continue
        if stream_id != current:
            if current is not None:
                yield _rebuilt(current, doc, last_pos, problem)
            current, doc, problem, last_pos = stream_id, None, None, 0
        last_pos = max(last_pos, pos)  # the stream's last event in commit order
        if problem is not None:
            continue
        try:
            data = upcast(event_type, schema_v, _loads(data_text))
            doc = apply(doc, event_type, data, version, recorded_at)
        except (AssertionError, LookupError, TypeError, ValueError, AttributeError) as exc:
            problem = f"its event at position {pos} ({event_type}, revision {version}) does not fold: {exc}"
    if current is not None:
        yield _rebuilt(current, doc, last_pos, problem)

_WIDE_NUMBER = re.compile(r"\d{19}")  # orjson reads an integer wider than 64 bits as a float, json exactly


def _loads(text: str) -> Any:
    """json.loads at orjson's speed (folding is most of a rebuild's and verify's work); what orjson would read
    differently (NaN, Infinity, integers wider than 64 bits, lone surrogates) json reads as before."""
    if _WIDE_NUMBER.search(text) is None:
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
    return json.loads(text)



def _rebuilt(stream_id: str, doc: dict[str, Any] | None, last_pos: int, problem: str | None) -> RebuiltTask:
    task_id = stream_id[len(TASK_PREFIX):]
    if problem is None and doc is not None:
        return RebuiltTask(task_id, doc, last_pos)
    return RebuiltTask(task_id, {}, last_pos, problem or "its events hold no task")


def iter_rebuilt_tasks(store: EventStore, conn: Connection, batch: int = BATCH) -> Iterator[RebuiltTask]:
    """Every task rebuilt from its events, one at a time, in stream order."""
    return fold_streams(store, task_event_rows(conn, batch))


def rebuild_tasks(store: EventStore, conn: Connection) -> tuple[dict[str, dict[str, Any]], dict[str, int]]:
    """Every task rebuilt from scratch, all in memory: docs and each task's last event position. For small stores
    and tests; `verify` streams (``iter_rebuilt_tasks``)."""
    docs: dict[str, dict[str, Any]] = {}
    last_pos: dict[str, int] = {}
    for t in iter_rebuilt_tasks(store, conn):
        if t.problem is None:
            docs[t.task_id], last_pos[t.task_id] = t.doc, t.last_pos
    return docs, last_pos


def _stored_revision(row: Any) -> int:
    """The highest revision the stored task claims, in its column or its document."""
    try:
        claimed = json.loads(row.doc).get("revision")
    except (ValueError, AttributeError):
        claimed = None
    return max(row.revision, claimed) if isinstance(claimed, int) else row.revision


def _batches(items: Iterable[RebuiltTask], size: int) -> Iterator[list[RebuiltTask]]:
    chunk: list[RebuiltTask] = []
    for item in items:
        chunk.append(item)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _as_current(stored: Any) -> Any:
    """A stored document as the current fold writes it: one stored before the fold derived ``blocked`` lacks the
    key, which means null (a task that is blocked by its events but whose stored document lacks the field is
    still drift: the read model would not show it; `verify --repair` refolds it)."""
    if isinstance(stored, dict) and "blocked" not in stored:
        return {**stored, "blocked": None}
    return stored


def _drift(rebuilt: RebuiltTask, row: Any) -> Drift | None:
    doc, pos = rebuilt.doc, rebuilt.last_pos
    if rebuilt.problem is not None:
        # the log lost or altered events of this task: nothing can be rebuilt from it, so --repair refuses
        return Drift(rebuilt.task_id, pos, f"the task cannot be rebuilt from its events: {rebuilt.problem}",
                     PROJECTION_AHEAD)
    if row is None:
        return Drift(rebuilt.task_id, pos, "task has events but no stored projection")
    revision = _stored_revision(row)
    if revision > doc["revision"] or row.last_pos > pos:
        return Drift(rebuilt.task_id, max(row.last_pos, pos), f"stored task is at revision {revision} "
                     f"(position {row.last_pos}), its events only reach revision {doc['revision']} "
                     f"(position {pos}): events of this task are missing from the log", PROJECTION_AHEAD)
    if canonical_json(_as_current(json.loads(row.doc))) != canonical_json(doc):
        return Drift(rebuilt.task_id, pos, "stored task document differs from the one rebuilt from events")
    if (row.state, row.revision, row.round, row.parent, row.root, row.recipient) != (
            doc["state"], doc["revision"], doc["round"], doc["parent"], doc["root"], doc["recipient"]):
        return Drift(rebuilt.task_id, pos, "stored task columns differ from the rebuilt document")
    return None


def compare_tasks(conn: Connection, rebuilt: Iterable[RebuiltTask], batch: int = BATCH) -> Comparison:
    """Compare every rebuilt task with its stored row, ``batch`` tasks at a time (their rows fetched by primary
    key), then list the stored rows no event backs. Holds one batch of each side, plus the drifts found."""
    drifts: list[Drift] = []
    count = 0
    for chunk in _batches(rebuilt, batch):
        count += len(chunk)
        ids = [t.task_id for t in chunk]
        stored = {r.task_id: r for r in conn.execute(sa.select(tasks).where(tasks.c.task_id.in_(ids)))}
        drifts.extend(d for t in chunk if (d := _drift(t, stored.get(t.task_id))) is not None)
    orphans = sa.select(tasks).where(~sa.exists().where(events.c.stream_id == sa.literal(TASK_PREFIX)
                                                        + tasks.c.task_id))
    for row in conn.execute(orphans.execution_options(yield_per=batch)):
        drifts.append(Drift(row.task_id, row.last_pos, f"stored task is at revision {_stored_revision(row)} "
                            f"(position {row.last_pos}) but the log holds no event of it", PROJECTION_AHEAD))
    drifts.sort(key=lambda d: d.position)
    return Comparison(drifts, count)


def repair_tasks(conn: Connection, rebuilt: Iterable[RebuiltTask], batch: int = BATCH) -> int:
    """Replace the task read model by the one rebuilt from events (inside the caller's write transaction),
    ``batch`` rows per insert. A task whose events do not fold gets no row (verify refuses to repair then)."""
    conn.execute(tasks.delete())
    count = 0
    for chunk in _batches((t for t in rebuilt if t.problem is None), batch):
        conn.execute(tasks.insert(), [
            {"task_id": t.task_id, "state": d["state"], "revision": d["revision"], "round": d["round"],
             "parent": d["parent"], "root": d["root"], "recipient": d["recipient"], "doc": canonical_json(d),
             "last_pos": t.last_pos} for t in chunk for d in (t.doc,)])
        count += len(chunk)
    return count
