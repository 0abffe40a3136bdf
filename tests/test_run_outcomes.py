"""Every run ends in an outcome the kernel records (issue 25): a run judged by what it left on its task, not by its
exit code; a review nobody may decide is never dispatched and waits, visibly, for a person; the scripted leader
never approves a merge; stalled tasks and dead letters are listed. Real `taskkernel` processes and the stand-in agent
CLIs (tests/procs/agent_cli.py) reproducing the real failure shapes."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from taskkernel.coordinator.inbox import waiting
from taskkernel.coordinator.runners.ledger import Purpose
from taskkernel.coordinator.workspace import Workspace
from taskkernel.kernel.canonical import utc_now_iso
from taskkernel.kernel.model.principal import LOCAL_OWNER
from taskkernel.kernel.queries import task_history
from taskkernel.kernel.store.db import Database
from taskkernel.kernel.store.schema import outbox
from tests.agents_support import Team, git, role
from tests.cli_support import taskkernel
from tests.coord_support import admin_task, coordinator, make_workspace
from tests.procs.agent_cli import TEXT_ANSWER


def runs_of(team: Team, task_id: str) -> list[dict[str, Any]]:
    return list(team.ok("runs", "list", "--task", task_id))


def report_bodies(team: Team, task_id: str) -> list[str]:
    db = Database(Workspace.load(team.root).database_url, "process")
    try:
        return [e.data.get("body") or "" for e in task_history(db, task_id) if e.type == "report_submitted"]
    finally:
        db.dispose()


def as_pm(team: Team) -> dict[str, str]:
    token = team.cli("token", "issue", "PM").stdout.strip()
    assert token, "a PM token"
    return {"TASKKERNEL_TOKEN": token}


def pm_task(team: Team, recipient: str, subject: str, body: str) -> str:
    """A branch task: PM assigns it, so PM is its done authority."""
    done = team.cli("task", "create", "--to", recipient, "--subject", subject, "--body", body, "--json",
                    env=as_pm(team))
    assert done.returncode == 0, done.stderr
    return str(json.loads(done.stdout)["task_id"])


def test_a_cli_that_answers_without_a_tool_call_is_retried_then_blocked_with_its_last_lines(tmp_path: Path) -> None:
    """Claude Code printing `{"type":"result","subtype":"success",...}` and exiting 0 without a tool call: the run
    failed `no_report`, was tried max_attempts times, then the task got a blocked report naming the cause and
    quoting the agent's last output, shown by `task show` and `inbox`."""
    team = Team(tmp_path, f"\n[roles.DEV]\n{role('claude-code')}")
    task = team.task("DEV", "Greeting", "Add the greeting.\nno-tool-call")
    done = team.up()
    assert json.loads(done.stdout)["pending"] == []
    assert len(team.runs_of(task)) == 2, "retried within the role's attempts"
    [run] = runs_of(team, task)
    assert (run["state"], run["attempt"], run["error_code"]) == ("failed", 2, "attempts_exhausted"), run
    assert "2 attempts failed; last: the agent ended without a done or blocked report" in run["last_error"]
    doc = team.show(task)
    assert doc["state"] == "active" and doc["blocked"] is not None
    assert doc["blocked"]["reason"].startswith("execute run of DEV gave up: 2 attempts failed"), doc["blocked"]
    [body] = report_bodies(team, task)
    assert "The agent's last output:\nstdout:\n> " in body and TEXT_ANSWER in body, body
    inbox = team.ok("inbox")
    assert [(b["task_id"], b["blocked"]["reason"]) for b in inbox["blocked"]] == [(task, doc["blocked"]["reason"])]
    assert inbox["stalled"] == [], "blocked, with its cause: not silently stalled"


def test_task_retry_runs_a_blocked_task_again_and_it_reaches_review(tmp_path: Path) -> None:
    """The same failure shape once, with one attempt: blocked; the person's `task retry` clears the block, the next
    `up` runs the agent again, which now works and reports: the task is in review with its diff."""
    team = Team(tmp_path, f"\n[roles.DEV]\n{role('claude-code', max_attempts=1)}")
    task = team.task("DEV", "Greeting", "Add the greeting.\nno-tool-call-once\nwrite hello.txt hello")
    team.up()
    assert team.show(task)["blocked"] is not None
    retried = team.ok("task", "retry", task, "--reason", "the MCP tools load now")
    assert retried["status"] == "accepted"
    team.up()
    doc = team.show(task)
    assert len(team.runs_of(task)) == 2
    assert doc["state"] == "review" and doc["blocked"] is None, doc
    assert [f["path"] for f in doc["reports"][-1]["diff"]["files"]] == ["hello.txt"]


