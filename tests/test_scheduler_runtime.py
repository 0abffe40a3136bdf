"""The async runtime: the in-memory APScheduler timer wakes it at the due time (not the safety
tick), and on PostgreSQL a schedule added by another process wakes it through LISTEN/NOTIFY."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

from taskkernel.kernel.store.db import Database
from taskkernel.scheduler import (
    ActionContext,
    ActionRegistry,
    ActionSpec,
    Ledger,
    SchedulerRuntime,
    Schedules,
    install,
    spec_from_user,
    system_clock,
)


def registry_recording(fired: list[tuple[str, float]]) -> ActionRegistry:
    registry = ActionRegistry()

    def record(ctx: ActionContext) -> None:
        fired.append((ctx.claim.name, (datetime.now(UTC) - ctx.claim.nominal).total_seconds()))

    registry.register_callable("record", record)
    return registry


def add(db: Database, name: str, user: dict[str, str]) -> None:
    spec = spec_from_user(user, name=name).model_copy(update={"action": ActionSpec(callable="record")})
    Schedules(Ledger(db)).add(spec, datetime.now(UTC))


async def run_for(rt: SchedulerRuntime, seconds: float, during: object = None) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(rt.run(stop))
    await asyncio.sleep(0.3)
    if callable(during):
        await asyncio.to_thread(during)
    await asyncio.sleep(seconds)
    stop.set()
    await asyncio.wait_for(task, 10)


async def test_timer_wakes_at_the_due_time(any_db: Database) -> None:
    install(any_db)
    fired: list[tuple[str, float]] = []
    add(any_db, "soon", {"at": (datetime.now(UTC) + timedelta(seconds=1)).isoformat()})
    add(any_db, "beat", {"every": "1s"})
    rt = SchedulerRuntime(any_db, registry_recording(fired), clock=system_clock, owner="rt", safety_tick_s=60)
    started = time.monotonic()
    await run_for(rt, 2.2)
    assert time.monotonic() - started < 8
    assert [n for n, _ in fired].count("soon") == 1
    assert [n for n, _ in fired].count("beat") >= 2
    assert max(late for _, late in fired) < 1.0  # woken by the timer, not by the 60 s safety tick


async def test_postgres_notify_wakes_other_coordinators(pg_url: str) -> None:
    db = Database(pg_url)
    install(db)
    fired: list[tuple[str, float]] = []
    rt = SchedulerRuntime(db, registry_recording(fired), clock=system_clock, owner="rt", safety_tick_s=60)
    other = Database(pg_url)  # "another process": its own engine and connections

    def add_elsewhere() -> None:
        add(other, "late-add", {"at": (datetime.now(UTC) + timedelta(seconds=0.5)).isoformat()})

    await run_for(rt, 2.0, add_elsewhere)
    other.dispose()
    db.dispose()
    assert [n for n, _ in fired] == ["late-add"]
    assert fired[0][1] < 1.0


def test_tick_reports_outcomes(sqlite_db: Database) -> None:
    install(sqlite_db)
    fired: list[tuple[str, float]] = []
    start = datetime(2026, 1, 1, tzinfo=UTC)
    spec = spec_from_user({"every": "10m"}, name="beat").model_copy(update={"action": ActionSpec(callable="record")})
    Schedules(Ledger(sqlite_db)).add(spec, start)
    rt = SchedulerRuntime(sqlite_db, registry_recording(fired), owner="rt")
    report = rt.tick(start + timedelta(minutes=10))
    assert report.summary() == {"claimed": 1, "outcomes": {"done": 1}, "lease_lost": 0}
