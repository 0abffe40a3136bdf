"""`taskkernel verify`: walk the hash chain and rebuild every projection from events."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from kernel.projections import compare_tasks, rebuild_tasks, repair_tasks
from kernel.store.db import Database
from kernel.store.events import EventStore, verify_chain
from kernel.store.schema import events


@dataclass
class VerifyReport:
    events: int = 0
    tasks: int = 0
    problems: list[dict[str, Any]] = field(default_factory=list)
    repaired: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def first_broken_position(self) -> int | None:
        return min((p["position"] for p in self.problems), default=None)

    def as_json(self) -> dict[str, Any]:
        return {"status": "ok" if self.ok else "broken", "first_broken_position": self.first_broken_position,
                "events": self.events, "tasks": self.tasks, "problems": self.problems, "repaired": self.repaired}


def verify(db: Database, store: EventStore, *, repair: bool = False) -> VerifyReport:
    report = VerifyReport()
    with db.read() as conn:
        report.events = conn.execute(sa.select(sa.func.count()).select_from(events)).scalar() or 0
        brk = verify_chain(store, conn)
        if brk is not None:
            report.problems.append({"kind": "hash_chain", "position": brk.global_pos, "detail": brk.detail})
        rebuilt, last_pos = rebuild_tasks(store, conn)
        report.tasks = len(rebuilt)
        drifts = compare_tasks(conn, rebuilt, last_pos)
    if drifts and repair and brk is None:
        with db.write() as uow:
            report.repaired = repair_tasks(uow.conn, rebuilt, last_pos)
        drifts = []
    report.problems.extend({"kind": "projection", "position": d.position, "task_id": d.task_id,
                            "detail": d.detail} for d in drifts)
    report.problems.sort(key=lambda p: p["position"])
    return report
