"""The durable occurrence ledger: claims, misses, leases and outcomes.

Invariants (docs/scheduler.md, "Guarantees"):
- An occurrence runs only in the coordinator whose ``INSERT ... ON CONFLICT DO NOTHING`` of
  ``(schedule_id, occurrence_key)`` committed; the commit happens before the action starts.
- The watermark advances by compare-and-set on ``schedule.revision`` in the transaction that
  records the occurrences it passes (claimed, waiting or missed), so it never moves backwards and no
  nominal occurrence is decided twice.
- A running occurrence holds a lease with a fencing token. Every later write about it names that
  token, so a holder whose lease expired can change nothing. An expired lease is re-claimed with
  ``attempt + 1`` and a new token only for idempotent actions; otherwise the row becomes ``abandoned``.
- One schedule never stops the others: a schedule whose stored definition cannot be read or computed
  (out of bounds, written by hand or by an older release) is *set aside* in the pass that meets it -
  paused with reason ``invalid``, no next due time, the error recorded in ``schedule_fault``, logged and
  handed to the runtime as a ``ScheduleFault`` (``take_set_aside``) - and the pass goes on with the others.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

import sqlalchemy as sa
from pydantic import ValidationError
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from taskkernel.kernel.logging import get_logger
from taskkernel.kernel.store.db import Database
from taskkernel.scheduler.models import (
    SET_ASIDE,
    Creator,
    Kind,
    MissReason,
    OccurrenceState,
    Overlap,
    ScheduleError,
    SchedulerException,
    ScheduleSpec,
    first_error,
)
from taskkernel.scheduler.policy import CLAIM, WAIT, plan
from taskkernel.scheduler.tables import coordinator, occurrence, occurrence_conflict, schedule, schedule_fault
from taskkernel.scheduler.triggers import Trigger, db_time, from_db_time

log = get_logger(__name__)
NOTIFY_CHANNEL = "taskkernel_schedule"
# Spelled exactly as the partial index's predicate: SQLite uses a partial index only when the query
# repeats its WHERE term literally (a bound parameter cannot prove it).
LIVE = sa.text("occurrence.state IN ('running','claimed')")


@dataclass(frozen=True)
class ScheduleRow:
    id: str
    name: str
    spec: ScheduleSpec
    definition: str
    created: datetime
    paused: bool
    pause_reason: str | None
    watermark: datetime
    next_due: datetime | None
    revision: int
    last_digest: str | None
    no_progress: int
    removed: bool
    # Why the stored definition cannot be read (then ``spec`` is a stand-in holding only its name, kind,
    # expression, zone and authority, for listing and managing the schedule); None when it reads.
    error: str | None = None

    @classmethod
    def load(cls, r: Any) -> ScheduleRow:
        try:
            spec, error = parse_spec(r.definition), None
        except SchedulerException as exc:
            spec, error = stand_in(r), exc.message
        return cls(
            id=r.id, name=r.name, spec=spec, definition=r.definition,
            created=from_db_time(r.created_utc), paused=bool(r.paused), pause_reason=r.pause_reason,
            watermark=from_db_time(r.watermark_utc),
            next_due=from_db_time(r.next_due_utc) if r.next_due_utc else None,
            revision=r.revision, last_digest=r.last_digest, no_progress=r.no_progress,
            removed=r.removed_utc is not None, error=error,
        )


@lru_cache(maxsize=65536)
def parse_spec(definition: str) -> ScheduleSpec:
    """Definitions are immutable text, so every coordinator parses each one once. One that does not
    validate (out of bounds, edited by hand) is ``schedule_invalid``."""
    try:
        return ScheduleSpec.model_validate_json(definition)
    except ValidationError as exc:
        raise SchedulerException(ScheduleError.SCHEDULE_INVALID, f"stored definition is invalid: "
                                 f"{first_error(exc)}") from None
    except (ValueError, RecursionError) as exc:
        raise SchedulerException(ScheduleError.SCHEDULE_INVALID, f"stored definition is unreadable: "
                                 f"{type(exc).__name__}") from None


def stand_in(r: Any) -> ScheduleSpec:
    """A placeholder spec for a row whose definition does not validate: what listing and the management
    rules need (name, kind, expression, zone, owner role, creator), read leniently. A creator that is
    present but unreadable counts as ADMIN, so only the owner may manage it; no action, so it never runs."""
    try:
        raw = json.loads(r.definition)
    except (ValueError, RecursionError):
        raw = None
    raw = raw if isinstance(raw, dict) else {}
    owner = raw.get("owner_role")
    creator: Creator | None = None
    if raw.get("created_by") is not None:
        try:
            creator = Creator.model_validate(raw["created_by"])
        except ValidationError:
            creator = Creator(role="ADMIN", agent="unknown")
    return ScheduleSpec.model_construct(
        name=r.name, kind=Kind(r.kind) if r.kind in Kind._value2member_map_ else Kind.DATE, spec=r.spec, tz=r.tz,
        owner_role=owner if isinstance(owner, str) and owner else "ADMIN", created_by=creator, action=None)


@dataclass(frozen=True)
class ScheduleFault:
    """A schedule set aside in a pass: its stored definition could not be read or computed."""

    schedule_id: str
    name: str
    error: str  # the exception's class and message

    @classmethod
    def of(cls, schedule_id: str, name: str, exc: BaseException) -> ScheduleFault:
        if isinstance(exc, SchedulerException):
            text = f"{exc.code.value}: {exc.message}"
        else:
            text = f"{type(exc).__name__}: {exc}"
        return cls(schedule_id, name, " ".join(text.split())[:500])


@dataclass(frozen=True, eq=False)
class Claim:
    """An occurrence this coordinator may run: it holds the lease with ``fencing``."""

    schedule_id: str
    name: str
    key: str
    nominal: datetime
    fencing: int
    attempt: int
    spec: ScheduleSpec
    last_digest: str | None
    no_progress: int


@dataclass
class Outcome:
    claim: Claim
    state: OccurrenceState  # DONE, FAILED or MISSED
    reason: MissReason | None = None
    run_ref: str | None = None
    detail: str | None = None
    digest: str | None = None  # new watched-state baseline (None: unchanged)
    no_progress: int | None = None  # new no-progress count (None: unchanged)
    pause: bool = False  # the no-progress fuse tripped


class TriggerCache:
    """Triggers are pure functions of (id, definition, creation time); building one parses the spec.
    Keyed by the stored text, so the hot path looks a row up without parsing it."""

    def __init__(self, limit: int = 50_000) -> None:
        self._items: dict[tuple[str, str, str], Trigger] = {}
        self._limit = limit

    def get(self, s: ScheduleRow) -> Trigger:
        return self.for_row(s.id, s.definition, db_time(s.created))

    def for_row(self, sid: str, definition: str, created_utc: str) -> Trigger:
        k = (sid, definition, created_utc)
        trig = self._items.get(k)
        if trig is None:
            if len(self._items) >= self._limit:
                self._items.clear()
            trig = self._items[k] = Trigger(parse_spec(definition), from_db_time(created_utc), sid)
        return trig


class Ledger:
    def __init__(self, db: Database, *, lease_s: int = 60, chunk: int = 5000, batch: int = 1000) -> None:
        self.db = db
        self.lease = timedelta(seconds=lease_s)
        self.chunk = chunk
        self.batch = batch
        self.triggers = TriggerCache()
        self._dialect = postgresql if db.is_postgres else sqlite
        self._sql = _HotSql(db.is_postgres)
        self._set_aside: list[ScheduleFault] = []

    @contextmanager
    def tx(self) -> Iterator[Connection]:
        """A write transaction. On PostgreSQL the scheduler's own tables need no global writer lock:
        rows are locked individually (``FOR UPDATE SKIP LOCKED``), so coordinators work in parallel."""
        if self.db.is_postgres:
            with self.db.engine.begin() as conn:
                yield conn
        else:
            with self.db.write() as uow:
                yield uow.conn

    def insert(self, table: sa.Table) -> Any:
        return self._dialect.insert(table)

    def locked(self, sel: Any, *of: sa.Table) -> Any:
        """``sel`` with its rows locked, skipping rows other coordinators hold (PostgreSQL; SQLite has one writer)."""
        return sel.with_for_update(skip_locked=True, of=list(of) or None) if self.db.is_postgres else sel

    # -- claiming ---------------------------------------------------------------------------------

    def claim_due(self, owner: str, now: datetime) -> list[Claim]:
        """Recover expired leases, start waiting occurrences and claim everything due, committing
        each batch before returning; the caller runs the returned claims afterwards. A schedule that
        cannot be decided is set aside, logged and kept for ``take_set_aside``; the others go on."""
        claims: list[Claim] = []
        done: list[ScheduleFault] = []  # set aside by a transaction that committed (a rollback sets nothing aside)
        try:
            met: list[ScheduleFault] = []
            with self.tx() as conn:
                claims += self._recover(conn, owner, now, met)
                claims += self._start_waiting(conn, owner, now, met)
                new, again = self._claim_batch(conn, owner, now, met)
                claims += new
            done += met
            while again:
                met = []
                with self.tx() as conn:
                    new, again = self._claim_batch(conn, owner, now, met)
                    claims += new
                done += met
        finally:
            self.note_set_aside(done)
        return claims

    def note_set_aside(self, faults: list[ScheduleFault]) -> None:
        """Log schedules a committed transaction set aside, and keep them for ``take_set_aside``."""
        for f in faults:
            log.error("schedule_set_aside", schedule=f.name, schedule_id=f.schedule_id, reason=SET_ASIDE,
                      error=f.error)
        self._set_aside += faults

    def take_set_aside(self) -> list[ScheduleFault]:
        """The schedules set aside since the last call (each is set aside once: then no pass selects it)."""
        out, self._set_aside = self._set_aside, []
        return out

    def _active(self, conn: Connection, now_s: str) -> dict[str, list[int]]:
        """schedule id -> [live running, waiting] occurrences."""
        out: dict[str, list[int]] = {}
        rows = conn.execute(
            sa.select(occurrence.c.schedule_id, occurrence.c.state, occurrence.c.lease_until).where(
                LIVE
            )
        )
        for sid, state, until in rows:
            counts = out.setdefault(sid, [0, 0])
            if state == OccurrenceState.CLAIMED:
                counts[1] += 1
            elif until is not None and until >= now_s:
                counts[0] += 1
        return out

    def _claim_batch(self, conn: Connection, owner: str, now: datetime,
                     met: list[ScheduleFault]) -> tuple[list[Claim], bool]:
        now_s = db_time(now)
        sel = (
            sa.select(schedule)
            .where(schedule.c.removed_utc.is_(None), schedule.c.next_due_utc <= now_s)
            .order_by(schedule.c.next_due_utc)
            .limit(self.batch)
        )
        rows = conn.execute(self.locked(sel)).all()
        if not rows:
            return [], False
        claims, more = self.apply_due(conn, rows, owner, now, met)
        return claims, more or len(rows) == self.batch

    def apply_due(self, conn: Connection, rows: Sequence[Any], owner: str, now: datetime,
                  faults: list[ScheduleFault] | None = None) -> tuple[list[Claim], bool]:
        """Decide the due occurrences of the given (locked) schedule rows, record them and advance
        each watermark by compare-and-set. Returns the claims and whether more are due.

        A schedule whose definition cannot be read or computed is set aside (``set_aside``) and appended
        to ``faults``, and the others are decided as usual; without ``faults`` it is ``schedule_invalid``."""
        now_s = db_time(now)
        active = self._active(conn, now_s)
        token = uuid.uuid4().hex
        lease_s = db_time(now + self.lease)
        occ_rows: list[dict[str, Any]] = []
        conflicts: list[dict[str, Any]] = []
        cas: list[dict[str, Any]] = []
        claimed: list[tuple[Any, Trigger, Any]] = []
        more = False
        for r in rows:
            # Everything about one schedule is computed before any of it is kept, so a schedule that fails
            # half-way leaves nothing behind; only this pure part can fail on a schedule's own data.
            try:
                running, waiting = active.get(r.id, (0, 0))
                trig = self.triggers.for_row(r.id, r.definition, r.created_utc)
                p = plan(trig, trig.spec, watermark=from_db_time(r.watermark_utc), now=now, paused=bool(r.paused),
                         running=running, waiting=waiting, chunk=self.chunk)
                mine_occ: list[dict[str, Any]] = []
                mine_conflicts: list[dict[str, Any]] = []
                mine_claimed: list[tuple[Any, Trigger, Any]] = []
                for d in p.decisions:
                    nominal_s = db_time(d.nominal)
                    if d.reason is MissReason.DUPLICATE:
                        mine_conflicts.append({"schedule_id": r.id, "nominal_utc": nominal_s, "occurrence_key": d.key,
                                               "reason": d.reason.value, "recorded_utc": now_s})
                        continue
                    row = {
                        "schedule_id": r.id, "occurrence_key": d.key, "nominal_utc": nominal_s,
                        "due_utc": nominal_s if d.due == d.nominal else db_time(d.due),
                        "state": OccurrenceState.MISSED.value, "reason": d.reason.value if d.reason else None,
                        "lease_owner": None, "lease_until": None, "fencing": 0, "attempt": 1, "claim_token": token,
                        "fired_utc": None, "recorded_utc": now_s,
                    }
                    if d.verdict == CLAIM:
                        row.update(state=OccurrenceState.RUNNING.value, lease_owner=owner, lease_until=lease_s,
                                   fencing=1, fired_utc=now_s)
                        mine_claimed.append((r, trig, d))
                    elif d.verdict == WAIT:
                        row.update(state=OccurrenceState.CLAIMED.value)
                    mine_occ.append(row)
                mine_cas = {
                    "b_id": r.id, "b_rev": r.revision,
                    "b_w": db_time(p.watermark) if p.watermark else r.watermark_utc,
                    "b_nd": db_time(p.next_due) if p.next_due else None,
                }
            except Exception as exc:  # noqa: BLE001 - one schedule's bad data must not stop the others
                fault = ScheduleFault.of(r.id, r.name, exc)
                if faults is None:
                    raise SchedulerException(ScheduleError.SCHEDULE_INVALID,
                                             f"schedule {r.name!r} cannot be computed: {fault.error}") from exc
                self.set_aside(conn, r.id, fault, now, owner, revision=r.revision)
                faults.append(fault)
                continue
            more = more or p.more
            occ_rows += mine_occ
            conflicts += mine_conflicts
            claimed += mine_claimed
            cas.append(mine_cas)
        if occ_rows:
            res = conn.exec_driver_sql(self._sql.insert_occurrence, occ_rows)
            if res.rowcount != len(occ_rows):
                ours = {(sid, key) for sid, key in conn.execute(
                    sa.select(occurrence.c.schedule_id, occurrence.c.occurrence_key)
                    .where(occurrence.c.claim_token == token))}
                for row in occ_rows:
                    if (row["schedule_id"], row["occurrence_key"]) not in ours:
                        conflicts.append({"schedule_id": row["schedule_id"], "nominal_utc": row["nominal_utc"],
                                          "occurrence_key": row["occurrence_key"],
                                          "reason": MissReason.DUPLICATE.value, "recorded_utc": now_s})
                claimed = [(r, trig, d) for r, trig, d in claimed if (r.id, d.key) in ours]
        if conflicts:
            conn.execute(self.insert(occurrence_conflict).on_conflict_do_nothing(), conflicts)
        if cas:
            res = conn.exec_driver_sql(self._sql.advance_watermark, cas)
            if res.rowcount != len(cas):
                raise SchedulerException(ScheduleError.STALE_REVISION, "a schedule changed while it was being ticked")
        claims = [Claim(r.id, r.name, d.key, d.nominal, 1, 1, trig.spec, r.last_digest, r.no_progress)
                  for r, trig, d in claimed]
        return claims, more

    def set_aside(self, conn: Connection, schedule_id: str, fault: ScheduleFault, now: datetime, by: str,
                  *, revision: int | None = None) -> None:
        """Take a schedule out of every pass: paused with reason ``invalid`` and no next due time (so no
        tick selects it again), the error recorded. ``resume`` refuses it while its definition stays invalid.
        With ``revision``, compare-and-set like a watermark advance."""
        where = schedule.c.id == schedule_id
        if revision is not None:
            where = where & (schedule.c.revision == revision)
        res = conn.execute(schedule.update().where(where).values(
            paused=1, pause_reason=SET_ASIDE, next_due_utc=None, revision=schedule.c.revision + 1))
        if revision is not None and res.rowcount != 1:
            raise SchedulerException(ScheduleError.STALE_REVISION, "a schedule changed while it was being ticked")
        conn.execute(self.insert(schedule_fault).values(
            schedule_id=schedule_id, recorded_utc=db_time(now), reason=SET_ASIDE, error=fault.error, by=by,
        ).on_conflict_do_nothing())
        self.notify(conn)

    def _recover(self, conn: Connection, owner: str, now: datetime, met: list[ScheduleFault]) -> list[Claim]:
        """Expired leases: re-claim idempotent actions (attempt + 1, new fencing), abandon the rest (and
        those of a schedule whose definition cannot be read, which is set aside)."""
        now_s = db_time(now)
        sel = (
            sa.select(occurrence, schedule.c.name, schedule.c.definition, schedule.c.last_digest,
                      schedule.c.no_progress)
            .join(schedule, schedule.c.id == occurrence.c.schedule_id)
            .where(LIVE, occurrence.c.state == OccurrenceState.RUNNING.value, occurrence.c.lease_until < now_s)
            .order_by(occurrence.c.nominal_utc)
        )
        claims: list[Claim] = []
        for r in conn.execute(self.locked(sel, occurrence)).all():
            pk = (occurrence.c.schedule_id == r.schedule_id) & (occurrence.c.occurrence_key == r.occurrence_key) & (
                occurrence.c.fencing == r.fencing) & (occurrence.c.state == OccurrenceState.RUNNING.value)
            spec = self._spec_or_set_aside(conn, r.schedule_id, r.name, r.definition, now, owner, met)
            if spec is None:
                conn.execute(occurrence.update().where(pk).values(
                    state=OccurrenceState.ABANDONED.value, finished_utc=now_s,
                    detail=f"lease of {r.lease_owner} expired at {r.lease_until}; "
                           "the schedule's definition is invalid (set aside): not re-run"))
                continue
            act = spec.action
            if act is not None and act.is_idempotent and r.attempt < act.max_attempts:
                res = conn.execute(occurrence.update().where(pk).values(
                    attempt=r.attempt + 1, fencing=r.fencing + 1, lease_owner=owner,
                    lease_until=db_time(now + self.lease)))
                if res.rowcount == 1:
                    claims.append(Claim(r.schedule_id, r.name, r.occurrence_key, from_db_time(r.nominal_utc),
                                        r.fencing + 1, r.attempt + 1, spec, r.last_digest, r.no_progress))
            else:
                why = "not idempotent" if act is None or not act.is_idempotent else "max_attempts reached"
                conn.execute(occurrence.update().where(pk).values(
                    state=OccurrenceState.ABANDONED.value, finished_utc=now_s,
                    detail=f"lease of {r.lease_owner} expired at {r.lease_until}; {why}: not re-run"))
        return claims

    def _start_waiting(self, conn: Connection, owner: str, now: datetime, met: list[ScheduleFault]) -> list[Claim]:
        """Start reserved occurrences (buffer_one, backfill) of schedules with nothing running, in
        nominal order; one coordinator runs a schedule's batch sequentially."""
        now_s = db_time(now)
        sel = (
            sa.select(occurrence, schedule.c.name, schedule.c.definition, schedule.c.last_digest,
                      schedule.c.no_progress, schedule.c.paused)
            .join(schedule, schedule.c.id == occurrence.c.schedule_id)
            .where(LIVE, occurrence.c.state == OccurrenceState.CLAIMED.value, schedule.c.removed_utc.is_(None))
            .order_by(occurrence.c.schedule_id, occurrence.c.nominal_utc)
        )
        rows = conn.execute(self.locked(sel, occurrence)).all()
        if not rows:
            return []
        active = self._active(conn, now_s)
        claims: list[Claim] = []
        aside: set[str] = set()
        for r in rows:
            if r.paused or r.schedule_id in aside:
                continue
            spec = self._spec_or_set_aside(conn, r.schedule_id, r.name, r.definition, now, owner, met)
            if spec is None:  # paused now: its reserved occurrences wait (a removal or a valid resume ends that)
                aside.add(r.schedule_id)
                continue
            if active.get(r.schedule_id, (0, 0))[0] > 0 and spec.overlap is not Overlap.ALLOW:
                continue
            res = conn.execute(occurrence.update().where(
                (occurrence.c.schedule_id == r.schedule_id) & (occurrence.c.occurrence_key == r.occurrence_key)
                & (occurrence.c.state == OccurrenceState.CLAIMED.value) & (occurrence.c.fencing == r.fencing)
            ).values(state=OccurrenceState.RUNNING.value, lease_owner=owner, lease_until=db_time(now + self.lease),
                     fencing=r.fencing + 1, fired_utc=now_s))
            if res.rowcount == 1:
                claims.append(Claim(r.schedule_id, r.name, r.occurrence_key, from_db_time(r.nominal_utc),
                                    r.fencing + 1, r.attempt, spec, r.last_digest, r.no_progress))
        return claims

    def _spec_or_set_aside(self, conn: Connection, sid: str, name: str, definition: str, now: datetime,
                           owner: str, met: list[ScheduleFault]) -> ScheduleSpec | None:
        """The schedule's spec; or, when its definition does not read, None with the schedule set aside."""
        try:
            return parse_spec(definition)
        except SchedulerException as exc:
            fault = ScheduleFault.of(sid, name, exc)
            if not any(f.schedule_id == sid for f in met):
                self.set_aside(conn, sid, fault, now, owner)
                met.append(fault)
            return None

    # -- running ----------------------------------------------------------------------------------

    def renew(self, claims: list[Claim], now: datetime) -> list[Claim]:
        """Extend the leases; returns the claims whose lease was lost (fencing moved on)."""
        if not claims:
            return []
        lost: list[Claim] = []
        until = db_time(now + self.lease)
        with self.tx() as conn:
            for c in claims:
                res = conn.execute(occurrence.update().where(self._fenced(c)).values(lease_until=until))
                if res.rowcount != 1:
                    lost.append(c)
        return lost

    @staticmethod
    def _fenced(c: Claim) -> Any:
        return ((occurrence.c.schedule_id == c.schedule_id) & (occurrence.c.occurrence_key == c.key)
                & (occurrence.c.fencing == c.fencing) & (occurrence.c.state == OccurrenceState.RUNNING.value))

    def check_fence(self, conn: Connection, c: Claim) -> bool:
        """For actions writing to this database: true while ``c`` still holds its lease."""
        return conn.execute(sa.select(sa.literal(1)).where(self._fenced(c))).first() is not None

    def finish(self, outcomes: list[Outcome], now: datetime) -> list[Outcome]:
        """Record outcomes under their fencing tokens; returns those whose lease was lost."""
        if not outcomes:
            return []
        now_s = db_time(now)
        params = [{
            "b_sid": o.claim.schedule_id, "b_key": o.claim.key, "b_f": o.claim.fencing, "b_state": o.state.value,
            "b_reason": o.reason.value if o.reason else None, "b_ref": o.run_ref, "b_detail": o.detail,
            "b_now": now_s,
        } for o in outcomes]
        with self.tx() as conn:
            res = conn.exec_driver_sql(self._sql.finish_occurrence, params)
            lost: list[Outcome] = []
            if res.rowcount != len(outcomes):
                lost = [o for o in outcomes if not self._finished_by(conn, o, now_s)]
            for o in outcomes:
                if o in lost or (o.digest is None and o.no_progress is None and not o.pause):
                    continue
                values: dict[str, Any] = {}
                if o.digest is not None:
                    values["last_digest"] = o.digest
                if o.no_progress is not None:
                    values["no_progress"] = o.no_progress
                if o.pause:
                    values.update(paused=1, pause_reason=MissReason.NO_PROGRESS.value,
                                  revision=schedule.c.revision + 1)
                conn.execute(schedule.update().where(schedule.c.id == o.claim.schedule_id).values(**values))
            if any(o.pause for o in outcomes if o not in lost):
                self.notify(conn)
        return lost

    @staticmethod
    def _finished_by(conn: Connection, o: Outcome, now_s: str) -> bool:
        row = conn.execute(sa.select(occurrence.c.fencing, occurrence.c.state, occurrence.c.finished_utc).where(
            (occurrence.c.schedule_id == o.claim.schedule_id) & (occurrence.c.occurrence_key == o.claim.key))).first()
        return row is not None and row.fencing == o.claim.fencing and row.state == o.state.value and (
            row.finished_utc == now_s)

    # -- coordination -----------------------------------------------------------------------------

    def heartbeat(self, owner: str, host: str, pid: int, now: datetime) -> None:
        now_s = db_time(now)
        stmt = self.insert(coordinator).values(id=owner, host=host, pid=pid, started_utc=now_s, heartbeat_utc=now_s)
        with self.tx() as conn:
            conn.execute(stmt.on_conflict_do_update(index_elements=[coordinator.c.id],
                                                    set_={"heartbeat_utc": now_s, "pid": pid}))

    def next_wakeup(self) -> datetime | None:
        """The earliest instant at which a tick has work: a due schedule or an expiring lease.
        (Reserved occurrences start when a running one finishes: the finisher ticks again.)"""
        with self.db.read() as conn:
            due = conn.execute(sa.select(sa.func.min(schedule.c.next_due_utc))
                               .where(schedule.c.removed_utc.is_(None))).scalar()
            lease = conn.execute(sa.select(sa.func.min(occurrence.c.lease_until))
                                 .where(LIVE, occurrence.c.state == OccurrenceState.RUNNING.value)).scalar()
        times = [from_db_time(due)] if due else []
        if lease:
            times.append(from_db_time(lease) + timedelta(microseconds=1))
        return min(times) if times else None

    def notify(self, conn: Connection) -> None:
        """Wake other coordinators (PostgreSQL LISTEN/NOTIFY; delivered at commit)."""
        if self.db.is_postgres:
            conn.execute(sa.text("SELECT pg_notify(:ch, '')"), {"ch": NOTIFY_CHANNEL})


