"""Real coordinator processes on one database: 3 run, one is SIGKILLed mid-action and restarted.

Each action appends a line to a shared log *when it starts* (O_APPEND + fsync), so a run killed
half-way is visible. Afterwards: no dedup key ran twice (non-idempotent), an idempotent one re-ran
only with a higher attempt, and every nominal occurrence up to the watermark is in the ledger -
fired, or missed for a reason the policy allows (overlap with the killed run while its lease lived).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from taskkernel.kernel.store.db import Database
from taskkernel.scheduler import (
    ActionContext,
    ActionRegistry,
    ActionSpec,
    Ledger,
    SchedulerRuntime,
    Schedules,
    build_trigger,
    install,
    spec_from_user,
    system_clock,
)
from taskkernel.scheduler.tables import occurrence, occurrence_conflict

LEASE_S = 2


def child_main(url: str, log_path: str, stop_path: str, owner: str, slow: bool) -> None:
    db = Database(url)
    registry = ActionRegistry()

    def record(ctx: ActionContext) -> None:
        line = f"{ctx.claim.schedule_id} {ctx.claim.key} {ctx.claim.attempt} {owner}\n"
        fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        time.sleep(0.6 if slow else 0.03)

    registry.register_callable("record", record)
    runtime = SchedulerRuntime(db, registry, clock=system_clock, owner=owner, lease_s=LEASE_S, safety_tick_s=0.3)

    async def main() -> None:
        stop = asyncio.Event()

        async def watch() -> None:
            while not os.path.exists(stop_path):
                await asyncio.sleep(0.05)
            stop.set()

        await asyncio.gather(runtime.run(stop), watch())

    asyncio.run(main())


def spawn(url: str, tmp: Path, owner: str, slow: bool = False) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.Popen(
        [sys.executable, __file__, url, str(tmp / "fires.log"), str(tmp / "stop"), owner, "1" if slow else "0"],
        env=env, stderr=subprocess.PIPE,
    )


def log_lines(tmp: Path) -> list[tuple[str, str, int, str]]:
    path = tmp / "fires.log"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        sid, key, attempt, owner = line.split()
        out.append((sid, key, int(attempt), owner))
    return out


def run_cluster(url: str, tmp: Path) -> None:
    db = Database(url)
    install(db)
    admin = Schedules(Ledger(db))
    now = datetime.now(UTC)
    specs = {"a": ({"every": "1s"}, False), "b": ({"every": "1s", "misfire": "skip"}, False),
             "c": ({"every": "1s"}, True), "d": ({"every": "2s", "overlap": "allow"}, False)}
    for name, (user, idem) in specs.items():
        spec = spec_from_user(user, name=name).model_copy(
            update={"action": ActionSpec(callable="record", idempotent=idem)})
        admin.add(spec, now)

    procs = {"p0": spawn(url, tmp, "p0", slow=True), "p1": spawn(url, tmp, "p1"), "p2": spawn(url, tmp, "p2")}
    try:
        # Kill p0 while one of its (slow) actions is running: right after it logged a start.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            time.sleep(0.01)
            if any(o == "p0" for *_, o in log_lines(tmp)) and time.monotonic() > deadline - 18:
                break
        else:
            pytest.fail("p0 never started an action")
        os.kill(procs["p0"].pid, signal.SIGKILL)
        procs["p0"].wait(timeout=10)
        killed_at = len(log_lines(tmp))
        time.sleep(1.0)
        procs["p0b"] = spawn(url, tmp, "p0b")
        time.sleep(LEASE_S * 2 + 1.5)
        assert len(log_lines(tmp)) > killed_at + 10, "the survivors kept firing"
    finally:
        (tmp / "stop").touch()
        for name, p in procs.items():
            if name == "p0":
                continue
            try:
                _, err = p.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                raise
            assert p.returncode == 0, err.decode()[-2000:]

    lines = log_lines(tmp)
    ids = {s.name: s for s in admin.all()}
    idempotent = {ids["c"].id}
    per_key = Counter((sid, key) for sid, key, _, _ in lines)
    per_attempt = Counter((sid, key, attempt) for sid, key, attempt, _ in lines)
    assert max(per_attempt.values()) == 1
    for (sid, key), n in per_key.items():
        assert n == 1 or sid in idempotent, f"{key} of {sid} ran {n} times"

    with db.read() as conn:
        occ = conn.execute(sa.select(occurrence)).all()
        dups = conn.execute(sa.select(occurrence_conflict)).all()
    assert dups == []
    killed_rows = [r for r in occ if r.lease_owner == "p0"]
    assert killed_rows, "p0 claimed nothing before it was killed"
    for name, s in ids.items():
        mine = {r.occurrence_key: r for r in occ if r.schedule_id == s.id}
        trig = build_trigger(s.spec, s.created, s.id)
        nominal = [trig.key(n) for n in trig.iter_after(s.created - timedelta(microseconds=1), s.watermark)]
        assert sorted(mine) == sorted(nominal), f"{name}: ledger has a gap or an extra occurrence"
        for key, r in mine.items():
            fired_lines = per_key.get((s.id, key), 0)
            if r.state == "done" and s.id in idempotent:
                # attempt n ran; earlier attempts may have died before or after starting
                assert 1 <= fired_lines <= r.attempt, (name, key)
            elif r.state == "done":
                assert fired_lines == 1, (name, key)
            elif r.state == "abandoned":
                assert r.lease_owner == "p0" and s.id not in idempotent
            elif r.state == "missed":
                assert r.reason == "overlap", (name, key, r.reason)
            else:  # still running at stop: only a killed holder's row whose lease nobody reaped yet
                assert r.state == "running" and r.lease_owner == "p0", (name, key, r.state)
        misses = sum(r.state == "missed" for r in mine.values())
        assert misses <= LEASE_S + 2, f"{name}: {misses} occurrences lost to overlap"
    # The killed run itself: started (logged), then abandoned or re-run by a survivor.
    p0_started = [(sid, key) for sid, key, attempt, owner in lines if owner == "p0"]
    last = {r.occurrence_key: r for r in occ if (r.schedule_id, r.occurrence_key) == p0_started[-1]}
    assert all(r.state in ("abandoned", "done", "running") for r in last.values())
    db.dispose()


@pytest.mark.slow
def test_three_coordinators_sqlite_one_killed(tmp_path: Path) -> None:
    run_cluster(f"sqlite:///{tmp_path / 'kernel.db'}", tmp_path)


@pytest.mark.slow
def test_three_coordinators_postgres_one_killed(pg_url: str, tmp_path: Path) -> None:
    run_cluster(pg_url, tmp_path)


def _child_entry(argv: list[str]) -> Any:
    url, log_path, stop_path, owner, slow = argv
    return child_main(url, log_path, stop_path, owner, slow == "1")


if __name__ == "__main__":
    _child_entry(sys.argv[1:])
