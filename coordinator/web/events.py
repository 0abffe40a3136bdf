"""One tail of the event log, fanned out to every server-sent-events client (``GET /api/events``).

The hub alone reads the log: every POLL_SECONDS it reads the log's end (one indexed read), and when it moved,
the events up to it, in commit order (positions are handed out under the writer lock and commit in order, so
every position up to the end has committed: none is skipped or sent twice). On PostgreSQL it reads them when a
commit NOTIFYs (kernel/store/listen.py, one listening connection per process), and the log's end otherwise only
every FALLBACK_SECONDS, for the time that connection is lost. Each event goes to every client's
queue as a small summary (EventSummary). Clients never poll: a page re-renders its live regions when an event
concerns it (static/board.js).

Some of what the board shows lives in tables that commit no event: the session log (grants, revocations), the
schedules, the run ledger and the usage ledger. Every MARKER_EVERY polls the hub reads a cheap marker of each (a
count and a sum or a maximum that any change moves) and, when one moved, sends ``{"type": "state_changed",
"stream": "sessions" | "schedules" | "runs" | "usage"}`` (no id: it is no event of the log).

A task page also follows its agents' live output (``run_events``, runners/live.py): a client that names a task
(``live``) gets ``{"type": "live", "task_id", …}`` when that task's runs stored new events. The hub reads, every
LIVE_EVERY polls, the newest event number of each run of the tasks its clients watch (the runs ledger by task, then
the run's primary key: a few index lookups, whatever the number of events), and tells only those clients; the page
then fetches what follows the last event it shows (``GET /api/tasks/{id}/live?after=…``). Each new subscription
gets one such notice at once, so a notice lost with a reconnect loses nothing: the page fetches after its cursor.

A client that reconnects with ``Last-Event-ID`` (the browser does it by itself) first gets the events it missed,
read from the log, then the live ones. A client too slow to keep up (its queue full) is disconnected; it
reconnects with its last id and catches up from the log, so nothing is lost, only delayed. More than
REPLAY_MAX missed events are not replayed: the client gets a ``reset`` event and reloads what it shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import anyio.to_thread
import sqlalchemy as sa

from taskkernel.kernel.logging import get_logger
from taskkernel.kernel.model.task import TARGET_STATE_OF_EVENT, TaskState
from taskkernel.kernel.queries import event_reader
from taskkernel.kernel.store import listen
from taskkernel.kernel.store.db import Database
from taskkernel.kernel.store.events import RecordedEvent, log_end

log = get_logger(__name__)
POLL_SECONDS = 0.1
FALLBACK_SECONDS = 1.0  # PostgreSQL: how often the log's end is read without a NOTIFY
FAILING_POLL_SECONDS = 1.0  # while the database cannot be read
MARKER_EVERY = 5  # polls between two reads of the markers below (every half second)
LIVE_EVERY = 2  # polls between two reads of the watched tasks' live output (RunOutput writes every 0.25 s)
QUEUE_SIZE = 2000  # events a client may lag behind before it is cut off (it then catches up from the log)
REPLAY_MAX = 5000  # missed events replayed to a reconnecting client; beyond, a reset
READ_BATCH = 1000
TASK_PREFIX = "task:"
IDLE: dict[str, Any] = {"type": "idle"}
LIVE = "live"  # the item a client following a task's live output gets when the task's runs stored events


def summary(ev: RecordedEvent) -> dict[str, Any]:
    """What a client learns of an event: where it is, what it is, whose task, the task's state after it."""
    task_id = ev.stream_id.removeprefix(TASK_PREFIX) if ev.stream_id.startswith(TASK_PREFIX) else None
    state = None
    if task_id is not None:
        if ev.type in ("task_created", "task_adopted"):
            state = str(ev.data.get("state", TaskState.INBOX.value))
        elif (target := TARGET_STATE_OF_EVENT.get(ev.type)) is not None:
            state = target.value
    return {"global_pos": ev.global_pos, "stream": ev.stream_id, "type": ev.type, "task_id": task_id,
            "state": state, "by": ev.data.get("by") or ev.meta.get("actor"), "at": ev.recorded_at}


