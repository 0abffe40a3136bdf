"""Regression tests of the review of issue 27 (FCoP 4): each finding, through the real entry points."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from fcop import Project

from taskkernel.coordinator.fcop4.authority import PROFILE_ID
from taskkernel.coordinator.fcop4.edges import CoreEdges
from taskkernel.coordinator.workspace import Workspace, init_workspace
from taskkernel.kernel.model.principal import LOCAL_OWNER
from tests.cli_support import run
from tests.coord_support import coordinator
from tests.fcop_mcp import FcopMcp
from tests.test_fcop4 import act, kernel_task, show, up


def g4_project(tmp_path: Path) -> Path:
    project = tmp_path / "proj"
    assert run("init", str(project), "--fcop", "g4", cwd=tmp_path).code == 0
    up(project)
    return project


def test_an_edge_that_fails_once_is_retried_in_order_and_the_file_ends_where_the_kernel_is(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    init_workspace(tmp_path, "dev-team", fcop_generation="g4")
    c = coordinator(Workspace.load(tmp_path))
    r = c.kernel.submit({"type": "create_task", "idempotency_key": "k", "payload": {
        "sender": "ADMIN", "recipient": "DEV", "subject": "flaky lock"}}, LOCAL_OWNER)
    task_id = str(r.task_id)
    c.run_once()
    for step, payload in (("claim", {}), ("submit_report", {"status": "done", "body": "done"}), ("submit", {}),
                          ("approve", {})):
        doc = c.kernel.task(task_id)
        assert c.kernel.submit({"type": step, "task_id": task_id, "thread_key": doc["thread_key"],
                                "expected_revision": doc["revision"], "round": doc["round"],
                                "idempotency_key": step, "payload": payload}, LOCAL_OWNER).ok
    real, failed = CoreEdges.step, []

    def flaky(self: CoreEdges, *args: Any, **kwargs: Any) -> None:
        if not failed:  # the claim's edge: fcop's lock was busy (LOCK_RECOVERY_REQUIRED)
            failed.append(args[3:5])
            raise RuntimeError("Operation lock remains unavailable")
        real(self, *args, **kwargs)

    monkeypatch.setattr(CoreEdges, "step", flaky)
    for _ in range(6):
        c.run_once()
    assert failed == [("inbox", "active")]
    assert Project(tmp_path).inspect_state(task_id=task_id)["stage"] == "done"
    v = run("verify", cwd=tmp_path)
    assert (v.code, v.json["status"]) == (0, "ok"), v.out


def test_fcop_import_on_a_g4_workspace_imports_through_the_core(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    core = Project(project)
    ws = core.create_workspace(profiles=[])["workspace_id"]
    task_id = core.create_task(workspace_id=ws, operation_id="op", sender="PM", recipient="DEV", subject="old",
                               body="x")["task_id"]
    assert run("init", ".", cwd=project).code == 0
    dry = run("fcop", "import", "--dry-run", cwd=project)
    assert (dry.code, dry.json["generation"], dry.json["tasks"]) == (0, "g4", 1), dry.out
    done = run("fcop", "import", cwd=project)
    assert (done.code, done.json["tasks"]) == (0, 1), done.out
    up(project)
    assert show(project, task_id)["state"] == "inbox"


@pytest.mark.parametrize("plant", ["fifo", "link", "deep"])
def test_a_crafted_file_in_g4_never_hangs_nor_stops_the_pass(tmp_path: Path, plant: str) -> None:
    project = g4_project(tmp_path)
    ws = json.loads((project / "fcop" / "fcop.json").read_bytes())["workspace_id"]
    good = Project(project).create_task(workspace_id=ws, operation_id="op", sender="PM", recipient="DEV",
                                        subject="agent work", body="x")["task_id"]
    name = f"TASK-{'ab' * 16}.md"
    inbox = project / "fcop" / "_lifecycle" / "inbox"
    if plant == "fifo":
        os.mkfifo(inbox / name)
    elif plant == "link":
        (inbox / name).symlink_to("/dev/zero")
    else:
        (project / "fcop" / "issues" / f"ISSUE-{'cd' * 16}.md").write_text(
            "---\nx: " + "[" * 5000 + "]" * 5000 + "\n---\nbody\n")
    r = run("up", "--once", cwd=project)  # the CLI's own timeout (120 s) would catch a hang
    assert r.code == 0 and r.json["status"] == "ok", r.out + r.err[-2000:]
    assert show(project, good)["state"] == "inbox", "the agent's task was taken in beside the planted file"
    if plant != "deep":  # moved out of fcop's way as the link or FIFO it is: fcop's Core works again
        assert not os.path.lexists(inbox / name)
        assert os.path.lexists(project / "fcop" / "_quarantine" / f"quarantined-{name}")
        assert Project(project).create_task(workspace_id=ws, operation_id="op2", sender="PM", recipient="DEV",
                                            subject="after", body="y")["task_id"]


def test_a_decision_made_without_the_kernel_is_answered_and_verify_shows_every_drift(tmp_path: Path) -> None:
    project = g4_project(tmp_path)
    task_id = kernel_task(project, subject="guarded")
    act(project, "claim", task_id)
    act(project, "report", task_id, "--status", "done", "--body", "done", "--submit")
    up(project)
    # an agent that runs fcop's Core with an evaluator of its own (fcop trusts whoever builds the Core)
    rogue = Project(project, trusted_profiles={PROFILE_ID: lambda **_: "AUTHORIZED"})
    state = rogue.inspect_state(task_id=task_id)
    ws = json.loads((project / "fcop" / "fcop.json").read_bytes())["workspace_id"]
    heads = rogue.list_reports(subject_ref=task_id, head_only=True)
    report = (heads["items"] if isinstance(heads, dict) else heads)[-1]["report_id"]
    review = rogue.write_review(workspace_id=ws, sender="DEV", recipient="ADMIN", subject_ref=task_id, body="ok",
                                review_kind="acceptance", decision="approved", attempt_id=state["current_attempt_id"],
                                references=[report])["review_id"]
    auth = rogue.write_review(workspace_id=ws, sender="DEV", recipient="ADMIN", subject_ref=task_id, body="me",
                              review_kind="authorization", decision="authorize", profile_ref=PROFILE_ID,
                              attempt_id=state["current_attempt_id"], transition={"from": "review", "to": "done"},
                              issued_at="2026-01-01T00:00:00+00:00", expires_at=None, issuer_proof={"any": 1},
                              authorization_scope="single_use", operation_kind="lifecycle_transition")["review_id"]
    rogue.transition(task_id=task_id, from_stage="review", to_stage="done", tool="approve_task", actor="DEV",
                     report_ref=report, review_ref=review, authorization_ref=auth, profile_ref=PROFILE_ID)
    up(project)
    assert show(project, task_id)["state"] == "review", "the kernel decides T4-T7"
    issues = [p for p in (project / "fcop" / "issues").glob("*.md") if "decision_not_taken" in p.read_text()]
    assert len(issues) == 1
    v = run("verify", cwd=project)
    assert (v.code, v.json["reason"]) == (2, "folder_drift"), v.out


def test_a_free_text_human_actor_never_acts_as_admin(tmp_path: Path) -> None:
    project = g4_project(tmp_path)
    task_id = kernel_task(project, subject="DEV's", to="DEV")
    up(project)
    with FcopMcp(project) as fcop:
        fcop.call("claim_task", task_id=task_id, actor="human:eve")
    up(project)
    assert show(project, task_id)["state"] == "inbox", "HUMAN-EVE is no role of the team, let alone ADMIN"
    v = run("verify", cwd=project)
    assert (v.code, v.json["reason"]) == (2, "folder_drift"), "the refused move is drift verify reports"


def test_migrating_a_g3_workspace_keeps_its_team(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    assert run("init", str(project), "--team", "media-team", cwd=tmp_path).code == 0
    task_id = kernel_task(project, subject="collect", to="COLLECTOR")
    up(project)
    out = run("fcop", "migrate", "--to", "g4", cwd=project)
    assert (out.code, out.json["team_to_config"]) == (0, True), out.out
    assert not list(project.glob(".fcop-g4-*")) and not list((project / ".taskkernel").glob("migrate-g4-*"))
    again = kernel_task(project, subject="collect more", to="COLLECTOR")
    up(project)
    assert show(project, again)["state"] == "inbox" and show(project, task_id)["recipient"] == "COLLECTOR"


def test_a_root_swapped_without_its_records_is_refused_not_taken_in_twice(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    assert run("init", str(project), cwd=tmp_path).code == 0
    kernel_task(project, subject="one")
    up(project)
    assert run("fcop", "migrate", "--to", "g4", cwd=project).code == 0
    with sqlite3.connect(project / ".taskkernel" / "kernel.db") as conn:  # as if the commit had not happened
        conn.execute("UPDATE folder_imports SET generation = 'g3'")
    r = run("up", "--once", cwd=project)
    assert (r.code, r.json["reason"]) == (2, "migration_incomplete"), r.out
    assert len(json.loads(run("task", "list", "--json", cwd=project).out)) == 1


def test_init_fcop_g4_over_an_empty_fcop_folder(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    (project / "fcop").mkdir(parents=True)
    r = run("init", str(project), "--fcop", "g4", cwd=tmp_path)
    assert r.code == 0 and r.json["fcop_created"] is True, r.out + r.err
    assert json.loads((project / "fcop" / "fcop.json").read_bytes())["protocol_version"] == "4.0"
