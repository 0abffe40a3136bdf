"""Actions end to end: create_task through the real TaskCommandKernel (with a SIGKILLed first run),
accept_input into the real session log, and the patrol guards (only_if_changed, no-progress fuse)."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from taskkernel.coordinator.compose import build_kernel
from taskkernel.kernel.sessionlog import SessionLog
from taskkernel.kernel.store.db import Database
from taskkernel.kernel.store.schema import tasks
from taskkernel.scheduler import (
    ActionContext,
    ActionRegistry,
    ActionSpec,
    Ledger,
    SchedulerRuntime,
    Schedules,
    install,
    spec_from_user,
)
from taskkernel.scheduler.tables import occurrence

T0 = datetime(2026, 11, 1, 0, 0, tzinfo=UTC)
KEY = "2026-11-01T00:10:00Z"


def minutes(n: float) -> datetime:
    return T0 + timedelta(minutes=n)


def occ(db: Database) -> dict[str, Any]:
    with db.read() as conn:
        return {r.occurrence_key: r for r in conn.execute(sa.select(occurrence).order_by(occurrence.c.nominal_utc))}


def kernel_registry(db: Database) -> ActionRegistry:
    return ActionRegistry(submit=build_kernel(db, None).submit, session_log=SessionLog(db))


def task_count(db: Database) -> int:
    with db.read() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(tasks)).scalar_one())


def add_create_task(db: Database, template: dict[str, Any] | None = None) -> None:
    install(db)
    tpl = template or {"recipient": "PM", "subject": "daily report {dedup_key}", "body": "for {local}"}
    spec = spec_from_user({"every": "10m", "tz": "Europe/Berlin"}, name="report").model_copy(
        update={"action": ActionSpec(type="create_task", template=tpl)})
    Schedules(Ledger(db)).add(spec, T0)


def crashing_child(url: str, point: str) -> None:
    """Tick once at 00:10 and SIGKILL this process at ``point`` (a real crash, nothing cleans up)."""
    db = Database(url)

    def die(at: str) -> None:
        if at == point:
            os.kill(os.getpid(), 9)

    SchedulerRuntime(db, kernel_registry(db), owner="doomed", faults=die).tick(minutes(10))


@pytest.mark.parametrize("point", ["after_claim", "before_finish"])
def test_create_task_rerun_after_sigkill_creates_exactly_one_task(any_url: str, point: str) -> None:
    db = Database(any_url)
    add_create_task(db)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    child = subprocess.run([sys.executable, __file__, any_url, point], env=env, capture_output=True, timeout=60)
    assert child.returncode == -9, child.stderr.decode()[-2000:]
    row = occ(db)[KEY]
    assert (row.state, row.lease_owner, row.attempt) == ("running", "doomed", 1)
    assert task_count(db) == (1 if point == "before_finish" else 0)

    report = SchedulerRuntime(db, kernel_registry(db), owner="survivor").tick(minutes(12))  # lease expired
    assert report.claimed == 1 and not report.lost
    row = occ(db)[KEY]
    assert (row.state, row.attempt, row.fencing, row.lease_owner) == ("done", 2, 2, "survivor")
    assert task_count(db) == 1
    with db.read() as conn:
        task = conn.execute(sa.select(tasks)).one()
    assert row.run_ref == task.task_id
    assert "daily report 2026-11-01T00:10:00Z" in task.doc and "2026-11-01T01:10:00+01:00" in task.doc
    db.dispose()


def test_create_task_rejected_by_the_kernel_is_a_failed_occurrence(sqlite_db: Database) -> None:
    add_create_task(sqlite_db, {"recipient": "DEVV", "subject": "x"})  # added without the team: refused at the fire
    SchedulerRuntime(sqlite_db, kernel_registry(sqlite_db), owner="a").tick(minutes(10))
    row = occ(sqlite_db)[KEY]
    assert row.state == "failed" and row.detail.startswith("action_rejected:")
    assert task_count(sqlite_db) == 0


def test_accept_input_appends_once_per_occurrence(sqlite_db: Database) -> None:
    install(sqlite_db)
    spec = spec_from_user({"every": "10m"}, name="nudge").model_copy(update={"action": ActionSpec(
        type="accept_input", session="s1", kind="message", payload={"text": "standup at {local}"})})
    Schedules(Ledger(sqlite_db)).add(spec, T0)
    log = SessionLog(sqlite_db)
    registry = ActionRegistry(session_log=log)
    rt = SchedulerRuntime(sqlite_db, registry, owner="a")
    rt.tick(minutes(10))
    rt.tick(minutes(20))
    recs = log.records("s1")
    assert [(r.seq, r.kind) for r in recs] == [(1, "message"), (2, "message")]
    assert recs[0].payload == {"text": "standup at 2026-11-01T00:10:00+00:00"}
    assert occ(sqlite_db)[KEY].run_ref == "s1#1"
    # The same occurrence delivered again (a re-run) is an idempotent replay, not a second input.
    again = log.accept("s1", {"input_id": recs[0].input_id, "kind": "message", "payload": recs[0].payload})
    assert (again.status, again.accept_seq) == ("replayed", 1)


# -- patrol guards (codeflowmu-kernel.md §4) -------------------------------------------------------

class Patrol:
    """A patrol whose watched state is a dict; ``self_exciting`` makes it write into it (a report)."""

    def __init__(self, db: Database, *, only_if_changed: bool, fuse: int = 3, self_exciting: bool = False) -> None:
        self.state: dict[str, Any] = {"open": ["T1"], "reports": 0}
        self.fired: list[str] = []
        self.registry = ActionRegistry()
        self.registry.register_probe("board", lambda: self.state)

        def patrol(ctx: ActionContext) -> None:
            self.fired.append(ctx.claim.key[11:16])
            if self_exciting:
                self.state["reports"] += 1

        self.registry.register_callable("patrol", patrol)
        install(db)
        spec = spec_from_user({"every": "10m"}, name="patrol").model_copy(update={"action": ActionSpec(
            callable="patrol", watch="board", only_if_changed=only_if_changed, fuse=fuse)})
        self.admin = Schedules(Ledger(db))
        self.admin.add(spec, T0)
        self.rt = SchedulerRuntime(db, self.registry, owner="a")

    def at(self, minute: int) -> None:
        self.rt.tick(minutes(minute))


def outcomes(db: Database) -> list[tuple[str, str, str | None]]:
    return [(k[11:16], r.state, r.reason) for k, r in occ(db).items()]


def test_only_if_changed_fires_only_after_the_watched_state_changed(sqlite_db: Database) -> None:
    p = Patrol(sqlite_db, only_if_changed=True)
    p.at(10)
    p.at(20)
    p.state["open"].append("T2")
    p.at(30)
    p.at(40)
    assert p.fired == ["00:10", "00:30"]
    assert outcomes(sqlite_db) == [("00:10", "done", None), ("00:20", "missed", "unchanged"),
                                   ("00:30", "done", None), ("00:40", "missed", "unchanged")]


def test_self_exciting_patrol_does_not_loop(sqlite_db: Database) -> None:
    # The patrol writes a report into the watched state; the baseline is taken after it ran, so its
    # own write is not a change (the CodeFlowMu PM-heartbeat loop).
    p = Patrol(sqlite_db, only_if_changed=True, self_exciting=True)
    for m in (10, 20, 30, 40):
        p.at(m)
    assert p.fired == ["00:10"]


def test_no_progress_fuse_pauses_after_three_fires_that_changed_nothing(sqlite_db: Database) -> None:
    p = Patrol(sqlite_db, only_if_changed=False)
    for m in (10, 20, 30, 40, 50):
        p.at(m)
    assert p.fired == ["00:10", "00:20", "00:30"]
    assert outcomes(sqlite_db)[3:] == [("00:40", "missed", "no_progress"), ("00:50", "missed", "paused")]
    s = p.admin.get("patrol")
    assert (s.paused, s.pause_reason, s.no_progress) == (True, "no_progress", 3)
    p.admin.resume("patrol", minutes(55))
    p.state["open"].append("T2")
    p.at(60)
    assert p.fired[-1] == "01:00"
    assert p.admin.get("patrol").no_progress == 0


def test_fuse_without_watch_counts_failures_and_reported_no_progress(sqlite_db: Database) -> None:
    install(sqlite_db)
    results = iter([{"progress": False}, RuntimeError("exec failed"), {"progress": True},
                    {"progress": False}, {"progress": False}, RuntimeError("exec failed")])
    registry = ActionRegistry()

    def step(_ctx: ActionContext) -> Any:
        r = next(results)
        if isinstance(r, Exception):
            raise r
        return r

    registry.register_callable("step", step)
    admin = Schedules(Ledger(sqlite_db))
    admin.add(spec_from_user({"every": "10m"}, name="goal").model_copy(
        update={"action": ActionSpec(callable="step", fuse=3)}), T0)
    rt = SchedulerRuntime(sqlite_db, registry, owner="a")
    for m in (10, 20, 30, 40, 50, 60, 70):
        rt.tick(minutes(m))
    states = outcomes(sqlite_db)
    assert [s for _, s, _ in states[:6]] == ["done", "failed", "done", "done", "done", "failed"]
    assert states[6] == ("01:10", "missed", "paused")
    assert "action_failed: RuntimeError: exec failed" in occ(sqlite_db)["2026-11-01T00:20:00Z"].detail
    assert admin.get("goal").pause_reason == "no_progress"


if __name__ == "__main__":
    crashing_child(sys.argv[1], sys.argv[2])
