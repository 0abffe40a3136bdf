"""The folder adapter end to end: files in, commands out, folders projected back."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import sqlalchemy as sa

from taskkernel.coordinator.fcop import read_envelope
from taskkernel.kernel.model.principal import LOCAL_OWNER, Principal
from taskkernel.kernel.store.schema import events
from tests.coord_support import admin_task, coordinator, make_workspace

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "fcop"
SCRIPTED = {"runner": "scripted"}


def fixtures() -> Path:
    import os

    for candidate in (Path(os.environ.get("TASKKERNEL_FIXTURES", "/nonexistent")) / "fcop", FIXTURES,
                      Path("/work/shared/fixtures/fcop")):
        if candidate.is_dir():
            return candidate
    raise AssertionError("FCoP fixtures not found (shared/fixtures/fcop beside the repository)")


def task_file(ws: Path, name: str, sender: str = "ADMIN", recipient: str = "PM", body: str = "Do it.",
              stage: str = "inbox", **front: str) -> Path:
    extra = "".join(f"{k}: {v}\n" for k, v in front.items() if k != "subject")
    path = ws / "fcop" / "_lifecycle" / stage / name
    path.write_text(f"---\nprotocol: fcop\nversion: 1\nsender: {sender}\nrecipient: {recipient}\npriority: P2\n"
                    f"subject: {front.get('subject', 'A task')}\n{extra}---\n{body}\n", encoding="utf-8")
    return path


NAME = "TASK-20261130-001-ADMIN-to-PM.md"


def child_files(c) -> list[str]:  # type: ignore[no-untyped-def]
    """The TASK file names of the root's children, which the kernel numbers on the day it creates them (UTC):
    never a date written into a test."""
    kids = c.kernel.children("TASK-20261130-001")
    assert [k["recipient"] for k in kids] == ["DEV", "QA"]
    return [f"{k['task_id']}-{k['sender']}-to-{k['recipient']}.md" for k in kids]


def one_task_ingested(tmp_path: Path, roles: dict | None = None):  # type: ignore[no-untyped-def]
    """A workspace whose coordinator has taken in one ADMIN->PM TASK file; returns (ws, coordinator, lifecycle)."""
    ws = make_workspace(tmp_path / "ws", roles or {})
    task_file(ws.root, NAME)
    c = coordinator(ws)
    c.run_once()
    return ws, c, ws.root / "fcop" / "_lifecycle"


def move(lifecycle: Path, src: str, dst: str) -> None:
    shutil.move(lifecycle / src / NAME, lifecycle / dst / NAME)



def test_a_task_file_flows_through_the_scripted_team(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "ws", {"PM": SCRIPTED, "DEV": SCRIPTED, "QA": SCRIPTED})
    c = coordinator(ws)
    c.run_once()  # the import (nothing yet): the file below is live input
    task_file(ws.root, "TASK-20261130-001-ADMIN-to-PM.md", subject="Ship it")
    c.run_once()
    review = ws.root / "fcop" / "_lifecycle" / "review" / "TASK-20261130-001-ADMIN-to-PM.md"
    env = read_envelope(review)
    # one entry per lifecycle event, fcop's tool names, each starting where the previous ended
    assert [(t.from_stage, t.to, t.tool) for t in env.transitions] == [  # type: ignore[union-attr]
        (None, "inbox", "create_task"), ("inbox", "active", "claim_task"), ("active", "review", "submit_task")]
    assert c.kernel.task("TASK-20261130-001")["state"] == "review"
    done = sorted(p.name for p in (ws.root / "fcop" / "_lifecycle" / "done").iterdir())
    assert done == child_files(c)
    ledger = [json.loads(x) for x in (ws.root / "fcop" / "ledger" / "tasks.jsonl").read_text().splitlines()]
    assert {t["task_id"]: t["state"] for t in ledger}["TASK-20261130-001"] == "review"
    assert "TASK-20261130-001" in (ws.root / "fcop" / "ledger" / "views" / "ADMIN.todo.md").read_text()


def test_rescans_and_restarts_never_duplicate(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "ws", {})
    task_file(ws.root, "TASK-20261130-001-ADMIN-to-PM.md")
    c = coordinator(ws)
    c.run_once()
    with c.db.read() as conn:
        before = conn.execute(sa.select(sa.func.count()).select_from(events)).scalar()
    for _ in range(3):
        assert sum(p.progress for p in coordinator(ws, owner="again").run_once()) == 0
    with c.db.read() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(events)).scalar() == before


def test_an_illegal_agent_move_is_moved_back_with_the_reason(tmp_path: Path) -> None:
    _, c, lifecycle = one_task_ingested(tmp_path)
    move(lifecycle, "inbox", "done")  # inbox -> done: no such edge
    c.run_once()
    assert (lifecycle / "inbox" / NAME).is_file()
    assert not (lifecycle / "done" / NAME).exists()
    assert "illegal_transition" in (lifecycle / "inbox" / f"_reason.{NAME}.txt").read_text()
    assert c.kernel.task("TASK-20261130-001")["state"] == "inbox"


def test_a_legal_agent_move_becomes_the_command(tmp_path: Path) -> None:
    _, c, lifecycle = one_task_ingested(tmp_path)
    move(lifecycle, "inbox", "active")  # an MCP claim_task
    c.run_once()
    doc = c.kernel.task("TASK-20261130-001")
    assert (doc["state"], doc["round"]) == ("active", 1)
    assert c.kernel.history("TASK-20261130-001")[-1].data["by"] == "PM:fcop-file"
    env = read_envelope(lifecycle / "active" / NAME)
    assert env.transitions[-1].to == "active"  # type: ignore[union-attr]


def test_a_report_file_is_evidence_and_a_done_report_submits(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "ws", {})
    task_file(ws.root, "TASK-20261130-001-ADMIN-to-PM.md")
    c = coordinator(ws)
    c.run_once()
    (ws.root / "fcop" / "reports" / "REPORT-20261130-001-PM-to-ADMIN.md").write_text(
        "---\nprotocol: fcop\nversion: 1\nsender: PM\nrecipient: ADMIN\nreferences:\n- TASK-20261130-001\n"
        "status: done\n---\nAll done.\n", encoding="utf-8")
    c.run_once()
    doc = c.kernel.task("TASK-20261130-001")
    assert doc["state"] == "review"
    assert [(r["report_id"], r["status"]) for r in doc["reports"]] == [("REPORT-20261130-001", "done")]
    assert (ws.root / "fcop" / "_lifecycle" / "review" / "TASK-20261130-001-ADMIN-to-PM.md").is_file()


def test_a_malformed_file_is_quarantined_with_its_bytes_and_a_reason(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "ws", {})
    c = coordinator(ws)
    c.run_once()  # the import: a malformed file already there is history and is kept where it is
    bad = ws.root / "fcop" / "_lifecycle" / "inbox" / "TASK-20261130-009-ADMIN-to-PM.md"
    raw = b"---\nprotocol: fcop\nversion: [1\nsender: ADMIN\n---\nbroken yaml\n"
    bad.write_bytes(raw)
    c.run_once()
    q = ws.root / "fcop" / "_quarantine"
    assert (q / f"quarantined-{bad.name}").read_bytes() == raw
    assert "malformed" in (q / f"quarantined-{bad.name}.reason.md").read_text()
    assert c.kernel.task("TASK-20261130-009") is None


def test_the_generated_g4_workspace_is_imported_in_its_stage(tmp_path: Path) -> None:
    from tests.cli_support import taskkernel

    ws = make_workspace(tmp_path / "ws", {})
    shutil.rmtree(ws.root / "fcop")
    shutil.copytree(fixtures() / "generated-v4" / "fcop", ws.root / "fcop")
    r = taskkernel("up", str(ws.root), "--once", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    show = taskkernel("task", "show", "TASK-56e11f3c1cde4cc98e91d103411b8e13", "--json", cwd=ws.root)
    doc = json.loads(show.stdout)
    assert (doc["state"], doc["sender"], doc["recipient"], doc["subject"]) == ("archive", "PM", "DEV", "Add auth")


def test_generated_v3_workspace_is_adopted_in_its_states(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "ws", {})
    shutil.rmtree(ws.root / "fcop")
    shutil.copytree(fixtures() / "generated-v3", ws.root / "fcop")
    c = coordinator(ws)
    c.run_once()
    doc = c.kernel.task("TASK-20261130-001")
    assert (doc["state"], doc["sender"], doc["recipient"]) == ("archive", "PM", "DEV")
    assert c.kernel.history("TASK-20261130-001")[0].type == "task_adopted"


def test_tetris_g2_workspace_ingests_to_expected_tasks_reports_and_states(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "ws", {})
    shutil.rmtree(ws.root / "fcop")
    root = ws.root / "fcop"
    for bucket in ("tasks", "reports"):
        shutil.copytree(fixtures() / "tetris-en-v1" / bucket, root / bucket)
    (root / "fcop.json").write_text(json.dumps({"mode": "custom", "team": "tetris", "leader": "PLANNER",
                                                "roles": ["PLANNER", "CODER", "ME"], "version": 1}))
    c = coordinator(ws)
    c.run_once()
    states = {t: (c.kernel.task(t) or {}).get("state") for t in [f"TASK-20260429-00{i}" for i in range(1, 8)]}
    assert None not in states.values(), states
    reported = {d["task_id"] for t in states if (d := c.kernel.task(t)) and d["reports"]}
    # every task with a done report from its driver is waiting for review; the rest are in the inbox
    for task_id, state in states.items():
        assert state == ("review" if task_id in reported else "inbox"), (task_id, state)
    assert len(reported) >= 5
    first = c.kernel.task("TASK-20260429-001")
    approve = {"type": "approve", "task_id": first["task_id"], "thread_key": first["thread_key"],
               "expected_revision": first["revision"], "round": first["round"], "idempotency_key": "ok"}
    before = {p: p.read_bytes() for p in root.rglob("*.md") if "ledger" not in p.parts}
    assert c.kernel.submit(approve, LOCAL_OWNER).status == "accepted"
    c.run_once()
    # G2 stays G2: the decision is a REVIEW file; no existing file moves or changes, no _lifecycle/ appears
    assert {p: p.read_bytes() for p in before} == before and not (root / "_lifecycle").exists()
    assert [p.name for p in (root / "reviews").iterdir() if p.name.startswith("REVIEW-")], "the approval is on disk"


def test_files_the_kernel_writes_are_read_by_fcops_v3_reader(tmp_path: Path) -> None:
    import pytest

    v3 = pytest.importorskip("fcop.compatibility.v3.project", reason="fcop is a dev dependency (the oracle)")
    import warnings

    ws = make_workspace(tmp_path / "ws", {"PM": SCRIPTED, "DEV": SCRIPTED, "QA": SCRIPTED})
    task_file(ws.root, "TASK-20261130-001-ADMIN-to-PM.md", subject="Ship it")
    c = coordinator(ws)
    c.run_once()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        project = v3.Project(ws.root)
        kids = [k["task_id"] for k in c.kernel.children("TASK-20261130-001")]
        for task_id in ("TASK-20261130-001", *kids):
            doc = c.kernel.task(task_id)
            seen = project.read_task(task_id)
            assert seen.path.parent.name == doc["state"]
            assert (seen.frontmatter.sender, seen.frontmatter.recipient) == (doc["sender"], doc["recipient"])
            assert [t["to"] for t in seen.frontmatter.extra["transitions"]][-1] == doc["state"]


def test_verify_finds_folder_drift_and_repairs_it(tmp_path: Path) -> None:
    from tests.cli_support import taskkernel

    ws = make_workspace(tmp_path / "ws", {"PM": SCRIPTED, "DEV": SCRIPTED, "QA": SCRIPTED})
    task_file(ws.root, "TASK-20261130-001-ADMIN-to-PM.md", subject="Ship it")
    c = coordinator(ws)
    c.run_once()
    dev_file = child_files(c)[0]
    lifecycle = ws.root / "fcop" / "_lifecycle"
    assert taskkernel("verify", cwd=ws.root).returncode == 0
    shutil.move(lifecycle / "done" / dev_file, lifecycle / "inbox")
    broken = taskkernel("verify", cwd=ws.root)
    out = json.loads(broken.stdout)
    assert broken.returncode == 2 and out["problems"][0]["kind"] == "folder"
    assert out["problems"][0]["task_id"] == dev_file[:len("TASK-YYYYMMDD-NNN")]
    fixed = taskkernel("verify", "--repair", cwd=ws.root)
    assert fixed.returncode == 0 and json.loads(fixed.stdout)["repaired"] == 1
    assert (lifecycle / "done" / dev_file).is_file()


def test_a_decision_cannot_be_made_by_moving_a_file(tmp_path: Path) -> None:
    ws, c, lifecycle = one_task_ingested(tmp_path)
    name = NAME
    move(lifecycle, "inbox", "active")  # the driver's claim: fine
    c.run_once()
    (ws.root / "fcop" / "reports" / "REPORT-20261130-001-PM-to-ADMIN.md").write_text(
        "---\nprotocol: fcop\nversion: 1\nsender: PM\nrecipient: ADMIN\nreferences:\n- TASK-20261130-001\n"
        "status: done\n---\nDone.\n", encoding="utf-8")
    c.run_once()
    assert c.kernel.task("TASK-20261130-001")["state"] == "review"
    move(lifecycle, "review", "done")  # an "approval" by hand
    c.run_once()
    assert c.kernel.task("TASK-20261130-001")["state"] == "review"
    assert (lifecycle / "review" / name).is_file()
    assert "role_not_authorized" in (lifecycle / "review" / f"_reason.{name}.txt").read_text()


def test_an_fcop_named_review_approves_without_moving_the_wrong_file(tmp_path: Path) -> None:
    from tests.cli_support import taskkernel

    ws = make_workspace(tmp_path / "ws", {"PM": SCRIPTED})
    task_file(ws.root, "TASK-20261130-001-ADMIN-to-PM.md")
    c = coordinator(ws)
    c.run_once()
    doc = c.kernel.task("TASK-20261130-001")
    for kind, payload in (("submit_report", {"status": "done"}), ("submit", {})):
        doc = c.kernel.task("TASK-20261130-001")
        c.kernel.submit({"type": kind, "task_id": doc["task_id"], "thread_key": doc["thread_key"],
                         "expected_revision": doc["revision"], "round": doc["round"],
                         "idempotency_key": f"pm-{kind}", "payload": payload}, LOCAL_OWNER)
    c.run_once()
    review = ws.root / "fcop" / "reviews" / "REVIEW-20261130-001-ADMIN-on-task-20261130-001-admin-to-pm.md"
    review.write_text("---\nprotocol: fcop\nversion: 1\ntype: REVIEW\nsender: ADMIN\n"
                      "review_id: REVIEW-20261130-001-ADMIN-on-task-20261130-001-admin-to-pm\nsubject_type: task\n"
                      "subject_ref: TASK-20261130-001\nreviewer_role: ADMIN\ndecision: approved\n"
                      "decided_at: '2026-11-30T10:00:00+00:00'\n---\nLooks right.\n", encoding="utf-8")
    c.run_once()
    assert c.kernel.task("TASK-20261130-001")["state"] == "done"
    assert (ws.root / "fcop" / "_lifecycle" / "done" / "TASK-20261130-001-ADMIN-to-PM.md").is_file()
    assert review.is_file(), "the REVIEW stays in reviews/"
    assert taskkernel("verify", cwd=ws.root).returncode == 0


def test_a_task_file_moved_while_the_projection_moves_it_is_found_again(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen in CI (two coordinators on one PostgreSQL workspace): the task's file moved between the projection's
    look for it and its move, the move failed with source_missing and `up --once` ended degraded. The projection
    looks again at once and moves the file from where it is now."""
    from taskkernel.coordinator.fcop import safeio
    from taskkernel.coordinator.folders import projection

    ws = make_workspace(tmp_path / "ws", {})
    c = coordinator(ws)
    task = admin_task(c, subject="moved meanwhile", recipient="DEV")
    c.run_once()
    assert c.folders is not None
    placed = c.folders.projection.find(task)
    assert placed is not None and placed.parent.name == "inbox"
    assert c.kernel.submit({"type": "claim", "task_id": task, "expected_revision": 1, "round": 0,
                            "idempotency_key": "claim-moved"}, Principal(role="DEV", agent="dev")).status == "accepted"
    real_move = safeio.move_no_overwrite
    calls: list[Path] = []

    def elsewhere_first(src: Path, dst: Path) -> Path:
        calls.append(src)
        if len(calls) == 1:  # someone else moves the file away just before this move
            shutil.move(src, src.parent.parent / "active" / src.name)
            return real_move(src, dst)  # source_missing
        return real_move(src, dst)

    monkeypatch.setattr(projection, "move_no_overwrite", elsewhere_first)
    where = c.folders.projection.place(task)
    assert where is not None and where.parent.name == "active" and where.is_file()
    assert len(calls) >= 1


