"""Scheduler benchmark: durable claims on SQLite vs APScheduler 3.11 in memory, same run.

10,000 schedules (cron in several zones + intervals) simulated over 24 virtual hours, no sleeping.

- durable: ``SchedulerRuntime.tick`` at every due instant - claim committed (synchronous=FULL, WAL),
  a no-op action, outcome recorded under the fencing token;
- baseline: APScheduler's own loop over a ``MemoryJobStore`` (``get_due_jobs``, ``_get_run_times``,
  ``trigger.get_next_fire_time``, ``update_job``) computing the same fire times, nothing persisted.

Prints time per due occurrence for both and the ratio (target <= 3x), plus memory per schedule.
Run: ``python bench/scheduler.py`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
import tracemalloc
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from apscheduler.job import Job  # noqa: E402
from apscheduler.jobstores.memory import MemoryJobStore  # noqa: E402
from apscheduler.schedulers.background import BackgroundScheduler  # noqa: E402

from taskkernel.kernel.store.db import Database  # noqa: E402
from taskkernel.scheduler import (  # noqa: E402
    ActionRegistry,
    ActionSpec,
    Ledger,
    SchedulerRuntime,
    Schedules,
    ScheduleSpec,
    build_trigger,
    install,
    spec_from_user,
)

START = datetime(2026, 6, 1, tzinfo=UTC)  # no DST change inside the day: both sides see the same times
ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Asia/Tokyo"]


def make_specs(n: int) -> list[ScheduleSpec]:
    action = ActionSpec(callable="noop")
    specs = []
    for i in range(n):
        if i % 10 < 7:
            user = {"cron": f"{i % 60} * * * *", "tz": ZONES[i % len(ZONES)]}
        else:
            user = {"every": f"{15 * (1 + i % 4)}m"}
        specs.append(spec_from_user(user, name=f"s{i}").model_copy(update={"action": action}))
    return specs


def bench_apscheduler(specs: list[ScheduleSpec], end: datetime) -> tuple[float, int, float]:
    sched = BackgroundScheduler(timezone=UTC)
    store = MemoryJobStore()
    store.start(sched, "default")
    watermark = START - timedelta(microseconds=1)
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for i, spec in enumerate(specs):
        trig = build_trigger(spec, START)._aps  # the very trigger objects the durable side uses
        first = trig.get_next_fire_time(None, watermark + timedelta(microseconds=1))
        job = Job(sched, id=f"s{i}", func=_noop, args=(), kwargs={}, trigger=trig, executor="default",
                  name=spec.name, misfire_grace_time=1, coalesce=False, max_instances=1, next_run_time=first)
        store.add_job(job)
    mem = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(before, "filename"))
    tracemalloc.stop()
    fires = 0
    t0 = time.perf_counter()
    now = store.get_next_run_time()
    while now is not None and now <= end:
        for job in store.get_due_jobs(now):
            run_times = job._get_run_times(now)
            for _ in run_times:
                _noop()
                fires += 1
            nxt = job.trigger.get_next_fire_time(run_times[-1], now)
            if nxt is None:
                store.remove_job(job.id)
            else:
                job._modify(next_run_time=nxt)
                store.update_job(job)
        now = store.get_next_run_time()
    return time.perf_counter() - t0, fires, mem / len(specs)


def bench_durable(specs: list[ScheduleSpec], end: datetime, workdir: Path
                  ) -> tuple[float, float, int, float, float]:
    """Returns (whole loop s, of which claiming s, fires, heap bytes per schedule, disk bytes per schedule)."""
    path = workdir / "bench.db"
    db = Database(f"sqlite:///{path}", durability="full")
    install(db)
    ledger = Ledger(db)
    Schedules(ledger).add_many(specs, START)
    registry = ActionRegistry()
    registry.register_callable("noop", lambda _ctx: None)
    rt = SchedulerRuntime(db, registry, owner="bench")
    rt.ledger = ledger
    claiming = 0.0
    claim_due = ledger.claim_due

    def timed_claim_due(owner: str, now: datetime) -> list:  # type: ignore[type-arg]
        nonlocal claiming
        t = time.perf_counter()
        try:
            return claim_due(owner, now)
        finally:
            claiming += time.perf_counter() - t

    ledger.claim_due = timed_claim_due  # type: ignore[method-assign]
    fires = 0
    t0 = time.perf_counter()
    now = ledger.next_wakeup()
    while now is not None and now <= end:
        report = rt.tick(now)
        fires += sum(1 for o in report.outcomes if o.state.value == "done")
        now = ledger.next_wakeup()
    elapsed = time.perf_counter() - t0
    # Memory the runtime keeps per schedule (trigger and spec caches), measured on a fresh one.
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    fresh = Ledger(db)
    for row in Schedules(fresh).all():
        fresh.triggers.get(row)
    mem = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(before, "filename"))
    tracemalloc.stop()
    db.dispose()
    return elapsed, claiming, fires, mem / len(specs), path.stat().st_size / len(specs)


def _noop() -> None:
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="500 schedules over 6 hours (smoke run)")
    ap.add_argument("--schedules", type=int, default=None)
    args = ap.parse_args()
    n = args.schedules or (500 if args.quick else 10_000)
    hours = 6 if args.quick else 24
    end = START + timedelta(hours=hours)
    specs = make_specs(n)
    with tempfile.TemporaryDirectory() as tmp:
        d_time, d_claim, d_fires, d_mem, d_disk = bench_durable(specs, end, Path(tmp))
    a_time, a_fires, a_mem = bench_apscheduler(specs, end)
    if a_fires != d_fires:
        raise SystemExit(f"fire counts differ: durable {d_fires}, APScheduler {a_fires}")
    d_us, c_us, a_us = d_time / d_fires * 1e6, d_claim / d_fires * 1e6, a_time / a_fires * 1e6
    print(f"schedules: {n}, virtual hours: {hours}, due occurrences: {d_fires}")
    print(f"durable, claiming only (trigger maths + claim committed):   {d_claim:8.2f} s  {c_us:7.1f} us/occurrence")
    print(f"durable, whole tick (claim + no-op action + outcome commit): {d_time:8.2f} s  {d_us:7.1f} us/occurrence")
    print(f"APScheduler 3.11 MemoryJobStore (fire times + job update):   {a_time:8.2f} s  {a_us:7.1f} us/occurrence")
    ratio = c_us / a_us
    print(f"ratio durable claims/APScheduler: {ratio:.2f}x (target <= 3x) {'OK' if ratio <= 3 else 'ABOVE TARGET'}")
    print(f"ratio whole durable tick/APScheduler: {d_us / a_us:.2f}x")
    print(f"memory per schedule: durable runtime heap {d_mem:,.0f} B (+ {d_disk:,.0f} B on disk incl. ledger), "
          f"APScheduler job store {a_mem:,.0f} B")


if __name__ == "__main__":
    main()
