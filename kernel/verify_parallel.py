"""The parallel proof of a sound SQLite store, for `taskkernel verify` (kernel/verify.py) on large stores.

Every check splits by key range. A chain link needs only its event and the stored hash of its predecessor, so the
chain splits by position; receipts split by rowid; task streams by stream id, each range folded and merged with the
stored tasks of the same ids (their order is the streams' order), which also finds the stored tasks no event backs.
Forked worker processes, each in one read transaction of its own begun as it starts, are handed one range at a time
over a pipe, while this process runs SQLite's integrity check in a thread (SQLite releases the GIL). Every worker is
forked before that thread starts (a fork copies no thread, and a lock another thread held would stay taken), and a
worker that dies (killed, out of memory) is seen by its process sentinel: the proof is then not made (None).

The ranges are detectors, not reporters: each says only whether everything in it holds, under the success
conditions of the sequential checks (a link and its position as store/events.py's walk computes them, a receipt by
verify_receipts.py's rule, a task by the conditions under which projections.py finds no drift). Anything else — a
break, a drift, an error, a record or head that is not plainly sound, a worker that saw another snapshot — returns
None, and verify runs the sequential checks, which find and word every problem as they always have. A sound store is
proven at the speed of the detectors; a broken one is reported by the one authoritative implementation.

One snapshot: every command appends events and re-seals the chain head in the transaction that writes its receipt
and task row, so processes whose read transactions saw the same head row and log end saw the same commands; a
worker that saw another is a disagreement (None)."""

from __future__ import annotations

import hmac
import json
import multiprocessing
import os
import signal
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection as Pipe
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from typing import Any

import orjson
from sqlalchemy.engine import Connection

from taskkernel.kernel.canonical import canonical_json
from taskkernel.kernel.logging import get_logger
from taskkernel.kernel.projections import TASK_PREFIX, RebuiltTask, fold_streams
from taskkernel.kernel.store.chain import (
    GENESIS_HASH,
    ChainKey,
    Link,
    legacy_head_seal,
    legacy_link,
    read_head,
    read_record,
)
from taskkernel.kernel.store.db import Database
from taskkernel.kernel.store.events import EventStore, log_end
from taskkernel.kernel.verify_receipts import receipt_problem

# Events per range of the chain and of the task streams, receipts per range: small enough that the workers finish
# together, large enough that a range's set-up (one statement, one predecessor read) does not show.
SPAN = 32_768
# Below this many events a store is proven sequentially: starting workers would cost more than it saves.
PARALLEL_FROM = 50_000
MAX_WORKERS = 8
_STREAM_END = TASK_PREFIX[:-1] + chr(ord(TASK_PREFIX[-1]) + 1)  # the first stream id past every "task:…" one

_IDENTITY_SQL = "SELECT (SELECT value FROM store_meta WHERE name = 'head'), max(global_pos) FROM events"
_BELOW_ONE_SQL = "SELECT count(*) FROM events WHERE global_pos < 1"
_FIRST_POSITION_SQL = "SELECT min(global_pos) FROM events WHERE global_pos >= ?"
_FIRST_RECEIPT_SQL = "SELECT min(rowid) FROM receipts WHERE rowid >= ?"
_MAX_ROWID = 2**63 - 1
_PREDECESSOR_SQL = ("SELECT global_pos, hash FROM events WHERE global_pos >= 1 AND global_pos < ? "
                    "ORDER BY global_pos DESC LIMIT 1")
_CHAIN_SQL = ("SELECT global_pos, stream_id, stream_version, event_type, schema_version, data, meta, recorded_at, "
              "hash FROM events WHERE global_pos >= ? AND global_pos < ? ORDER BY global_pos")
_RECEIPTS_SQL = ("SELECT r.idempotency_key, r.task_id, r.first_pos, r.last_pos, r.result, f.stream_id, l.stream_id, "
                 "l.stream_version, l.meta FROM receipts AS r "
                 "LEFT OUTER JOIN events AS f ON f.global_pos = r.first_pos "
                 "LEFT OUTER JOIN events AS l ON l.global_pos = r.last_pos WHERE 1 = 1")
