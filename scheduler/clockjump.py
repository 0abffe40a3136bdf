"""Forward clock jumps: a watermark far ahead of the clock is clamped back to now (reason ``clock_jump``).

The watermark only moves forward, so a tick taken while the clock ran ahead (an NTP step, a host
resumed with a wrong clock, a faked time) leaves the watermark and the next due time in the future,
and the schedule stalls until real time catches up - possibly years later. A tick only decides
occurrences that are due, so a watermark more than ``max_clock_skew`` ahead of the clock cannot come
from a correct one: it is set back to now and the clamp is recorded (``schedule_clamp``, a log line).

Never twice per occurrence still holds: dedup keys do not change, an occurrence that fired while the
clock was ahead keeps its row (when real time reaches its key it is a ``duplicate``), and only the
*missed* records after the new watermark - decisions about occurrences that never ran, made on the
wrong clock - are removed, so those occurrences are decided again when they really come due.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from taskkernel.kernel.logging import get_logger
from taskkernel.scheduler.ledger import Ledger, ScheduleFault
from taskkernel.scheduler.models import CLOCK_JUMP, SET_ASIDE, Kind, OccurrenceState, ScheduleError, SchedulerException
from taskkernel.scheduler.tables import occurrence, occurrence_conflict, schedule, schedule_clamp
from taskkernel.scheduler.triggers import Trigger, db_time, from_db_time, iso_z

log = get_logger(__name__)
DEFAULT_MAX_CLOCK_SKEW = timedelta(days=1)
_MICRO = timedelta(microseconds=1)


@dataclass(frozen=True)
class ClockJump:
    schedule_id: str
    name: str
    watermark_from: datetime
    watermark_to: datetime
    reopened: int


def _target(trig: Trigger, created: datetime, now: datetime) -> datetime:
    """Now; for a calendar interval the last nominal instant up to now, because APScheduler advances a
    calendar interval from the previous fire's date and an arbitrary instant would shift its grid."""
    if trig.kind is not Kind.CALENDAR:
        return now
    last = created - _MICRO
    for n in trig.iter_after(last, now):
        last = n
    return last


def clamp_clock_jumps(ledger: Ledger, owner: str, now: datetime, max_skew: timedelta) -> list[ClockJump]:
    """Clamp every live schedule whose watermark is more than ``max_skew`` ahead of ``now``. One whose
    definition cannot be computed is set aside instead (``Ledger.take_set_aside``), as in a pass."""
    limit = db_time(now + max_skew)
    # A watermark ahead implies a next due time further ahead (or none): that term lets the due-time index
    # skip the schedules that are due soon, i.e. nearly all of them. Schedules set aside are left alone.
    ahead = sa.select(schedule).where(
        schedule.c.removed_utc.is_(None), schedule.c.watermark_utc > limit,
        sa.or_(schedule.c.next_due_utc > limit, schedule.c.next_due_utc.is_(None)),
        sa.or_(schedule.c.pause_reason.is_(None), schedule.c.pause_reason != SET_ASIDE))
    with ledger.db.read() as conn:  # the usual answer is "none": find it without taking the writer lock
        if conn.execute(ahead.limit(1)).first() is None:
            return []
    jumps: list[ClockJump] = []
    met: list[ScheduleFault] = []
    with ledger.tx() as conn:
        rows = conn.execute(ledger.locked(ahead)).all()
        for r in rows:
            try:
                trig = ledger.triggers.for_row(r.id, r.definition, r.created_utc)
                to = _target(trig, from_db_time(r.created_utc), now)
                to_s = db_time(to)
                nxt = trig.next_after(to)
                next_due = db_time(trig.due(nxt)) if nxt else None
                w_from = from_db_time(r.watermark_utc)
            except Exception as exc:  # noqa: BLE001 - one schedule's bad data must not stop the others
                fault = ScheduleFault.of(r.id, r.name, exc)
                ledger.set_aside(conn, r.id, fault, now, owner, revision=r.revision)
                met.append(fault)
                continue
            reopened = conn.execute(occurrence.delete().where(
                occurrence.c.schedule_id == r.id, occurrence.c.state == OccurrenceState.MISSED.value,
                occurrence.c.nominal_utc > to_s)).rowcount
            reopened += conn.execute(occurrence_conflict.delete().where(
                occurrence_conflict.c.schedule_id == r.id, occurrence_conflict.c.nominal_utc > to_s)).rowcount
            res = conn.execute(schedule.update().where(schedule.c.id == r.id, schedule.c.revision == r.revision)
                               .values(watermark_utc=to_s, next_due_utc=next_due, revision=schedule.c.revision + 1))
            if res.rowcount != 1:
                raise SchedulerException(ScheduleError.STALE_REVISION, "a schedule changed while it was clamped")
            conn.execute(schedule_clamp.insert().values(
                schedule_id=r.id, recorded_utc=db_time(now), reason=CLOCK_JUMP, watermark_from=r.watermark_utc,
                watermark_to=to_s, reopened=reopened, by=owner))
            jumps.append(ClockJump(r.id, r.name, w_from, to, reopened))
        if jumps:
            ledger.notify(conn)
    ledger.note_set_aside(met)
    for j in jumps:
        log.warning("schedule_clock_jump", reason=CLOCK_JUMP, schedule=j.name, watermark_from=iso_z(j.watermark_from),
                    watermark_to=iso_z(j.watermark_to), reopened=j.reopened, max_skew_s=max_skew.total_seconds())
    return jumps


def recent_clamps(ledger: Ledger, schedule_id: str, limit: int = 10) -> list[dict[str, Any]]:
    """The latest clamps of a schedule, newest first (``schedule show``)."""
    with ledger.db.read() as conn:
        rows = conn.execute(sa.select(schedule_clamp).where(schedule_clamp.c.schedule_id == schedule_id)
                            .order_by(schedule_clamp.c.recorded_utc.desc()).limit(limit)).all()
    return [{"reason": r.reason, "at": iso_z(from_db_time(r.recorded_utc)),
             "watermark_from": iso_z(from_db_time(r.watermark_from)),
             "watermark_to": iso_z(from_db_time(r.watermark_to)), "reopened": r.reopened, "by": r.by} for r in rows]
