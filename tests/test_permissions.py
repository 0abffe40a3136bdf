"""Protected actions need a current human grant from the session log, judged at execution time."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from taskkernel.coordinator.compose import build_kernel
from taskkernel.kernel.sessionlog import SessionLog
from taskkernel.kernel.store.db import Database
from tests.cli_support import taskkernel
from tests.kernel_harness import ADMIN, PM, Harness


def high_risk_in_review(any_db: Database, risk: str = "high") -> tuple[Harness, str]:
    h = Harness(any_db)
    h.kernel = build_kernel(any_db, None)
    tid = h.create(risk_level=risk).task_id
    h.drive_to(tid, "review", driver=PM)
    return h, tid


def grant(log: SessionLog, kind: str, input_id: str, task_id: str, permission: str = "approve",
          by: str = "ADMIN:alice") -> int:
    r = log.accept("admin", {"input_id": input_id, "kind": kind,
                             "payload": {"permission": permission, "scope": f"task:{task_id}"}}, accepted_by=by)
    return int(r.accept_seq)


def test_high_risk_approval_without_a_grant_is_refused_with_no_effect(any_db: Database) -> None:
    h, tid = high_risk_in_review(any_db)
    events = h.event_count()
    r = h.cmd("approve", tid, ADMIN)
    assert r.reason == "permission_required" and "no grant" in r.message
    assert h.event_count() == events
    grant(SessionLog(any_db), "allow", "g1", tid)
    assert h.cmd("approve", tid, ADMIN).status == "accepted"


def test_a_grant_an_agent_gave_itself_does_not_authorize(any_db: Database) -> None:
    h, tid = high_risk_in_review(any_db)
    grant(SessionLog(any_db), "allow", "g1", tid, by="PM:pm-agent")
    r = h.cmd("approve", tid, ADMIN)
    assert r.reason == "permission_required" and "not accepted from ADMIN" in r.message


def test_a_revoked_grant_does_not_authorize(any_db: Database) -> None:
    h, tid = high_risk_in_review(any_db)
    log = SessionLog(any_db)
    grant(log, "allow", "g1", tid)
    grant(log, "revoke", "g2", tid)
    r = h.cmd("approve", tid, ADMIN)
    assert r.reason == "permission_required" and "revoked by g2" in r.message


def test_a_grant_accepted_after_the_commands_cutoff_does_not_authorize(any_db: Database) -> None:
    h, tid = high_risk_in_review(any_db)
    log = SessionLog(any_db)
    log.accept("admin", {"input_id": "m1", "kind": "message", "payload": {"text": "looking at it"}})
    grant(log, "allow", "g1", tid)  # seq 2
    assert h.cmd("approve", tid, ADMIN, permission_as_of=1).reason == "permission_required"
    assert h.cmd("approve", tid, ADMIN, permission_as_of=2).status == "accepted"


def test_grants_are_scoped_to_the_task_and_permission(any_db: Database) -> None:
    h, tid = high_risk_in_review(any_db)
    other = h.create().task_id
    log = SessionLog(any_db)
    grant(log, "allow", "g-other", other)
    grant(log, "allow", "g-archive", tid, permission="archive")
    assert h.cmd("approve", tid, ADMIN).reason == "permission_required"


def test_low_risk_needs_no_grant_and_irreversible_protects_reopen(any_db: Database) -> None:
    h = Harness(any_db)
    h.kernel = build_kernel(any_db, None)
    low = h.create().task_id
    h.drive_to(low, "done")
    tid = h.create(risk_level="irreversible").task_id
    h.drive_to(tid, "review")
    log = SessionLog(any_db)
    grant(log, "allow", "g1", tid)
    assert h.cmd("approve", tid, ADMIN).status == "accepted"
    assert h.cmd("reopen", tid, ADMIN).reason == "permission_required"


def test_grant_through_the_cli(tmp_path: Path) -> None:
    def tk(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return taskkernel(*args, cwd=tmp_path / "ws", stdin=stdin)

    (tmp_path / "ws").mkdir()
    assert tk("init", ".").returncode == 0
    created = json.loads(tk("submit", stdin=json.dumps({"type": "create_task", "idempotency_key": "c", "payload": {
        "sender": "ADMIN", "recipient": "PM", "subject": "deploy", "risk_level": "high"}})).stdout)
    tid = created["task_id"]
    rev = 1
    for i, (kind, payload) in enumerate([("claim", {}), ("submit_report", {"status": "done"}), ("submit", {})]):
        out = json.loads(tk("submit", stdin=json.dumps({"type": kind, "task_id": tid, "thread_key": tid,
                                                          "expected_revision": rev, "round": 0 if i == 0 else 1,
                                                          "idempotency_key": f"s{i}", "payload": payload})).stdout)
        rev = out["revision"]
    approve = json.dumps({"type": "approve", "task_id": tid, "thread_key": tid, "expected_revision": rev, "round": 1,
                          "idempotency_key": "ap"})
    assert json.loads(tk("submit", stdin=approve).stdout)["reason"] == "permission_required"
    r = tk("session", "accept", "admin", "--kind", "allow", "--input-id", "ok-1", "--payload",
           json.dumps({"permission": "approve", "scope": f"task:{tid}"}))
    assert json.loads(r.stdout)["accept_seq"] == 1
    assert json.loads(tk("submit", stdin=approve).stdout)["status"] == "accepted"


def test_a_cutoff_cannot_bring_back_a_revoked_grant(any_db: Database) -> None:
    h, tid = high_risk_in_review(any_db)
    log = SessionLog(any_db)
    grant(log, "allow", "g1", tid)
    grant(log, "revoke", "g2", tid)
    r = h.cmd("approve", tid, ADMIN, permission_as_of=1)
    assert r.reason == "permission_required" and "revoked by g2" in r.message
    assert h.kernel.task(tid)["state"] == "review"


def test_only_admin_may_lower_a_tasks_risk_level(any_db: Database) -> None:
    from tests.kernel_harness import DEV

    h = Harness(any_db)
    h.kernel = build_kernel(any_db, None)
    root = h.create().task_id
    h.cmd("claim", root, PM)
    child = h.create(sender=PM, recipient="DEV", parent=root, risk_level="high").task_id
    h.drive_to(child, "review", driver=DEV, reviewer=PM)
    assert h.cmd("approve", child, PM).reason == "permission_required"
    r = h.cmd("amend", child, PM, payload={"risk_level": "low"})
    assert r.reason == "role_not_authorized" and "lower" in r.message
    assert h.cmd("amend", child, PM, payload={"risk_level": "irreversible"}).status == "accepted"
    assert h.cmd("amend", child, ADMIN, payload={"risk_level": "low"}).status == "accepted"
