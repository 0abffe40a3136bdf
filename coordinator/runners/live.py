"""A running agent's stdout, stored as typed run events as it grows (`run_events`; docs/live-output.md).

The supervisor hands ``RunOutput.feed`` the new bytes of the agent's stdout every tenth of a second, cut anywhere
(inside a line, inside a UTF-8 character). They are split into lines here, each read by its CLI's parser
(runners/stream.py), redacted, and written in one transaction at most every FLUSH_EVERY_S, and once more at
``close``: a follower sees an event a fraction of a second after the agent printed it, and the database sees a
few writes a second per run however chatty the agent is.

What is stored is bounded: a line counts up to MAX_LINE_BYTES (the rest of it is dropped), an event's text up to
its kind's bound, and a run (all its attempts) keeps at most MAX_EVENTS_PER_RUN rows: its first HEAD_EVENTS
events, its latest TAIL_EVENTS, and between them one ``output`` event saying how many were not kept. The first
events say what the agent set out to do, the latest how it is doing now (a retried attempt stays visible).

Storing is a side show: ``feed`` and ``close`` never raise (a failure is logged and the events are lost), so live
output can never fail a run. ``read_events`` and ``latest_events`` are what `runs follow`, `task watch`, MCP
`get_task` and the board read.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from taskkernel.coordinator.agent_profiles import OutputKind
from taskkernel.coordinator.runners.history import view_state
from taskkernel.coordinator.runners.stream import LineParser, RunEvent, finished
from taskkernel.coordinator.tables import loop_metadata, run_events, runs
from taskkernel.kernel.canonical import utc_now_iso
from taskkernel.kernel.logging import get_logger
from taskkernel.kernel.store.db import Database

log = get_logger(__name__)

FLUSH_EVERY_S = 0.25
MAX_LINE_BYTES = 1 << 20
MAX_EVENTS_PER_RUN = 2000
HEAD_EVENTS = 1000  # kept for good: what the agent set out to do
TAIL_EVENTS = MAX_EVENTS_PER_RUN - HEAD_EVENTS - 1  # the latest; one row between them counts what was dropped
MAX_READ = 1000  # the most events one read returns
MAX_RAW_BYTES = 8 << 20  # printed and not parsed yet: beyond this (the flushes fell behind) it is dropped, counted
# The kernel's tools whose arguments and results carry instructions people gave a task: their text is never kept
# (`task inputs` shows it to those who may read it; a live event is read by anyone who may read the task).
INSTRUCTION_TOOLS = ("read_inputs", "say_to_task", "interrupt_task")
ACTIVE_STATES = frozenset({"queued", "running", "retrying"})  # a run in one of these may print more


class RunOutput:
    """One attempt's live output. ``secrets``: the values never to store (the run's token, the provider keys
    the agent was given); ``output_kind``: its CLI's parser (None: the generic command runner's)."""

    def __init__(self, db: Database, *, run_id: str, task_id: str, attempt: int, output_kind: OutputKind | None,
                 secrets: Sequence[str]) -> None:
        self.db, self.run_id, self.task_id, self.attempt = db, run_id, task_id, attempt
        self.secrets = tuple(secrets)
        self.parser = LineParser(output_kind)
        self._raw = bytearray()  # what the agent printed since the last flush, not parsed yet
        self._raw_dropped = 0  # bytes not kept because the flushes fell MAX_RAW_BYTES behind
        self._partial = bytearray()
        self._dropping = False  # the current line passed MAX_LINE_BYTES: skip to its end
        self._pending: list[tuple[str, RunEvent]] = []  # (when read, event)
        self._skipped = 0  # events dropped from the middle of pending ones, counted in the run's numbers
        self._lock = threading.Lock()  # the raw bytes and the timer (the supervisor's thread, a timer's)
        self._writing = threading.Lock()  # one write at a time, in the order the events were read
        self._timer: threading.Timer | None = None
        self._flushed_at = float("-inf")
        self._failures = 0
        self._closed = False
        try:
            db.create_schema(loop_metadata)
        except Exception:  # noqa: BLE001 - no live output is no reason not to run the agent
            self._failed("run_output_unavailable")
            self._closed = True

    def feed(self, chunk: bytes) -> None:
        """New bytes of the agent's stdout, cut anywhere: kept as they are, parsed and stored within FLUSH_EVERY_S
        by a timer thread (the supervisor's own thread never parses nor waits for the database: it watches the
        agent's deadlines and heartbeats). Never raises."""
        try:
            with self._lock:
                if self._closed:
                    return
                room = MAX_RAW_BYTES - len(self._raw)
                self._raw += chunk[:room]
                self._raw_dropped += max(0, len(chunk) - room)
                if self._timer is None:
                    wait = max(0.0, self._flushed_at + FLUSH_EVERY_S - time.monotonic())
                    self._timer = threading.Timer(wait, self._flush_later)
                    self._timer.daemon = True
                    self._timer.start()
        except Exception:  # noqa: BLE001 - live output must never break a run
            self._failed("run_output_failed")

    def close(self) -> None:
        """The agent ended: its last line (even without a newline) and everything pending are stored when this
        returns, and nothing more is taken. Never raises."""
        try:
            with self._lock:
                if self._closed:
                    return
                self._closed = True
                if self._timer is not None:
                    self._timer.cancel()
            self._flush(final=True)
        except Exception:  # noqa: BLE001 - live output must never break a run
            self._failed("run_output_failed")
        if self._failures > 1:
            log.warning("run_output_failures", run_id=self.run_id, failures=self._failures)

    def _take(self, chunk: bytes) -> None:
        """Split ``chunk`` into lines after what was left of the last one; a line longer than MAX_LINE_BYTES is
        read up to there and the rest of it dropped."""
        start = 0
        while (end := chunk.find(b"\n", start)) != -1:
            if not self._dropping:
                self._line(bytes(self._partial) + chunk[start:end][:MAX_LINE_BYTES - len(self._partial)])
            self._partial.clear()
            self._dropping = False
            start = end + 1
        if self._dropping:
            return
        self._partial += chunk[start:]
        if len(self._partial) >= MAX_LINE_BYTES:
            self._line(bytes(self._partial[:MAX_LINE_BYTES]))
            self._partial.clear()
            self._dropping = True

    def _line(self, raw: bytes) -> None:
        self._add(self.parser.parse(raw.decode("utf-8", errors="replace")))

    def _add(self, events: list[RunEvent]) -> None:
        at = utc_now_iso()
        self._pending += [(at, finished(_unquoted(event), self.secrets)) for event in events]
        if (over := len(self._pending) - MAX_EVENTS_PER_RUN) > 0:  # the database is behind: memory stays bounded
            del self._pending[HEAD_EVENTS:HEAD_EVENTS + over]  # by dropping now what the trim would drop
            self._skipped += over

    def _flush_later(self) -> None:
        try:
            with self._lock:
                self._timer = None
            self._flush()
        except Exception:  # noqa: BLE001 - a timer thread has nobody to raise to
            self._failed("run_output_failed")

    def _flush(self, final: bool = False) -> None:
        """Parse what the agent printed since the last flush (``final``: and its unfinished last line), then write
        the events in one transaction, numbered after the run's last event (read under the writer lock: two holders
        of one run never collide), and trim the run to its bound. On failure they are lost."""
        with self._writing:
            with self._lock:
                raw, dropped = bytes(self._raw), self._raw_dropped
                self._raw.clear()
                self._raw_dropped = 0
                self._flushed_at = time.monotonic()
            self._take(raw)
            if dropped:
                self._pending.append((utc_now_iso(), RunEvent("output", f"… {dropped:,} bytes of output not read "
                                                                        "(the agent printed faster than it is kept)")))
            if final:
                if self._partial and not self._dropping:
                    self._line(bytes(self._partial))
                self._partial.clear()
                self._add(self.parser.finish())
            pending, self._pending = self._pending, []
            skipped, self._skipped = self._skipped, 0
            if not pending:
                return
            with self.db.write() as uow:
                conn = uow.conn
                last = conn.execute(sa.select(sa.func.max(run_events.c.n)).where(
                    run_events.c.run_id == self.run_id)).scalar() or 0
                conn.execute(run_events.insert(), [
                    {"run_id": self.run_id, "n": last + i + (skipped if i > HEAD_EVENTS else 0),
                     "task_id": self.task_id, "attempt": self.attempt, "at": at, "kind": e.kind, "tool": e.tool,
                     "text": e.text} for i, (at, e) in enumerate(pending, start=1)])
                total = last + len(pending) + skipped
                if total > MAX_EVENTS_PER_RUN:
                    self._trim(conn, total)

    def _trim(self, conn: sa.Connection, total: int) -> None:
        """Keep the first HEAD_EVENTS and the latest TAIL_EVENTS of ``total``; the row after the head says how many
        were dropped. It keeps the ``at`` of the event it replaces (or of the head's last one), so it sorts where
        the dropped events were."""
        c = run_events.c
        conn.execute(run_events.delete().where(c.run_id == self.run_id, c.n > HEAD_EVENTS + 1,
                                               c.n <= total - TAIL_EVENTS))
        dropped = total - TAIL_EVENTS - HEAD_EVENTS
        notice = {"kind": "output", "tool": None, "attempt": self.attempt,
                  "text": f"… {dropped:,} more events not kept (a run keeps its first {HEAD_EVENTS:,} and latest "
                          f"{TAIL_EVENTS:,})"}
        if conn.execute(run_events.update().where(c.run_id == self.run_id, c.n == HEAD_EVENTS + 1)
                        .values(**notice)).rowcount == 0:  # its event was dropped before it was written
            at = conn.execute(sa.select(c.at).where(c.run_id == self.run_id, c.n <= HEAD_EVENTS)
                              .order_by(c.n.desc()).limit(1)).scalar()
            conn.execute(run_events.insert().values(run_id=self.run_id, n=HEAD_EVENTS + 1, task_id=self.task_id,
                                                    at=at or utc_now_iso(), **notice))

    def _failed(self, what: str) -> None:
        self._failures += 1
        if self._failures == 1:
            log.exception(what, run_id=self.run_id, task_id=self.task_id, attempt=self.attempt)


# -- reading --------------------------------------------------------------------------------------------------

_COLUMNS = ("run_id", "n", "task_id", "attempt", "at", "kind", "tool", "text")


def read_events(db: Database, *, run_id: str | None = None, task_id: str | None = None,
                after: tuple[str, int] | int | None = None, limit: int = 200) -> list[dict[str, Any]]:
    """Stored events, oldest first, at most ``limit`` (up to MAX_READ). Of one run (``run_id``) in the order it
    printed them, ``after`` its event number ``n``; or of a task's runs (``task_id``) in the order they were read
    (``at``, then run and number), ``after`` the event ``(run_id, n)`` a previous read ended with."""
    if run_id is None and task_id is None:
        raise ValueError("read_events: name a run_id or a task_id")
    c = run_events.c
    q = sa.select(*(c[name] for name in _COLUMNS)).limit(max(1, min(limit, MAX_READ)))
    if run_id is not None:
        q = q.where(c.run_id == run_id)
    if task_id is not None:
        q = q.where(c.task_id == task_id)
    task_after: tuple[str, int] | None = None
    if run_id is not None:
        number = after[1] if isinstance(after, tuple) else after
        q = q.order_by(c.n) if number is None else q.where(c.n > number).order_by(c.n)
    elif isinstance(after, int):
        raise ValueError("read_events: an event number continues one run: name its run_id")
    else:
        task_after = after
        q = q.order_by(c.at, c.run_id, c.n)
    with db.read() as conn:
        if task_after is not None:
            q = q.where(_after_in_task(conn, task_after))
        rows = conn.execute(q).all()
    return [dict(r._mapping) for r in rows]


def _after_in_task(conn: sa.Connection, after: tuple[str, int]) -> sa.ColumnElement[bool]:
    """Events past ``(run_id, n)`` in a task's order (at, run_id, n): of its own run, those numbered after it
    (even when it was trimmed away since); of the others, those read after it."""
    c = run_events.c
    run, n = after
    at = conn.execute(sa.select(c.at).where(c.run_id == run, c.n <= n).order_by(c.n.desc()).limit(1)).scalar()
    if at is None:
        return sa.true()
    return sa.or_(sa.and_(c.run_id == run, c.n > n),
                  sa.and_(c.run_id != run, sa.or_(c.at > at, sa.and_(c.at == at, c.run_id > run))))


def latest_events(db: Database, task_id: str, limit: int) -> list[dict[str, Any]]:
    """The newest ``limit`` events of a task's runs (up to MAX_READ), oldest first: what its agents did last."""
    c = run_events.c
    q = (sa.select(*(c[name] for name in _COLUMNS)).where(c.task_id == task_id)
         .order_by(c.at.desc(), c.run_id.desc(), c.n.desc()).limit(max(1, min(limit, MAX_READ))))
    with db.read() as conn:
        rows = conn.execute(q).all()
    return [dict(r._mapping) for r in reversed(rows)]


def run_state(db: Database, run_id: str) -> str | None:
    """The run's state as `runs list` shows it (queued, running, retrying, done, failed, blocked); None when the
    ledger has no such run."""
    with db.read() as conn:
        row = conn.execute(sa.select(runs.c.state, runs.c.attempt, runs.c.error_code)
                           .where(runs.c.run_id == run_id)).first()
    return None if row is None else view_state(row.state, row.attempt, row.error_code)


def _unquoted(event: RunEvent) -> RunEvent:
    """An event of a kernel tool that carries instructions, without their text (INSTRUCTION_TOOLS)."""
    if event.tool is None or not event.tool.endswith(INSTRUCTION_TOOLS):
        return event
    what = "read the instructions given to it" if event.tool.endswith("read_inputs") else "instructed a task"
    return RunEvent(event.kind, f"(the agent {what}: their text is not kept here; `taskkernel task inputs` shows "
                                "it to those who may read it)", event.tool)
