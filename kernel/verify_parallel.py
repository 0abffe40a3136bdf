"""The parallel proof of a sound SQLite store, for `taskkernel verify` (kernel/verify.py) on large stores.

Every check splits by key range. A chain link needs only its event and the stored hash of its predecessor, so the
chain splits by position; receipts split by rowid; task streams by stream id, each range folded and merged with the
stored tasks of the same ids (their order is the streams' order), which also finds the stored tasks no event backs.
Forked worker processes take ranges from a queue, each in one read transaction of its own, while this process runs
SQLite's integrity check in a thread (SQLite releases the GIL).

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
import multiprocessing
import os
import sqlite3
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy.engine import Connection

from taskkernel.kernel.canonical import canonical_json
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
_PREDECESSOR_SQL = ("SELECT global_pos, hash FROM events WHERE global_pos >= 1 AND global_pos < ? "
                    "ORDER BY global_pos DESC LIMIT 1")
_CHAIN_SQL = ("SELECT global_pos, stream_id, stream_version, event_type, schema_version, data, meta, recorded_at, "
              "hash FROM events WHERE global_pos >= ? AND global_pos < ? ORDER BY global_pos")
_RECEIPTS_SQL = ("SELECT r.idempotency_key, r.task_id, r.first_pos, r.last_pos, r.result, f.stream_id, l.stream_id, "
                 "l.stream_version, l.meta FROM receipts AS r "
                 "LEFT OUTER JOIN events AS f ON f.global_pos = r.first_pos "
                 "LEFT OUTER JOIN events AS l ON l.global_pos = r.last_pos WHERE r.rowid >= ? AND r.rowid < ?")
_STREAMS_SQL = ("SELECT global_pos, stream_id, stream_version, event_type, schema_version, data, recorded_at "
                "FROM events WHERE stream_id >= ? AND stream_id < ? ORDER BY stream_id, stream_version")
_TASKS_SQL = ("SELECT task_id, state, revision, round, parent, root, recipient, doc, last_pos FROM tasks "
              "WHERE task_id >= ? {upper}ORDER BY task_id")

Range = tuple[str, Any, Any]  # (kind, low, high): chain positions, receipt rowids or stream ids, high excluded


@dataclass(frozen=True)
class Proven:
    """What verify reports of a store the parallel proof found sound, read in the proof's snapshot."""

    events: int
    tasks: int
    chain: str  # the chain's algorithm
    head: dict[str, Any] | None  # {"position", "hash"}


@dataclass(frozen=True)
class _Job:
    """What every worker needs, inherited through the fork (the chain key never crosses a pipe)."""

    db: Database
    store: EventStore
    key: ChainKey | None
    keyed_from: int  # first position linked with the key (past the log's end: every link is legacy)
    end: int  # the log's last position in the parent's snapshot
    identity: tuple[Any, ...]  # the head row and log end the parent's snapshot saw


_job: _Job | None = None
_con: Any = None  # a worker's pooled connection (kept referenced: released, the pool would roll it back)


def default_workers() -> int:
    """One per CPU this process may use, at most MAX_WORKERS (a bound on the processes and connections one verify
    opens)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(cpus, MAX_WORKERS)


def prove_in_parallel(db: Database, store: EventStore, workers: int) -> Proven | None:
    """The figures of a store every check passes, proven by ``workers`` processes; None if anything did not hold
    or the store is not proven this way (PostgreSQL, one CPU, a small store, a process running threads, such as a
    server: workers are forked): the caller runs the sequential checks."""
    if (db.dialect != "sqlite" or workers < 2 or "fork" not in multiprocessing.get_all_start_methods()
            or threading.active_count() > 1):  # a fork copies no thread: a lock another thread held stays taken
        return None
    try:
        return _prove(db, store, workers)
    except Exception:  # noqa: BLE001 - a damaged page, an edited value: the sequential checks report it
        return None


def _prove(db: Database, store: EventStore, workers: int) -> Proven | None:
    """Workers are forked while this process holds its read transaction, and it holds it until they are done: SQLite
    in a forked child shares the parent's record of the locks it holds, so a worker's lock on the WAL frames of the
    same snapshot is the parent's, which must stay taken. (A worker that read another snapshot answers None.)"""
    global _job
    with db.snapshot() as conn:
        end, _ = log_end(conn)
        chain = _sound_chain(db, conn) if end >= PARALLEL_FROM else None
        if chain is None:
            return None
        record, head = read_record(conn), read_head(conn)
        identity = tuple(conn.exec_driver_sql(_IDENTITY_SQL).one())
        ranges = _ranges(conn.connection.driver_connection, end)  # type: ignore[arg-type]
        _job = _Job(db, store, *chain, end, identity)
        try:
            pool = multiprocessing.get_context("fork").Pool(workers, initializer=_open)
        finally:
            _job = None  # the workers hold their copy
        integrity = _Background(db.integrity_problems)  # started after the fork: no worker inherits a thread
        try:
            with pool:
                tasks = _gather(pool.imap_unordered(_run, ranges))
        finally:
            findings = integrity.wait()
        # the chain's ranges found every position from 1 to the end, once each (the positions are the key): the
        # events counted are those and any row below position 1 (which no link covers)
        count = end + (conn.exec_driver_sql(_BELOW_ONE_SQL).scalar() or 0)
    if findings != [] or tasks is None:
        return None
    return Proven(count, tasks, record.algorithm, {"position": head.pos, "hash": head.hash} if head else None)


