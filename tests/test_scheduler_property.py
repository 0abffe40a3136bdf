"""Property: random specs, crash points, downtime and clock jumps, 1-3 coordinators.

For every schedule and every window: fired occurrences <= nominal occurrences, and no dedup key is
ever run twice (a non-idempotent action runs at most once; an idempotent one re-runs only after
its holder crashed, with a higher attempt, and its effect - keyed by the idempotency key - happens
once).
"""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from taskkernel.kernel.store.db import Database
from taskkernel.scheduler import ActionContext, ActionSpec, Schedules, build_trigger, install, spec_from_user
from taskkernel.scheduler.models import FIRED_STATES
from taskkernel.scheduler.simulate import Crash, VirtualCluster, sim_registry
from taskkernel.scheduler.tables import occurrence
from taskkernel.scheduler.triggers import from_db_time

BASE = datetime(2026, 10, 31, 0, 0, tzinfo=UTC)  # the New York fall-back night is inside the range
ZONES = ["UTC", "America/New_York", "Europe/Berlin", "Australia/Lord_Howe"]

cron_exprs = st.sampled_from([
    "30 1 * * *", "30 2 * * *", "*/20 * * * *", "45 1,2 * * *", "0 */3 * * *", "15 9 * * 0", "0 0 * * *",
])
user_specs = st.one_of(
    st.builds(lambda c, tz: {"cron": c, "tz": tz}, cron_exprs, st.sampled_from(ZONES)),
    st.builds(lambda s: {"every": f"{s}s"}, st.integers(600, 4 * 3600)),
    st.builds(lambda m: {"at": (BASE + timedelta(minutes=m)).isoformat()}, st.integers(0, 36 * 60)),
)
policies = st.fixed_dictionaries({
    "misfire": st.sampled_from(["skip", "latest_once", "all"]),
    "catchup_window": st.sampled_from(["0s", "10m", "1h", "6h"]),
    "catchup_max": st.integers(1, 4),
    "overlap": st.sampled_from(["skip", "buffer_one", "allow"]),
    "grace": st.sampled_from(["0s", "60s"]),
    "jitter": st.sampled_from(["0s", "5m"]),
})
minute_offsets = st.integers(0, 36 * 60)


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    n_sched = draw(st.integers(1, 3))
    specs = [{**draw(user_specs), **draw(policies)} for _ in range(n_sched)]
    procs = draw(st.integers(1, 3))
    downs = [sorted(draw(st.lists(st.tuples(minute_offsets, st.integers(1, 240)), max_size=2))) for _ in range(procs)]
    skews = [draw(st.lists(st.tuples(minute_offsets, st.integers(-120, 120)), max_size=2)) for _ in range(procs)]
    return {
        "specs": specs,
        "idempotent": [draw(st.booleans()) for _ in range(n_sched)],
        "processes": procs,
        "downs": downs,
        "skews": skews,
        "crash_rate": draw(st.sampled_from([0.0, 0.05, 0.2])),
        "run_for": draw(st.sampled_from([0, 0, 300, 2400])),
        "seed": draw(st.integers(0, 2**32 - 1)),
        "hours": draw(st.integers(6, 24)),
    }


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_never_more_than_nominal_and_never_twice(sc: dict[str, Any]) -> None:
    check_scenario(sc)


@pytest.mark.soak
@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_never_more_than_nominal_and_never_twice_soak(sc: dict[str, Any]) -> None:
    check_scenario(sc)


def check_scenario(sc: dict[str, Any]) -> None:
    rng = random.Random(sc["seed"])
    calls: list[tuple[str, str, int]] = []
    effects: Counter[str] = Counter()

    def record(ctx: ActionContext) -> None:
        calls.append((ctx.claim.schedule_id, ctx.claim.key, ctx.claim.attempt))
        effects[ctx.idempotency_key] += 0  # the keyed effect below is what an idempotent sink keeps
        if ctx.claim.spec.action is not None and ctx.claim.spec.action.idempotent:
            effects[ctx.idempotency_key] = 1
        else:
            effects[ctx.idempotency_key] += 1

    def faults(_proc: str) -> Any:
        def hook(point: str) -> None:
            if rng.random() < sc["crash_rate"]:
                raise Crash(point)
        return hook

    db = Database("sqlite://", durability="process")
    try:
        install(db)
        cluster = VirtualCluster(db, sim_registry(record), sc["processes"], faults=faults, lease_s=1800,
                                 run_for=timedelta(seconds=sc["run_for"]), restart_after=timedelta(minutes=7))
        for p, down, skew in zip(cluster.procs, sc["downs"], sc["skews"], strict=True):
            p.down = [(BASE + timedelta(minutes=a), BASE + timedelta(minutes=a + d)) for a, d in down]
            p.skew = sorted((BASE + timedelta(minutes=a), timedelta(minutes=o)) for a, o in skew)
        admin = Schedules(cluster.ledger)
        rows = []
        for i, (user, idem) in enumerate(zip(sc["specs"], sc["idempotent"], strict=True)):
            spec = spec_from_user(user, name=f"s{i}").model_copy(
                update={"action": ActionSpec(callable="simulate", idempotent=idem)})
            rows.append((admin.add(spec, BASE), spec))
        end = BASE + timedelta(hours=sc["hours"])
        cluster.run(BASE, end)

        with db.read() as conn:
            ledger = conn.execute(sa.select(occurrence)).all()
        fired_states = {s.value for s in FIRED_STATES}
        for row, spec in rows:
            trig = build_trigger(spec, row.created, row.id)
            # Skewed clocks (up to +2h) may claim occurrences before their true time.
            nominal = list(trig.iter_after(row.watermark, end + timedelta(hours=2, minutes=10)))
            fired = sorted(from_db_time(r.nominal_utc) for r in ledger
                           if r.schedule_id == row.id and r.state in fired_states)
            # Every fired occurrence is a nominal one, at most once per dedup key ...
            assert set(fired) <= set(nominal)
            assert len({trig.key(n) for n in fired}) == len(fired)
            # ... and in every window, fires <= nominal occurrences.
            for _ in range(20):
                a, b = sorted(rng.sample(range(0, sc["hours"] * 60 + 130), 2))
                lo, hi = BASE + timedelta(minutes=a), BASE + timedelta(minutes=b)
                assert sum(lo <= f <= hi for f in fired) <= sum(lo <= n <= hi for n in nominal)

        event(f"crashes: {min(cluster.crashes, 3)}")
        event(f"re-runs: {sum(1 for _, _, a in calls if a > 1) > 0}")
        runs = Counter((sid, key) for sid, key, _ in calls)
        attempts = Counter(calls)
        assert max(attempts.values(), default=1) == 1  # no (key, attempt) ever ran twice
        idempotent_ids = {row.id for (row, _), idem in zip(rows, sc["idempotent"], strict=True) if idem}
        for (sid, _key), n in runs.items():
            if sid not in idempotent_ids:
                assert n == 1  # a re-run needs a crash (or downtime mid-run) *and* an idempotent action
        assert max(effects.values(), default=1) <= 1
    finally:
        db.dispose()
