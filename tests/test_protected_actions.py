"""Protected actions through the kernel: the gate judges the plan against the session log *now*.

Includes seed 001's story end to end through the coordinator: a plan formed while the environment
was staging is blocked after it switched to production, and the file it would have written is untouched.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from taskkernel.coordinator.compose import build_kernel
from taskkernel.kernel.model.principal import Principal
from taskkernel.kernel.sessionlog import SessionLog
from taskkernel.kernel.store.db import Database
from taskkernel.kernel.store.schema import events, outbox
from tests.coord_support import admin_task, coordinator, make_workspace
from tests.kernel_harness import Harness

DEV = Principal("DEV", "dev-agent")
TOOL = "TOOL:env-probe"
ADMIN = "ADMIN:alice"


def say(log: SessionLog, input_id: str, kind: str, by: str, **payload: Any) -> int:
    return int(log.accept("admin", {"input_id": input_id, "kind": kind, "payload": payload}, accepted_by=by).accept_seq)


def world_at_staging(log: SessionLog) -> None:
    say(log, "m1", "message", ADMIN, entity="file:staging/config.json",
        text="Raise the timeout in staging config to 30s")
    say(log, "o1", "observation", TOOL, tool="get_env", status="ok", entity="env:current", key="name", value="staging")
    say(log, "g1", "allow", ADMIN, permission="write", scope="file:staging/*", principal="DEV")


def plan(plan_seq: int | None = 3, **over: Any) -> dict[str, Any]:
    return {"operation": "write", "entity": "file:staging/config.json", "tool": "write_file",
            "args": {"path": "staging/config.json", "content": '{"timeout": 30}\n'}, "based_on_event": "m1",
            "permission_event": "g1", "requires_state": {"entity": "env:current", "key": "name", "equals": "staging"},
            "plan_seq": plan_seq, **over}


def active_dev_task(db: Database, risk: str = "medium") -> tuple[Harness, str]:
    h = Harness(db)
    h.kernel = build_kernel(db, None)
    tid = h.create(recipient="DEV", risk_level=risk).task_id
    h.cmd("claim", tid, DEV)
    return h, tid


def gate_events(db: Database, task_id: str) -> list[dict[str, Any]]:
    with db.read() as conn:
        rows = conn.execute(sa.select(events.c.data).where(events.c.stream_id == f"gate:{task_id}")
                            .order_by(events.c.global_pos)).scalars()
        return [json.loads(r) for r in rows]


def test_current_plan_passes_and_records_verdict_and_effect(any_db: Database) -> None:
    h, tid = active_dev_task(any_db)
    world_at_staging(SessionLog(any_db))
    r = h.cmd("perform", tid, DEV, key="act-1", payload=plan())
    assert r.status == "accepted", r
    [verdict] = gate_events(any_db, tid)
    assert (verdict["status"], verdict["action_id"], verdict["plan_seq"]) == ("PASS", "act-1", 3)
    authorized = h.kernel.history(tid)[-1]
    assert authorized.type == "action_authorized" and authorized.data["verdict"]["status"] == "PASS"
    with any_db.read() as conn:
        effects = conn.execute(sa.select(outbox.c.effect).where(outbox.c.source_pos == authorized.global_pos)
                               ).scalars().all()
    assert "perform_action" in effects


def test_stale_plan_is_blocked_and_appends_only_its_verdict(any_db: Database) -> None:
    h, tid = active_dev_task(any_db)
    log = SessionLog(any_db)
    world_at_staging(log)
    say(log, "o2", "observation", TOOL, tool="get_env", status="ok", entity="env:current", key="name",
        value="production")
    revision = h.kernel.task(tid)["revision"]
    r = h.cmd("perform", tid, DEV, key="act-old", payload=plan(plan_seq=3))
    assert (r.status, r.reason) == ("rejected", "gate_blocked")
    assert "STATE_DISALLOWS" in r.message
    assert h.kernel.task(tid)["revision"] == revision, "a BLOCK appends nothing to the task"
    [verdict] = gate_events(any_db, tid)
    assert verdict["status"] == "BLOCK" and verdict["reasons"][0]["code"] == "STATE_DISALLOWS"
    assert h.receipt_count() == 2  # create + claim only: a blocked action leaves no receipt


def test_superseded_instruction_blocks_the_plan_built_on_it(any_db: Database) -> None:
    h, tid = active_dev_task(any_db)
    log = SessionLog(any_db)
    world_at_staging(log)
    say(log, "m2", "message", ADMIN, entity="doc:notes", text="Cancel that, write release notes instead",
        supersedes=["m1"])
    r = h.cmd("perform", tid, DEV, payload=plan())
    assert r.reason == "gate_blocked" and "SUPERSEDED_BASIS" in r.message


def test_agent_cannot_grant_itself_or_fake_a_tool_read(any_db: Database) -> None:
    h, tid = active_dev_task(any_db)
    log = SessionLog(any_db)
    say(log, "m1", "message", ADMIN, entity="file:staging/config.json", text="Raise the timeout")
    say(log, "o1", "observation", "DEV:dev-agent", tool="get_env", status="ok", entity="env:current", key="name",
        value="staging")
    say(log, "g1", "allow", "DEV:dev-agent", permission="write", scope="file:staging/*")
    r = h.cmd("perform", tid, DEV, payload=plan())
    assert r.reason == "gate_blocked"
    codes = [x["code"] for x in gate_events(any_db, tid)[0]["reasons"]]
    assert "UNTRUSTED_PERMISSION" in codes


def test_missing_evidence_fails_closed(any_db: Database) -> None:
    h, tid = active_dev_task(any_db)
    world_at_staging(SessionLog(any_db))
    r = h.cmd("perform", tid, DEV, payload=plan(based_on_event=None))
    assert r.reason == "gate_insufficient_evidence" and "MISSING_BASIS" in r.message
    r = h.cmd("perform", tid, DEV, payload=plan(permission_event=None))
    assert r.reason == "gate_insufficient_evidence" and "MISSING_PERMISSION" in r.message


def test_single_use_grant_is_consumed_by_the_action(any_db: Database) -> None:
    h, tid = active_dev_task(any_db)
    log = SessionLog(any_db)
    say(log, "m1", "message", ADMIN, entity="file:staging/config.json", text="Raise the timeout")
    say(log, "o1", "observation", TOOL, tool="get_env", status="ok", entity="env:current", key="name", value="staging")
    say(log, "g1", "allow", ADMIN, permission="write", scope="file:staging/*", single_use=True)
    assert h.cmd("perform", tid, DEV, key="first", payload=plan(plan_seq=None)).status == "accepted"
    consumed = [r for r in log.records("admin") if r.input_id == "consumed:g1"]
    assert consumed and consumed[0].accepted_by == "SYSTEM:kernel"
    again = h.cmd("perform", tid, DEV, key="second", payload=plan(plan_seq=None))
    assert again.reason == "gate_blocked" and "PERMISSION_NOT_CURRENT" in again.message
    assert h.cmd("perform", tid, DEV, key="first", payload=plan(plan_seq=None)).status == "replayed"


def test_irreversible_tasks_protect_every_operation(any_db: Database) -> None:
    h, tid = active_dev_task(any_db, risk="irreversible")
    log = SessionLog(any_db)
    say(log, "m1", "message", ADMIN, entity="ticket:42", text="Close ticket 42")
    r = h.cmd("perform", tid, DEV, payload={"operation": "close", "entity": "ticket:42", "tool": "close_ticket",
                                            "based_on_event": "m1"})
    assert r.reason == "gate_insufficient_evidence" and "MISSING_PERMISSION" in r.message
    h2, low = active_dev_task(any_db, risk="low")
    r = h2.cmd("perform", low, DEV, payload={"operation": "close", "entity": "ticket:42", "tool": "close_ticket",
                                             "based_on_event": "m1"})
    assert r.status == "accepted", "on a low-risk task `close` is not a protected operation"


def test_seed_001_staging_to_production_through_the_coordinator(tmp_path: Path) -> None:
    """The agent formed its plan at 10:16 (staging). At 10:40 the environment became production. At 11:05
    the old plan resumes through the coordinator: it is blocked, and staging/config.json is untouched."""
    plan_file = tmp_path / "plan.json"
    agent = tmp_path / "agent.py"
    agent.write_text(textwrap.dedent(f"""
        import json, os, subprocess, sys
        run = lambda *a, stdin=None: subprocess.run([{sys.executable!r}, "-m", "taskkernel", *a], input=stdin,
                                                     capture_output=True, text=True)
        task = json.loads(run("task", "show", os.environ["TASKKERNEL_TASK_ID"]).stdout)
        cmd = {{"type": "perform", "task_id": task["task_id"], "thread_key": task["thread_key"],
               "expected_revision": task["revision"], "round": task["round"],
               "idempotency_key": "resume-plan-" + task["task_id"],
               "payload": json.load(open({str(plan_file)!r}))}}
        out = run("submit", stdin=json.dumps(cmd))
        print(out.stdout.strip())
        sys.exit(0 if json.loads(out.stdout)["status"] != "rejected" else 5)
    """))
    ws = make_workspace(tmp_path / "ws", {"DEV": {"runner": "command", "argv": [sys.executable, str(agent)],
                                                 "max_attempts": 1}})
    c = coordinator(ws)
    log = SessionLog(c.db)
    config = ws.root / "workspace" / "staging" / "config.json"
    config.parent.mkdir(parents=True)
    config.write_text('{"timeout": 10}\n')
    world_at_staging(log)                                   # 10:02 staging, protected config may change
    plan_file.write_text(json.dumps(plan(plan_seq=3)))      # 10:16 the plan is formed, then interrupted
    say(log, "o2", "observation", TOOL, tool="get_env", status="ok", entity="env:current", key="name",
        value="production")                                 # 10:40 the world changed
    tid = admin_task(c, subject="Raise the staging timeout", recipient="DEV")
    c.run_once()                                            # 11:05 the old plan resumes
    assert config.read_text() == '{"timeout": 10}\n', "the file the stale plan targeted is untouched"
    [verdict] = gate_events(c.db, tid)
    assert verdict["status"] == "BLOCK" and verdict["reasons"][0]["code"] == "STATE_DISALLOWS"
    assert [e.type for e in c.kernel.history(tid)].count("action_authorized") == 0

    # A corrected plan, formed against the current world with a current grant, passes and writes the file.
    say(log, "m3", "message", ADMIN, entity="file:staging/config.json", text="Staging is back: apply the timeout")
    say(log, "o3", "observation", TOOL, tool="get_env", status="ok", entity="env:current", key="name", value="staging")
    tid2 = admin_task(c, subject="Apply the timeout again", recipient="DEV", key="second")
    plan_file.write_text(json.dumps(plan(plan_seq=None, based_on_event="m3")))
    c.run_once()
    assert gate_events(c.db, tid2)[-1]["status"] == "PASS"
    assert config.read_text() == '{"timeout": 30}\n'


def test_protection_is_configurable_per_role_and_risk_level(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "ws", {})
    with open(ws.root / "taskkernel.toml", "a") as fh:
        fh.write('\n[gate]\nprotected = { low = ["deploy"] }\nroles = { DEV = ["close"] }\n')
    from taskkernel.coordinator.workspace import Workspace

    c = coordinator(Workspace.load(ws.root))
    log = SessionLog(c.db)
    say(log, "m1", "message", ADMIN, entity="ticket:42", text="Close ticket 42 and write a note")
    tid = admin_task(c, recipient="DEV", risk_level="low")
    c.kernel.submit({"type": "claim", "task_id": tid, "thread_key": tid, "expected_revision": 1, "round": 0,
                     "idempotency_key": "cl"}, DEV)

    def perform(op: str, key: str) -> Any:
        doc = c.kernel.task(tid)
        return c.kernel.submit({"type": "perform", "task_id": tid, "thread_key": tid, "round": 1,
                                "expected_revision": doc["revision"], "idempotency_key": key,
                                "payload": {"operation": op, "entity": "ticket:42", "tool": "t",
                                            "based_on_event": "m1"}}, DEV)

    assert perform("write", "w").status == "accepted", "write is not protected on low-risk tasks here"
    assert perform("close", "c").reason == "gate_insufficient_evidence", "DEV's close is protected"


def test_a_plan_judged_against_a_session_the_caller_may_not_read_is_refused_and_records_nothing(
        sqlite_db: Database) -> None:
    """A verdict quotes the inputs it weighed: naming another principal's session as permission_session must not
    turn the gate into a way to read it."""
    h, tid = active_dev_task(sqlite_db)
    log = SessionLog(sqlite_db)
    log.accept("TOOL:vault", {"input_id": "o1", "kind": "observation", "payload": {
        "tool": "read_secret", "status": "ok", "entity": "env:prod", "key": "db_password", "value": "hunter2"}},
        accepted_by="TOOL:vault")
    r = h.cmd("perform", tid, DEV, key="peek", payload=plan(), permission_session="TOOL:vault")
    assert r.reason == "role_not_authorized" and "hunter2" not in r.message, r
    assert gate_events(sqlite_db, tid) == []
    own = h.cmd("perform", tid, DEV, key="own", payload=plan(), permission_session="DEV:dev-agent")
    assert own.reason != "role_not_authorized", own  # its own session is judged (and lacks the evidence)
