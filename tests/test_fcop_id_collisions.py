"""One id, one file: TASK files that collide on an id, take an id the kernel holds, or claim a later stage without
the import; reason notes that stay one per file; REVIEWs and REPORTs that name their subject unusually."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fcop.compatibility.v3.project import Project
from hypothesis import given, settings
from hypothesis import strategies as st

from taskkernel.coordinator.workspace import Workspace, init_workspace
from tests.cli_support import Run, run
from tests.coord_support import coordinator
from tests.fcop_oracle import attached_ids, copy_workspace, reason_notes, show_tasks, tree

DEV_TEAM = {"mode": "preset", "team": "dev-team", "leader": "PM", "roles": ["PM", "DEV", "QA", "OPS"]}


def task_text(sender: str, recipient: str, subject: str, **extra: str) -> str:
    more = "".join(f"{k}: {v}\n" for k, v in extra.items())
    return (f"---\nprotocol: fcop\nversion: 1\nsender: {sender}\nrecipient: {recipient}\npriority: P2\n"
            f"subject: {subject}\n{more}---\n\nBody of {subject}.\n")


def put(path: Path, text: str) -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path.read_bytes()


def note_of(path: Path) -> Path:
    return path.parent / f"_reason.{path.name}.txt"


def up(project: Path) -> Run:
    r = run("up", "--once", cwd=project)
    assert (r.code, r.json["status"]) == (0, "ok"), r.out + r.err[-2000:]
    return r


def g3_workspace(tmp_path: Path) -> Path:
    """A fresh G3 workspace whose import (of nothing) is done: what is written next is live input."""
    project = tmp_path / "ws"
    assert run("init", str(project), cwd=tmp_path).code == 0
    up(project)
    return project


def g2_workspace(tmp_path: Path) -> Path:
    """The r1 field workspace (G2, two archived tasks and a report), imported."""
    project = tmp_path / "ws"
    copy_workspace("r1-g2-archive", project)
    assert run("init", ".", cwd=project).code == 0
    up(project)
    return project


def create(project: Path, key: str, recipient: str = "PM", subject: str = "CLI task") -> str:
    r = run("submit", cwd=project, stdin=json.dumps({"type": "create_task", "idempotency_key": key, "payload": {
        "sender": "ADMIN", "recipient": recipient, "subject": subject, "body": "Do it."}}))
    assert r.json["status"] == "accepted", r.out
    return str(r.json["task_id"])


def drive(project: Path, task_id: str, *steps: tuple[str, dict[str, Any]]) -> None:
    """Lifecycle commands through the CLI as the owner, each at the revision and round the last one left."""
    doc = show_tasks(project, [task_id])[task_id] or {}
    revision, round_ = doc["revision"], doc["round"]
    for kind, payload in steps:
        r = run("submit", cwd=project, stdin=json.dumps({
            "type": kind, "task_id": task_id, "thread_key": doc["thread_key"], "expected_revision": revision,
            "round": round_, "idempotency_key": f"{task_id}-{kind}-{revision}", "payload": payload}))
        assert r.json["status"] == "accepted", r.out
        revision, round_ = r.json["revision"], r.json["round"]


def today() -> str:
    return datetime.now(UTC).strftime("%Y%m%d")


# -- (a) one id in several TASK files at the import ------------------------------------------------------------

def test_r2_one_id_in_two_files_is_one_task_from_the_first_file_and_the_other_is_never_written(
        tmp_path: Path) -> None:
    project = tmp_path / "r2"
    copy_workspace("r2-dup-id", project)
    tasks = project / "fcop" / "tasks"
    winner, loser = tasks / "TASK-20260501-001-ADMIN-to-PM.md", tasks / "TASK-20260501-001-PM-to-DEV.md"
    loser_bytes = loser.read_bytes()
    assert run("init", ".", cwd=project).code == 0
    up(project)
    doc = show_tasks(project, ["TASK-20260501-001"])["TASK-20260501-001"] or {}
    assert (doc.get("sender"), doc.get("recipient"), doc.get("subject")) == ("ADMIN", "PM", "original")
    assert "duplicate_task_id" in note_of(loser).read_text(encoding="utf-8")
    assert not note_of(winner).exists()
    drive(project, "TASK-20260501-001", ("claim", {}), ("submit_report", {"status": "done", "body": "Done."}),
          ("submit", {}), ("approve", {}), ("archive", {"reason": "shipped"}))
    for _ in range(2):
        up(project)
    assert loser.read_bytes() == loser_bytes
    assert sorted(reason_notes(project / "fcop")) == [f"tasks/{note_of(loser).name}"]
    verify = run("verify", cwd=project)
    assert (verify.code, verify.json["status"]) == (0, "ok"), verify.json["problems"]


# -- (b) a hand-written TASK file takes the id of a task the CLI created ----------------------------------------

def test_a_hand_written_inbox_file_with_an_id_the_cli_allocated_is_adopted_under_the_next_free_id(
        tmp_path: Path) -> None:
    project = g3_workspace(tmp_path)
    task_id = create(project, "c1")
    hand = project / "fcop" / "_lifecycle" / "inbox" / f"{task_id}-ADMIN-to-QA.md"
    hand_bytes = put(hand, task_text("ADMIN", "QA", "Hand-made"))
    up(project)
    doc = show_tasks(project, [task_id])[task_id] or {}
    assert (doc.get("recipient"), doc.get("subject")) == ("PM", "CLI task"), "the CLI task is untouched"
    next_id = f"{task_id[:14]}{int(task_id[14:]) + 1:03d}"
    renamed = hand.with_name(f"{next_id}-ADMIN-to-QA.md")
    assert not hand.exists() and renamed.read_bytes().startswith(hand_bytes.split(b"---\n\n")[0]), "renamed"
    assert renamed.read_bytes().endswith(hand_bytes.split(b"---\n\n")[1]), "the body untouched"
    adopted = show_tasks(project, [next_id])[next_id] or {}
    assert (adopted.get("recipient"), adopted.get("subject")) == ("QA", "Hand-made")
    note = note_of(renamed).read_text(encoding="utf-8")
    assert "renamed" in note and hand.name in note and next_id in note
    verify = run("verify", cwd=project)
    assert (verify.code, verify.json["status"]) == (0, "ok"), verify.json["problems"]


def test_a_duplicate_of_a_task_in_the_inbox_is_still_refused_not_adopted(tmp_path: Path) -> None:
    project = g3_workspace(tmp_path)
    task_id = create(project, "c1")
    up(project)
    again = project / "fcop" / "_lifecycle" / "inbox" / f"{task_id}-ADMIN-to-PM-again.md"
    put(again, task_text("ADMIN", "PM", "CLI task"))
    up(project)
    assert again.is_file() and "duplicate_task_id" in note_of(again).read_text(encoding="utf-8")
    assert show_tasks(project, [f"{task_id[:14]}{int(task_id[14:]) + 1:03d}"]) == {
        f"{task_id[:14]}{int(task_id[14:]) + 1:03d}": None}


def test_fcops_own_create_task_after_a_claim_makes_one_task_per_call_and_fcop_validate_stays_valid(
        tmp_path: Path) -> None:
    """fcop's legacy create_task numbers from the inbox and log/tasks only: after the kernel's first task moved to
    active/, each later call reuses its id. Each is still a task of its own."""
    project = g3_workspace(tmp_path)
    inbox, active = project / "fcop" / "_lifecycle" / "inbox", project / "fcop" / "_lifecycle" / "active"
    made = []
    for subject in ("first", "second", "third"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            made.append(Project(project).write_task(sender="PM", recipient="DEV", priority="P2", subject=subject,
                                                    body=f"Do the {subject} thing."))
        up(project)
        for path in inbox.glob("TASK-*.md"):  # the driver's claim, as fcop-mcp's claim_task moves it
            path.rename(active / path.name)
        up(project)
    assert len({m.task_id for m in made}) == 1, "fcop reused one id (else this test shows nothing)"
    tasks = json.loads(run("task", "list", "--json", cwd=project).out)
    assert sorted((t["subject"], t["state"]) for t in tasks) == [("first", "active"), ("second", "active"),
                                                                  ("third", "active")]
    assert not (project / "fcop" / "_quarantine").exists() or not any((project / "fcop" / "_quarantine").iterdir())
    fcop_validate = subprocess.run([str(Path(sys.executable).parent / "fcop"), "validate"], cwd=project,
                                   capture_output=True, text=True, check=False)
    assert fcop_validate.returncode == 0 and '"valid": true' in fcop_validate.stdout, fcop_validate.stdout


# -- (c) a TASK file planted in a later stage after the import ------------------------------------------------

@pytest.mark.parametrize(("generation", "folder"), [("g3", "_lifecycle/done"), ("g3", "_lifecycle/archive"),
                                                    ("g2", "log/tasks")])
def test_an_unknown_task_outside_the_inbox_after_the_import_is_refused(tmp_path: Path, generation: str,
                                                                       folder: str) -> None:
    project = (g3_workspace if generation == "g3" else g2_workspace)(tmp_path)
    spoof = project / "fcop" / folder / "TASK-20261201-009-ADMIN-to-PM.md"
    spoof_bytes = put(spoof, task_text("ADMIN", "PM", "Already approved, honest"))
    up(project)
    assert show_tasks(project, ["TASK-20261201-009"]) == {"TASK-20261201-009": None}
    assert spoof.read_bytes() == spoof_bytes
    assert "unknown_task_outside_inbox" in note_of(spoof).read_text(encoding="utf-8")


# -- (d) reason notes: one per refused file, and passes change nothing -------------------------------------------

def test_refused_files_keep_exactly_one_note_and_three_passes_leave_the_tree_of_one(tmp_path: Path) -> None:
    project = g3_workspace(tmp_path)
    root = project / "fcop"
    task_id = create(project, "c1")
    up(project)
    refused = {
        f"_lifecycle/done/TASK-{today()}-090-ADMIN-to-PM.md": (task_text("ADMIN", "PM", "spoof"),
                                                              "unknown_task_outside_inbox"),
        f"_lifecycle/inbox/{task_id}-ADMIN-to-PM-again.md": (task_text("ADMIN", "PM", "CLI task"),
                                                             "duplicate_task_id"),
        f"reports/REPORT-{today()}-090-PM-to-ADMIN.md": (
            "---\nprotocol: fcop\nversion: 1\nsender: PM\nrecipient: ADMIN\nreferences:\n- TASK-20200101-001\n"
            "status: done\n---\n\nDone.\n", "task_not_found"),
    }
    for rel, (text, _) in refused.items():
        put(root / rel, text)
    up(project)
    first = tree(project)
    notes = reason_notes(root)
    assert sorted(notes) == sorted(note_of(Path(rel)).as_posix() for rel in refused)
    for rel, (_, reason) in refused.items():
        assert reason in notes[note_of(Path(rel)).as_posix()], rel
    up(project)
    up(project)
    third = tree(project)
    assert {rel for rel in set(first) | set(third) if first.get(rel) != third.get(rel)} == set()


# -- (e) a REVIEW of a document is evidence, not a refusal --------------------------------------------------------

def _review_of_a_document(project: Path, sequence: int) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        review = Project(project).write_review(reviewer_role="QA", subject_type="code_change",
                                               subject_ref=f"docs/adr/ADR-00{sequence}-review-file-type.md",
                                               decision="approved", rationale="reads well",
                                               date="20261201", subject_short=f"adr-00{sequence}")
    return Path(review.path)


def test_a_review_of_a_document_is_recorded_as_evidence_at_the_import_and_live(tmp_path: Path) -> None:
    project = tmp_path / "ws"
    assert run("init", str(project), cwd=tmp_path).code == 0
    history = _review_of_a_document(project, 17)
    up(project)
    live = _review_of_a_document(project, 18)
    written = {p: p.read_bytes() for p in (history, live)}
    up(project)
    assert {p.name: p.read_bytes() == b for p, b in written.items()} == {history.name: True, live.name: True}
    assert reason_notes(project / "fcop") == {}
    assert not any((project / "fcop" / "_quarantine").glob("REVIEW-*"))


# -- (f) a REPORT that names its task outside references: --------------------------------------------------------

def _report_named_by(key: str, task_id: str, sequence: int) -> str:
    return (f"---\nprotocol: fcop\nversion: 1\nsender: PM\nrecipient: ADMIN\n{key}: {task_id}\nstatus: in_progress\n"
            f"---\n\nReport {sequence}.\n")


@pytest.mark.parametrize("importer", [("fcop", "import"), ("up", "--once")], ids=["fcop-import", "up"])
def test_a_report_naming_its_task_by_ref_task_is_attached_at_the_import_with_a_warning(
        tmp_path: Path, importer: tuple[str, ...]) -> None:
    project = tmp_path / "ws"
    task = project / "fcop" / "_lifecycle" / "archive" / "TASK-20261201-001-ADMIN-to-PM.md"
    put(task, task_text("ADMIN", "PM", "Done long ago"))
    report = project / "fcop" / "reports" / "REPORT-20261201-001-PM-to-ADMIN.md"
    put(report, _report_named_by("ref_task", "docs/agents/log/tasks/TASK-20261201-001-ADMIN-to-PM.md", 1))
    assert run("init", ".", cwd=project).code == 0
    r = run(*importer, cwd=project)
    assert (r.code, r.json["status"]) == (0, "ok"), r.out + r.err[-2000:]
    doc = show_tasks(project, ["TASK-20261201-001"])["TASK-20261201-001"]
    assert "REPORT-20261201-001" in {x["record_id"] for x in (doc or {}).get("records", [])}
    said = r.out + r.err  # `fcop import` lists it in its JSON; `up` must tell its owner too
    assert "task_named_outside_references" in said and f"reports/{report.name}" in said, said


def test_a_report_naming_its_task_by_in_reply_to_is_attached_live_with_a_warning(tmp_path: Path) -> None:
    project = g3_workspace(tmp_path)
    task_id = create(project, "c1")
    up(project)
    report = project / "fcop" / "reports" / f"REPORT-{today()}-001-PM-to-ADMIN.md"
    put(report, _report_named_by("in_reply_to", task_id, 1))
    r = up(project)
    assert f"REPORT-{today()}-001" in attached_ids(show_tasks(project, [task_id])[task_id])
    assert "task_named_outside_references" in r.out + r.err and report.name in r.out + r.err
    assert not note_of(report).exists()


# -- the id allocator and verify -------------------------------------------------------------------------------

@pytest.mark.parametrize(("generation", "folders"), [
    ("g3", ("_lifecycle/inbox", "_lifecycle/done", "_lifecycle/archive")), ("g2", ("tasks", "log/tasks"))])
def test_the_allocator_skips_every_id_present_as_a_file(tmp_path: Path, generation: str,
                                                        folders: tuple[str, ...]) -> None:
    project = (g3_workspace if generation == "g3" else g2_workspace)(tmp_path)
    planted = {f"TASK-{today()}-{n:03d}" for n in range(1, len(folders) + 1)}
    for folder, task_id in zip(folders, sorted(planted), strict=True):
        put(project / "fcop" / folder / f"{task_id}-ADMIN-to-QA.md", task_text("ADMIN", "QA", "on disk"))
    leader = "PM" if generation == "g3" else "ME"  # the r1 workspace is a solo team: a task is for a role it has
    got = {create(project, f"c{i}", recipient=leader) for i in range(len(folders) + 1)}
    assert got & planted == set()


def test_verify_compares_a_task_file_with_the_read_model_and_lists_files_of_unknown_tasks(tmp_path: Path) -> None:
    project = g3_workspace(tmp_path)
    task_id = create(project, "c1")
    up(project)
    own = next((project / "fcop" / "_lifecycle").rglob(f"{task_id}-*.md"))
    own.write_text(own.read_text(encoding="utf-8").replace("subject: CLI task", "subject: Something else"),
                   encoding="utf-8")
    verify = run("verify", cwd=project)
    assert (verify.code, verify.json["status"]) == (2, "broken")
    assert any(own.name in json.dumps(p) for p in verify.json["problems"]), verify.json["problems"]


# -- property: colliding ids -> one task per id, no other file written into ------------------------------------

ROUTES = [("ADMIN", "PM"), ("ADMIN", "DEV"), ("ADMIN", "QA"), ("PM", "DEV"), ("PM", "QA")]
NAMES = st.builds(lambda date, n, route, slug: f"TASK-{date}-{n:03d}-{route[0]}-to-{route[1]}{slug}.md",
                  st.sampled_from(["20261201", "20261202"]), st.integers(1, 3), st.sampled_from(ROUTES),
                  st.sampled_from(["", "-a", "-b"]))


@settings(max_examples=25, deadline=None)
@given(generation=st.sampled_from(["g2", "g3"]), history=st.lists(NAMES, min_size=1, max_size=6, unique=True),
       live=st.lists(NAMES, max_size=4, unique=True))
def test_colliding_task_ids_make_one_task_each_and_no_other_file_is_written(
        tmp_path_factory: pytest.TempPathFactory, generation: str, history: list[str], live: list[str]) -> None:
    live = [name for name in live if name not in history]
    project = tmp_path_factory.mktemp("collide")
    folder = project / "fcop" / ("tasks" if generation == "g2" else "_lifecycle/inbox")
    put(project / "fcop" / "fcop.json", json.dumps(DEV_TEAM))
    subjects: dict[Path, str] = {}
    written: dict[Path, bytes] = {}

    def write(names: list[str]) -> None:
        for name in names:
            subjects[folder / name] = f"subject {len(subjects)}"
            sender, recipient = name.split("-")[3], name.split("-")[5].removesuffix(".md")
            written[folder / name] = put(folder / name, task_text(sender, recipient, subjects[folder / name]))

    write(history)
    init_workspace(project)
    c = coordinator(Workspace.load(project))
    c.run_once()
    write(live)
    c.run_once()
    for path in (folder / name for name in live):  # live input never collides: each file is a task of its own
        copies = [p for p in folder.iterdir()  # the file, or the file renamed (its creation transition appended)
                  if p.name.startswith("TASK-") and f"subject: {subjects[path]}\n" in p.read_text(encoding="utf-8")]
        assert len(copies) == 1, f"{path.name}: {[p.name for p in copies]}"
        doc = c.kernel.task(copies[0].name[:17])
        assert doc is not None and doc["subject"] == subjects[path], (path.name, copies[0].name)
        if copies[0] != path:  # renamed to the next free number of its day, the note saying what it was called
            assert path.name in note_of(copies[0]).read_text(encoding="utf-8")
            assert copies[0].name[:13] == path.name[:13]
    for task_id in {name[:17] for name in history}:
        doc = c.kernel.task(task_id)
        assert doc is not None, f"{task_id}: no task"
        owners = [p for p, s in subjects.items() if p.name.startswith(task_id) and s == doc["subject"]
                  and p.name in history]
        assert len(owners) == 1, (task_id, doc["subject"])
        first_in_history = min((n for n in history if n.startswith(task_id)), default=None)
        assert first_in_history in (None, owners[0].name), "the import takes the first file by name"
        assert not note_of(owners[0]).exists(), owners[0].name
        for path in (p for p in written if p.name.startswith(task_id) and p != owners[0] and p.name in history):
            # refused where it is, or (holding the name the task's own file is written under) quarantined
            held = project / "fcop" / "_quarantine" / f"quarantined-{path.name}"
            where, note = (path, note_of(path)) if path.exists() else (held, held.with_name(f"{held.name}.reason.md"))
            assert where.is_file() and where.read_bytes() == written[path], f"{path.name}: written into, or lost"
            text = note.read_text(encoding="utf-8")
            assert "duplicate_task_id" in text or "task_id_taken" in text, path.name