def notice(type_: str, stream: str, task_id: str | None = None) -> dict[str, Any]:
    """An item that is no event of the log (no position): a table outside it changed, or a task's live output."""
    return {"type": type_, "stream": stream, "global_pos": None, "task_id": task_id, "state": None, "by": None,
            "at": None}


@functools.cache
def _markers() -> dict[str, sa.Select[Any]]:
    """What moves when the state of a table outside the event log changes."""
    from taskkernel.coordinator.tables import runs
    from taskkernel.kernel.sessionlog.tables import session_counter as sc
    from taskkernel.kernel.store.schema import usage
    from taskkernel.scheduler.tables import occurrence, occurrence_conflict, schedule

    f = sa.func
    return {  # heartbeats and lease renewals are left out on purpose: they move all the time and show nowhere
        "sessions": sa.select(f.count(), f.sum(sc.c.last_seq), f.sum(sc.c.last_record), f.sum(sc.c.last_consumed_seq),
                              f.sum(sc.c.turns_completed)),
        "schedules": sa.select(f.count(), f.sum(schedule.c.revision), f.max(schedule.c.watermark_utc),
                               f.sum(schedule.c.paused),
                               # occurrences being run (the partial index ix_occurrence_live: no scan of the
                               # history); one claimed moves the watermark, one finished leaves this count
                               sa.select(f.count()).select_from(occurrence)
                               .where(sa.text("state IN ('running','claimed')")).scalar_subquery(),
                               sa.select(f.count()).select_from(occurrence_conflict).scalar_subquery()),
        "runs": sa.select(f.count(), f.sum(runs.c.attempt), f.max(runs.c.ended_at), f.max(runs.c.not_before),
                          f.sum(sa.case((runs.c.state == "running", 1), else_=0))),
        "usage": sa.select(f.count()).select_from(usage),
    }


def _live_marks(db: Database, tasks: list[str]) -> dict[str, frozenset[tuple[str, int | None]]]:
    """For each task, its runs and the number of each one's newest stored event: it moves whenever one of them
    stores an event (a run numbers on past the events it no longer keeps)."""
    from taskkernel.coordinator.tables import run_events, runs

    newest = sa.select(sa.func.max(run_events.c.n)).where(run_events.c.run_id == runs.c.run_id).scalar_subquery()
    found: dict[str, set[tuple[str, int | None]]] = {t: set() for t in tasks}
    with db.read() as conn:
        for task_id, run_id, n in conn.execute(sa.select(runs.c.task_id, runs.c.run_id, newest)
                                               .where(runs.c.task_id.in_(tasks))):
            found[task_id].add((run_id, n))
    return {t: frozenset(v) for t, v in found.items()}


@dataclass(eq=False)
class Subscription:
    """One client's queue; ``start`` is the hub's position when it subscribed (live events are past it)."""

    start: int
    queue: asyncio.Queue[dict[str, Any] | None]
    cut_off: bool = False
    live_task: str | None = None  # the task whose live output it follows (a task page), if any