_STREAMS_SQL = ("SELECT global_pos, stream_id, stream_version, event_type, schema_version, data, recorded_at "
                "FROM events WHERE stream_id >= ? AND stream_id < ? ORDER BY stream_id, stream_version")
_TASKS_SQL = ("SELECT task_id, state, revision, round, parent, root, recipient, doc, last_pos FROM tasks "
              "WHERE task_id >= ? {upper}ORDER BY task_id")

# (kind, low, high): chain positions, receipt rowids (None: unbounded) or stream ids, high excluded
Range = tuple[str, Any, Any]

_log = get_logger(__name__)


@dataclass(frozen=True)
class Proven:
    """What verify reports of a store the parallel proof found sound, read in the proof's snapshot."""

    events: int
    tasks: int
    chain: str  # the chain's algorithm
    head: dict[str, Any] | None  # {"position", "hash"}


@dataclass(frozen=True)
class Attempt:
    """The parallel proof's outcome: ``proven`` (None: not proven, the sequential checks run) and ``integrity``,
    SQLite's integrity check findings if it ran to its end beside the workers (None: it did not), which the
    sequential checks then take instead of running it again."""

    proven: Proven | None
    integrity: list[str] | None = None


@dataclass(frozen=True)
class _Job:
    """What every worker needs, inherited through the fork (the chain key never crosses a pipe)."""

    db: Database
    store: EventStore
    key: ChainKey | None
    keyed_from: int  # first position linked with the key (past the log's end: every link is legacy)
    end: int  # the log's last position in the parent's snapshot
    identity: tuple[Any, ...]  # the head row and log end the parent's snapshot saw


