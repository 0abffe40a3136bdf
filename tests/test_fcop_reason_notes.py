"""Reason notes are not envelopes (issue 10): one note per refused file, stable over passes, gone once fixed.

Everything runs through the real CLI in separate processes (`taskkernel init`, `taskkernel up --once`).
"""

from __future__ import annotations

import hashlib
import shutil
import warnings
from pathlib import Path

import pytest

from taskkernel.coordinator.fcop.filenames import envelope_prefix, is_reason_note, parse_filename, reason_note_name
from tests.cli_support import taskkernel

NAME = "TASK-20261130-001-ADMIN-to-PM.md"
BAD = "TASK-20261130-009-ADMIN-to-PM.md"
REPORT = "REPORT-20261130-005-PM-to-ADMIN.md"
TASK = ("---\nprotocol: fcop\nversion: 1\nsender: ADMIN\nrecipient: PM\npriority: P2\nsubject: x\n---\nbody\n")
BROKEN = b"---\nprotocol: fcop\nversion: [1\nsender: ADMIN\n---\nbroken\n"


def report_text(task: str) -> str:
    return (f"---\nprotocol: fcop\nversion: 1\nsender: PM\nrecipient: ADMIN\nreferences:\n- {task}\n"
            "status: in_progress\n---\nworking\n")


def up(ws: Path) -> None:
    r = taskkernel("up", "--once", cwd=ws)
    assert r.returncode == 0, r.stderr


def tree(ws: Path) -> dict[str, str]:
    root = ws / "fcop"
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def notes(ws: Path) -> list[str]:
    return sorted(k for k in tree(ws) if is_reason_note(k.rsplit("/", 1)[-1]) or k.endswith(".reason.md"))


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    assert taskkernel("init", str(root), cwd=tmp_path).returncode == 0
    up(root)  # the first pass imports the (empty) workspace; files written after it are live input
    return root


def refused_everything(ws: Path) -> Path:
    """A malformed TASK, a refused move (inbox -> done) and a refused REPORT; returns the lifecycle folder."""
    lc = ws / "fcop" / "_lifecycle"
    (lc / "inbox" / NAME).write_text(TASK, encoding="utf-8")
    (lc / "inbox" / BAD).write_bytes(BROKEN)
    up(ws)
    shutil.move(lc / "inbox" / NAME, lc / "done" / NAME)
    (ws / "fcop" / "reports" / REPORT).write_text(report_text("TASK-20261130-077"), encoding="utf-8")
    return lc


EXPECTED_NOTES = [f"_lifecycle/inbox/{reason_note_name(NAME)}", f"_quarantine/quarantined-{BAD}.reason.md",
                  f"reports/{reason_note_name(REPORT)}"]


def test_the_note_name_matches_no_envelope_rule() -> None:
    for name in (NAME, REPORT, "REVIEW-20261130-001-QA-on-task-20261130-001.md", "ISSUE-20261130-001-QA.md"):
        note = reason_note_name(name)
        assert is_reason_note(note) and envelope_prefix(note) is None and parse_filename(note) is None
        assert not note.endswith((".md", ".fcop")) and not note.startswith(".")
    assert len(reason_note_name("TASK-" + "x" * 250 + ".md").encode()) <= 255


def test_one_note_each_after_one_and_three_passes_and_the_tree_is_stable(ws: Path) -> None:
    lc = refused_everything(ws)
    up(ws)
    first = tree(ws)
    assert notes(ws) == EXPECTED_NOTES
    assert "illegal_transition" in (lc / "inbox" / reason_note_name(NAME)).read_text()      # Moved back
    assert "task_not_found" in (ws / "fcop" / "reports" / reason_note_name(REPORT)).read_text()  # Not applied
    assert (ws / "fcop" / "_quarantine" / f"quarantined-{BAD}").read_bytes() == BROKEN
    up(ws)
    up(ws)
    assert notes(ws) == EXPECTED_NOTES
    assert tree(ws) == first


def test_fixing_the_file_removes_its_note(ws: Path) -> None:
    lc = refused_everything(ws)
    up(ws)
    # Not applied -> re-written so it is accepted
    (ws / "fcop" / "reports" / REPORT).write_text(report_text("TASK-20261130-001"), encoding="utf-8")
    # Moved back -> the driver's legal claim
    shutil.move(lc / "inbox" / NAME, lc / "active" / NAME)
    # quarantined -> fixed and moved back to be retried
    q = ws / "fcop" / "_quarantine" / f"quarantined-{BAD}"
    q.unlink()
    (lc / "inbox" / BAD).write_text(TASK.replace("subject: x", "subject: fixed"), encoding="utf-8")
    up(ws)
    assert notes(ws) == []
    assert (lc / "active" / NAME).is_file() and (lc / "inbox" / BAD).is_file()
    assert (ws / "fcop" / "reports" / REPORT).is_file()
    stable = tree(ws)
    up(ws)
    assert tree(ws) == stable


def test_a_refused_file_refused_again_keeps_a_single_note(ws: Path) -> None:
    refused_everything(ws)
    up(ws)
    report = ws / "fcop" / "reports" / REPORT
    report.write_text(report_text("TASK-20261130-078"), encoding="utf-8")
    up(ws)
    assert [n for n in notes(ws) if n.startswith("reports/")] == [f"reports/{reason_note_name(REPORT)}"]
    assert "TASK-20261130-078" in (ws / "fcop" / "reports" / reason_note_name(REPORT)).read_text()


def test_fcops_reader_ignores_the_notes(ws: Path) -> None:
    v3 = pytest.importorskip("fcop.compatibility.v3.project", reason="fcop is a dev dependency (the oracle)")
    from fcop.core.filename import parse_task_filename

    refused_everything(ws)
    up(ws)
    assert len(notes(ws)) == 3
    for note in notes(ws):
        assert parse_task_filename(note.rsplit("/", 1)[-1]) is None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        project = v3.Project(ws)
        tasks = project.list_tasks()
        reports = project.list_reports()
    assert sorted(t.path.name for t in tasks) == [NAME]
    assert sorted(r.path.name for r in reports) == [REPORT]
    for folder in ("_lifecycle/inbox", "reports"):  # fcop's globs and counts: TASK-*.md, REPORT-*.md, *.md
        names = [p.name for p in (ws / "fcop" / folder).glob("*.md")]
        assert names and not any(is_reason_note(n) for n in names)
