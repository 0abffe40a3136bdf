"""Schedule management: add, list, show, pause, resume, remove, backfill, preview.

Every change bumps the schedule's revision (so a concurrent tick's compare-and-set fails instead
of overwriting it) and, on PostgreSQL, notifies the other coordinators.

A schedule whose stored definition cannot be read or computed (``ScheduleRow.error``, or set aside by a
pass) is still listed, shown, paused and removed; ``next``, ``backfill`` and ``resume`` refuse it
(``schedule_invalid``).

A change made for a caller (``by``: its principal, from its credential) is authorized by
``taskkernel.scheduler.authority`` on the row it writes, inside the transaction; ``by=None`` is the process's
own wiring (the demo, tests), which holds no credential to check.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from taskkernel.kernel.canonical import canonical_json
from taskkernel.kernel.model.principal import Principal
from taskkernel.scheduler.authority import check_create, check_manage
from taskkernel.scheduler.inputs import KnownRoles, check_inputs
from taskkernel.scheduler.ledger import Ledger, ScheduleRow
from taskkernel.scheduler.models import (
    MAX_BACKFILL,
    MAX_INSTANT,
    MIN_INSTANT,
    SET_ASIDE,
    Kind,
    OccurrenceState,
    ScheduleError,
    SchedulerException,
    ScheduleSpec,
)
from taskkernel.scheduler.tables import occurrence, occurrence_conflict, schedule, schedule_fault
from taskkernel.scheduler.triggers import Trigger, db_time, from_db_time, iso_z

_MICRO = timedelta(microseconds=1)


class Schedules:
    def __init__(self, ledger: Ledger, roles: KnownRoles | None = None) -> None:
        """``roles``: the team's (the kernel's role registry); given, ``add`` refuses a schedule whose owner or
        template names a role the team does not have (``unknown_role``): its every fire would be refused."""
        self.ledger = ledger
        self.db = ledger.db
        self.roles = roles

    # -- reading ----------------------------------------------------------------------------------

    def _find(self, conn: Connection, name: str, *, lock: bool = False) -> Any:
        sel = sa.select(schedule).where(schedule.c.name == name, schedule.c.removed_utc.is_(None))
        if lock and self.db.is_postgres:
            sel = sel.with_for_update()
        row = conn.execute(sel).first()
        if row is None:
            raise SchedulerException(ScheduleError.SCHEDULE_NOT_FOUND, f"no schedule named {name!r}")
        return row

    def get(self, name: str) -> ScheduleRow:
        with self.db.read() as conn:
            return ScheduleRow.load(self._find(conn, name))

    def all(self) -> list[ScheduleRow]:
        with self.db.read() as conn:
            rows = conn.execute(sa.select(schedule).where(schedule.c.removed_utc.is_(None))
                                .order_by(schedule.c.name)).all()
        return [ScheduleRow.load(r) for r in rows]

    def trigger(self, s: ScheduleRow) -> Trigger:
        """The schedule's trigger, or ``schedule_invalid`` when its definition cannot be computed."""
        if s.error is not None:
            raise _invalid(s.name, s.error)
        try:
            return self.ledger.triggers.get(s)
        except SchedulerException as exc:
            raise _invalid(s.name, exc.message) from None
        except Exception as exc:  # noqa: BLE001 - stored data, whatever it holds, is a refusal here
            raise _invalid(s.name, f"{type(exc).__name__}: {exc}") from None

    def upcoming(self, s: ScheduleRow, now: datetime, count: int) -> list[dict[str, Any]]:
        """The next ``count`` nominal occurrences after both the watermark and ``now``."""
        trig = self.trigger(s)
        try:
            return [self._occ_view(trig, n) for n in trig.preview(s.watermark, now, count)]
        except (OverflowError, ValueError) as exc:
            raise _invalid(s.name, f"{type(exc).__name__}: {exc}") from None

    @staticmethod
    def _occ_view(trig: Trigger, n: datetime) -> dict[str, Any]:
        key = trig.key(n)
        return {"dedup_key": key, "nominal": iso_z(n), "local": trig.local(n), "due": iso_z(trig.due(n, key))}

    def outcomes(self, s: ScheduleRow, limit: int = 10) -> list[dict[str, Any]]:
        """The latest ``limit`` decided occurrences (fired, missed, duplicates), newest first."""
        with self.db.read() as conn:
            # Keys of one schedule sort chronologically (wall keys: except inside a DST fold), so the
            # primary key finds the latest rows without an extra index on every claim.
            occ = conn.execute(sa.select(occurrence).where(occurrence.c.schedule_id == s.id)
                               .order_by(occurrence.c.occurrence_key.desc()).limit(limit + 1)).all()
            dup = conn.execute(sa.select(occurrence_conflict).where(occurrence_conflict.c.schedule_id == s.id)
                               .order_by(occurrence_conflict.c.nominal_utc.desc()).limit(limit)).all()
        items = [{
            "dedup_key": r.occurrence_key, "nominal": _out(r.nominal_utc), "state": r.state, "reason": r.reason,
            "attempt": r.attempt, "fired_at": _out(r.fired_utc), "finished_at": _out(r.finished_utc),
            "run_ref": r.run_ref, "detail": r.detail,
        } for r in occ]
        items += [{"dedup_key": r.occurrence_key, "nominal": _out(r.nominal_utc), "state": "missed",
                   "reason": r.reason} for r in dup]
        items.sort(key=lambda i: i["nominal"], reverse=True)
        return items[:limit]

    def faults(self, s: ScheduleRow, limit: int = 10) -> list[dict[str, Any]]:
        """Why the schedule was set aside, newest first (``schedule show`` → ``faults``)."""
        with self.db.read() as conn:
            rows = conn.execute(sa.select(schedule_fault).where(schedule_fault.c.schedule_id == s.id)
                                .order_by(schedule_fault.c.recorded_utc.desc()).limit(limit)).all()
        return [{"reason": r.reason, "at": _out(r.recorded_utc), "error": r.error, "by": r.by} for r in rows]

    def view(self, s: ScheduleRow) -> dict[str, Any]:
        if s.error is not None:  # the definition does not read: what the row itself holds, and why
            return {
                "name": s.name, "id": s.id, "kind": s.spec.kind.value, "spec": s.spec.spec, "tz": s.spec.tz,
                "misfire": None, "catchup_window": None, "catchup_max": None, "grace": None, "overlap": None,
                "jitter": None, "dst": None, "paused": s.paused, "pause_reason": s.pause_reason,
                "watermark": iso_z(s.watermark), "next_due": iso_z(s.next_due) if s.next_due else None,
                "revision": s.revision, "no_progress": s.no_progress, "owner_role": s.spec.owner_role,
                "created_by": s.spec.created_by.model_dump(mode="json") if s.spec.created_by else None,
                "action": None, "error": s.error,
            }
        return {
            "name": s.name, "id": s.id, "kind": s.spec.kind.value, "spec": s.spec.spec, "tz": s.spec.tz,
            "misfire": s.spec.misfire.value, "catchup_window": s.spec.catchup_window,
            "catchup_max": s.spec.catchup_max, "grace": s.spec.grace, "overlap": s.spec.overlap.value,
            "jitter": s.spec.jitter, "dst": s.spec.dst, "paused": s.paused, "pause_reason": s.pause_reason,
            "watermark": iso_z(s.watermark), "next_due": iso_z(s.next_due) if s.next_due else None,
            "revision": s.revision, "no_progress": s.no_progress, "owner_role": s.spec.owner_role,
            "created_by": s.spec.created_by.model_dump(mode="json") if s.spec.created_by else None,
            "action": {"type": s.spec.action.type.value,
                       **s.spec.action.model_dump(mode="json", exclude_defaults=True)} if s.spec.action else None,
        }

    # -- changing ---------------------------------------------------------------------------------

    def add(self, spec: ScheduleSpec, now: datetime, by: Principal | None = None) -> ScheduleRow:
        self.add_many([spec], now, by)
        return self.get(spec.name)

    def add_many(self, specs: list[ScheduleSpec], now: datetime, by: Principal | None = None) -> None:
        """Add schedules in one transaction (all or none), each recording ``by`` as its creator."""
        if by is not None:
            specs = [check_create(by, spec) for spec in specs]
        for spec in specs:
            check_inputs(spec, self.roles)
        # Nominal occurrences at or after the creation instant belong to the schedule.
        watermark = now - _MICRO
        rows = []
        for spec in specs:
            if spec.action is None:
                raise SchedulerException(ScheduleError.INVALID_ACTION, f"schedule {spec.name!r} needs an action")
            sid = "sch_" + uuid.uuid4().hex[:16]
            try:
                definition = canonical_json(spec.definition())
                trig = self.ledger.triggers.for_row(sid, definition, db_time(now))
                first = trig.next_after(watermark)
                first_due = db_time(trig.due(first)) if first else None
            except SchedulerException:
                raise
            except (ValueError, OverflowError) as exc:  # checked by the models; kept so nothing unbounded is stored
                raise SchedulerException(ScheduleError.INVALID_SPEC,
                                         f"schedule {spec.name!r} cannot be stored: {exc}") from exc
            rows.append({
                "id": sid, "name": spec.name, "kind": spec.kind.value, "spec": spec.spec, "tz": spec.tz,
                "definition": definition, "created_utc": db_time(now),
                "watermark_utc": db_time(watermark), "next_due_utc": first_due,
                "revision": 0,
            })
        names = [spec.name for spec in specs]
        if len(set(names)) != len(names):
            raise SchedulerException(ScheduleError.SCHEDULE_EXISTS, "duplicate names in one batch")
        with self.ledger.tx() as conn:
            taken = conn.execute(sa.select(schedule.c.name).where(
                schedule.c.name.in_(names), schedule.c.removed_utc.is_(None))).scalars().all()
            if taken:
                raise SchedulerException(ScheduleError.SCHEDULE_EXISTS, f"a schedule named {taken[0]!r} exists")
            conn.execute(schedule.insert(), rows)
            self.ledger.notify(conn)

    def _authorize(self, row: Any, by: Principal | None, verb: str) -> None:
        if by is not None:  # a definition that does not read is judged by its stand-in's recorded authority
            check_manage(by, ScheduleRow.load(row).spec, verb)

    def pause(self, name: str, now: datetime, by: Principal | None = None) -> ScheduleRow:
        return self._set_paused(name, now, by, paused=True)

    def resume(self, name: str, now: datetime, by: Principal | None = None) -> ScheduleRow:
        return self._set_paused(name, now, by, paused=False)

    def _set_paused(self, name: str, now: datetime, by: Principal | None, *, paused: bool) -> ScheduleRow:
        with self.ledger.tx() as conn:
            row = self._find(conn, name, lock=True)
            self._authorize(row, by, "pause" if paused else "resume")
            if not paused and row.paused:
                # Occurrences that came due during the pause are recorded missed ("paused") before
                # the schedule runs again, so resuming never fires them as a catch-up. A definition that
                # cannot be computed is refused here (schedule_invalid): it stays set aside.
                self.trigger(ScheduleRow.load(row))
                more = True
                while more:
                    _, more = self.ledger.apply_due(conn, [row], "resume", now)
                    row = self._find(conn, name)
            # Pausing a schedule that was set aside keeps the reason: it still needs a valid definition.
            reason = (SET_ASIDE if row.pause_reason == SET_ASIDE else "manual") if paused else None
            conn.execute(schedule.update().where(schedule.c.id == row.id).values(
                paused=int(paused), pause_reason=reason,
                no_progress=0 if not paused else schedule.c.no_progress, revision=schedule.c.revision + 1))
            self.ledger.notify(conn)
        return self.get(name)

    def remove(self, name: str, now: datetime, by: Principal | None = None) -> ScheduleRow:
        """Soft delete: the ledger rows stay for audit; the name can be reused."""
        with self.ledger.tx() as conn:
            row = self._find(conn, name, lock=True)
            self._authorize(row, by, "remove")
            conn.execute(schedule.update().where(schedule.c.id == row.id).values(
                removed_utc=db_time(now), next_due_utc=None, revision=schedule.c.revision + 1))
            self.ledger.notify(conn)
            removed = conn.execute(sa.select(schedule).where(schedule.c.id == row.id)).one()
        return ScheduleRow.load(removed)

    def backfill(self, name: str, start: datetime, end: datetime, now: datetime,
                 max_count: int = 100, by: Principal | None = None) -> dict[str, Any]:
        """Reserve the nominal occurrences in ``[start, end]`` that never fired, for the coordinators
        to run in order. Explicit (a range), bounded (``max_count``), deduplicated (a key that
        already fired is reported, not queued; a missed one is re-queued once)."""
        if not 1 <= max_count <= MAX_BACKFILL:
            raise SchedulerException(ScheduleError.INVALID_RANGE, f"--max must be 1 to {MAX_BACKFILL}")
        if not (MIN_INSTANT <= start < MAX_INSTANT and MIN_INSTANT <= end < MAX_INSTANT):
            raise SchedulerException(ScheduleError.INVALID_RANGE, "the range must lie from 1970-01-01 to 9000-01-01")
        if end < start:
            raise SchedulerException(ScheduleError.INVALID_RANGE, "--to is before --from")
        if end > now:
            raise SchedulerException(ScheduleError.INVALID_RANGE, "backfill covers past occurrences only (--to > now)")
        s = self.get(name)
        if by is not None:  # the rows written below name this schedule's id, so it is the one authorized
            check_manage(by, s.spec, "backfill")
        trig = self.trigger(s)
        # Calendar triggers advance from a nominal date, so walk them from the creation anchor.
        walk_from = s.created - _MICRO if s.spec.kind is Kind.CALENDAR else start - _MICRO
        nominals: dict[str, datetime] = {}
        for n in trig.iter_after(walk_from, end):
            if n >= start:
                nominals.setdefault(trig.key(n), n)
                if len(nominals) > max_count:
                    raise SchedulerException(ScheduleError.BACKFILL_TOO_LARGE,
                                             f"more than {max_count} occurrences in range; narrow it or raise --max")
        now_s = db_time(now)
        queued: list[str] = []
        skipped: list[dict[str, str]] = []
        with self.ledger.tx() as conn:
            existing = {r.occurrence_key: r.state for r in conn.execute(
                sa.select(occurrence.c.occurrence_key, occurrence.c.state).where(
                    occurrence.c.schedule_id == s.id, occurrence.c.occurrence_key.in_(list(nominals))))}
            for key, n in nominals.items():
                state = existing.get(key)
                if state is None:
                    conn.execute(self.ledger.insert(occurrence).values(
                        schedule_id=s.id, occurrence_key=key, nominal_utc=db_time(n), due_utc=db_time(n),
                        state=OccurrenceState.CLAIMED.value, fencing=0, attempt=1, recorded_utc=now_s,
                    ).on_conflict_do_nothing())
                elif state == OccurrenceState.MISSED.value:
                    conn.execute(occurrence.update().where(
                        occurrence.c.schedule_id == s.id, occurrence.c.occurrence_key == key,
                        occurrence.c.state == OccurrenceState.MISSED.value,
                    ).values(state=OccurrenceState.CLAIMED.value, reason=None, recorded_utc=now_s))
                else:
                    skipped.append({"dedup_key": key, "state": state})
                    continue
                queued.append(key)
            self.ledger.notify(conn)
        return {"name": name, "queued": queued, "skipped": skipped}


def _invalid(name: str, error: str) -> SchedulerException:
    return SchedulerException(ScheduleError.SCHEDULE_INVALID,
                              f"schedule {name!r} cannot be computed ({error}); it stays set aside: remove it and add "
                              "it again with values in bounds")


def _out(text: str | None) -> str | None:
    return iso_z(from_db_time(text)) if text else None