def default_workers() -> int:
    """One per CPU this process may use, at most MAX_WORKERS (a bound on the processes and connections one verify
    opens)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(cpus, MAX_WORKERS)


def prove_in_parallel(db: Database, store: EventStore, workers: int) -> Proven | None:
    """The figures of a store every check passes, proven by ``workers`` processes; None if anything did not hold
    or the store is not proven this way: the caller runs the sequential checks."""
    return attempt(db, store, workers).proven


def attempt(db: Database, store: EventStore, workers: int) -> Attempt:
    """prove_in_parallel, with the integrity check's findings when it ran. Not attempted on PostgreSQL, with one
    CPU, on a small store, or in a process running threads, such as a server (workers are forked)."""
    if (db.dialect != "sqlite" or workers < 2 or "fork" not in multiprocessing.get_all_start_methods()
            or threading.active_count() > 1):  # a fork copies no thread: a lock another thread held stays taken
        return Attempt(None)
    try:
        return _prove(db, store, workers)
    except Exception as exc:  # noqa: BLE001 - a damaged page, an edited value: the sequential checks report it
        _swallowed(exc)
        return Attempt(None)


def _swallowed(exc: Exception) -> None:
    """A failure of the proof is no failure of verify (the sequential checks run and report), but is logged: a
    database error (a damaged page the sequential checks will report) quietly, anything else as a warning."""
    if isinstance(exc, sqlite3.DatabaseError) or isinstance(getattr(exc, "orig", None), sqlite3.DatabaseError):
        _log.info("verify_parallel_not_proven", error=repr(exc))
    else:
        _log.warning("verify_parallel_failed", error=repr(exc), exc_info=exc)


def _prove(db: Database, store: EventStore, workers: int) -> Attempt:
    """Workers are forked while this process holds its read transaction, and it holds it until they are done: SQLite
    in a forked child shares the parent's record of the locks it holds, so a worker's lock on the WAL frames of the
    same snapshot is the parent's, which must stay taken. Each worker begins its read transaction as soon as it is
    forked (the sooner, the likelier no command committed meanwhile); one that read another snapshot answers None.
    The ranges are cut while the workers start."""
    with db.snapshot() as conn:
        end, _ = log_end(conn)
        chain = _sound_chain(db, conn) if end >= PARALLEL_FROM else None
        if chain is None:
            return Attempt(None)
        record, head = read_record(conn), read_head(conn)
        identity = tuple(conn.exec_driver_sql(_IDENTITY_SQL).one())
        pool = _Workers(_Job(db, store, *chain, end, identity), workers)
        try:
            integrity = _Background(db.integrity_problems)  # after every fork: no worker inherits a thread
            try:
                tasks = pool.run(_ranges(conn.connection.driver_connection, end))  # type: ignore[arg-type]
                # the chain's ranges found every position from 1 to the end, once each (the positions are the key):
                # the events counted are those and any row below position 1 (which no link covers)
                count = end + (conn.exec_driver_sql(_BELOW_ONE_SQL).scalar() or 0)
            except _NotProven:
                tasks = None
            except Exception as exc:  # noqa: BLE001 - as in attempt(), but the integrity check's findings still count
                _swallowed(exc)
                tasks = None
            # a BaseException (Ctrl-C) leaves without waiting for the integrity check (a daemon thread)
            findings = integrity.wait()
        finally:
            pool.stop()
    if findings != [] or tasks is None:
        return Attempt(None, findings)
    return Attempt(Proven(count, tasks, record.algorithm, {"position": head.pos, "hash": head.hash} if head else None),
                   findings)


class _Workers:
    """``n`` forked processes, all started here (before any thread of this proof), each answering over its own pipe:
    first whether its snapshot is the parent's (0, else None), then each range it is handed (``_run``'s answer)."""

    def __init__(self, job: _Job, n: int) -> None:
        ctx = multiprocessing.get_context("fork")
        self._procs: list[tuple[BaseProcess, Pipe]] = []
        try:
            for _ in range(n):
                mine, theirs = ctx.Pipe()
                ours = [pipe for _, pipe in self._procs] + [mine]  # the child closes its copies of these
                proc = ctx.Process(target=_work, args=(job, theirs, ours), daemon=True)
                proc.start()
                theirs.close()
                self._procs.append((proc, mine))
        except BaseException:
            self.stop()
            raise

    def run(self, ranges: Iterable[Range]) -> int | None:
        """Hand out the ranges, one at a time to whichever worker answered; the tasks they rebuilt, or None as soon
        as one answers None or a worker that owes an answer has died."""
        todo = iter(ranges)
        owing = {pipe: proc.sentinel for proc, pipe in self._procs}  # every worker owes its first answer
        tasks = 0
        while owing:
            ready = wait([*owing, *owing.values()])
            try:
                if any(not isinstance(r, Pipe) for r in ready):
                    raise EOFError  # a worker owing an answer exited
                for pipe in ready:
                    assert isinstance(pipe, Pipe)
                    result = pipe.recv()
                    if result is None:
                        return None
                    tasks += result
                    task = next(todo, None)
                    pipe.send(task)  # None: done, the worker leaves
                    if task is None:
                        del owing[pipe]
            except (EOFError, OSError):  # killed, out of memory, crashed
                _log.warning("verify_parallel_worker_died",
                             exitcodes=[proc.exitcode for proc, _ in self._procs if proc.exitcode is not None])
                return None
        return tasks

    def stop(self) -> None:
        """Every worker ended (one still working is killed: its answer no longer matters) and waited for."""
        for proc, pipe in self._procs:
            if proc.is_alive():
                proc.kill()
            proc.join()
            pipe.close()
        self._procs = []


def _sound_chain(db: Database, conn: Connection) -> tuple[ChainKey | None, int] | None:
    """The key and first keyed position, when the chain record and head are plainly sound (verify_chain's success
    conditions in store/events.py): the record unkeyed (and no key to expect), or keyed with this key under a valid
    seal; the head present where the record requires one, sealed, at the log's end, over its hash. None for
    anything else: verify_chain tells what."""
    record, key, head = read_record(conn), db.chain.key, read_head(conn)
    end, end_hash = log_end(conn)
    sealer: Callable[[int, str], str]
    if not record.keyed:
        if key is not None and end:
            return None
        link_key, keyed_from, sealer, required = None, end + 1, legacy_head_seal, False
    elif key is not None and key.key_id == record.key_id and hmac.compare_digest(
            record.seal, key.seal(record.keyed_from, record.sealed_head)):
        link_key, keyed_from, sealer, required = key, record.keyed_from, key.head_seal, record.sealed_head
    else:
        return None
    if head is None:
        return None if required else (link_key, keyed_from)
    if head.sealed_by(sealer) and head.pos == end and hmac.compare_digest(head.hash, end_hash):
        return link_key, keyed_from
    return None


class _NotProven(Exception):  # noqa: N818 - not an error: a store the sequential checks must word
    """Cutting the ranges met a gap in the positions (the sequential checks report it)."""


def _ranges(con: sqlite3.Connection, end: int) -> Iterator[Range]:
    """Every range of every check, cut as they are handed out and interleaved so that the workers share each kind.
    The ranges grow with the rows, never with the span of their keys (a position or rowid far from the others), and
    each cut is one index seek: the chain's are cut in positions 1 to ``end`` and stop at the first that does not
    begin where it should (_NotProven: a gap); the receipts' at the first stored rowid SPAN past the last cut
    (empty stretches skipped), the first and last range open-ended; the task streams at every so many stored tasks
    (the cuts only balance the work: the ranges cover every key)."""
    bounds = [TASK_PREFIX]
    step = max(1, SPAN // 6)  # about six events per task
    for i, (task_id,) in enumerate(con.execute("SELECT task_id FROM tasks ORDER BY task_id")):
        if i and i % step == 0 and isinstance(task_id, str):
            bounds.append(TASK_PREFIX + task_id)
    bounds.append(_STREAM_END)
    streams = [("streams", lo, hi) for lo, hi in zip(bounds, bounds[1:], strict=False) if lo < hi]
    kinds = [iter(streams), _chain_ranges(con, end), _receipt_ranges(con)]
    while kinds:
        for kind in list(kinds):
            cut = next(kind, None)
            if cut is None:
                kinds.remove(kind)
            else:
                yield cut


def _chain_ranges(con: sqlite3.Connection, end: int) -> Iterator[Range]:
    for lo in range(1, end + 1, SPAN):
        if con.execute(_FIRST_POSITION_SQL, (lo,)).fetchone()[0] != lo:
            raise _NotProven(f"no event at position {lo}")
        yield "chain", lo, min(lo + SPAN, end + 1)


def _receipt_ranges(con: sqlite3.Connection) -> Iterator[Range]:
    low, lo = con.execute("SELECT min(rowid) FROM receipts").fetchone()[0], None
    while low is not None and low + SPAN <= _MAX_ROWID:
        cut = con.execute(_FIRST_RECEIPT_SQL, (low + SPAN,)).fetchone()[0]
        if cut is None:
            break
        yield "receipts", lo, cut
        lo = low = cut
    yield "receipts", lo, None


def _work(job: _Job, pipe: Pipe, ours: list[Pipe]) -> None:
    """A worker: its own connection and read transaction, begun at once (the parent's connections are never used
    after the fork), then one range per message until told None, or until the parent is gone (its ends of the
    pipes, ``ours``, are closed here so that only the parent holds them). Ctrl-C is the parent's to handle: it kills
    the workers."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for end in ours:
        end.close()
    con: sqlite3.Connection | None = None
    try:
        job.db.engine.dispose(close=False)
        pooled = job.db.engine.raw_connection()  # kept referenced: released, the pool would roll it back
        con = pooled.driver_connection  # type: ignore[assignment]
        assert con is not None
        con.execute("BEGIN")
        same = tuple(con.execute(_IDENTITY_SQL).fetchone()) == job.identity
    except Exception:  # noqa: BLE001 - the parent falls back to the sequential checks
        same = False
    try:
        pipe.send(0 if same else None)
        while same and (task := pipe.recv()) is not None:
            pipe.send(_run(con, job, task))
    except (EOFError, OSError):  # the parent is gone
        pass


