"""`taskkernel task retry` (docs/runs.md, "Trying again") through the real CLI, each call its own process: a
blocked task is run again, and a retry is refused where another run cannot help."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

from tests.cli_support import Run, append_config, new_workspace, run, taskkernel


def ok(*args: str, cwd: Path) -> Any:
    r = run(*args, "--json", cwd=cwd)
    assert r.code == 0, (args, r.out, r.err)
    return r.json


def token(ws: Path, role: str) -> str:
    issued = run("token", "issue", role, cwd=ws)
    assert issued.code == 0, issued
    return issued.out.strip()


def as_(tok: str, *args: str, cwd: Path) -> Run:
    proc = taskkernel(*args, "--json", cwd=cwd, env={"TASKKERNEL_TOKEN": tok})
    return Run(proc.returncode, proc.stdout, proc.stderr)


def test_a_blocked_task_is_retried_refused_where_a_retry_cannot_help(tmp_path: Path) -> None:
    ws = new_workspace(tmp_path)
    agent = tmp_path / "agent.py"
    starts, fail = tmp_path / "starts.txt", tmp_path / "fail"
    agent.write_text(textwrap.dedent(f"""
        import pathlib, sys
        with open({str(starts)!r}, "a") as fh:
            fh.write("start\\n")
        sys.exit(3 if pathlib.Path({str(fail)!r}).exists() else 0)
    """), encoding="utf-8")
    fail.touch()
    append_config(ws, f"\n[roles.DEV]\nrunner = \"command\"\nargv = [{json.dumps(sys.executable)}, "
                      f"{json.dumps(str(agent))}]\nmax_attempts = 1\nbackoff = 0\n")
    tid = ok("task", "create", "--to", "DEV", "--subject", "build it", cwd=ws)["task_id"]
    qa_task = ok("task", "create", "--to", "QA", "--subject", "check it", cwd=ws)["task_id"]
    assert run("up", "--once", cwd=ws).code in (0, 1)
    doc = ok("task", "show", tid, cwd=ws)
    assert doc["state"] == "active" and doc["blocked"] is not None, doc
    assert starts.read_text().count("start") == 1

    # not the done authority (ADMIN decides this task): refused, nothing recorded
    dev = token(ws, "DEV")
    refused = as_(dev, "task", "retry", tid, "--reason", "again", cwd=ws)
    assert refused.code == 2 and refused.json["reason"] == "role_not_authorized", refused
    # the role that would run has no runner: the message says what to fix
    ok("task", "claim", qa_task, cwd=ws)
    no_runner = run("task", "retry", qa_task, "--json", cwd=ws)
    assert no_runner.code == 2 and no_runner.json["reason"] == "retry_cannot_help", no_runner
    assert "QA has no runner: add [roles.QA] to taskkernel.toml" in no_runner.json["message"]

    fail.unlink()  # the cause is fixed
    retried = ok("task", "retry", tid, "--reason", "the flaky disk was replaced", cwd=ws)
    assert retried["status"] == "accepted"
    doc = ok("task", "show", tid, cwd=ws)
    assert doc["state"] == "active" and doc["blocked"] is None and doc["round"] == 1
    [event] = [e for e in doc["history"] if e["type"] == "task_retried"]
    assert event["reason"] == "the flaky disk was replaced" and event["round"] == 1, event
    again = ok("task", "retry", tid, "--reason", "the flaky disk was replaced", cwd=ws)  # a double click
    assert again["status"] == "replayed"

    assert run("up", "--once", cwd=ws).code in (0, 1)
    assert starts.read_text().count("start") == 2, "the retry made a new run due"

    # a done task is finished: a retry runs nothing
    ok("task", "report", tid, "--status", "done", "--body", "ok", "--submit", cwd=ws)
    ok("task", "approve", tid, cwd=ws)
    done = run("task", "retry", tid, "--json", cwd=ws)
    assert done.code == 2 and done.json["reason"] == "task_terminal" and "reopen" in done.json["message"], done
    inbox = ok("task", "create", "--to", "DEV", "--subject", "later", cwd=ws)["task_id"]
    assert run("task", "retry", inbox, "--json", cwd=ws).json["reason"] == "illegal_transition"


def test_a_retry_never_doubles_a_run_and_is_never_an_agents(tmp_path: Path) -> None:
    """A run waiting out its backoff (or running) is not joined by a second one on the same worktree; a run's
    task-scoped token may not retry, even as the done authority; an ADMIN review is decided, not retried."""
    ws = new_workspace(tmp_path)
    agent = tmp_path / "agent.py"
    agent.write_text("import sys\nsys.exit(3)\n", encoding="utf-8")
    append_config(ws, f"\n[roles.DEV]\nrunner = \"command\"\nargv = [{json.dumps(sys.executable)}, "
                      f"{json.dumps(str(agent))}]\nmax_attempts = 2\nbackoff = 3600\n")
    tid = ok("task", "create", "--to", "DEV", "--subject", "build it", cwd=ws)["task_id"]
    assert run("up", "--once", "--once-wait", "0", cwd=ws).code in (0, 1)
    [waiting] = ok("runs", "list", cwd=ws)
    assert waiting["state"] == "retrying", waiting
    queued = run("task", "retry", tid, "--json", cwd=ws)
    assert queued.code == 2 and queued.json["reason"] == "retry_cannot_help", queued
    assert f"its run {waiting['run_id']} is queued" in queued.json["message"]

    scoped = run("token", "issue", "ADMIN", "--task", tid, cwd=ws).out.strip()
    by_agent = as_(scoped, "task", "retry", tid, cwd=ws)
    assert by_agent.code == 2 and by_agent.json["reason"] == "role_not_authorized", by_agent
    assert "task-scoped token may not retry" in by_agent.json["message"]

    review = ok("task", "create", "--to", "QA", "--subject", "check it", cwd=ws)["task_id"]
    ok("task", "claim", review, cwd=ws)
    ok("task", "report", review, "--status", "done", "--body", "ok", "--submit", cwd=ws)
    decide = run("task", "retry", review, "--json", cwd=ws)
    assert decide.code == 2 and decide.json["reason"] == "retry_cannot_help", decide
    assert f"the review is ADMIN's: decide it (`taskkernel task approve|reject {review}`)" in decide.json["message"]