@pytest.mark.parametrize("command", [("init", "."), ("up", "--once")])
def test_a_linked_fcop_folder_is_refused_by_init_as_by_up_with_the_reason_said_once(tmp_path: Path,
                                                                                   command: tuple[str, ...]) -> None:
    from tests.cli_support import taskkernel

    project, elsewhere = tmp_path / "ws", tmp_path / "elsewhere"
    if command[0] == "up":
        make_workspace(project, {})
        shutil.move(project / "fcop", elsewhere)
    else:
        (elsewhere / "_lifecycle" / "inbox").mkdir(parents=True)
        project.mkdir()
    (project / "fcop").symlink_to(elsewhere)
    r = taskkernel(*command, cwd=project)
    assert r.returncode == 2 and json.loads(r.stdout)["reason"] == "symlink_refused", r.stdout + r.stderr
    assert r.stderr.replace(str(project), "<ws>").count("symlink_refused") == 1, r.stderr
    if command[0] == "init":
        assert not (project / "taskkernel.toml").exists() and not (project / ".taskkernel").exists()


LEDGER_WRITER = """
import sys, pathlib
from taskkernel.coordinator.fcop.safeio import drain_refusals
from taskkernel.coordinator.workspace import Workspace
from tests.coord_support import admin_task, coordinator
c = coordinator(Workspace.load(pathlib.Path(sys.argv[1])))
projection = c.folders.projection
go = pathlib.Path(sys.argv[2])
while not go.exists():
    pass
for i in range(int(sys.argv[3])):
    admin_task(c, f"{sys.argv[4]} {i}")  # the views change on every pass
    projection.dirty = True
    while projection.dirty:  # the other writer holds the lock: this one writes at its next pass
        projection.refresh_ledger()
    assert not drain_refusals(), "a ledger write was refused"
"""


