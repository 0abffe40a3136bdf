"""The coordinator-side runtime: when to tick, and running what a tick claimed.

APScheduler's ``AsyncIOScheduler`` with a ``MemoryJobStore`` is only the alarm clock: one ``date``
job at the earliest due occurrence (re-read from the database after every tick) plus a safety
``interval`` tick. All state lives in the ledger, so any number of coordinators can run, crash and
restart; a restarted one recomputes what is due from the watermark. On PostgreSQL, schedule changes
``NOTIFY`` the other coordinators, which wake at once.

Before claiming, a runtime looks for watermarks a forward clock jump left far ahead of the clock
(``taskkernel.scheduler.clockjump``): on its first tick, whenever its clock went backwards, and at least every
``clock_check_s`` - one more query (about 1 ms on 10,000 schedules) kept off the per-tick path.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import groupby
from typing import Any

from apscheduler.jobstores.base import JobLookupError
from apscheduler.jobstores.memory import MemoryJobStore
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from taskkernel.kernel.logging import get_logger
from taskkernel.kernel.store import listen
from taskkernel.kernel.store.clock import store_now
from taskkernel.kernel.store.db import Database
from taskkernel.scheduler.actions import ActionRegistry, execute
from taskkernel.scheduler.clockjump import DEFAULT_MAX_CLOCK_SKEW, ClockJump, clamp_clock_jumps
from taskkernel.scheduler.ledger import NOTIFY_CHANNEL, Claim, Ledger, Outcome, ScheduleFault
from taskkernel.scheduler.models import ScheduleError, SchedulerException
from taskkernel.scheduler.tables import install

log = get_logger(__name__)

Clock = Callable[[], datetime]
Faults = Callable[[str], None]  # test hook: raise at a named point to simulate a crash


def system_clock() -> datetime:
    return datetime.now(UTC)


class DbClock:
    """PostgreSQL's clock for every coordinator (leases compare against one time source);
    SQLite is one host, so its application clock is the system clock."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def __call__(self) -> datetime:
        if not self.db.is_postgres:
            return system_clock()
        with self.db.engine.connect() as conn:
            return store_now(conn)  # the clock the run ledger and the outbox time their leases by


@dataclass
class TickReport:
    claimed: int = 0
    outcomes: list[Outcome] = field(default_factory=list)
    lost: list[Outcome] = field(default_factory=list)
    clock_jumps: list[ClockJump] = field(default_factory=list)
    faults: list[ScheduleFault] = field(default_factory=list)  # schedules set aside in this pass

    def summary(self) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for o in self.outcomes:
            counts[o.state.value] = counts.get(o.state.value, 0) + 1
        out: dict[str, Any] = {"claimed": self.claimed, "outcomes": counts, "lease_lost": len(self.lost)}
        if self.faults:
            out["set_aside"] = [f.name for f in self.faults]
        return out


class SchedulesSetAside(SchedulerException):
    """Raised by ``SchedulerRuntime.tick`` after a pass that did all its other work but had to set schedules
    aside, so the pass is reported as failed (`up --once` says degraded); ``report`` is the whole pass."""

    def __init__(self, report: TickReport) -> None:
        names = ", ".join(f"{f.name} ({f.error})" for f in report.faults[:5])
        more = f" and {len(report.faults) - 5} more" if len(report.faults) > 5 else ""
        super().__init__(ScheduleError.SCHEDULE_INVALID,
                         f"{len(report.faults)} schedule(s) set aside (paused, reason invalid), the others ran: "
                         f"{names}{more}")
        self.report = report


class LeaseKeeper:
    """Renews the leases of in-flight claims every lease/3 while actions run."""

    def __init__(self, ledger: Ledger, clock: Clock) -> None:
        self.ledger = ledger
        self.clock = clock
        self._claims: set[Claim] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def hold(self, claims: list[Claim]) -> None:
        with self._lock:
            self._claims.update(claims)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="lease-keeper", daemon=True)
                self._thread.start()

    def release(self, claims: list[Claim]) -> None:
        with self._lock:
            self._claims.difference_update(claims)

    def _loop(self) -> None:
        period = self.ledger.lease.total_seconds() / 3
        while not self._stop.wait(period):
            with self._lock:
                held = list(self._claims)
            try:
                lost = self.ledger.renew(held, self.clock())
            except Exception as exc:  # noqa: BLE001 - keep renewing; the lease is the safety net
                log.warning("lease_renewal_failed", error=str(exc))
                continue
            for c in lost:
                log.warning("lease_lost", schedule=c.name, dedup_key=c.key, fencing=c.fencing)

    def stop(self) -> None:
        self._stop.set()


def group_by_schedule(claims: list[Claim]) -> list[list[Claim]]:
    """Claims of one schedule run one after another, in nominal order."""
    ordered = sorted(claims, key=lambda c: (c.schedule_id, c.nominal))
    return [list(g) for _, g in groupby(ordered, key=lambda c: c.schedule_id)]