def _run(con: Any, job: _Job, task: Range) -> int | None:
    """One range: the tasks it rebuilt (0 for the chain and receipts), or None if anything in it did not hold."""
    try:
        kind, lo, hi = task
        if kind == "chain":
            return 0 if _chain_holds(con, job, lo, hi) else None
        if kind == "receipts":
            return 0 if _receipts_hold(con, job.end, lo, hi) else None
        return _streams_hold(con, job.store, lo, hi)
    except Exception:  # noqa: BLE001 - a damaged page, an edited value: the sequential checks report it
        return None


def _chain_holds(con: sqlite3.Connection, job: _Job, lo: int, hi: int) -> bool:
    """Positions ``lo``…``hi - 1`` are all there and each links to its predecessor's stored hash."""
    row = con.execute(_PREDECESSOR_SQL, (lo,)).fetchone() if lo > 1 else None
    expected, prev = (row[0] + 1, row[1]) if row else (1, GENESIS_HASH)
    compare, keyed_from = hmac.compare_digest, job.keyed_from
    keyed: Link = job.key.link if job.key is not None else legacy_link  # no key: keyed_from is past the end
    for pos, stream_id, version, event_type, schema_v, data, meta, at, stored in con.execute(_CHAIN_SQL, (lo, hi)):
        if pos != expected:
            return False
        link = keyed if pos >= keyed_from else legacy_link
        if not compare(link(prev, pos, stream_id, version, event_type, schema_v, data, meta, at), stored):
            return False
        prev, expected = stored, pos + 1
    return expected == hi


