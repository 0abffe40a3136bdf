"""Team benchmark (issue 13): `taskkernel up` running a team of command agents, as an owner runs it.

    python bench/team.py             # 200 tasks at once, then 2 x 200 spread-out arrivals
    python bench/team.py --quick     # 48 tasks at once, then 2 x 48 arrivals

Real processes: a fresh workspace (`taskkernel init`, embedded SQLite, durability full) whose four roles (the
dev-team preset: PM, DEV, QA, OPS) each have ``runner = "command"`` and ``concurrency = 2``, with
``[kernel] max_runs = 8``; `taskkernel up` (not --once) in its own process; the tasks created by this process
through the kernel the CLI builds (``CliContext.kernel().submit``, the owner), each one's creation time taken
right after its commit returned. Every agent is ``sh -c`` that appends its start time (``date +%s.%N``) to a
file of its own, sleeps 0.5 s and appends its end time: an agent that takes 0.5 s, whose start the benchmark
reads from outside the coordinator. It does not report: a run that exits 0 is a finished run, and nothing
wakes the task's agent again (the benchmark checks that each agent ran exactly once). A warm-up task per role
runs first. Three phases, one after the other in the same workspace and coordinator:

- **burst**: N tasks (round-robin over the roles) created at once. ``wall_s`` = first creation -> last agent
  end, against ``ideal_s`` = N x 0.5 / 8. Goal: ``wall_ratio`` <= 1.25.
- **steady**: N tasks arriving one every ``--interval`` (80 ms, round-robin, so a role gets one every 320 ms and
  its two slots are never both busy while a run's bookkeeping takes under 140 ms). Dispatch latency: the agent's
  start - the moment its task became eligible, i.e. created and a slot of its role free. Slots are assumed
  handed out first come first served: the i-th task of a role with c slots is eligible at max(its creation,
  the (i-c)-th end among the role's runs in this phase); here that is its creation almost always. Goals: p50
  <= 100 ms, p99 <= 500 ms, over all roles. Beside them, the medians of the steps between (from the event log,
  the run ledger and `up`'s run_started lines): creation -> claim, claim -> run queued, queued -> run_started,
  run_started -> the agent's first line (process start-up).
- **hung**: the same arrivals, but the first OPS agent of the phase sleeps until `up` stops (its timeout, the
  default 600 s, is longer than the phase): it holds one of OPS's slots and one of max_runs' the whole phase.
  Goal: the other roles' p50 and p99 within noise of theirs in the steady phase (``noise_ms``: the larger of
  25 ms and 50 % of the steady figure). OPS's own figures are reported (its queue has one slot left).

The burst's latency (how fast a freed slot is refilled) is reported without a goal. Stopping `up` (SIGTERM,
``shutdown_grace = 1``) interrupts the hung agent (its run is left ``pending``: due again at the next start).
``--no-folders`` runs the same with ``[folders] enabled = false``, to see what the folder stages (the TASK files'
projection runs in every pass before any run starts) cost the figures. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import sqlalchemy as sa  # noqa: E402

from taskkernel.coordinator.cli.common import CliContext  # noqa: E402
from taskkernel.coordinator.tables import runs  # noqa: E402
from taskkernel.kernel.model.principal import LOCAL_OWNER  # noqa: E402
from taskkernel.kernel.projections import TASK_PREFIX  # noqa: E402
from taskkernel.kernel.store.schema import events  # noqa: E402

CLI = [sys.executable, "-m", "taskkernel"]
ROLES = ("PM", "DEV", "QA", "OPS")
HUNG_ROLE = "OPS"
CONCURRENCY = 2
MAX_RUNS = 8
AGENT_S = 0.5
GOALS = {"wall_ratio": 1.25, "p50_ms": 100.0, "p99_ms": 500.0, "hung_noise_ms": 25.0, "hung_noise_rel": 0.5}
CHILD_ENV = {k: v for k, v in os.environ.items() if k not in (
    "PYTHONDONTWRITEBYTECODE", "TASKKERNEL_TOKEN", "TASKKERNEL_DB", "TASKKERNEL_WORKSPACE", "TASKKERNEL_LOG_LEVEL")}
# $0: the folder of time files, $1: the task, $2: the role. A file hang-<ROLE> there makes the first agent of
# that role to remove it hang (rm succeeds for one agent only).
AGENT = ('date +%s.%N >> "$0/$1"; if rm "$0/hang-$2" 2>/dev/null; then sleep 86400; fi; '
         f'sleep {AGENT_S}; date +%s.%N >> "$0/$1"')


def cli(*args: str, cwd: Path) -> str:
    done = subprocess.run([*CLI, *args], cwd=cwd, capture_output=True, text=True, env=CHILD_ENV)
    if done.returncode != 0:
        raise SystemExit(f"taskkernel {' '.join(args)} failed: {done.stderr.strip()[-500:]}")
    return done.stdout.strip()


def configure(ws: Path, times: Path, folders: bool) -> None:
    """max_runs 8, a short shutdown grace, and a command runner with 2 slots for each role."""
    path = ws / "taskkernel.toml"
    text = path.read_text(encoding="utf-8")
    for old, new in (("# max_runs = 4", f"max_runs = {MAX_RUNS}"), ("# shutdown_grace = 30", "shutdown_grace = 1")):
        assert old in text, f"taskkernel.toml has no {old!r} line"
        text = text.replace(old, new, 1)
    argv = json.dumps(["sh", "-c", AGENT, str(times), "{task_id}", "{role}"])
    for role in ROLES:
        text += f'\n[roles.{role}]\nrunner = "command"\nargv = {argv}\nconcurrency = {CONCURRENCY}\n'
    if not folders:
        text += "\n[folders]\nenabled = false\n"
    path.write_text(text, encoding="utf-8")


def epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank) of ``values``."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


class Bench:
    def __init__(self, ws: Path, times: Path, up_log: Path) -> None:
        self.ws, self.times, self.up_log = ws, times, up_log
        self.context = CliContext(workspace_path=str(ws))
        self.kernel = self.context.kernel()
        self.created: dict[str, float] = {}  # task -> epoch seconds, right after its create_task committed
        self.role: dict[str, str] = {}
        self.serial = 0

    def create(self, role: str, tag: str) -> str:
        self.serial += 1
        r = self.kernel.submit({"type": "create_task", "idempotency_key": f"bench-team-{self.serial}", "payload": {
            "sender": "ADMIN", "recipient": role, "subject": f"{tag} {self.serial}"}}, LOCAL_OWNER)
        now = time.time()
        assert r.status == "accepted", r
        task = str(r.task_id)
        self.created[task], self.role[task] = now, role
        return task

    def agent_times(self, task: str) -> list[float]:
        try:
            return [float(x) for x in (self.times / task).read_text().split()]
        except (OSError, ValueError):
            return []

    def wait(self, tasks: list[str], timeout: float, hung: set[str] = frozenset()) -> dict[str, list[float]]:
        """Until every agent of ``tasks`` ended (those in ``hung``: started); their time lines."""
        deadline = time.monotonic() + timeout
        while True:
            got = {t: self.agent_times(t) for t in tasks}
            if all(len(v) >= (1 if t in hung else 2) for t, v in got.items()):
                return got
            if time.monotonic() > deadline:
                missing = [t for t, v in got.items() if len(v) < (1 if t in hung else 2)]
                raise SystemExit(f"{len(missing)} agent(s) did not run within {timeout:g}s (e.g. {missing[:3]}); "
                                 f"see {self.up_log}")
            time.sleep(0.05)

    def arrivals(self, n: int, interval: float, tag: str) -> list[str]:
        """n tasks, one every ``interval`` seconds on an absolute schedule, round-robin over the roles."""
        out, t0 = [], time.monotonic()
        for i in range(n):
            time.sleep(max(0.0, t0 + i * interval - time.monotonic()))
            out.append(self.create(ROLES[i % len(ROLES)], tag))
        return out

    def latencies(self, tasks: list[str], got: dict[str, list[float]]) -> tuple[dict[str, float], dict[str, str]]:
        """Per task: agent start - eligible (created, and a slot of its role free, slots first come first served;
        a hung agent's slot never frees); and, for a task that waited for a slot, the task whose end freed it."""
        out, freed_by = {}, {}
        for role in ROLES:
            mine = sorted((t for t in tasks if self.role[t] == role), key=lambda t: self.created[t])
            ends = sorted((got[t][1] if len(got[t]) > 1 else math.inf, t) for t in mine)
            for i, t in enumerate(mine):
                eligible = self.created[t]
                if i >= CONCURRENCY and ends[i - CONCURRENCY][0] > eligible:
                    eligible, freed_by[t] = ends[i - CONCURRENCY]
                out[t] = got[t][0] - eligible
        return out, freed_by

    def steps(self, tasks: list[str], got: dict[str, list[float]], freed_by: dict[str, str]) -> dict[str, Any]:
        """Medians (ms) of the steps from eligible to the agent's start, from the event log, the run ledger and
        `up`'s log lines. A task eligible when created: creation -> claim -> run queued -> run_started -> the
        agent's first line. A task that waited for a slot: the previous run's agent end -> its run_finished
        line -> this run_started -> this agent's first line."""
        wanted = set(tasks)
        with self.context.database().read() as conn:
            claimed = {t: epoch(r.recorded_at) for r in conn.execute(
                sa.select(events.c.stream_id, events.c.recorded_at).where(events.c.event_type == "task_claimed"))
                if (t := r.stream_id.removeprefix(TASK_PREFIX)) in wanted}
            queued = {r.task_id: epoch(r.created_at) for r in conn.execute(
                sa.select(runs.c.task_id, runs.c.created_at).where(runs.c.purpose == "execute"))
                if r.task_id in wanted}
        logged: dict[str, dict[str, float]] = {"run_started": {}, "run_finished": {}}
        for line in self.up_log.read_text(encoding="utf-8", errors="replace").splitlines():
            if '"run_started"' in line or '"run_finished"' in line:
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if rec.get("task_id") in wanted and rec.get("event") in logged:
                    logged[rec["event"]].setdefault(rec["task_id"], epoch(rec["timestamp"]))
        started, finished = logged["run_started"], logged["run_finished"]
        agent = {t: v[0] for t, v in got.items()}
        ended = {t: v[1] for t, v in got.items() if len(v) > 1}
        prev = freed_by.get
        arrived = [t for t in tasks if t not in freed_by]
        waited = [t for t in tasks if t in freed_by]

        def median(pairs: list[tuple[float | None, float | None]]) -> float | None:
            diffs = [b - a for a, b in pairs if a is not None and b is not None]
            return ms(statistics.median(diffs)) if diffs else None

        return {
            "eligible_at_creation": {
                "n": len(arrived),
                "create_to_claim_ms": median([(self.created[t], claimed.get(t)) for t in arrived]),
                "claim_to_queued_ms": median([(claimed.get(t), queued.get(t)) for t in arrived]),
                "queued_to_run_started_ms": median([(queued.get(t), started.get(t)) for t in arrived]),
                "run_started_to_agent_ms": median([(started.get(t), agent[t]) for t in arrived])},
            "waited_for_slot": {
                "n": len(waited),
                "prev_agent_end_to_run_finished_ms": median([(ended.get(prev(t, "")), finished.get(prev(t, "")))
                                                             for t in waited]),
                "prev_run_finished_to_run_started_ms": median([(finished.get(prev(t, "")), started.get(t))
                                                               for t in waited]),
                "run_started_to_agent_ms": median([(started.get(t), agent[t]) for t in waited])}}


def summary(lat: dict[str, float], tasks: list[str]) -> dict[str, Any]:
    values = [lat[t] for t in tasks]
    return {"n": len(values), "p50_ms": ms(pct(values, 50)), "p99_ms": ms(pct(values, 99)),
            "max_ms": ms(max(values))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="48 tasks per phase instead of 200")
    parser.add_argument("--tasks", type=int, default=None, help="tasks per phase")
    parser.add_argument("--interval", type=float, default=0.08, help="seconds between arrivals (steady, hung)")
    parser.add_argument("--no-folders", action="store_true",
                        help="[folders] enabled = false (to see what the folder stages cost a pass)")
    args = parser.parse_args()
    n = args.tasks or (48 if args.quick else 200)
    with tempfile.TemporaryDirectory(prefix="bench-team-") as tmp:
        ws, times, up_log = Path(tmp) / "ws", Path(tmp) / "times", Path(tmp) / "up.log"
        times.mkdir()
        cli("init", str(ws), cwd=Path(tmp))
        configure(ws, times, folders=not args.no_folders)
        bench = Bench(ws, times, up_log)
        with open(up_log, "w") as err, open(Path(tmp) / "up.out", "w") as out:
            up = subprocess.Popen([*CLI, "up", str(ws)], cwd=ws, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                  env={**CHILD_ENV, "TASKKERNEL_LOG_LEVEL": "INFO"})
        try:
            load = os.getloadavg()[0]
            report = phases(bench, n, args.interval)
            report["folders"] = not args.no_folders
            report["load_avg_1m"] = {"before": round(load, 2), "after": round(os.getloadavg()[0], 2)}
        finally:
            if up.poll() is None:
                up.send_signal(signal.SIGTERM)
            try:
                up_exit = up.wait(timeout=60)
            except subprocess.TimeoutExpired:
                up.kill()
                up_exit = up.wait()
        with bench.context.database().read() as conn:
            rows = conn.execute(sa.select(runs.c.task_id, runs.c.state, runs.c.attempt)).all()
        bench.context.database().dispose()
        report["checks"] = {
            "runs": len(rows), "tasks": len(bench.created),
            "runs_by_state": {st: sum(r.state == st for r in rows) for st in sorted({r.state for r in rows})},
            "retried": sum(r.attempt > 1 for r in rows),
            "agents_run_more_than_once": sum(len(bench.agent_times(t)) > 2 for t in bench.created),
            "up_exit": up_exit}
    print(json.dumps(report, indent=2))


def phases(bench: Bench, n: int, interval: float) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while "coordinator up" not in bench.up_log.read_text(errors="replace"):
        if time.monotonic() > deadline:
            raise SystemExit(f"taskkernel up did not start: {bench.up_log.read_text()[-500:]}")
        time.sleep(0.05)
    warm = [bench.create(role, "warm-up") for role in ROLES]
    bench.wait(warm, 60)

    # burst: everything at once
    t0 = time.monotonic()
    burst = [bench.create(ROLES[i % len(ROLES)], "burst") for i in range(n)]
    create_s = time.monotonic() - t0
    ideal = n * AGENT_S / MAX_RUNS
    got = bench.wait(burst, 30 + 10 * ideal)
    first = min(bench.created[t] for t in burst)
    wall = max(v[1] for v in got.values()) - first
    starts = sorted(v[0] - first for v in got.values())
    burst_lat, burst_freed = bench.latencies(burst, got)

    # steady: arrivals below capacity
    steady = bench.arrivals(n, interval, "steady")
    got_steady = bench.wait(steady, 60 + n * interval)
    steady_lat, steady_freed = bench.latencies(steady, got_steady)

    # hung: the same, with the first agent of HUNG_ROLE asleep for the rest of the run
    (bench.times / f"hang-{HUNG_ROLE}").touch()
    hung = bench.arrivals(n, interval, "hung")
    stuck = next(t for t in hung if bench.role[t] == HUNG_ROLE)
    got_hung = bench.wait(hung, 60 + n * interval * 2, hung={stuck})
    assert len(got_hung[stuck]) == 1, "the hung agent ended"
    hung_lat, hung_freed = bench.latencies(hung, got_hung)

    others = [r for r in ROLES if r != HUNG_ROLE]
    steady_all = summary(steady_lat, steady)
    steady_others = summary(steady_lat, [t for t in steady if bench.role[t] in others])
    hung_others = summary(hung_lat, [t for t in hung if bench.role[t] in others and t != stuck])
    hung_own = summary(hung_lat, [t for t in hung if bench.role[t] == HUNG_ROLE and t != stuck])
    noise = {k: max(GOALS["hung_noise_ms"], GOALS["hung_noise_rel"] * steady_others[k]) for k in ("p50_ms", "p99_ms")}
    diff = {k: round(hung_others[k] - steady_others[k], 1) for k in ("p50_ms", "p99_ms")}
    report: dict[str, Any] = {
        "roles": list(ROLES), "concurrency": CONCURRENCY, "max_runs": MAX_RUNS, "agent_s": AGENT_S,
        "cores": os.cpu_count(), "tasks_per_phase": n, "interval_s": interval,
        "burst": {"create_s": round(create_s, 3), "wall_s": round(wall, 3), "ideal_s": ideal,
                  "wall_ratio": round(wall / ideal, 3),
                  "first_start_s": round(starts[0], 3), "first_wave_started_s": round(starts[MAX_RUNS - 1], 3),
                  "agent_s_median": round(statistics.median(
                      v[1] - v[0] for v in got.values()), 3), "latency": summary(burst_lat, burst),
                  "steps": bench.steps(burst, got, burst_freed)},
        "steady": {**steady_all, "by_role": {r: summary(steady_lat, [t for t in steady if bench.role[t] == r])
                                             for r in ROLES},
                   "others": steady_others, "steps": bench.steps(steady, got_steady, steady_freed)},
        "hung": {"hung_role": HUNG_ROLE, "others": hung_others, HUNG_ROLE: hung_own,
                 "others_minus_steady": diff, "noise_ms": noise, "steps": bench.steps(hung, got_hung, hung_freed)},
        "targets": {"wall_ratio": GOALS["wall_ratio"], "p50_ms": GOALS["p50_ms"], "p99_ms": GOALS["p99_ms"],
                    "hung_others_within": "max(25 ms, 50 % of steady)"}}
    report["goals_met"] = {
        "wall_ratio": report["burst"]["wall_ratio"] <= GOALS["wall_ratio"],
        "p50_ms": steady_all["p50_ms"] <= GOALS["p50_ms"], "p99_ms": steady_all["p99_ms"] <= GOALS["p99_ms"],
        "hung_unchanged": all(diff[k] <= noise[k] for k in diff)}
    return report


if __name__ == "__main__":
    main()