class SchedulerRuntime:
    def __init__(
        self,
        db: Database,
        actions: ActionRegistry,
        clock: Clock | None = None,
        *,
        owner: str | None = None,
        lease_s: int = 60,
        safety_tick_s: float = 30.0,
        workers: int = 4,
        faults: Faults | None = None,
        max_clock_skew: timedelta = DEFAULT_MAX_CLOCK_SKEW,
        clock_check_s: float = 60.0,
    ) -> None:
        install(db)
        self.db = db
        self.actions = actions
        self.clock: Clock = clock or DbClock(db)
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}"
        self.ledger = Ledger(db, lease_s=lease_s)
        self.safety_tick_s = safety_tick_s
        self.workers = workers
        self.faults = faults
        self.max_clock_skew = max_clock_skew
        self.clock_check_s = clock_check_s
        self._last_heartbeat: float | None = None
        self._last_check = 0.0  # monotonic time of the last clock-jump check
        self._last_now: datetime | None = None  # the clock at the previous tick

    def _fault(self, point: str) -> None:
        if self.faults is not None:
            self.faults(point)

    def _heartbeat(self, now: datetime) -> None:
        # Rate-limited on the monotonic clock: virtual clocks (tests, bench) jump far ahead.
        mono = time.monotonic()
        if self._last_heartbeat is None or mono - self._last_heartbeat >= self.ledger.lease.total_seconds() / 3:
            self.ledger.heartbeat(self.owner, socket.gethostname(), os.getpid(), now)
            self._last_heartbeat = mono

    def check_clock(self, now: datetime) -> list[ClockJump]:
        """Clamp watermarks a forward clock jump left ahead (rate-limited; see the module docstring)."""
        mono, prev = time.monotonic(), self._last_now
        if prev is not None and now >= prev and mono - self._last_check < self.clock_check_s:
            self._last_now = now
            return []
        jumps = clamp_clock_jumps(self.ledger, self.owner, now, self.max_clock_skew)
        self._last_now, self._last_check = now, mono  # only after it succeeded: a failed check is retried
        return jumps

    def run_claims(self, claims: list[Claim]) -> list[Outcome]:
        outcomes = []
        for c in claims:
            self._fault("before_action")
            outcomes.append(execute(c, self.actions))
            self._fault("after_action")
        return outcomes

    def tick(self, now: datetime | None = None, *, raise_set_aside: bool = True) -> TickReport:
        """One durable pass: claim what is due (committed), run it, record the outcomes.
        Used by ``--once`` and by tests; ``now`` overrides the clock.

        A schedule that cannot be computed is set aside and the pass goes on with the others; then, once
        everything else is done, the pass raises ``SchedulesSetAside`` (unless ``raise_set_aside`` is false:
        the report lists them), so the caller's stage is reported as failed."""
        at = now or self.clock()
        self._heartbeat(at)
        self.ledger.take_set_aside()  # only this pass's: the long-running loop logs and moves on
        jumps = self.check_clock(at)
        claims = self.ledger.claim_due(self.owner, at)
        self._fault("after_claim")
        report = TickReport(claimed=len(claims), clock_jumps=jumps, faults=self.ledger.take_set_aside())
        keeper = LeaseKeeper(self.ledger, self.clock) if now is None and claims else None
        if keeper:
            keeper.hold(claims)
        try:
            for group in group_by_schedule(claims):
                report.outcomes += self.run_claims(group)
        finally:
            if keeper:
                keeper.stop()
        self._fault("before_finish")
        report.lost = self.ledger.finish(report.outcomes, now or self.clock())
        if report.faults and raise_set_aside:
            raise SchedulesSetAside(report)
        return report

    async def run(self, stop_event: asyncio.Event) -> None:
        """Run until ``stop_event`` is set: tick at every due time, on notifications and on the
        safety tick; actions run in a thread pool so a slow one does not delay other schedules."""
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()

        async def _wake() -> None:
            wake.set()

        timer = AsyncIOScheduler(jobstores={"default": MemoryJobStore()}, timezone=UTC,
                                 job_defaults={"coalesce": True, "misfire_grace_time": None, "max_instances": 1})
        timer.start()
        timer.add_job(_wake, "interval", seconds=self.safety_tick_s, id="safety")
        # PostgreSQL: schedule changes NOTIFY (Ledger.notify); this process's one listening connection wakes us
        listening = listen.subscribe(self.db.engine.url, NOTIFY_CHANNEL, lambda _: loop.call_soon_threadsafe(
            wake.set)) if self.db.is_postgres else None
        keeper = LeaseKeeper(self.ledger, self.clock)
        pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="schedule-action")
        inflight: set[asyncio.Future[Any]] = set()

        def _run_group(group: list[Claim]) -> None:
            try:
                for c in group:
                    outcome = execute(c, self.actions)
                    self.ledger.finish([outcome], self.clock())
                    keeper.release([c])
            finally:
                keeper.release(group)
                loop.call_soon_threadsafe(wake.set)  # a finished run may let a waiting one start

        try:
            while not stop_event.is_set():
                wake.clear()
                try:
                    now = await asyncio.to_thread(self.clock)
                    await asyncio.to_thread(self._heartbeat, now)
                    await asyncio.to_thread(self.check_clock, now)
                    claims = await asyncio.to_thread(self.ledger.claim_due, self.owner, now)
                    self.ledger.take_set_aside()  # logged where they were set aside; the others run on
                    if claims:
                        keeper.hold(claims)
                    for group in group_by_schedule(claims):
                        fut = loop.run_in_executor(pool, _run_group, group)
                        inflight.add(fut)
                        fut.add_done_callback(inflight.discard)
                    nxt = await asyncio.to_thread(self.ledger.next_wakeup)
                except Exception as exc:  # noqa: BLE001 - a failed pass is retried at the safety tick
                    log.error("scheduler_tick_failed", error=f"{type(exc).__name__}: {exc}")
                    nxt = None
                with contextlib.suppress(JobLookupError):
                    timer.remove_job("wake")
                if nxt is not None:
                    timer.add_job(_wake, "date", run_date=max(nxt, system_clock()), id="wake")
                waiter = asyncio.ensure_future(wake.wait())
                stopper = asyncio.ensure_future(stop_event.wait())
                await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                stopper.cancel()
        finally:
            timer.shutdown(wait=False)
            if listening is not None:
                listening.close()
            if inflight:
                await asyncio.gather(*inflight, return_exceptions=True)
            pool.shutdown(wait=True)
            keeper.stop()