class EventHub:
    """The one reader of the log's tail for a server; clients subscribe and read their queue."""

    def __init__(self, db: Database, poll_seconds: float = POLL_SECONDS, queue_size: int = QUEUE_SIZE,
                 fallback_seconds: float = FALLBACK_SECONDS) -> None:
        self.db = db
        self.poll_seconds = poll_seconds
        self._fallback_every = max(1, round(fallback_seconds / poll_seconds))  # PostgreSQL: ticks between log reads
        self._committed: asyncio.Event | None = None  # PostgreSQL: set by a commit's NOTIFY
        self.listening: listen.Subscription | None = None
        self._failing = False
        self.queue_size = queue_size
        self.position = 0
        self.clients: set[Subscription] = set()
        self._task: asyncio.Task[None] | None = None
        self._marks: dict[str, Any] = {}
        self._live_marks: dict[str, frozenset[tuple[str, int | None]]] = {}
        self._unreadable: set[str] = set()
        self._ticks = 0

    async def start(self) -> None:
        if self.db.is_postgres:  # listen first: a commit after the position is read is not missed
            loop, committed = asyncio.get_running_loop(), asyncio.Event()
            self._committed = committed
            self.listening = listen.on_commit(self.db.engine.url, lambda: loop.call_soon_threadsafe(committed.set))
        try:
            self.position = await anyio.to_thread.run_sync(self._end)
            self._marks = await anyio.to_thread.run_sync(self._read_marks)
        except BaseException:  # the server does not start: its subscription (a thread, a connection) goes too
            if self.listening is not None:
                self.listening.close()
                self.listening = None
            raise
        self._task = asyncio.create_task(self._run(), name="taskkernel-event-hub")

    async def stop(self) -> None:
        if self.listening is not None:
            self.listening.close()
            self.listening = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.close_clients()

    def close_clients(self) -> None:
        """End every client's stream (the server is stopping: an open stream would hold the stop up)."""
        for client in list(self.clients):
            self._cut(client)

    def _end(self) -> int:
        with self.db.read() as conn:
            return int(log_end(conn)[0])

    def _read(self, after: int, end: int) -> list[RecordedEvent]:
        """The events after ``after`` up to ``end`` (at most READ_BATCH), in commit order."""
        out: list[RecordedEvent] = []
        with self.db.read() as conn:
            for ev in event_reader().read_all(conn, after + 1, batch=READ_BATCH):
                if ev.global_pos > end or len(out) >= READ_BATCH:
                    break
                out.append(ev)
        return out

    async def _run(self) -> None:
        while True:
            await self._guarded(self._advance)
            wait = FAILING_POLL_SECONDS if self._failing else self.poll_seconds
            if self._committed is None:
                await asyncio.sleep(wait)
            else:
                await self._follow_commits(wait)

    async def _guarded(self, step: Callable[[], Awaitable[bool]]) -> None:
        """Run a step that may read the log; only one that did (True) says the feed recovered: a tick without a
        read of the log proves nothing about an outage."""
        try:
            if not await step():
                return
            if self._failing:
                log.info("event_feed_recovered", position=self.position)
            self._failing = False
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a database outage: said once, retried every second
            if not self._failing:
                log.warning("event_feed_failed", error=f"{type(exc).__name__}: {exc}")
            self._failing = True

    async def _follow_commits(self, wait: float) -> None:
        """PostgreSQL, until the next tick in ``wait`` seconds: the log's new events at each commit's NOTIFY."""
        assert self._committed is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while (left := deadline - loop.time()) > 0:
            try:
                await asyncio.wait_for(self._committed.wait(), left)
            except TimeoutError:
                return
            self._committed.clear()
            await self._guarded(self._advance_log)

    def _read_marks(self) -> dict[str, Any]:
        """Each marker's value now. One that cannot be read (its table not created yet, a busy database) keeps its
        last value, so a failure sends nothing; it is logged once until it reads again."""
        found: dict[str, Any] = {}
        for name, query in _markers().items():
            try:  # one read each: on PostgreSQL a missing table aborts the transaction it is read in
                with self.db.read() as conn:
                    found[name] = tuple(conn.execute(query).one())
                self._unreadable.discard(name)
            except sa.exc.SQLAlchemyError as exc:
                found[name] = self._marks.get(name)
                if name not in self._unreadable:
                    self._unreadable.add(name)
                    log.info("event_marker_unreadable", marker=name, error=f"{type(exc).__name__}: {exc}"[:300])
        return found

    async def _advance(self) -> bool:
        """One tick: the markers, the live output and (SQLite; on PostgreSQL every FALLBACK tick) the log. Whether
        it read the log."""
        self._ticks += 1
        if self._ticks % MARKER_EVERY == 0:
            marks = await anyio.to_thread.run_sync(self._read_marks)
            for name, value in marks.items():
                if value != self._marks.get(name):
                    self._publish(notice("state_changed", name))
            self._marks = marks
        if self._ticks % LIVE_EVERY == 0:
            await self._advance_live()
        if self._committed is None or self._failing or self._ticks % self._fallback_every == 0:
            return await self._advance_log()  # while failing, every (slower) tick looks again
        return False

    async def _advance_log(self) -> bool:
        """The events committed since the hub's position, to every client (True: the log was read)."""
        end = await anyio.to_thread.run_sync(self._end)
        while end > self.position:
            events = await anyio.to_thread.run_sync(self._read, self.position, end)
            if not events:
                break
            for ev in events:
                self._publish(summary(ev))
            self.position = events[-1].global_pos
        return True

    async def _advance_live(self) -> None:
        """Tell each client following a task's live output when the task's runs stored new events (and when it
        starts to be watched: what was stored while the client connected is not missed)."""
        watched = sorted({c.live_task for c in self.clients if c.live_task is not None})
        if not watched:
            self._live_marks = {}
            return
        try:
            marks = await anyio.to_thread.run_sync(_live_marks, self.db, watched)
            self._unreadable.discard(LIVE)
        except sa.exc.SQLAlchemyError as exc:  # no live notice this time; the log's feed goes on
            if LIVE not in self._unreadable:
                self._unreadable.add(LIVE)
                log.info("event_marker_unreadable", marker=LIVE, error=f"{type(exc).__name__}: {exc}"[:300])
            return
        for task_id in watched:
            if marks[task_id] != self._live_marks.get(task_id):
                self._publish(notice(LIVE, LIVE, task_id), [c for c in self.clients if c.live_task == task_id])
        self._live_marks = marks

    def _publish(self, item: dict[str, Any], to: Iterable[Subscription] | None = None) -> None:
        """Queue ``item`` for every client (``to``: for those)."""
        for client in list(self.clients if to is None else to):
            try:
                client.queue.put_nowait(item)
            except asyncio.QueueFull:
                self._cut(client)

    def _cut(self, client: Subscription) -> None:
        """Disconnect a client: what it has not read yet is dropped (a full queue would otherwise hold the end
        marker out and leave the stream open, silent, for ever); it reconnects with the last id it received and
        catches up from the log."""
        self.clients.discard(client)
        client.cut_off = True
        while not client.queue.empty():
            client.queue.get_nowait()
        client.queue.put_nowait(None)

    async def follow(self, last_seen: int | None, idle_seconds: float | None = None, live_task: str | None = None
                     ) -> AsyncIterator[dict[str, Any]]:
        """The events after ``last_seen`` (None: only those committed from now on), then each as it commits;
        a ``{"type": "reset"}`` item when too many were missed to replay; ``{"type": "idle"}`` every
        ``idle_seconds`` (for the caller's own checks: it is not sent to a client); ``{"type": "live"}`` when
        ``live_task``'s runs stored new events."""
        # subscribe first: nothing falls between the replay and the live feed
        client = Subscription(self.position, asyncio.Queue(self.queue_size), live_task=live_task)
        self.clients.add(client)
        if live_task is not None:  # what was stored before it subscribed: its reader fetches after its cursor now
            client.queue.put_nowait(notice(LIVE, LIVE, live_task))
        loop = asyncio.get_running_loop()
        next_idle = None if idle_seconds is None else loop.time() + idle_seconds
        try:
            if last_seen is not None and last_seen < client.start:
                if client.start - last_seen > REPLAY_MAX:
                    yield {"type": "reset", "global_pos": client.start}
                else:
                    after = last_seen
                    while after < client.start:
                        try:
                            missed = await anyio.to_thread.run_sync(self._read, after, client.start)
                        except Exception as exc:  # noqa: BLE001 - the stream ends; the client reconnects from `after`
                            log.warning("event_replay_failed", error=f"{type(exc).__name__}: {exc}")
                            return
                        if not missed:
                            break
                        for ev in missed:
                            yield summary(ev)
                        after = missed[-1].global_pos
            while True:
                try:  # the idle tick comes every idle_seconds, however many items come between
                    item = await asyncio.wait_for(client.queue.get(),
                                                  None if next_idle is None else max(0.0, next_idle - loop.time()))
                except TimeoutError:
                    next_idle = loop.time() + (idle_seconds or 0.0)
                    yield IDLE
                    continue
                if item is None:
                    return
                yield item
        finally:
            self.clients.discard(client)