_OCC_COLUMNS = ("schedule_id", "occurrence_key", "nominal_utc", "due_utc", "state", "reason", "lease_owner",
                "lease_until", "fencing", "attempt", "claim_token", "fired_utc", "recorded_utc")


class _HotSql:
    """The three statements every due occurrence goes through, as driver SQL for executemany:
    SQLAlchemy's per-row parameter processing costs more than the statements themselves."""

    def __init__(self, postgres: bool) -> None:
        def p(name: str) -> str:
            return f"%({name})s" if postgres else f":{name}"

        self.insert_occurrence = (
            f"INSERT INTO occurrence ({', '.join(_OCC_COLUMNS)}) "
            f"VALUES ({', '.join(p(c) for c in _OCC_COLUMNS)}) ON CONFLICT DO NOTHING"
        )
        self.advance_watermark = (
            f"UPDATE schedule SET watermark_utc = {p('b_w')}, next_due_utc = {p('b_nd')}, "
            f"revision = revision + 1 WHERE id = {p('b_id')} AND revision = {p('b_rev')}"
        )
        self.finish_occurrence = (
            f"UPDATE occurrence SET state = {p('b_state')}, reason = {p('b_reason')}, run_ref = {p('b_ref')}, "
            f"detail = {p('b_detail')}, finished_utc = {p('b_now')}, lease_until = NULL "
            f"WHERE schedule_id = {p('b_sid')} AND occurrence_key = {p('b_key')} AND fencing = {p('b_f')} "
            f"AND state = 'running'"
        )