def test_a_reviewer_that_ends_without_deciding_blocks_the_review_and_got_the_report_and_diffstat(
        tmp_path: Path) -> None:
    """PM reviews DEV's work on Claude Code and exits 0 without approving or rejecting: `no_decision`, retried,
    then a blocked report on the task in review (filed as its driver), listed by `inbox`. Its prompt held the done
    report's body and the diffstat of the round."""
    team = Team(tmp_path, f"\n[roles.DEV]\n{role('claude-code')}\n[roles.PM]\n{role('claude-code')}")
    task = pm_task(team, "DEV", "Greeting", "Add the greeting.\nwrite hello.txt hello\nwrite notes.txt a\\nb")
    team.up()
    starts = team.runs_of(task)
    assert [r["env"]["TASKKERNEL_PURPOSE"] for r in starts] == ["execute", "review", "review"]
    prompt = starts[1]["prompt"]
    work = prompt.split("## The work to review", 1)[1]
    assert "done by the claude stand-in" in work, prompt
    assert "  hello.txt | +1 -0" in work and "  notes.txt | +2 -0" in work, work
    assert "2 file(s) changed, +3 -0" in work, work
    review = next(r for r in runs_of(team, task) if r["purpose"] == "review")
    assert (review["state"], review["attempt"], review["error_code"]) == ("failed", 2, "attempts_exhausted")
    assert "without approving or rejecting" in review["last_error"]
    doc = team.show(task)
    assert doc["state"] == "review" and doc["blocked"]["reason"].startswith("review run of PM gave up: "), doc
    assert doc["blocked"]["by"].startswith("DEV:"), "filed as the driver: reports are the driver's"
    inbox = team.ok("inbox", "--role", "PM")
    assert [b["task_id"] for b in inbox["blocked"]] == [task]
    assert [r["task_id"] for r in inbox["reviews"]] == [task] and inbox["reviews"][0]["waits_for_person"] is None


def test_a_review_by_a_role_that_cannot_approve_is_never_dispatched_and_waits_for_a_person(tmp_path: Path) -> None:
    """PM assigned the task while it led the team; the team's leader is now OPS, so PM may not approve. Its review is
    not dispatched to PM's agent (it could only be refused); `inbox` says a person must decide, and ADMIN can."""
    team = Team(tmp_path, f"\n[roles.DEV]\n{role('claude-code')}\n[roles.PM]\n{role('claude-code')}")
    task = pm_task(team, "DEV", "Greeting", "write hello.txt hello")
    config = team.root / "fcop" / "fcop.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "leader": "OPS"}))
    done = team.up()
    assert "review_waits_for_person" in done.stderr
    assert [r["purpose"] for r in runs_of(team, task)] == ["execute"], "no review run"
    assert [r["env"]["TASKKERNEL_PURPOSE"] for r in team.runs_of(task)] == ["execute"]
    assert team.show(task)["state"] == "review"
    [entry] = team.ok("inbox")["reviews"]
    assert (entry["task_id"], entry["waits_for_person"]) == (task, "PM may not approve: waiting for a person (ADMIN)"
                                                                   " to decide")
    team.ok("task", "approve", task)
    assert team.show(task)["state"] == "done"


def test_the_scripted_leader_never_approves_a_merge_but_approves_what_merges_nothing(tmp_path: Path) -> None:
    """DEV merges on approval, OPS keeps its branch; the scripted PM reviews both. DEV's task waits for a person
    (`inbox`: approval merges into main) and nothing reaches main; OPS's is approved."""
    team = Team(tmp_path, f"\n[roles.DEV]\n{role('claude-code', on_approve='merge')}\n[roles.OPS]\n"
                          f"{role('gemini-cli')}\n[roles.PM]\nrunner = \"scripted\"\n")
    merging = pm_task(team, "DEV", "Greeting", "write hello.txt hello")
    kept = pm_task(team, "OPS", "Notes", "write notes.txt notes")
    team.up()
    assert team.show(merging)["state"] == "review" and team.show(kept)["state"] == "done"
    assert not (team.root / "hello.txt").exists() and git(team.root, "log", "-1", "--format=%s") == "start"
    [entry] = team.ok("inbox")["reviews"]
    assert (entry["task_id"], entry["waits_for_person"]) == (merging, "approval merges into main: waiting for a person")
    assert [r["purpose"] for r in runs_of(team, merging)] == ["execute"]
    team.ok("task", "approve", merging)  # a person decides: the merge follows
    team.up()
    assert (team.root / "hello.txt").read_text() == "hello\n"