def _gather(results: Iterable[int | None]) -> int | None:
    tasks = 0
    for result in results:
        if result is None:
            return None  # leaving the pool's block terminates the other workers
        tasks += result
    return tasks


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


def _ranges(con: sqlite3.Connection, end: int) -> list[Range]:
    """Every range of every check, interleaved so that the workers share each kind; the task streams are cut at
    every so many stored tasks (the cuts only balance the work: the ranges cover every stream id)."""
    bounds = [TASK_PREFIX]
    step = max(1, SPAN // 6)  # about six events per task
    for i, (task_id,) in enumerate(con.execute("SELECT task_id FROM tasks ORDER BY task_id")):
        if i and i % step == 0 and isinstance(task_id, str):
            bounds.append(TASK_PREFIX + task_id)
    bounds.append(_STREAM_END)
    streams = [("streams", lo, hi) for lo, hi in zip(bounds, bounds[1:], strict=False) if lo < hi]
    chain = [("chain", lo, min(lo + SPAN, end + 1)) for lo in range(1, end + 1, SPAN)]
    low, high = con.execute("SELECT min(rowid), max(rowid) FROM receipts").fetchone()
    receipts = [] if low is None else [("receipts", lo, lo + SPAN) for lo in range(low, high + 1, SPAN)]
    out: list[Range] = []
    for i in range(max(len(streams), len(chain), len(receipts))):
        out.extend(kind[i] for kind in (streams, chain, receipts) if i < len(kind))
    return out


def _open() -> None:
    """A worker's own connection and read transaction (the parent's connections are never used after the fork).
    Never raises: a pool would start another worker in its place, forever; ``_run`` answers None instead."""
    global _con
    try:
        assert _job is not None
        _job.db.engine.dispose(close=False)
        _con = _job.db.engine.raw_connection()
        _con.driver_connection.execute("BEGIN")
    except Exception:  # noqa: BLE001
        _con = None


def _run(task: Range) -> int | None:
    """One range: the tasks it rebuilt (0 for the chain and receipts), or None if anything in it did not hold."""
    if _job is None or _con is None:
        return None
    con: sqlite3.Connection = _con.driver_connection
    if tuple(con.execute(_IDENTITY_SQL).fetchone()) != _job.identity:
        return None
    kind, lo, hi = task
    if kind == "chain":
        return 0 if _chain_holds(con, _job, lo, hi) else None
    if kind == "receipts":
        return 0 if _receipts_hold(con, _job.end, lo, hi) else None
    return _streams_hold(con, _job.store, lo, hi)


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


def _receipts_hold(con: sqlite3.Connection, end: int, lo: int, hi: int) -> bool:
    """Every receipt of rowids ``lo``…``hi - 1`` names events within the log that carry its command."""
    for key, task_id, first_pos, last_pos, result, first_stream, last_stream, version, meta in con.execute(
            _RECEIPTS_SQL, (lo, hi)):
        if max(first_pos, last_pos) > end or receipt_problem(task_id, first_pos, last_pos, result, first_stream,
                                                              last_stream, version, meta, key, orjson.loads):
            return False
    return True


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
        self._thread.join()
        return self._result
