"""``schedule simulate``: the real ledger and policies against a virtual clock, no sleeping.

Coordinators are virtual processes sharing one in-memory SQLite store. Time jumps from event to
event (the earliest due occurrence, an expiring lease, a run finishing, a coordinator coming back
up); at each event every coordinator that is up ticks, in rotating order. A coordinator that goes
down while an action is running loses that run, exactly like a crash: its lease expires and the
recovery rules apply.

Input and output are documented in docs/scheduler.md ("schedule simulate").
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from taskkernel.kernel.store.db import Database
from taskkernel.scheduler.actions import ActionContext, ActionRegistry, ActionResult
from taskkernel.scheduler.admin import Schedules
from taskkernel.scheduler.ledger import Ledger, Outcome
from taskkernel.scheduler.models import (
    FIRED_STATES,
    ActionSpec,
    OccurrenceState,
    ScheduleError,
    SchedulerException,
    ScheduleSpec,
    parse_duration,
    parse_instant,
    spec_from_user,
)
from taskkernel.scheduler.runtime import Faults, SchedulerRuntime, group_by_schedule
from taskkernel.scheduler.tables import install, occurrence, occurrence_conflict
from taskkernel.scheduler.triggers import from_db_time, iso_z

SIM_CALLABLE = "simulate"
MAX_STEPS = 200_000
_ZERO = timedelta(0)


class Crash(Exception):  # noqa: N818 - a simulated process death, not an error
    """Raised by a fault hook: the coordinator dies at that point (nothing after it runs)."""


@dataclass
class VirtualProcess:
    name: str
    runtime: SchedulerRuntime
    down: list[tuple[datetime, datetime]] = field(default_factory=list)
    skew: list[tuple[datetime, timedelta]] = field(default_factory=list)  # (from instant, clock offset)
    inflight: list[tuple[datetime, datetime, list[Outcome]]] = field(default_factory=list)  # started, ends

    def is_down(self, t: datetime) -> bool:
        return any(a <= t < b for a, b in self.down)

    def went_down(self, after: datetime, until: datetime) -> bool:
        return any(after < a <= until for a, _ in self.down)

    def offset(self, t: datetime) -> timedelta:
        off = _ZERO
        for at, value in self.skew:
            if at <= t:
                off = value
        return off


class VirtualCluster:
    """``processes`` coordinators on one store, driven by a virtual clock."""

    def __init__(self, db: Database, registry: ActionRegistry, processes: int, *, lease_s: int = 60,
                 run_for: timedelta = _ZERO, faults: Callable[[str], Faults | None] | None = None,
                 restart_after: timedelta = timedelta(minutes=5)) -> None:
        install(db)
        self.db = db
        self.ledger = Ledger(db, lease_s=lease_s)
        self.run_for = run_for
        self.restart_after = restart_after
        self.procs = [
            VirtualProcess(f"sim-{i + 1}", SchedulerRuntime(db, registry, clock=_no_clock, owner=f"sim-{i + 1}",
                                                            lease_s=lease_s, faults=faults(f"sim-{i + 1}")
                                                            if faults else None))
            for i in range(processes)
        ]
        for p in self.procs:
            p.runtime.ledger = self.ledger
        self.crashes = 0

    def _tick(self, p: VirtualProcess, t: datetime) -> None:
        now = t + p.offset(t)
        # A run dies with its coordinator: if the process went down after it started, it never finishes.
        p.inflight = [x for x in p.inflight if not p.went_down(x[0], min(t, x[1]))]
        for item in [x for x in p.inflight if x[1] <= t]:
            p.inflight.remove(item)
            self.ledger.finish(item[2], item[1] + p.offset(item[1]))
        if p.inflight:  # the virtual lease keeper of a running action
            self.ledger.renew([o.claim for _, _, outcomes in p.inflight for o in outcomes], now)
        try:
            p.runtime.check_clock(now)
            claims = self.ledger.claim_due(p.runtime.owner, now)
            p.runtime._fault("after_claim")
            outcomes: list[Outcome] = []
            for group in group_by_schedule(claims):
                outcomes += p.runtime.run_claims(group)
            if self.run_for > _ZERO and outcomes:
                p.inflight.append((t, t + self.run_for, outcomes))
            else:
                p.runtime._fault("before_finish")
                self.ledger.finish(outcomes, now)
        except Crash:
            self.crashes += 1
            p.inflight.clear()
            p.down.append((t, t + self.restart_after))

    def run(self, start: datetime, end: datetime) -> None:
        t = start
        for step in range(MAX_STEPS):
            for i in range(len(self.procs)):
                p = self.procs[(i + step) % len(self.procs)]
                if p.is_down(t):
                    p.inflight.clear()  # whatever ran there died with it
                else:
                    self._tick(p, t)
            nxt = self._next_event(t)
            if nxt is None or nxt > end:
                return
            t = nxt
        raise SchedulerException(ScheduleError.INVALID_SIMULATION,
                                 f"more than {MAX_STEPS} simulation steps; shorten the range")

    def _next_event(self, t: datetime) -> datetime | None:
        wake = self.ledger.next_wakeup()
        candidates: list[datetime] = []
        for p in self.procs:
            candidates += [b for _, b in p.down if b > t] + [at for at, _ in p.skew if at > t]
            candidates += [done for _, done, _ in p.inflight]
            if p.inflight:
                candidates.append(t + self.ledger.lease / 3)
            if wake is not None and not p.is_down(t):  # a down process's work waits for its restart
                candidates.append(wake - p.offset(t))
        if not candidates:
            return None
        nxt = min(candidates)
        if nxt <= t:  # work that cannot progress right now; look again a little later
            nxt = t + timedelta(seconds=1)
        while all(q.is_down(nxt) for q in self.procs):  # skip instants where every coordinator is down
            nxt = min(b for q in self.procs for a, b in q.down if a <= nxt < b)
        return nxt


def sim_registry(record: Callable[[ActionContext], None] | None = None) -> ActionRegistry:
    registry = ActionRegistry()

    def _run(ctx: ActionContext) -> ActionResult:
        if record is not None:
            record(ctx)
        return ActionResult()

    registry.register_callable(SIM_CALLABLE, _run)
    return registry


def fired_and_missed(db: Database, schedule_id: str) -> dict[str, list[dict[str, Any]]]:
    """The simulate output shape, read back from the ledger."""
    with db.read() as conn:
        occ = conn.execute(sa.select(occurrence).where(occurrence.c.schedule_id == schedule_id)
                           .order_by(occurrence.c.nominal_utc)).all()
        dup = conn.execute(sa.select(occurrence_conflict).where(occurrence_conflict.c.schedule_id == schedule_id)
                           .order_by(occurrence_conflict.c.nominal_utc)).all()
    fired_states = {s.value for s in FIRED_STATES}
    fired = [{"dedup_key": r.occurrence_key, "nominal": iso_z(from_db_time(r.nominal_utc)),
              "fired_at": iso_z(from_db_time(r.fired_utc))} for r in occ if r.state in fired_states]
    missed = [(r.nominal_utc, r.occurrence_key, r.reason) for r in occ if r.state == OccurrenceState.MISSED.value]
    missed += [(r.nominal_utc, r.occurrence_key, r.reason) for r in dup]
    missed.sort()
    return {"fired": fired, "missed": [{"dedup_key": k, "nominal": iso_z(from_db_time(n)), "reason": why}
                                       for n, k, why in missed]}


@dataclass(frozen=True)
class SimRequest:
    spec: ScheduleSpec
    start: datetime
    end: datetime
    down: list[tuple[datetime, datetime]]
    processes: int
    run_for: timedelta
    seed: int


def parse_request(doc: Any) -> SimRequest:
    if not isinstance(doc, dict):
        raise SchedulerException(ScheduleError.INVALID_SIMULATION, "the simulation input must be a JSON object")
    unknown = set(doc) - {"schedule", "from", "to", "down", "processes", "run_for", "seed"}
    if unknown:
        raise SchedulerException(ScheduleError.INVALID_SIMULATION, f"unknown keys: {', '.join(sorted(unknown))}")
    for key in ("schedule", "from", "to"):
        if key not in doc:
            raise SchedulerException(ScheduleError.INVALID_SIMULATION, f"missing {key!r}")
    sched = doc["schedule"]
    if not isinstance(sched, dict):
        raise SchedulerException(ScheduleError.INVALID_SIMULATION, "'schedule' must be an object")
    idempotent = bool(sched.get("idempotent", False))
    spec = spec_from_user({k: v for k, v in sched.items() if k not in ("action", "idempotent")},
                          name=str(sched.get("name", "simulated")))
    spec = spec.model_copy(update={"action": ActionSpec(callable=SIM_CALLABLE, idempotent=idempotent)})
    start, end = parse_instant(doc["from"], spec.tz), parse_instant(doc["to"], spec.tz)
    if end < start:
        raise SchedulerException(ScheduleError.INVALID_SIMULATION, "'to' is before 'from'")
    down_raw = doc.get("down", [])
    if not isinstance(down_raw, list) or not all(isinstance(w, list) and len(w) == 2 for w in down_raw):
        raise SchedulerException(ScheduleError.INVALID_SIMULATION, "'down' must be a list of [from, to] pairs")
    down = [(parse_instant(a, spec.tz), parse_instant(b, spec.tz)) for a, b in down_raw]
    if any(b < a for a, b in down):
        raise SchedulerException(ScheduleError.INVALID_SIMULATION, "a 'down' window ends before it starts")
    processes = doc.get("processes", 1)
    if not isinstance(processes, int) or isinstance(processes, bool) or not 1 <= processes <= 16:
        raise SchedulerException(ScheduleError.INVALID_SIMULATION, "'processes' must be an integer 1-16")
    seed = doc.get("seed", 0)
    return SimRequest(spec, start, end, down, processes, timedelta(seconds=parse_duration(doc.get("run_for", 0))),
                      int(seed) if isinstance(seed, int) else 0)


def simulate(doc: Any) -> dict[str, list[dict[str, Any]]]:
    """Run a simulation request (the parsed ``SPEC.json``) and return the output document."""
    req = parse_request(doc)
    db = Database("sqlite://", durability="process")  # one in-memory store for all virtual coordinators
    try:
        install(db)
        registry = sim_registry()
        cluster = VirtualCluster(db, registry, req.processes, run_for=req.run_for)
        for p in cluster.procs:
            p.down = list(req.down)
        rng = random.Random(req.seed)
        rng.shuffle(cluster.procs)
        row = Schedules(cluster.ledger).add(req.spec, req.start)
        cluster.run(req.start, req.end)
        return fired_and_missed(db, row.id)
    finally:
        db.dispose()


def _no_clock() -> datetime:
    raise RuntimeError("virtual coordinators are always given the time")