def _receipts_hold(con: sqlite3.Connection, end: int, lo: int | None, hi: int | None) -> bool:
    """Every receipt of rowids ``lo``…``hi - 1`` (None: no bound) names events within the log that carry its
    command. Its JSON is read as the sequential check reads it (``_receipt_loads``: json's semantics)."""
    sql, args = _RECEIPTS_SQL, list[int]()
    if lo is not None:
        sql, args = sql + " AND r.rowid >= ?", [*args, lo]
    if hi is not None:
        sql, args = sql + " AND r.rowid < ?", [*args, hi]
    for key, task_id, first_pos, last_pos, result, first_stream, last_stream, version, meta in con.execute(sql, args):
        if max(first_pos, last_pos) > end or receipt_problem(task_id, first_pos, last_pos, result, first_stream,
                                                              last_stream, version, meta, key, _receipt_loads):
            return False
    return True


def _receipt_loads(text: str) -> Any:
    """json.loads, as the sequential check reads a receipt, for what receipt_problem reads of it (an object's
    "command_id" and "revision"), at orjson's speed: orjson refuses some texts json reads (NaN, lone surrogates) and
    reads an integer wider than 64 bits as a float; json reads those. (projections._loads is exact for any value,
    but its scan for wide numbers costs five times orjson's parse: 16 us a receipt.)"""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)
    if isinstance(value, dict) and isinstance(value.get("revision"), float):
        return json.loads(text)
    return value


def _streams_hold(con: sqlite3.Connection, store: EventStore, lo: str, hi: str) -> int | None:
    """Fold the task streams in [lo, hi) and merge them with the stored tasks of the same ids: the number of tasks,
    or None if one does not fold, differs from its stored row, or a stored row has no events."""
    low = "" if lo == TASK_PREFIX else lo[len(TASK_PREFIX):]
    if hi == _STREAM_END:
        stored = con.execute(_TASKS_SQL.format(upper=""), (low,))
    else:
        stored = con.execute(_TASKS_SQL.format(upper="AND task_id < ? "), (low, hi[len(TASK_PREFIX):]))
    count = 0
    for task in fold_streams(store, con.execute(_STREAMS_SQL, (lo, hi))):
        row = stored.fetchone()
        if row is None or row[0] != task.task_id or not _same(task, row):
            return None
        count += 1
    return count if stored.fetchone() is None else None


def _same(task: RebuiltTask, row: tuple[Any, ...]) -> bool:
    """No drift, by projections.py's own conditions: the task folds, its stored row is not ahead of its events, and
    the stored document is the canonical text of the rebuilt one (so it parses to the same document, with the same
    revision) with the same columns."""
    doc = task.doc
    return (task.problem is None and row[8] <= task.last_pos and row[7] == canonical_json(doc)
            and (row[1], row[2], row[3], row[4], row[5], row[6])
            == (doc["state"], doc["revision"], doc["round"], doc["parent"], doc["root"], doc["recipient"]))


class _Background:
    """A call in a thread; ``wait`` returns its result (None if it raised: the sequential checks report why)."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._result: Any = None
        self._thread = threading.Thread(target=self._call, args=(fn,), daemon=True)
        self._thread.start()

    def _call(self, fn: Callable[[], Any]) -> None:
        try:
            self._result = fn()
        except Exception:  # noqa: BLE001 - DatabaseCorrupt and the like
            self._result = None

    def wait(self) -> Any:
        """Joins the thread (never called on a BaseException: Ctrl-C does not wait for the check)."""
        self._thread.join()
        return self._result
