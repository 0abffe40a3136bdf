"""The durable ledger on both backends: claims, watermark, leases and fencing, recovery, admin."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from taskkernel.kernel.store.db import Database
from taskkernel.scheduler import (
    ActionContext,
    ActionRegistry,
    ActionSpec,
    Ledger,
    OccurrenceState,
    ScheduleError,
    SchedulerException,
    SchedulerRuntime,
    Schedules,
    install,
    spec_from_user,
)
from taskkernel.scheduler.ledger import Outcome
from taskkernel.scheduler.tables import occurrence, schedule

T0 = datetime(2026, 11, 1, 0, 0, tzinfo=UTC)


class Crash(Exception):
    pass


def minutes(n: float) -> datetime:
    return T0 + timedelta(minutes=n)


def rows(db: Database) -> dict[str, Any]:
    with db.read() as conn:
        return {r.occurrence_key: r for r in conn.execute(sa.select(occurrence).order_by(occurrence.c.nominal_utc))}


@pytest.fixture
def env(any_db: Database) -> dict[str, Any]:
    install(any_db)
    calls: list[tuple[str, int]] = []
    registry = ActionRegistry()

    def record(ctx: ActionContext) -> None:
        calls.append((ctx.claim.key, ctx.claim.attempt))

    registry.register_callable("record", record)
    return {"db": any_db, "calls": calls, "registry": registry, "schedules": Schedules(Ledger(any_db))}


def add(env: dict[str, Any], name: str, *, idempotent: bool = False, **user: Any) -> Any:
    spec = spec_from_user(user or {"every": "10m"}, name=name)
    spec = spec.model_copy(update={"action": ActionSpec(callable="record", idempotent=idempotent)})
    return env["schedules"].add(spec, T0)


def runtime(env: dict[str, Any], owner: str, faults: Any = None, lease_s: int = 60) -> SchedulerRuntime:
    return SchedulerRuntime(env["db"], env["registry"], owner=owner, faults=faults, lease_s=lease_s)


def test_each_occurrence_is_claimed_by_exactly_one_coordinator(env: dict[str, Any]) -> None:
    add(env, "beat")
    a, b = runtime(env, "a"), runtime(env, "b")
    for minute in (10, 20, 30):
        ra, rb = a.tick(minutes(minute)), b.tick(minutes(minute))
        assert ra.claimed + rb.claimed == 1
    assert [k for k, _ in env["calls"]] == ["2026-11-01T00:10:00Z", "2026-11-01T00:20:00Z", "2026-11-01T00:30:00Z"]
    assert {r.state for r in rows(env["db"]).values()} == {"done"}


def test_claim_is_committed_before_the_action_runs(env: dict[str, Any]) -> None:
    add(env, "beat")

    def crash_after_claim(point: str) -> None:
        if point == "after_claim":
            raise Crash

    with pytest.raises(Crash):
        runtime(env, "a", crash_after_claim).tick(minutes(10))
    row = rows(env["db"])["2026-11-01T00:10:00Z"]
    assert (row.state, row.lease_owner, row.fencing, row.attempt) == ("running", "a", 1, 1)
    assert env["calls"] == []
    # Another coordinator within the lease: nothing to do, and it never takes the claimed key.
    assert runtime(env, "b").tick(minutes(10.5)).claimed == 0


def test_expired_lease_of_non_idempotent_action_is_abandoned_not_rerun(env: dict[str, Any]) -> None:
    add(env, "beat")

    def crash(point: str) -> None:
        if point == "before_finish":
            raise Crash

    with pytest.raises(Crash):
        runtime(env, "a", crash).tick(minutes(10))
    assert env["calls"] == [("2026-11-01T00:10:00Z", 1)]
    runtime(env, "b").tick(minutes(12))  # lease (60 s) expired
    row = rows(env["db"])["2026-11-01T00:10:00Z"]
    assert row.state == "abandoned" and "not idempotent" in row.detail
    assert env["calls"] == [("2026-11-01T00:10:00Z", 1)]


def test_expired_lease_of_idempotent_action_reruns_with_attempt_plus_one(env: dict[str, Any]) -> None:
    add(env, "beat", idempotent=True)

    def crash(point: str) -> None:
        if point == "before_finish":
            raise Crash

    with pytest.raises(Crash):
        runtime(env, "a", crash).tick(minutes(10))
    b = runtime(env, "b")
    report = b.tick(minutes(12))
    assert report.claimed == 1
    row = rows(env["db"])["2026-11-01T00:10:00Z"]
    assert (row.state, row.attempt, row.fencing, row.lease_owner) == ("done", 2, 2, "b")
    assert env["calls"] == [("2026-11-01T00:10:00Z", 1), ("2026-11-01T00:10:00Z", 2)]


def test_idempotent_reruns_stop_at_max_attempts(env: dict[str, Any]) -> None:
    spec = spec_from_user({"every": "10m"}, name="beat").model_copy(
        update={"action": ActionSpec(callable="record", idempotent=True, max_attempts=2)})
    env["schedules"].add(spec, T0)

    def crash(point: str) -> None:
        if point == "before_finish":
            raise Crash

    for i, at in enumerate((10, 12)):
        with pytest.raises(Crash):
            runtime(env, f"c{i}", crash).tick(minutes(at))
    runtime(env, "z").tick(minutes(14))
    row = rows(env["db"])["2026-11-01T00:10:00Z"]
    assert (row.state, row.attempt) == ("abandoned", 2)
    assert len(env["calls"]) == 2


def test_stale_holder_cannot_finish_after_its_lease_moved_on(env: dict[str, Any]) -> None:
    add(env, "beat", idempotent=True)
    ledger = Ledger(env["db"])
    [old] = ledger.claim_due("a", minutes(10))
    [new] = ledger.claim_due("b", minutes(12))  # a's lease expired: re-claimed with fencing 2
    assert (old.fencing, new.fencing) == (1, 2)
    assert ledger.renew([old], minutes(12)) == [old]
    lost = ledger.finish([Outcome(old, OccurrenceState.DONE, run_ref="stale")], minutes(12))
    assert len(lost) == 1
    assert ledger.finish([Outcome(new, OccurrenceState.DONE, run_ref="fresh")], minutes(12)) == []
    row = rows(env["db"])["2026-11-01T00:10:00Z"]
    assert (row.state, row.run_ref, row.fencing) == ("done", "fresh", 2)


def test_watermark_only_moves_forward_and_backward_clock_fires_nothing(env: dict[str, Any]) -> None:
    add(env, "beat")
    rt = runtime(env, "a")
    rt.tick(minutes(30))
    wm = env["schedules"].get("beat").watermark
    assert rt.tick(minutes(5)).claimed == 0  # clock jumped back
    assert env["schedules"].get("beat").watermark == wm
    assert rt.tick(minutes(30)).claimed == 0


def test_watermark_compare_and_set_rejects_a_stale_revision(env: dict[str, Any]) -> None:
    add(env, "beat")
    ledger: Ledger = env["schedules"].ledger
    with env["db"].read() as conn:
        stale = conn.execute(sa.select(schedule)).one()
    env["schedules"].pause("beat", minutes(1))  # bumps the revision
    with pytest.raises(SchedulerException) as exc, ledger.tx() as conn:
        ledger.apply_due(conn, [stale], "x", minutes(10))
    assert exc.value.code is ScheduleError.STALE_REVISION
    assert rows(env["db"]) == {}  # the whole transaction rolled back


def test_restart_recovery_applies_the_misfire_policy_from_the_watermark(env: dict[str, Any]) -> None:
    add(env, "beat", **{"every": "10m", "misfire": "latest_once", "catchup_window": "15m"})
    runtime(env, "a").tick(minutes(10))
    # Down until 01:05; a fresh coordinator recomputes from the watermark.
    runtime(env, "fresh").tick(minutes(65))
    states = {k[11:16]: (r.state, r.reason) for k, r in rows(env["db"]).items()}
    assert states == {"00:10": ("done", None), "00:20": ("missed", "misfire"), "00:30": ("missed", "misfire"),
                      "00:40": ("missed", "misfire"), "00:50": ("missed", "misfire"), "01:00": ("done", None)}


def test_paused_occurrences_are_recorded_and_never_caught_up(env: dict[str, Any]) -> None:
    add(env, "beat")
    s: Schedules = env["schedules"]
    s.pause("beat", minutes(5))
    runtime(env, "a").tick(minutes(25))
    s.resume("beat", minutes(44))  # nobody ticked between 00:25 and 00:44
    runtime(env, "a").tick(minutes(44))
    runtime(env, "a").tick(minutes(50))
    states = {k[11:16]: (r.state, r.reason) for k, r in rows(env["db"]).items()}
    assert states == {"00:10": ("missed", "paused"), "00:20": ("missed", "paused"),
                      "00:30": ("missed", "paused"), "00:40": ("missed", "paused"), "00:50": ("done", None)}
    assert [k[11:16] for k, _ in env["calls"]] == ["00:50"]


def test_backfill_is_explicit_bounded_and_deduplicated(env: dict[str, Any]) -> None:
    add(env, "beat", **{"every": "10m", "misfire": "skip"})
    s: Schedules = env["schedules"]
    rt = runtime(env, "a")
    rt.tick(minutes(10))
    rt.tick(minutes(45))  # 00:20, 00:30 missed (skip); 00:40 missed too (5 min late > 60 s grace)
    with pytest.raises(SchedulerException) as exc:
        s.backfill("beat", minutes(0), minutes(45), minutes(46), max_count=3)
    assert exc.value.code is ScheduleError.BACKFILL_TOO_LARGE
    with pytest.raises(SchedulerException) as exc:
        s.backfill("beat", minutes(0), minutes(90), minutes(46))
    assert exc.value.code is ScheduleError.INVALID_RANGE
    out = s.backfill("beat", minutes(0), minutes(45), minutes(46))
    assert out["queued"] == ["2026-11-01T00:20:00Z", "2026-11-01T00:30:00Z", "2026-11-01T00:40:00Z"]
    assert out["skipped"] == [{"dedup_key": "2026-11-01T00:10:00Z", "state": "done"}]
    rt.tick(minutes(46))
    again = s.backfill("beat", minutes(0), minutes(45), minutes(47))
    assert again["queued"] == [] and len(again["skipped"]) == 4
    assert sorted(k[11:16] for k, _ in env["calls"]) == ["00:10", "00:20", "00:30", "00:40"]


def test_backfilled_key_the_tick_reaches_later_is_a_duplicate_not_a_second_fire(env: dict[str, Any]) -> None:
    add(env, "beat")
    s: Schedules = env["schedules"]
    s.backfill("beat", minutes(10), minutes(10), minutes(11))  # coordinator has not ticked yet
    runtime(env, "a").tick(minutes(11))
    assert env["calls"] == [("2026-11-01T00:10:00Z", 1)]
    assert [o["reason"] for o in s.outcomes(s.get("beat")) if o["state"] == "missed"] == ["duplicate"]


def test_admin_errors_and_name_reuse_after_remove(env: dict[str, Any]) -> None:
    s: Schedules = env["schedules"]
    add(env, "beat")
    with pytest.raises(SchedulerException) as exc:
        add(env, "beat")
    assert exc.value.code is ScheduleError.SCHEDULE_EXISTS
    for verb in ("pause", "resume", "remove"):
        with pytest.raises(SchedulerException) as exc:
            getattr(s, verb)("nope", T0)
        assert exc.value.code is ScheduleError.SCHEDULE_NOT_FOUND
    runtime(env, "a").tick(minutes(10))
    s.remove("beat", minutes(11))
    assert s.all() == []
    assert runtime(env, "a").tick(minutes(30)).claimed == 0
    add(env, "beat")  # the name is free again; the old ledger rows stay
    assert len(rows(env["db"])) == 1


def test_show_lists_next_occurrences_and_latest_outcomes(env: dict[str, Any]) -> None:
    add(env, "beat")
    s: Schedules = env["schedules"]
    runtime(env, "a").tick(minutes(10))
    row = s.get("beat")
    nxt = s.upcoming(row, minutes(10), 5)
    assert [n["nominal"] for n in nxt] == [f"2026-11-01T00:{m}0:00Z" for m in range(2, 6)] + ["2026-11-01T01:00:00Z"]
    assert [o["state"] for o in s.outcomes(row)] == ["done"]
