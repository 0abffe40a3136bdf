"""Background work (summaries, patrols) with a lifecycle of its own.

- single-flight per subject: at most one job runs for a subject at a time;
- debounced: a burst of requests becomes one run, `debounce` seconds after the last request
  (but never later than `max_wait` after the first, so a busy subject is not starved);
- a result computed against an older revision of its task is discarded at commit
  (`stale_result`) instead of overwriting newer state; the subject is re-requested.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

import sqlalchemy as sa

from taskkernel.kernel.canonical import canonical_json, utc_now_iso
from taskkernel.kernel.store.db import Database
from taskkernel.kernel.store.schema import background_jobs as jobs
from taskkernel.kernel.store.schema import metadata, tasks


class BackgroundOutcome(StrEnum):
    STORED = "stored"
    STALE_RESULT = "stale_result"
    LEASE_LOST = "lease_lost"



def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class Job:
    subject: str
    task_id: str
    fencing: int
    based_on_revision: int


class BackgroundJobs:
    def __init__(self, db: Database, *, debounce: float = 2.0, max_wait: float = 30.0, lease: float = 300.0
                 ) -> None:
        self.db = db
        self.debounce = timedelta(seconds=debounce)
        self.max_wait = timedelta(seconds=max_wait)
        self.lease = timedelta(seconds=lease)
        db.create_schema(metadata)

    def request(self, subject: str, task_id: str, now: datetime | None = None) -> None:
        t = now or datetime.now(UTC)
        with self.db.write() as uow:
            row = uow.conn.execute(sa.select(jobs).where(jobs.c.subject == subject)).first()
            if row is None:
                uow.conn.execute(jobs.insert().values(subject=subject, task_id=task_id, state="scheduled",
                                                      first_requested=_iso(t), not_before=_iso(t + self.debounce)))
            elif row.state == "running":
                uow.conn.execute(jobs.update().where(jobs.c.subject == subject).values(rerun=True))
            else:
                first = row.first_requested if row.state == "scheduled" else _iso(t)
                cap = datetime.strptime(first, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC) + self.max_wait
                uow.conn.execute(jobs.update().where(jobs.c.subject == subject).values(
                    state="scheduled", first_requested=first, not_before=_iso(min(t + self.debounce, cap))))

    def claim_due(self, now: datetime | None = None) -> list[Job]:
        """Start every due job whose subject is not already running (single flight)."""
        t = now or datetime.now(UTC)
        stamp = _iso(t)
        due = sa.or_(sa.and_(jobs.c.state == "scheduled", jobs.c.not_before <= stamp),
                     sa.and_(jobs.c.state == "running", jobs.c.lease_until < stamp))
        out: list[Job] = []
        with self.db.write() as uow:
            for row in uow.conn.execute(sa.select(jobs).where(due)).all():
                revision = uow.conn.execute(sa.select(tasks.c.revision).where(tasks.c.task_id == row.task_id)
                                            ).scalar() or 0
                uow.conn.execute(jobs.update().where(jobs.c.subject == row.subject).values(
                    state="running", fencing=row.fencing + 1, lease_until=_iso(t + self.lease),
                    based_on_revision=revision, rerun=False))
                out.append(Job(row.subject, row.task_id, row.fencing + 1, revision))
        return out

    def commit(self, job: Job, result: Any) -> BackgroundOutcome:
        """Store the result only if the task is still at the revision it was computed from."""
        with self.db.write() as uow:
            row = uow.conn.execute(sa.select(jobs).where(jobs.c.subject == job.subject)).first()
            if row is None or row.fencing != job.fencing or row.state != "running":
                return BackgroundOutcome.LEASE_LOST
            current = uow.conn.execute(sa.select(tasks.c.revision).where(tasks.c.task_id == job.task_id)
                                       ).scalar() or 0
            if current != job.based_on_revision:
                uow.conn.execute(jobs.update().where(jobs.c.subject == job.subject).values(
                    state="scheduled", not_before=utc_now_iso(), first_requested=utc_now_iso(),
                    discarded=row.discarded + 1, lease_until=None))
                return BackgroundOutcome.STALE_RESULT
            next_state = "scheduled" if row.rerun else "idle"
            uow.conn.execute(jobs.update().where(jobs.c.subject == job.subject).values(
                state=next_state, result=canonical_json(result), result_revision=current, lease_until=None,
                not_before=utc_now_iso() if row.rerun else None, first_requested=utc_now_iso() if row.rerun else None))
            return BackgroundOutcome.STORED

    def run_due(self, compute: Callable[[Job], Any], now: datetime | None = None) -> dict[str, BackgroundOutcome]:
        return {job.subject: self.commit(job, compute(job)) for job in self.claim_due(now)}

    def result(self, subject: str) -> tuple[Any, int | None]:
        with self.db.read() as conn:
            row = conn.execute(sa.select(jobs.c.result, jobs.c.result_revision).where(jobs.c.subject == subject)
                               ).first()
        return (json.loads(row.result), row.result_revision) if row and row.result else (None, None)
