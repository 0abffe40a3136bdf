"""Agent runners end to end through the coordinator: scripted team, real commands, crashes, usage."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import sqlalchemy as sa

from taskkernel.coordinator.runners.presets import Preset
from taskkernel.kernel.usage import summarize, usage_table
from tests.coord_support import admin_task, coordinator, make_workspace

SCRIPTED = {"runner": "scripted"}


def test_scripted_team_splits_builds_checks_and_submits(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "ws", {"PM": SCRIPTED, "DEV": SCRIPTED, "QA": SCRIPTED})
    c = coordinator(ws)
    root = admin_task(c)
    c.run_once()
    doc = c.kernel.task(root)
    assert doc["state"] == "review" and doc["reports"][-1]["status"] == "done"
    kids = c.kernel.children(root)
    assert [(k["subject"], k["state"]) for k in kids] == [("Build: Login page", "done"), ("Check: Login page", "done")]
    artifact = ws.root / "workspace" / "login-page" / "README.md"
    assert kids[0]["task_id"] in artifact.read_text()
    # every run is attributed to the root task
    by_root = summarize(c.db, "root")
    assert [r["owner"] for r in by_root] == [root]
    assert by_root[0]["units"] >= 6


def test_rerunning_the_coordinator_duplicates_nothing(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "ws", {"PM": SCRIPTED, "DEV": SCRIPTED, "QA": SCRIPTED})
    c = coordinator(ws)
    admin_task(c)
    c.run_once()
    with c.db.read() as conn:
        events = conn.exec_driver_sql("SELECT count(*) FROM events").scalar()
    again = coordinator(ws, owner="restarted")
    assert sum(p.progress for p in again.run_once()) == 0
    with c.db.read() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM events").scalar() == events


def write_agent(path: Path, body: str) -> Path:
    path.write_text(textwrap.dedent(body), encoding="utf-8")
    return path


def test_command_runner_reports_through_the_cli_with_a_scoped_token(tmp_path: Path) -> None:
    agent = write_agent(tmp_path / "agent.py", f"""
        import json, os, subprocess, sys
        task = os.environ["TASKKERNEL_TASK_ID"]
        assert open(sys.argv[1]).read()  # the task file is readable
        def submit(cmd):
            out = subprocess.run([{sys.executable!r}, "-m", "taskkernel",
                                  "submit"], input=json.dumps(cmd), capture_output=True, text=True)
            return json.loads(out.stdout)
        show = json.loads(subprocess.run([{sys.executable!r}, "-m", "taskkernel",
                                          "task", "show", task], capture_output=True, text=True).stdout)
        base = {{"task_id": task, "thread_key": show["thread_key"], "round": show["round"]}}
        r = submit({{**base, "type": "submit_report", "expected_revision": show["revision"],
                    "idempotency_key": "rep-" + task, "payload": {{"status": "done", "body": "did it"}}}})
        r = submit({{**base, "type": "submit", "expected_revision": r["revision"], "idempotency_key": "sub-" + task}})
        assert r["status"] in ("accepted", "replayed"), r
        print(json.dumps({{"usage": {{"tokens_in": 1200, "tokens_out": 300, "cost_usd": 0.0125}}}}))
    """)
    ws = make_workspace(tmp_path / "ws", {"DEV": {"runner": "command", "argv": [sys.executable, str(agent),
                                                                            "{task_file}"], "timeout": 60}})
    c = coordinator(ws)
    tid = admin_task(c, recipient="DEV")
    c.run_once()
    doc = c.kernel.task(tid)
    assert doc["state"] == "review"
    assert {e.data.get("by") for e in c.kernel.history(tid)} >= {"DEV:dev-agent"}
    with c.db.read() as conn:
        row = conn.execute(sa.select(usage_table)).one()
    assert (row.task_id, row.role, row.exit_code, row.tokens_in, row.tokens_out) == (tid, "DEV", 0, 1200, 300)
    assert row.cost_usd == 0.0125 and row.root_task == tid and row.feature == "foreground"


def test_crashing_agent_is_retried_then_blocked_with_a_reason(tmp_path: Path) -> None:
    agent = write_agent(tmp_path / "crash.py", """
        import sys
        print("about to crash", flush=True)
        sys.exit(3)
    """)
    ws = make_workspace(tmp_path / "ws", {"DEV": {"runner": "command", "argv": [sys.executable, str(agent)],
                                                 "max_attempts": 3, "backoff": 0}})
    c = coordinator(ws)
    tid = admin_task(c, recipient="DEV")
    c.run_once()
    [run] = c.dispatcher.ledger.all_runs()
    assert (run["state"], run["attempt"], run["exit_code"]) == ("blocked", 3, 3)
    doc = c.kernel.task(tid)
    assert doc["state"] == "active"
    assert doc["reports"][-1]["status"] == "blocked"
    history = c.kernel.history(tid)
    assert "3 attempts failed; last: exit code 3" in history[-1].data["body"]
    with c.db.read() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(usage_table)).scalar() == 3


def test_timeout_and_missing_binary_are_failures_not_crashes(tmp_path: Path) -> None:
    sleeper = write_agent(tmp_path / "sleep.py", "import time\ntime.sleep(30)\n")
    binary = write_agent(tmp_path / "agent-binary", "#!/bin/sh\nexit 0\n")
    binary.chmod(0o755)
    ws = make_workspace(tmp_path / "ws", {
        "DEV": {"runner": "command", "argv": [sys.executable, str(sleeper)], "timeout": 0.5, "max_attempts": 1},
        "QA": {"runner": "command", "argv": [str(binary)], "max_attempts": 1}})
    c = coordinator(ws)  # a binary missing when it starts is refused (tests/test_config.py); this one goes later
    binary.unlink()
    dev_task = admin_task(c, subject="slow", recipient="DEV")
    qa_task = admin_task(c, subject="missing", recipient="QA")
    c.run_once()
    runs = {r["task_id"]: r for r in c.dispatcher.ledger.all_runs()}
    assert "last: timeout after 0.5s (terminated)" in runs[dev_task]["last_error"]
    assert runs[dev_task]["error_code"] == "attempts_exhausted"
    assert runs[qa_task]["last_error"].startswith("binary_missing: runner unavailable: ")
    assert runs[qa_task]["error_code"] == "binary_missing"


def test_lost_lease_is_fenced_and_reclaimed(tmp_path: Path) -> None:
    from datetime import UTC, datetime, timedelta

    ws = make_workspace(tmp_path / "ws", {"DEV": SCRIPTED})
    c = coordinator(ws)
    admin_task(c, recipient="DEV")
    c.dispatcher.dispatch_new()
    c.dispatcher.relay_wakes()
    [first] = c.dispatcher.ledger.claim_due()  # this holder "hangs"
    later = datetime.now(UTC) + timedelta(hours=1)
    [second] = c.dispatcher.ledger.claim_due(now=later)
    assert (second.attempt, second.fencing) == (2, first.fencing + 1)
    assert not c.dispatcher.ledger.succeed(first, 0), "a stale holder can change nothing"
    assert c.dispatcher.ledger.succeed(second, 0)


def parse_usage(stdout: str) -> dict[str, float]:
    return Preset().read(stdout).usage  # the `command` runner's reading of a usage line


def test_usage_line_parsing() -> None:
    assert parse_usage('noise\n{"tokens_in": 5, "cost_usd": 0.5}\n') == {"tokens_in": 5, "cost_usd": 0.5}
    assert parse_usage('{"usage": {"tokens_out": 7}}') == {"tokens_out": 7}
    assert parse_usage('{"other": 1}\nplain text') == {}


def test_implausible_usage_figures_are_ignored_and_never_stop_the_coordinator(tmp_path: Path) -> None:
    agent = write_agent(tmp_path / "agent.py", """
        print('{"tokens_in": 1e400, "tokens_out": -5, "cost_usd": NaN}')
    """)
    ws = make_workspace(tmp_path / "ws", {"DEV": {"runner": "command", "argv": [sys.executable, str(agent)],
                                                 "max_attempts": 1}})
    c = coordinator(ws)
    admin_task(c, recipient="DEV")
    c.run_once()
    with c.db.read() as conn:
        row = conn.execute(sa.select(usage_table)).one()
    assert (row.tokens_in, row.tokens_out, row.cost_usd) == (0, 0, 0.0)
    assert parse_usage('{"tokens_in": 1e400}') == {} and parse_usage('{"tokens_in": true}') == {}


def test_the_blocked_report_lands_even_if_the_agent_moved_the_task_first(tmp_path: Path) -> None:
    agent = write_agent(tmp_path / "agent.py", f"""
        import json, os, subprocess, sys
        run = lambda *a, stdin=None: subprocess.run([{sys.executable!r}, "-m", "taskkernel", *a], input=stdin,
                                                     capture_output=True, text=True)
        task = json.loads(run("task", "show", os.environ["TASKKERNEL_TASK_ID"]).stdout)
        run("submit", stdin=json.dumps({{"type": "submit_report", "task_id": task["task_id"],
            "thread_key": task["thread_key"], "expected_revision": task["revision"], "round": task["round"],
            "idempotency_key": "progress-1", "payload": {{"status": "in_progress", "body": "halfway"}}}}))
        sys.exit(3)
    """)
    ws = make_workspace(tmp_path / "ws", {"DEV": {"runner": "command", "argv": [sys.executable, str(agent)],
                                                 "max_attempts": 1}})
    c = coordinator(ws)
    tid = admin_task(c, recipient="DEV")
    c.run_once()
    assert [r["status"] for r in c.kernel.task(tid)["reports"]] == ["in_progress", "blocked"]
