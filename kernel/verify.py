"""`taskkernel verify`: prove the store. SQLite's integrity check first (nothing else can be trusted on a
damaged file), then the hash chain with the workspace's key and its sealed head (the log ends where the last
append left it), then every receipt against the events it names, then every projection rebuilt from events.
``--repair`` rebuilds projections only, and never while the store is unproven: a rewrite that recomputed the
chain, or a log that lost events the read model or a receipt still remembers, would otherwise be copied into
the read model.

Every step streams, so a verify costs constant memory in the size of the store (plus the problems it reports): the
chain is walked in bounded batches, receipts through a streaming cursor, and each task is rebuilt from its events,
compared with its stored row and dropped (kernel/projections.py). On PostgreSQL the checks read one snapshot
(REPEATABLE READ), as SQLite's read transaction does, so a command committed meanwhile is never half seen.

A large SQLite store is first proven in parallel (kernel/verify_parallel.py: every check split by key range over one
worker per CPU, the integrity check beside them); only a store that proof does not find sound goes through the
sequential checks below, which find and word its problems."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from taskkernel.kernel.projections import BATCH, PROJECTION_AHEAD, compare_tasks, iter_rebuilt_tasks, repair_tasks
from taskkernel.kernel.store.chain import read_head, read_record
from taskkernel.kernel.store.db import Database, DatabaseCorrupt, is_corruption
from taskkernel.kernel.store.events import EventStore, log_end, verify_chain
from taskkernel.kernel.store.schema import events, receipts
from taskkernel.kernel.verify_parallel import attempt, default_workers
from taskkernel.kernel.verify_receipts import receipt_problem

DATABASE_CORRUPT = "database_corrupt"
HASH_CHAIN = "hash_chain"
RECEIPT_MISMATCH = "receipt_mismatch"
# The chain is not proven: nothing derived from events may be trusted, so --repair refuses.
CHAIN_REASONS = frozenset({HASH_CHAIN, "chain_key_missing", "chain_key_mismatch", "chain_unkeyed"})
# The chain holds, but a receipt or a stored task remembers more than the log holds (or names events that are not
# its own): the log may have lost events, or a table the chain does not cover was edited. --repair refuses too.
UNPROVEN_REASONS = frozenset({RECEIPT_MISMATCH, PROJECTION_AHEAD})


@dataclass
class VerifyReport:
    events: int = 0
    tasks: int = 0
    chain: str | None = None  # sha256 (legacy) or hmac-sha256, as the store records it
    head: dict[str, Any] | None = None  # the chain head the store records: {"position", "hash"}
    problems: list[dict[str, Any]] = field(default_factory=list)
    repaired: int = 0
    # TASK files of ids the log does not know that are not drift (refused, kept, or waiting for ingest): listed
    # so a person sees every file FCoP readers take for a task; {file, task_id, status}
    unknown_task_files: list[dict[str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def first_broken_position(self) -> int | None:
        return min((p["position"] for p in self.problems), default=None)

    @property
    def reason(self) -> str | None:
        """The most fundamental problem: a damaged file, then an unproven chain, then a receipt or stored task
        the log cannot back, then the earliest drift."""
        def rank(p: dict[str, Any]) -> tuple[int, int]:
            r = p["reason"]
            return (0 if r == DATABASE_CORRUPT else 1 if r in CHAIN_REASONS else 2 if r in UNPROVEN_REASONS else 3,
                    p["position"])
        return min(self.problems, key=rank)["reason"] if self.problems else None

    @property
    def chain_broken(self) -> bool:
        return any(p["reason"] in CHAIN_REASONS or p["reason"] == DATABASE_CORRUPT for p in self.problems)

    @property
    def repair_refused(self) -> bool:
        """--repair may not run: the file, the chain, or the log's completeness is not proven."""
        return self.chain_broken or any(p["reason"] in UNPROVEN_REASONS for p in self.problems)

    def add(self, kind: str, reason: str, position: int, detail: str, **extra: Any) -> None:
        """Keep problems ordered by position, in the order they were found within one position."""
        bisect.insort_right(self.problems, {"kind": kind, "reason": reason, "position": position, "detail": detail,
                                            **extra}, key=lambda p: p["position"])

    def as_json(self) -> dict[str, Any]:
        return {"status": "ok" if self.ok else "broken", "reason": self.reason,
                "first_broken_position": self.first_broken_position, "events": self.events, "tasks": self.tasks,
                "chain": self.chain, "head": self.head, "problems": self.problems, "repaired": self.repaired,
                "unknown_task_files": self.unknown_task_files}