def test_stalled_tasks_and_dead_letters_are_listed(tmp_path: Path) -> None:
    """A task whose run of the round ended (as a run did before runs were judged by their outcome) with nothing
    queued is stalled: `inbox` and the live view list it with its last run; a dead-lettered effect is listed for
    every role, with its last error. A task with a run queued is not stalled."""
    from rich.console import Console

    from taskkernel.coordinator.cli.live import live_view

    c = coordinator(make_workspace(tmp_path / "ws", {"DEV": {"runner": "command", "argv": ["true"]}}))
    stuck, queued = admin_task(c, "Stuck", recipient="DEV"), admin_task(c, "Queued", recipient="DEV")
    ledger = c.dispatcher.ledger
    for tid in (stuck, queued):
        assert c.kernel.submit({"type": "claim", "task_id": tid, "expected_revision": 1, "round": 0,
                                "idempotency_key": f"claim:{tid}"}, LOCAL_OWNER).status == "accepted"
    with c.db.write() as uow:
        for tid in (stuck, queued):
            ledger.enqueue(uow, f"{tid}:r1:execute:old", tid, 1, "DEV", Purpose.EXECUTE, 1)
    [claimed] = [r for r in ledger.claim_due(10) if r.task_id == stuck]
    ledger.succeed(claimed, 0)
    with c.db.write() as uow:
        key = uow.conn.execute(sa.select(outbox.c.effect_key).limit(1)).scalar_one()
        uow.conn.execute(outbox.update().where(outbox.c.effect_key == key).values(
            status="failed", attempts=5, last_error="checkout has local changes", failed_at=utc_now_iso()))
    found = waiting(c.db, None, None, LOCAL_OWNER, 10)
    [entry] = found["stalled"]
    assert (entry["task_id"], entry["state"], entry["waiting_on"]) == (stuck, "active", "DEV")
    assert entry["last_run"]["run_id"] == f"{stuck}:r1:execute:old" and entry["last_run"]["state"] == "done"
    assert "no report followed and nothing is queued" in entry["cause"]
    [letter] = found["dead_letters"]
    assert (letter["effect_key"], letter["last_error"], letter["attempts"]) == (key, "checkout has local changes", 5)
    assert waiting(c.db, None, "DEV", LOCAL_OWNER, 10)["dead_letters"] == []
    assert waiting(c.db, None, "QA", LOCAL_OWNER, 10)["stalled"] == []
    console = Console(width=200, record=True)
    console.print(live_view(c, {}))
    text = console.export_text()
    assert "Stalled tasks (1)" in text and stuck in text, text


def test_an_agent_that_reports_with_a_report_file_is_judged_by_that_report(tmp_path: Path) -> None:
    """An FCoP agent reports by writing a REPORT file and exits: the run waits for the ingest to take the file in
    before judging it, so the task is in review with its report, not blocked as a run that left none."""
    agent = tmp_path / "agent.py"
    agent.write_text(textwrap.dedent("""
        import os, pathlib
        task = os.environ["TASKKERNEL_TASK_ID"]
        day, number = task.split("-")[1:3]
        report = pathlib.Path(os.environ["TASKKERNEL_WORKSPACE"]) / "fcop" / "reports"
        report.mkdir(parents=True, exist_ok=True)
        (report / f"REPORT-{day}-{number}-DEV-to-ADMIN.md").write_text(
            f"---\\nprotocol: fcop\\nversion: 1\\nsender: DEV\\nrecipient: ADMIN\\nreferences:\\n- {task}\\n"
            "status: done\\n---\\nDone, by file.\\n", encoding="utf-8")
    """), encoding="utf-8")
    ws = make_workspace(tmp_path / "ws", {"DEV": {"runner": "command", "argv": [sys.executable, str(agent)],
                                                  "max_attempts": 1}})
    c = coordinator(ws)
    task = admin_task(c, subject="by file", recipient="DEV")
    up = taskkernel("up", str(ws.root), "--once", cwd=tmp_path)
    assert up.returncode == 0, up.stdout + up.stderr
    doc = c.kernel.task(task)
    assert doc["state"] == "review" and doc["blocked"] is None, doc
    assert [r["status"] for r in doc["reports"]] == ["done"]
