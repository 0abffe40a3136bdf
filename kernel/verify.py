"""`taskkernel verify`: prove the store. SQLite's integrity check first (nothing else can be trusted on a
damaged file), then the hash chain with the workspace's key, then every projection rebuilt from events.
``--repair`` rebuilds projections only, and never while the chain is unproven: a rewrite that recomputed
the chain would otherwise be copied into the read model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from kernel.projections import compare_tasks, rebuild_tasks, repair_tasks
from kernel.store.chain import read_record
from kernel.store.db import Database, DatabaseCorrupt, is_corruption
from kernel.store.events import EventStore, verify_chain
from kernel.store.schema import events

DATABASE_CORRUPT = "database_corrupt"
# The chain is not proven: nothing derived from events may be trusted, so --repair refuses.
CHAIN_REASONS = frozenset({"hash_chain", "chain_key_missing", "chain_key_mismatch", "chain_unkeyed"})


@dataclass
class VerifyReport:
    events: int = 0
    tasks: int = 0
    chain: str | None = None  # sha256 (legacy) or hmac-sha256, as the store records it
    problems: list[dict[str, Any]] = field(default_factory=list)
    repaired: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def first_broken_position(self) -> int | None:
        return min((p["position"] for p in self.problems), default=None)

    @property
    def reason(self) -> str | None:
        """The most fundamental problem: a damaged file, then an unproven chain, then the earliest drift."""
        def rank(p: dict[str, Any]) -> tuple[int, int]:
            return (0 if p["reason"] == DATABASE_CORRUPT else 1 if p["reason"] in CHAIN_REASONS else 2,
                    p["position"])
        return min(self.problems, key=rank)["reason"] if self.problems else None

    @property
    def chain_broken(self) -> bool:
        return any(p["reason"] in CHAIN_REASONS or p["reason"] == DATABASE_CORRUPT for p in self.problems)

    def add(self, kind: str, reason: str, position: int, detail: str, **extra: Any) -> None:
        self.problems.append({"kind": kind, "reason": reason, "position": position, "detail": detail, **extra})
        self.problems.sort(key=lambda p: p["position"])

    def as_json(self) -> dict[str, Any]:
        return {"status": "ok" if self.ok else "broken", "reason": self.reason,
                "first_broken_position": self.first_broken_position, "events": self.events, "tasks": self.tasks,
                "chain": self.chain, "problems": self.problems, "repaired": self.repaired}


def corrupt_report(detail: str) -> VerifyReport:
    report = VerifyReport()
    report.add("database", DATABASE_CORRUPT, 0, detail)
    return report


def verify(db: Database, store: EventStore, *, repair: bool = False) -> VerifyReport:
    try:
        return _verify(db, store, repair)
    except DatabaseCorrupt as exc:
        return corrupt_report(str(exc))
    except sa.exc.DatabaseError as exc:  # a damaged page met while reading events or read models
        if is_corruption(exc):
            return corrupt_report(f"{db.url}: {exc.orig}")
        raise


def _verify(db: Database, store: EventStore, repair: bool) -> VerifyReport:
    findings = db.integrity_problems()
    if findings:
        return corrupt_report("integrity_check: " + "; ".join(findings[:5]))
    report = VerifyReport()
    with db.read() as conn:
        report.events = conn.execute(sa.select(sa.func.count()).select_from(events)).scalar() or 0
        report.chain = read_record(conn).algorithm
        brk = verify_chain(store, conn, db.chain)
        if brk is not None:
            report.add("hash_chain", brk.reason, brk.global_pos, brk.detail)
        rebuilt, last_pos = rebuild_tasks(store, conn)
        report.tasks = len(rebuilt)
        drifts = compare_tasks(conn, rebuilt, last_pos)
    if drifts and repair and brk is None:
        with db.write() as uow:
            report.repaired = repair_tasks(uow.conn, rebuilt, last_pos)
        drifts = []
    for d in drifts:
        report.add("projection", "projection_drift", d.position, d.detail, task_id=d.task_id)
    return report
