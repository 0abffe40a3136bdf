"""FCoP 4 (G4) workspaces shared with fcop 4.0.5's Core and fcop-mcp 4.0.5's canonical server (the oracles):
fcop agents create, claim, report and submit (T1–T3); the kernel decides T4–T7 and they land as the Core
requires; `task show`, fcop-mcp's inspect_task and validate_workspace agree after every step."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from fcop import Project
from fcop.errors import V4ProtocolError
from fcop.workspace import validate_workspace

from taskkernel.coordinator.fcop4.authority import PROFILE_ID, evaluator
from tests.cli_support import Run, run
from tests.fcop_mcp import FcopMcp, ToolError


def up(project: Path) -> Run:
    r = run("up", "--once", cwd=project)
    assert (r.code, r.json["status"]) == (0, "ok"), r.out + r.err[-3000:]
    return r


def show(project: Path, task_id: str) -> dict[str, Any]:
    r = run("task", "show", task_id, "--json", cwd=project)
    assert r.code == 0, r.out + r.err
    return r.json  # type: ignore[no-any-return]


def verified(project: Path) -> None:
    """Both sides call the workspace sound: the kernel's chain and drift check, and fcop's own validator."""
    v = run("verify", cwd=project)
    assert (v.code, v.json["status"]) == (0, "ok"), v.out
    report = validate_workspace(project)
    assert report["valid"], report["errors"]


def tree(project: Path) -> dict[str, str]:
    root = project / "fcop"
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def task_fields(core: Project, task_id: str) -> dict[str, Any]:
    read = core.read_task(task_id=task_id)
    return read.get("fields", read)  # type: ignore[no-any-return]


def kernel_task(project: Path, **fields: str) -> str:
    r = run("task", "create", "--to", fields.get("to", "DEV"), "--subject", fields["subject"], "--body",
            fields.get("body", "Do it."), "--json", cwd=project)
    assert r.json["status"] == "accepted", r.out
    return str(r.json["task_id"])


def act(project: Path, verb: str, task_id: str, *args: str) -> None:
    r = run("task", verb, task_id, *args, "--json", cwd=project)
    assert r.json["status"] == "accepted", r.out + r.err


def test_an_fcop_mcp_agent_and_the_kernel_share_one_g4_workspace_through_approve_and_reject(
        tmp_path: Path) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    with FcopMcp(project) as fcop:
        ws = fcop.call("init_workspace")["workspace_id"]
        init = run("init", ".", cwd=project)
        assert init.code == 0 and init.json["fcop_created"] is False, init.out + init.err
        up(project)
        ids = {}
        for n in ("approve", "reject"):
            ids[n] = fcop.call("create_task", workspace_id=ws, operation_id=f"op-{n}", sender="PM", recipient="DEV",
                               subject=f"Task to {n}", body="Handle floats.")["task_id"]
        up(project)
        assert {show(project, i)["state"] for i in ids.values()} == {"inbox"}, "fcop's id is the kernel's"
        verified(project)
        for task_id in ids.values():  # the agent: T2, its REPORT, T3
            attempt = fcop.call("claim_task", task_id=task_id, actor="DEV")["attempt_id"]
            up(project)
            assert (show(project, task_id)["state"], show(project, task_id)["round"]) == ("active", 1)
            report = fcop.call("write_report", workspace_id=ws, sender="DEV", recipient="PM", subject_ref=task_id,
                               attempt_id=attempt, body="Floats handled.", result="done")["report_id"]
            fcop.call("submit_task", task_id=task_id, actor="DEV", report_ref=report)
            up(project)
            doc = show(project, task_id)
            assert doc["state"] == "review" and doc["reports"][-1]["report_id"] == report
            verified(project)
        act(project, "approve", ids["approve"])
        act(project, "reject", ids["reject"], "--reason", "Also handle NaN.")
        up(project)
        done = fcop.call("inspect_task", task_id=ids["approve"])
        assert done["stage"] == "done" and done["last_transition"]["tool"] == "approve_task"
        evidence = done["last_transition"]["evidence_ref"]
        for ref, digest in zip(evidence, done["last_transition"]["evidence_digest"], strict=True):
            folder = "reports" if ref.startswith("REPORT-") else "reviews"
            assert hashlib.sha256((project / "fcop" / folder / f"{ref}.md").read_bytes()).hexdigest() == digest
        kinds = {r["review_kind"] for r in fcop.call("list_reviews", subject_ref=ids["approve"])["items"]}
        assert kinds == {"acceptance", "authorization"}
        redo = fcop.call("inspect_task", task_id=ids["reject"])
        assert redo["stage"] == "active" and redo["last_transition"]["tool"] == "reject_task"
        attempt = redo["current_attempt_id"]
        assert attempt != done["current_attempt_id"]
        verified(project)
        # the new attempt is the kernel's round 2: the agent reports on it and submits again
        report = fcop.call("write_report", workspace_id=ws, sender="DEV", recipient="PM", subject_ref=ids["reject"],
                           attempt_id=attempt, body="NaN handled too.", result="done")["report_id"]
        fcop.call("submit_task", task_id=ids["reject"], actor="DEV", report_ref=report)
        up(project)
        assert (show(project, ids["reject"])["state"], show(project, ids["reject"])["round"]) == ("review", 2)
        act(project, "approve", ids["reject"])
        act(project, "archive", ids["reject"], "--reason", "shipped")
        up(project)
        assert fcop.call("inspect_task", task_id=ids["reject"])["stage"] == "archive"
        assert fcop.call("validate_workspace")["valid"]
        verified(project)


def test_fcop_agents_cannot_decide_t4_to_t7_nor_mint_the_kernels_proof(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    assert run("init", str(project), "--fcop", "g4", cwd=tmp_path).code == 0
    task_id = kernel_task(project, subject="Guarded")
    act(project, "claim", task_id)
    act(project, "report", task_id, "--status", "done", "--body", "Done.", "--submit")
    up(project)
    with FcopMcp(project) as fcop:
        state = fcop.call("inspect_task", task_id=task_id)
        assert state["stage"] == "review"
        reports = fcop.call("list_reports", subject_ref=task_id)["items"]
        ws = json.loads((project / "fcop" / "fcop.json").read_bytes())["workspace_id"]
        review = fcop.call("write_review", workspace_id=ws, sender="DEV", recipient="PM", subject_ref=task_id,
                           review_kind="acceptance", decision="approved", body="Self-approved.",
                           attempt_id=state["current_attempt_id"], references=[reports[-1]["report_id"]])
        forged = fcop.call("write_review", workspace_id=ws, sender="DEV", recipient="PM", subject_ref=task_id,
                           review_kind="authorization", decision="authorize", body="Trust me.",
                           attempt_id=state["current_attempt_id"], profile_ref=PROFILE_ID,
                           transition={"from": "review", "to": "done"}, issued_at="2026-01-01T00:00:00+00:00",
                           authorization_scope="single_use", operation_kind="lifecycle_transition",
                           issuer_proof={"method": "taskkernel-hmac-sha256", "nonce": "0", "mac": "0" * 64})
        with pytest.raises(ToolError) as refused:
            fcop.call("approve_task", task_id=task_id, actor="DEV", report_ref=reports[-1]["report_id"],
                      review_ref=review["review_id"], authorization_ref=forged["review_id"], profile_ref=PROFILE_ID)
        assert refused.value.code.startswith("AUTHORIZATION_"), refused.value.content
    # even given the Profile's evaluator, a proof made without the workspace's key is refused
    key = b"\x00" * 32
    core = Project(project, trusted_profiles={PROFILE_ID: evaluator(key)})
    with pytest.raises(V4ProtocolError) as denied:
        core.transition(task_id=task_id, from_stage="review", to_stage="done", tool="approve_task", actor="DEV",
                        report_ref=reports[-1]["report_id"], review_ref=review["review_id"],
                        authorization_ref=forged["review_id"], profile_ref=PROFILE_ID)
    assert denied.value.code == "AUTHORIZATION_INVALID"
    up(project)
    assert show(project, task_id)["state"] == "review", "nothing an agent wrote moved the task"
    act(project, "approve", task_id)
    up(project)
    assert Project(project).inspect_state(task_id=task_id)["stage"] == "done"
    verified(project)


def test_a_task_made_in_taskkernel_on_g4_walks_every_core_edge(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    r = run("init", str(project), "--fcop", "g4", cwd=tmp_path)
    assert r.code == 0 and r.json["fcop_created"] is True, r.out + r.err
    manifest = json.loads((project / "fcop" / "fcop.json").read_bytes())
    assert manifest["protocol_version"] == "4.0" and PROFILE_ID in manifest["profiles"]
    task_id = kernel_task(project, subject="Every edge")
    assert len(task_id) == len("TASK-") + 32
    up(project)
    assert Project(project).inspect_state(task_id=task_id)["stage"] == "inbox"
    act(project, "claim", task_id)
    act(project, "report", task_id, "--status", "done", "--body", "Round one.", "--submit")
    act(project, "reject", task_id, "--reason", "Not yet.")
    act(project, "report", task_id, "--status", "done", "--body", "Round two.", "--submit")
    act(project, "approve", task_id)
    up(project)  # five kernel edges at once: the Core walks them one by one
    core = Project(project)
    state = core.inspect_state(task_id=task_id)
    assert state["stage"] == "done"
    tools = [t["tool"] for t in task_fields(core, task_id)["transitions"]]
    assert tools == ["create_task", "claim_task", "submit_task", "reject_task", "submit_task", "approve_task"]
    verified(project)
    act(project, "reopen", task_id, "--reason", "One more thing.")
    up(project)
    assert core.inspect_state(task_id=task_id)["stage"] == "active"
    act(project, "report", task_id, "--status", "done", "--body", "Round three.", "--submit")
    act(project, "approve", task_id)
    act(project, "archive", task_id, "--reason", "shipped")
    up(project)
    assert core.inspect_state(task_id=task_id)["stage"] == "archive"
    assert show(project, task_id)["state"] == "archive"
    verified(project)


def test_a_g4_workspace_with_history_is_imported_without_changing_a_byte(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    with FcopMcp(project) as fcop:  # fcop-mcp's own init, then fcop's Core with a Profile of the team's own
        ws = fcop.call("init_workspace", profile="acme/1")["workspace_id"]
    core = Project(project, trusted_profiles={"acme/1": lambda **_: "AUTHORIZED"})
    stages: dict[str, str] = {}

    def make(name: str) -> str:
        return str(core.create_task(workspace_id=ws, operation_id=f"op-{name}", sender="PM", recipient="DEV",
                                    subject=name, body=f"{name} body")["task_id"])

    def to_review(task_id: str) -> str:
        attempt = core.transition(task_id=task_id, from_stage="inbox", to_stage="active", tool="claim_task",
                                  actor="DEV")["attempt_id"]
        report = core.write_report(workspace_id=ws, sender="DEV", recipient="PM", body="done", subject_ref=task_id,
                                   attempt_id=attempt, report_kind="final", result="done")["report_id"]
        core.transition(task_id=task_id, from_stage="active", to_stage="review", tool="submit_task", actor="DEV",
                        report_ref=report)
        return str(report)

    def decide(task_id: str, frm: str, to: str, tool: str, report: str | None) -> None:
        attempt = core.inspect_state(task_id=task_id)["current_attempt_id"]
        kind = {"approve_task": ("acceptance", "approved"), "reject_task": ("rejection", "rejected")}.get(tool)
        review = None
        if kind:
            review = core.write_review(workspace_id=ws, sender="PM", recipient="DEV", body="ok", subject_ref=task_id,
                                       review_kind=kind[0], decision=kind[1], attempt_id=attempt,
                                       references=[report])["review_id"]
        auth_id = core.write_review(workspace_id=ws, sender="PM", recipient="DEV", body="authorized",
                                    subject_ref=task_id, review_kind="authorization", decision="authorize",
                                    attempt_id=attempt, profile_ref="acme/1", transition={"from": frm, "to": to},
                                    issued_at="2026-01-01T00:00:00+00:00", expires_at=None,
                                    authorization_scope="single_use", operation_kind="lifecycle_transition",
                                    issuer_proof={"token": "t"})["review_id"]
        extra = {"report_ref": report, "review_ref": review} if kind else {}
        if tool == "reopen_task":
            extra = {"review_ref": auth_id}
        core.transition(task_id=task_id, from_stage=frm, to_stage=to, tool=tool, actor="PM",
                        authorization_ref=auth_id, profile_ref="acme/1", **extra)

    stages[make("waiting")] = "inbox"
    working = make("working")
    core.transition(task_id=working, from_stage="inbox", to_stage="active", tool="claim_task", actor="DEV")
    stages[working] = "active"
    reviewing = make("reviewing")
    to_review(reviewing)
    stages[reviewing] = "review"
    finished = make("finished")
    decide(finished, "review", "done", "approve_task", to_review(finished))
    stages[finished] = "done"
    reworked = make("reworked")
    decide(reworked, "review", "active", "reject_task", to_review(reworked))
    stages[reworked] = "active"
    archived = make("archived")
    decide(archived, "review", "done", "approve_task", to_review(archived))
    decide(archived, "done", "archive", "archive_task", None)
    stages[archived] = "archive"
    branch = str(core.create_task(workspace_id=ws, operation_id="op-branch", sender="DEV", recipient="QA",
                                  subject="branch", body="a branch of the working task", branch_of=working)["task_id"])
    stages[branch] = "inbox"
    core.write_issue(workspace_id=ws, sender="QA", recipient="PM", body="flaky", subject_ref=working, severity="low")
    before = tree(project)

    assert run("init", ".", cwd=project).code == 0
    up(project)
    up(project)
    assert tree(project) == before, "the import and a quiet pass change no byte"
    for task_id, stage in stages.items():
        doc = show(project, task_id)
        assert doc["state"] == stage, (task_id, doc["state"], stage)
        attempts = [t for t in task_fields(core, task_id)["transitions"] if t.get("attempt_id")]
        assert doc["round"] == len(attempts), (task_id, doc["round"], len(attempts))
    assert show(project, branch)["parent"] == working, "a G4 branch is its root's child in the kernel"
    listed = {p.stem for folder in ("reports", "reviews", "issues") for p in (project / "fcop" / folder).glob("*.md")}
    log = run("log", "--json", cwd=project).out.splitlines()
    attached = {json.loads(line)["data"].get("record_id") for line in log if line.startswith("{")}
    assert listed <= attached, listed - attached
    verified(project)


def test_a_file_fcops_core_refuses_is_left_alone_and_the_others_go_on(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    assert run("init", str(project), "--fcop", "g4", cwd=tmp_path).code == 0
    up(project)
    bad = project / "fcop" / "_lifecycle" / "inbox" / f"TASK-{'0' * 32}.md"
    bad.write_bytes(b"---\nprotocol: fcop\nversion: 4\n: [\n---\n")
    good = kernel_task(project, subject="Still works")
    first = up(project)
    assert "fcop4.invalid" in first.err and bad.name in first.err
    assert bad.read_bytes() == b"---\nprotocol: fcop\nversion: 4\n: [\n---\n", "never moved nor rewritten"
    assert show(project, good)["state"] == "inbox"
    assert "fcop4.invalid" not in up(project).err, "said once while the file stays as it is"
