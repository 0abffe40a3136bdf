"""Goals: kernel-owned terminal states, the circuit breaker bound to a goal id, exact accounting."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from taskkernel.kernel.goals import Budget, GoalService, GoalState
from taskkernel.kernel.model.principal import LOCAL_OWNER
from taskkernel.kernel.store.db import Database
from taskkernel.kernel.usage import Feature, UsageRecord, record_usage, summarize
from tests.coord_support import admin_task, coordinator, make_workspace

ROOT = Path(__file__).resolve().parent.parent


def test_three_failing_runs_block_the_goal_through_the_dispatcher(tmp_path: Path) -> None:
    crash = tmp_path / "crash.py"
    crash.write_text("import sys\nsys.exit(7)\n")
    ws = make_workspace(tmp_path / "ws", {"DEV": {"runner": "command", "argv": [sys.executable, str(crash)],
                                                 "max_attempts": 5, "backoff": 0}})
    c = coordinator(ws)
    tid = admin_task(c, recipient="DEV")
    goal = c.dispatcher.goals.start(tid, Budget())
    c.run_once()
    shown = c.dispatcher.goals.show(goal)
    assert (shown["state"], shown["reason"], shown["consecutive_failures"]) == ("blocked", "execution_unavailable", 3)
    [run] = c.dispatcher.ledger.all_runs()
    assert run["state"] == "blocked" and "goal" in run["last_error"]
    assert shown["spent"]["attempts"] == 3, "no fourth run was started once the goal was blocked"


def test_a_success_in_between_resets_the_count(sqlite_db: Database) -> None:
    goals = GoalService(sqlite_db)
    g = goals.start("TASK-20260101-001", Budget())
    for executed in (False, False, True, False, False):
        assert goals.record_run(g, executed=executed) is GoalState.ACTIVE
    assert goals.record_run(g, executed=False) is GoalState.BLOCKED
    assert goals.record_run(g, executed=True) is None, "a terminal goal is never revived"


def test_a_stale_failure_of_a_replaced_goal_changes_nothing(sqlite_db: Database) -> None:
    goals = GoalService(sqlite_db)
    old = goals.start("TASK-20260101-001", Budget())
    goals.record_run(old, executed=False)
    goals.record_run(old, executed=False)
    new = goals.start("TASK-20260101-001", Budget())
    assert goals.show(old)["state"] == "cancelled" and goals.show(old)["reason"] == "replaced"
    assert goals.record_run(old, executed=False) is None
    shown = goals.show(new)
    assert (shown["state"], shown["consecutive_failures"]) == ("active", 0)
    assert goals.active_goal("TASK-20260101-001") == new


def test_budget_counts_descendants_and_exhausts(sqlite_db: Database) -> None:
    goals = GoalService(sqlite_db)
    g = goals.start("TASK-20260101-001", Budget(tokens=1000, cost_usd=5))
    with sqlite_db.write() as uow:
        record_usage(uow, UsageRecord("u1", "PM", "pm", Feature.FOREGROUND, "TASK-20260101-001",
                                      "TASK-20260101-001", 1, tokens_in=300))
        record_usage(uow, UsageRecord("u2", "DEV", "dev", Feature.FOREGROUND, "TASK-20260101-001",
                                      "TASK-20260101-002", 1, tokens_in=500, tokens_out=250))
    assert goals.record_run(g, executed=True) is GoalState.BUDGET_EXHAUSTED
    assert goals.show(g)["reason"] == "budget_tokens"


def test_root_done_completes_the_goal(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "ws", {"DEV": {"runner": "scripted"}})
    c = coordinator(ws)
    tid = admin_task(c, recipient="DEV")
    goal = c.dispatcher.goals.start(tid, Budget())
    c.run_once()
    doc = c.kernel.task(tid)
    c.kernel.submit({"type": "approve", "task_id": tid, "thread_key": tid, "expected_revision": doc["revision"],
                     "round": doc["round"], "idempotency_key": "ok"}, LOCAL_OWNER)
    c.run_once()
    assert c.dispatcher.goals.show(goal)["state"] == "complete"


def test_concurrent_accounting_under_threads_sums_exactly(sqlite_db: Database) -> None:
    goals = GoalService(sqlite_db)
    g = goals.start("TASK-20260101-001", Budget())

    def work(i: int) -> None:
        with sqlite_db.write() as uow:
            record_usage(uow, UsageRecord(f"t{i}", "DEV", f"dev-{i % 4}", Feature.FOREGROUND, "TASK-20260101-001",
                                          "TASK-20260101-002", 1, wall_ms=10, tokens_in=7, cost_usd=0.001))
            record_usage(uow, UsageRecord(f"t{i}", "DEV", "dup", Feature.FOREGROUND, "TASK-20260101-001"))
        goals.record_run(g, executed=True)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(work, range(200)))
    [row] = summarize(sqlite_db, "root")
    assert (row["units"], row["tokens_in"], row["wall_ms"]) == (200, 1400, 2000)
    assert abs(row["cost_usd"] - 0.2) < 1e-9
    assert goals.show(g)["spent"]["attempts"] == 200


def test_concurrent_accounting_under_processes_sums_exactly(any_url: str, tmp_path: Path) -> None:
    script = tmp_path / "acct.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        from taskkernel.kernel.goals import GoalService
        from taskkernel.kernel.store.db import Database
        from taskkernel.kernel.usage import Feature, UsageRecord, record_usage
        db = Database({any_url!r})
        goals = GoalService(db)
        proc = sys.argv[1]
        goal = goals.active_goal("TASK-20260101-001")
        for i in range(40):
            with db.write() as uow:
                record_usage(uow, UsageRecord(f"{{proc}}-{{i}}", "DEV", proc, Feature.BACKGROUND,
                                              "TASK-20260101-001", tokens_out=3))
            goals.record_run(goal, executed=True)
    """))
    db = Database(any_url)
    g = GoalService(db).start("TASK-20260101-001", Budget())
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, str(script), f"p{k}"], env=env) for k in range(4)]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    [row] = summarize(db, "root")
    assert (row["units"], row["tokens_out"]) == (160, 480)
    assert GoalService(db).show(g)["state"] == "active"
    by_agent = {r["owner"]: r["units"] for r in summarize(db, "agent")}
    assert by_agent == {"p0": 40, "p1": 40, "p2": 40, "p3": 40}
    db.dispose()
