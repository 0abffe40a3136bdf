"""Interop with real FCoP data: the shared fixtures parse, and fcop's own v3 reader accepts what we write."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import warnings
from pathlib import Path

import pytest

from taskkernel.coordinator.fcop import (
    EnvelopeKind,
    FcopError,
    FcopReason,
    Generation,
    ReportEnvelope,
    ReviewEnvelope,
    Scanner,
    TaskDraft,
    TaskEnvelope,
    Transition,
    append_transition,
    move_no_overwrite,
    open_workspace,
    parse_envelope,
    read_envelope,
    write_issue,
    write_report,
    write_review,
    write_task,
)

fcop_fm = pytest.importorskip("fcop.core.frontmatter", reason="the fcop package is a dev dependency (oracle)")
from fcop.compatibility.v3.project import Project as FcopV3Project  # noqa: E402
from fcop.lifecycle.events import read_events  # noqa: E402


def _fixtures() -> Path:
    """``<repo>/../shared/fixtures`` (CI clones the repo beside a copy of shared/), else $TASKKERNEL_FIXTURES."""
    beside = Path(__file__).resolve().parent.parent.parent / "shared" / "fixtures"
    if beside.is_dir():
        return beside
    return Path(os.environ.get("TASKKERNEL_FIXTURES", "/work/shared/fixtures"))


FIXTURES = _fixtures() / "fcop"
TETRIS = FIXTURES / "tetris-en-v1"
GENERATED_V3 = FIXTURES / "generated-v3"


def _v3(project_root: Path) -> FcopV3Project:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return FcopV3Project(project_root)


def test_fixture_folder_is_present() -> None:
    assert TETRIS.is_dir() and GENERATED_V3.is_dir(), f"fixtures not found under {FIXTURES}"


@pytest.mark.parametrize("path", sorted((TETRIS / "tasks").glob("*.md")) + sorted((TETRIS / "reports").glob("*.md")),
                         ids=lambda p: p.name)
def test_every_tetris_envelope_parses_like_fcop(path: Path) -> None:
    env = read_envelope(path)
    data = path.read_bytes()
    theirs, their_body = fcop_fm.parse_task_frontmatter(data.decode("utf-8"))
    assert env.sha256 == hashlib.sha256(data).hexdigest()
    assert isinstance(env, TaskEnvelope | ReportEnvelope)
    assert (env.sender, env.recipient, env.priority.value) == (theirs.sender, theirs.recipient,
                                                              theirs.priority.value)
    assert env.body == their_body.lstrip("\n")
    assert not data.endswith(b"\n")  # the fixtures have no final newline; the body keeps that
    assert env.body.endswith(data.decode()[-20:])
    if isinstance(env, TaskEnvelope):
        assert env.subject == theirs.subject and env.thread_key == theirs.thread_key
    else:
        assert env.task_id == f"TASK-{env.name.date}-{env.name.sequence:03d}"  # tetris reports answer their number
        assert env.status == "done"


def test_tetris_reference_forms_are_normalised_and_hashes_match_the_digest() -> None:
    t1 = TETRIS / "tasks" / "TASK-20260429-001-ADMIN-to-ME.md"
    assert hashlib.sha256(t1.read_bytes()).hexdigest().startswith("ee9fe9e7644fef23")
    t4 = read_envelope(TETRIS / "tasks" / "TASK-20260429-004-ADMIN-to-PLANNER.md")
    assert t4.front_matter["references"] == ["TASK-20260429-003-PLANNER-to-CODER.md"]  # as written
    assert isinstance(t4, TaskEnvelope) and t4.references == ("TASK-20260429-003",)
    r5 = read_envelope(TETRIS / "reports" / "REPORT-20260429-005-PLANNER-to-ADMIN.md")
    assert isinstance(r5, ReportEnvelope) and r5.priority.value == "P1" and r5.task_id == "TASK-20260429-005"


def test_tetris_proposals_are_not_envelopes() -> None:
    for path in (TETRIS / "proposals").iterdir():
        with pytest.raises(FcopError) as exc:
            read_envelope(path)
        assert exc.value.reason is FcopReason.BAD_FILENAME


def test_g2_workspace_built_from_tetris_scans_to_its_tasks_and_reports(tmp_path: Path) -> None:
    agents = tmp_path / "docs" / "agents"
    shutil.copytree(TETRIS / "tasks", agents / "tasks")
    shutil.copytree(TETRIS / "reports", agents / "reports")
    shutil.copytree(TETRIS / "proposals", tmp_path / ".fcop" / "proposals")
    stray = next((TETRIS / "proposals").iterdir())
    shutil.copy(stray, agents / "tasks" / stray.name)  # a non-envelope where tasks live: a ghost
    ws = open_workspace(tmp_path)
    assert (ws.root, ws.generation) == (agents, Generation.G2)
    batch = Scanner(ws, settle_s=0, grace_s=0).scan()
    kinds = sorted((e.envelope.kind.value, e.envelope.id) for e in batch.ready if e.envelope)
    assert kinds == sorted([("TASK", f"TASK-20260429-00{n}") for n in range(1, 8)]
                           + [("REPORT", f"REPORT-20260429-00{n}") for n in range(1, 8)])
    assert [g.rel for g in batch.ghosts] == [f"tasks/{stray.name}"] and not batch.invalid
    assert (agents / "tasks" / stray.name).read_bytes() == stray.read_bytes()


def test_generated_v3_files_parse_with_their_lifecycle_and_links() -> None:
    ws = open_workspace(GENERATED_V3)
    assert ws.generation is Generation.G3 and ws.config["leader"] == "PM"
    got = {e.envelope.kind: e for e in Scanner(ws, settle_s=0, grace_s=0).scan().ready if e.envelope}
    task = got[EnvelopeKind.TASK]
    assert task.stage == "archive" and isinstance(task.envelope, TaskEnvelope)
    assert [(t.from_stage, t.to, t.by) for t in task.envelope.transitions] == [
        (None, "inbox", "PM"), ("inbox", "active", "archiver"), ("active", "done", "archiver"),
        ("done", "archive", "archiver")]
    review = got[EnvelopeKind.REVIEW].envelope
    assert isinstance(review, ReviewEnvelope)
    assert (review.subject_task_id, review.decision, review.reviewer) == ("TASK-20261130-001", "approved", "ADMIN")
    issue = got[EnvelopeKind.ISSUE].envelope
    assert (issue.reporter, issue.severity, issue.summary) == ("QA", "high", "flaky test")  # type: ignore[union-attr]
    assert got[EnvelopeKind.REPORT].envelope.task_id == "TASK-20261130-001"  # type: ignore[union-attr]


def test_generated_v4_workspace_is_detected_as_g4_and_a_g4_manifest_outside_fcop_is_refused(tmp_path: Path) -> None:
    assert open_workspace(FIXTURES / "generated-v4").generation is Generation.G4
    shutil.copytree(FIXTURES / "generated-v4" / "fcop", tmp_path / "docs" / "agents")
    with pytest.raises(FcopError) as exc:  # fcop's Core reads a G4 workspace only at <project>/fcop
        open_workspace(tmp_path)
    assert exc.value.reason is FcopReason.UNSUPPORTED_WORKSPACE_GENERATION


def _strip_times(text: str) -> str:
    return re.sub(r"'\d{4}-\d\d-\d\dT[^']*'", "'<t>'", text)


def test_our_task_is_byte_identical_to_fcops_own_write_task(tmp_path: Path) -> None:
    ours_root, theirs_root = tmp_path / "ours", tmp_path / "theirs"
    ws = open_workspace(ours_root, create=True)
    draft = TaskDraft(sender="PM", recipient="DEV", subject="Add auth", body="Body text\n", priority="high",
                      thread_key="auth", references=("TASK-20260101-001-ADMIN-to-PM.md",))
    ours = write_task(ws, draft)
    theirs_project = _v3(theirs_root)
    theirs_project.init(team="dev-team", lang="en")
    theirs = theirs_project.write_task(sender="PM", recipient="DEV", priority="P1", subject="Add auth",
                                       body="Body text\n", references=("TASK-20260101-001",), thread_key="auth")
    assert ours.path.name == Path(theirs.path).name
    assert _strip_times(ours.path.read_text()) == _strip_times(Path(theirs.path).read_text())


def test_fcop_v3_reader_accepts_everything_we_write(tmp_path: Path) -> None:
    ws = open_workspace(tmp_path, create=True)
    task = write_task(ws, TaskDraft(sender="PM", recipient="DEV", slot="BACKEND", slug="auth-fix",
                                    subject="Fix: auth — ünïcode", body="Line 1\n\nLine 3",
                                    extra={"risk_level": "high", "x_custom": {"k": [1, 2]}}))
    report = write_report(ws, sender="DEV", recipient="PM", task_id=task.name.id, body="done it", status="done")
    issue = write_issue(ws, reporter="QA", summary="flaky test", body="x", severity="high")
    review = write_review(ws, reviewer="PM", subject_ref=task.path.stem, decision="needs_changes",
                          rationale="almost", required_changes=["add a test"])
    p = _v3(tmp_path)
    assert p.topology == "v3"
    t = p.read_task(task.path.name)
    assert (t.sender, t.recipient, t.task_id, t.frontmatter.subject) == ("PM", "DEV", task.name.id,
                                                                          "Fix: auth — ünïcode")
    assert t.frontmatter.extra["risk_level"] == "high" and t.frontmatter.extra["x_custom"] == {"k": [1, 2]}
    assert [r.filename for r in p.list_reports(task_id=task.name.id)] == [report.path.name]
    assert p.read_issue(issue.path.name).summary == "flaky test"
    rv = p.read_review(review.path.name)
    assert (rv.review_id, rv.required_changes) == (review.path.stem, ("add a test",))
    # and the moves the projection will make: link-move, then one appended event per move
    for stage, tool in (("active", "claim_task"), ("review", "submit_task")):
        src = next(ws.lifecycle_dir.glob(f"*/{task.path.name}"))
        before = src.read_bytes()
        dst = move_no_overwrite(src, ws.stage_dir(stage) / src.name)
        append_transition(dst, Transition.model_validate(
            {"at": "2026-01-01T00:00:00+00:00", "from": src.parent.name, "to": stage, "by": "DEV", "tool": tool}))
        after = dst.read_bytes()
        head = before[: before.index(b"\n---\n") + 1]
        assert after.startswith(head) and after.endswith(before[before.index(b"\n---\n"):])
    moved = p.read_task(task.name.id)
    assert moved.path.parent.name == "review" and moved.body.lstrip("\n") == read_envelope(moved.path).body
    events = read_events(moved.path.read_text())
    assert [(e.to_stage.value, e.tool) for e in events] == [("inbox", "create_task"), ("active", "claim_task"),
                                                            ("review", "submit_task")]


def test_appending_to_a_fixture_keeps_every_existing_byte(tmp_path: Path) -> None:
    src = GENERATED_V3 / "_lifecycle" / "archive" / "TASK-20261130-001-PM-to-DEV.md"
    path = tmp_path / src.name
    shutil.copy(src, path)
    before = path.read_bytes()
    append_transition(path, Transition.model_validate({"at": "2026-12-01T00:00:00+00:00", "from": "archive",
                                                       "to": "archive", "by": "ADMIN", "tool": "note"}),
                      expect_sha256=hashlib.sha256(before).hexdigest())
    after = path.read_bytes()
    fence = before.index(b"---\n\nBody text")
    assert after[:fence] == before[:fence] and after.endswith(before[fence:])
    assert len(read_events(after.decode())) == 5


def test_crlf_and_bom_files_parse_and_rewrite_into_something_fcop_reads(tmp_path: Path) -> None:
    ws = open_workspace(tmp_path, create=True)
    text = ("\ufeff---\r\nprotocol: agent-bridge\r\nversion: '1'\r\nsender: ADMIN\r\nrecipient: PM\r\n"
            "priority: urgent\r\nowner_note: keep me\r\n---\r\n\r\nWindows body\r\nline 2")
    path = ws.stage_dir("inbox") / "TASK-20260102-001-ADMIN-to-PM.md"
    path.write_bytes(text.encode())
    env = read_envelope(path)
    assert isinstance(env, TaskEnvelope)
    assert (env.protocol, env.priority.value, env.body, env.extra) == ("fcop", "P0", "Windows body\nline 2",
                                                                       {"owner_note": "keep me"})
    append_transition(path, Transition.model_validate({"at": "2026-01-02T00:00:00+00:00", "from": None,
                                                       "to": "inbox", "by": "ADMIN", "tool": "create_task"}))
    raw = path.read_bytes()
    assert not raw.startswith(b"\xef\xbb\xbf") and raw.endswith(b"\r\n\r\nWindows body\r\nline 2")
    assert b"\n" not in raw.replace(b"\r\n", b"")  # still CRLF throughout
    t = _v3(tmp_path).read_task(path.name)
    assert (t.priority.value, t.frontmatter.extra["owner_note"]) == ("P0", "keep me")
    assert len(read_events(raw.decode())) == 1


def test_parse_envelope_agrees_with_fcop_on_what_fcop_writes(tmp_path: Path) -> None:
    project = _v3(tmp_path)
    project.init(team="dev-team", lang="en")
    task = project.write_task(sender="ADMIN", recipient="PM", priority="P3", subject="s", body="b")
    env = parse_envelope(Path(task.path).name, Path(task.path).read_bytes())
    assert isinstance(env, TaskEnvelope) and env.transitions[0].tool == "create_task"
    assert env.id == task.task_id