def test_coordinators_sharing_a_folder_write_its_ledger_in_turn(tmp_path: Path) -> None:
    """Two coordinators on one workspace (hosts sharing a store and a folder) rewrite the ledger and views over
    and over at once: neither sees its staged file replaced by the other's (CI found `content_changed` on
    ADMIN.todo.md with two `up` on one PostgreSQL workspace), so neither reports a failed stage."""
    import subprocess
    import sys

    ws, _, _ = one_task_ingested(tmp_path)
    go = tmp_path / "go"
    root = Path(__file__).resolve().parents[1]
    writers = [subprocess.Popen([sys.executable, "-c", LEDGER_WRITER, str(ws.root), str(go), "40", name], cwd=root,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for name in ("A", "B")]
    go.touch()
    for writer in writers:
        out, _ = writer.communicate(timeout=120)
        assert writer.returncode == 0, out
    assert "B 39" in (ws.root / "fcop" / "ledger" / "views" / "PM.todo.md").read_text()


HOLD_LEDGER_LOCK = """
import signal, sys, pathlib
from taskkernel.coordinator.fcop.safeio import locked
with locked(pathlib.Path(sys.argv[1])):
    print("held", flush=True)
    signal.pause()
"""


def test_a_stopped_coordinator_holding_the_ledger_lock_never_stops_another_pass(tmp_path: Path) -> None:
    """A coordinator stopped (SIGSTOP, a frozen host) while it writes the ledger keeps its lock: another
    coordinator's pass goes on without the ledger (it stays due) instead of waiting for it, and writes it once the
    lock is free (review of 1fa2d55: the blocking lock froze every pass, so no lapsed lease was taken over)."""
    import signal
    import subprocess
    import sys
    import threading

    ws, c, _ = one_task_ingested(tmp_path)
    projection = c.folders.projection
    lock = ws.root / "fcop" / ".locks" / "ledger.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LEDGER_LOCK, str(lock)], cwd=Path(__file__).parents[1],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        holder.send_signal(signal.SIGSTOP)
        admin_task(c, "Written later")
        projection.dirty = True
        done = threading.Event()
        worker = threading.Thread(target=lambda: (c.pass_once(), done.set()), daemon=True)
        worker.start()
        assert done.wait(30), "a pass waited for the stopped holder's lock"
        assert projection.dirty, "the ledger is still due"
        assert "Written later" not in (ws.root / "fcop" / "ledger" / "views" / "PM.todo.md").read_text()
    finally:
        holder.kill()
        holder.wait()
    assert projection.refresh_ledger() >= 1 and not projection.dirty
    assert "Written later" in (ws.root / "fcop" / "ledger" / "views" / "PM.todo.md").read_text()