def corrupt_report(detail: str) -> VerifyReport:
    report = VerifyReport()
    report.add("database", DATABASE_CORRUPT, 0, detail)
    return report


def verify(db: Database, store: EventStore, *, repair: bool = False, batch: int = BATCH,
           workers: int | None = None) -> VerifyReport:
    """``batch``: tasks compared (and rows fetched from a cursor) at a time; memory does not grow with the store.
    ``workers``: processes for the parallel proof of a large sound store (default: one per CPU; 1: sequential)."""
    parallel = attempt(db, store, default_workers() if workers is None else workers)
    proven = parallel.proven
    if proven is not None:
        return VerifyReport(events=proven.events, tasks=proven.tasks, chain=proven.chain, head=proven.head)
    try:
        return _verify(db, store, repair, batch, parallel.integrity)
    except DatabaseCorrupt as exc:
        return corrupt_report(str(exc))
    except sa.exc.DatabaseError as exc:  # a damaged page met while reading events or read models
        if is_corruption(exc):
            return corrupt_report(f"{db.url}: {exc.orig}")
        raise


def _verify(db: Database, store: EventStore, repair: bool, batch: int,
            integrity: list[str] | None = None) -> VerifyReport:
    """``integrity``: the integrity check's findings if the parallel proof ran it to its end (not run again)."""
    findings = db.integrity_problems() if integrity is None else integrity
    if findings:
        return corrupt_report("integrity_check: " + "; ".join(findings[:5]))
    report = VerifyReport()
    with db.snapshot() as conn:
        report.events = conn.execute(sa.select(sa.func.count()).select_from(events)).scalar() or 0
        report.chain = read_record(conn).algorithm
        head = read_head(conn)
        report.head = {"position": head.pos, "hash": head.hash} if head is not None else None
        brk = verify_chain(store, conn, db.chain)
        if brk is not None:
            report.add("hash_chain", brk.reason, brk.global_pos, brk.detail)
        _check_receipts(conn, report, batch)
        comparison = compare_tasks(conn, iter_rebuilt_tasks(store, conn, batch), batch)
        report.tasks = comparison.tasks
    drifts = comparison.drifts
    for d in drifts:
        if d.reason == PROJECTION_AHEAD:
            report.add("projection", d.reason, d.position, d.detail, task_id=d.task_id)
    drifts = [d for d in drifts if d.reason != PROJECTION_AHEAD]
    if drifts and repair and not report.repair_refused:
        # rebuilt again under the writer lock, streaming as well: from the log as it is now, so a command
        # committed since the check is not undone
        with db.write() as uow:
            report.repaired = repair_tasks(uow.conn, iter_rebuilt_tasks(store, uow.conn, batch), batch)
        drifts = []
    for d in drifts:
        report.add("projection", d.reason, d.position, d.detail, task_id=d.task_id)
    return report


def _check_receipts(conn: Connection, report: VerifyReport, batch: int = BATCH) -> None:
    """Every receipt must name events that exist, belong to its task's stream and carry its command: a receipt
    past the log's end means the log lost its newest events (hash_chain, where the log now ends plus one); one
    that names another task's or another command's events, or a revision its event does not have, was edited
    (the receipts table is not covered by the chain): receipt_mismatch."""
    end, _ = log_end(conn)
    first, last = events.alias("first"), events.alias("last")
    q = (sa.select(receipts.c.idempotency_key, receipts.c.task_id, receipts.c.first_pos, receipts.c.last_pos,
                   receipts.c.result, first.c.stream_id, last.c.stream_id, last.c.stream_version, last.c.meta)
         .outerjoin(first, first.c.global_pos == receipts.c.first_pos)
         .outerjoin(last, last.c.global_pos == receipts.c.last_pos)
         .order_by(receipts.c.first_pos))
    past_end, first_past_end = 0, ""
    rows = conn.execute(q.execution_options(yield_per=batch))
    for key, task_id, first_pos, last_pos, result, first_stream, last_stream, version, meta in rows:
        shown = key.split("\x1f", 1)[-1]  # the caller's idempotency key, without the principal
        if max(first_pos, last_pos) > end:
            first_past_end = first_past_end if past_end else shown
            past_end += 1
            continue
        problem = receipt_problem(task_id, first_pos, last_pos, result, first_stream, last_stream, version, meta,
                                  key)
        if problem:
            report.add("receipt", RECEIPT_MISMATCH, first_pos, f"receipt {shown!r}: {problem}", task_id=task_id)
    if past_end:
        report.add("receipt", HASH_CHAIN, end + 1, f"{past_end} receipt(s) name events past the log's end "
                   f"(position {end}), e.g. {first_past_end!r}: the newest events were deleted")
