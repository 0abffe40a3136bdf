"""`taskkernel fcop import`: findings of the review of the import (issue 10), each as a regression test.

An import interrupted between batches is finished by the next one (its own files are never refused); history
beyond the kernel's payload limits is shortened in the kernel's copy, never dropped; files read with a legacy
encoding say so; a file that takes an id the kernel holds is told the next free id.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from taskkernel.coordinator.cli.common import CliContext
from taskkernel.coordinator.compose import build_kernel
from taskkernel.coordinator.fcop import open_workspace
from taskkernel.coordinator.folders.importer import Importer
from taskkernel.coordinator.folders.tracking import FileTracker
from taskkernel.coordinator.workspace import STATE_DIR, Workspace
from tests.cli_support import run


def task(path: Path, *, sender: str = "ADMIN", recipient: str = "DEV", subject: str = "Work", body: str = "x",
         extra: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"---\nprotocol: fcop\nversion: 1\nsender: {sender}\nrecipient: {recipient}\nsubject: {subject}\n"
                    f"{extra}---\n{body}\n", encoding="utf-8")


def report(path: Path, task_id: str, extra: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"---\nprotocol: fcop\nversion: 1\nsender: DEV\nrecipient: ADMIN\nstatus: done\n"
                    f"references:\n- {task_id}\n{extra}---\ndone\n", encoding="utf-8")


@pytest.fixture
def g3(tmp_path: Path) -> Path:
    project = tmp_path / "proj"
    assert run("init", str(project), cwd=tmp_path).code == 0
    return project


def show(project: Path, task_id: str) -> dict:
    r = run("task", "show", task_id, cwd=project)
    assert r.code == 0, r.out
    return r.json


def test_an_import_interrupted_between_batches_is_finished_by_the_next(g3: Path, monkeypatch) -> None:
    lc = g3 / "fcop" / "_lifecycle"
    for n in range(1, 6):
        task(lc / "archive" / f"TASK-20260101-00{n}-ADMIN-to-DEV.md", subject=f"Old {n}")
        report(g3 / "fcop" / "reports" / f"REPORT-20260101-00{n}-DEV-to-ADMIN.md", f"TASK-20260101-00{n}")
    ws = Workspace.load(g3)
    db = CliContext(workspace_path=str(g3)).database()
    kernel = build_kernel(db, ws)
    tracker = FileTracker(db)
    importer = Importer.for_workspace(kernel, open_workspace(g3), tracker, g3, STATE_DIR)
    importer.batch_size = 2
    calls = {"n": 0}
    record = tracker.record_many

    def crash_after_the_first(rows):  # noqa: ANN001, ANN202 - the process dies after its first batch is recorded
        calls["n"] += 1
        if calls["n"] > 1:
            raise KeyboardInterrupt("killed")
        record(rows)

    monkeypatch.setattr(tracker, "record_many", crash_after_the_first)
    with pytest.raises(KeyboardInterrupt):
        importer.run()
    monkeypatch.undo()
    again = run("fcop", "import", cwd=g3)
    assert again.code == 0 and again.json["refused"] == [], again.json
    assert not list(lc.rglob("_reason.*")), "no file of the first attempt was taken for an intruder"
    for n in range(1, 6):
        doc = show(g3, f"TASK-20260101-00{n}")
        assert doc["state"] == "archive" and [r["record_id"] for r in doc["records"]] == [f"REPORT-20260101-00{n}"]
    assert run("up", "--once", cwd=g3).code == 0
    assert run("verify", cwd=g3).code == 0


def test_history_beyond_the_payload_limits_is_shortened_never_dropped(g3: Path) -> None:
    lc = g3 / "fcop" / "_lifecycle"
    refs = "references:\n" + "".join(f"- https://example.org/{i}\n" for i in range(40))
    task(lc / "done" / "TASK-20260101-001-ADMIN-to-DEV.md", extra=refs)
    big = lc / "archive" / "TASK-20260101-002-ADMIN-to-DEV.md"
    task(big, body="y" * 600_000)
    report(g3 / "fcop" / "reports" / "REPORT-20260101-001-DEV-to-ADMIN.md", "TASK-20260101-001",
           extra="".join(f"- https://example.org/r{i}\n" for i in range(40)))
    before = big.read_bytes()
    r = run("fcop", "import", cwd=g3)
    assert r.code == 0 and r.json["refused"] == [] and r.json["tasks"] == 2, r.json
    assert {w["warning"] for w in r.json["warnings"]} == {"history_shortened"}
    assert len(show(g3, "TASK-20260101-001")["references"]) == 32
    assert len(show(g3, "TASK-20260101-002")["body"].encode()) <= 512 * 1024
    assert show(g3, "TASK-20260101-001")["records"][0]["record_id"] == "REPORT-20260101-001"
    assert big.read_bytes() == before, "the file keeps every byte"


def test_a_file_read_with_a_legacy_encoding_says_so(g3: Path) -> None:
    path = g3 / "fcop" / "_lifecycle" / "archive" / "TASK-20260101-001-ADMIN-to-DEV.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes("---\nprotocol: fcop\nversion: 1\nsender: ADMIN\nrecipient: DEV\nsubject: 协议\n---\n正文\n"
                     .encode("gbk"))
    r = run("fcop", "import", cwd=g3)
    assert r.code == 0 and r.json["tasks"] == 1
    assert [(w["file"], w["warning"]) for w in r.json["warnings"]] == [
        ("_lifecycle/archive/TASK-20260101-001-ADMIN-to-DEV.md", "legacy_encoding")]
    assert show(g3, "TASK-20260101-001")["subject"] == "协议"


def test_an_id_the_kernel_holds_is_refused_with_the_next_free_id(g3: Path) -> None:
    made = run("submit", cwd=g3, stdin=json.dumps({"type": "create_task", "idempotency_key": "k", "payload": {
        "sender": "ADMIN", "recipient": "DEV", "subject": "Mine"}}))
    task_id = made.json["task_id"]
    _, day, seq = task_id.split("-")
    task(g3 / "fcop" / "_lifecycle" / "archive" / f"{task_id}-ADMIN-to-QA.md", recipient="QA", subject="Theirs")
    r = run("fcop", "import", cwd=g3)
    [refused] = r.json["refused"]
    assert refused["reason"] == "task_id_taken"
    assert f"TASK-{day}-{int(seq) + 1:03d}" in refused["message"]
    assert show(g3, task_id)["subject"] == "Mine"


def test_verify_lists_task_files_of_tasks_the_log_does_not_know(g3: Path) -> None:
    assert run("up", "--once", cwd=g3).code == 0  # the import: what comes after is live
    task(g3 / "fcop" / "_lifecycle" / "done" / "TASK-20260101-007-ADMIN-to-DEV.md", subject="Planted done")
    task(g3 / "fcop" / "_lifecycle" / "inbox" / "TASK-20260101-008-ADMIN-to-DEV.md", subject="Not yet seen")
    up = run("up", "--once", cwd=g3)
    assert up.code == 0 and "unknown_task_outside_inbox" in up.err
    (g3 / "fcop" / "_lifecycle" / "inbox" / "TASK-20260101-009-ADMIN-to-DEV.md").write_text("---\nbroken: [\n")
    verify = run("verify", cwd=g3)
    assert verify.code == 0, verify.out
    assert {(f["task_id"], f["status"]) for f in verify.json["unknown_task_files"]} == {
        ("TASK-20260101-007", "refused"), ("TASK-20260101-009", "waiting")}


def history(project: Path, n: int) -> int:
    """``n`` TASK files over three stages and a REPORT on every second one; returns the file count."""
    lc = project / "fcop" / "_lifecycle"
    for i in range(1, n + 1):
        stage = ("inbox", "done", "archive")[i % 3]
        task(lc / stage / f"TASK-202601{1 + (i - 1) // 999:02d}-{(i - 1) % 999 + 1:03d}-ADMIN-to-DEV.md",
             subject=f"Job {i}", body="Do the work. " * 200)  # 2.6 KB: a body is never held to the end
        if i % 2 == 0:
            tid = f"TASK-202601{1 + (i - 1) // 999:02d}-{(i - 1) % 999 + 1:03d}"
            report(project / "fcop" / "reports" / f"REPORT{tid[4:]}-DEV-to-ADMIN.md", tid)
    return n + n // 2


def test_the_first_pass_visits_reads_and_parses_each_file_once(g3: Path, monkeypatch) -> None:
    """The import's walk is the pass's scan: every file is looked at, read and parsed once in the whole
    `up --once` (no second scan by the live ingest, no follow-up pass walking every file again)."""
    from taskkernel.coordinator.fcop import scan
    from taskkernel.coordinator.loop import Coordinator

    files = history(g3, 30)
    counts = {"visits": 0, "reads": 0, "parses": 0}

    def counting(name, fn):  # noqa: ANN001, ANN202
        def counted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            counts[name] += 1
            return fn(*args, **kwargs)
        return counted

    monkeypatch.setattr(scan.Scanner, "_visit", counting("visits", scan.Scanner._visit))
    monkeypatch.setattr(scan, "read_at", counting("reads", scan.read_at))
    monkeypatch.setattr(scan, "parse_envelope", counting("parses", scan.parse_envelope))
    coordinator = Coordinator(Workspace.load(g3), CliContext(workspace_path=str(g3)).database(), settle_s=0.0,
                              grace_s=0.0)
    coordinator.run_once()
    assert counts == {"visits": files, "reads": files, "parses": files}
    assert sum(coordinator.folders.last_import.tasks.values()) == 30  # type: ignore[union-attr]
    assert run("up", "--once", cwd=g3).code == 0 and run("verify", cwd=g3).code == 0


def test_what_an_import_holds_per_file_is_small(tmp_path: Path) -> None:
    """An import keeps of each file what planning needs (its place, id, route and parent, not the parsed
    envelope: that was ≈ 11 KB a file); the rest of each command waits in a spill file and reaches the kernel a
    batch at a time. Peak and retained memory over an import of 4× the files grow by a small bound per extra
    file, whatever the files' bodies hold (tracemalloc: deterministic, not a timing)."""
    import gc
    import tracemalloc

    def measure(n: int) -> tuple[int, int, int]:
        project = tmp_path / f"p{n}"
        assert run("init", str(project), cwd=tmp_path).code == 0
        files = history(project, n)
        db = CliContext(workspace_path=str(project)).database()
        kernel = build_kernel(db, Workspace.load(project))
        importer = Importer.for_workspace(kernel, open_workspace(project), FileTracker(db), project, STATE_DIR)
        importer.batch_size = 100  # what a batch holds is the same for both sizes
        gc.collect()
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            report = importer.run()
            gc.collect()
            retained, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert sum(report.tasks.values()) == n and sum(report.records.values()) == n // 2
        return files, peak - base, retained - base

    small_files, small_peak, small_kept = measure(200)
    large_files, large_peak, large_kept = measure(800)
    extra = large_files - small_files
    assert (large_peak - small_peak) / extra < 1500, "peak bytes per extra file"
    assert (large_kept - small_kept) / extra < 600, "bytes per extra file held after the import (the scan's stat keys)"


# -- review of 84a5775 --------------------------------------------------------------------------------

def test_a_typed_scalar_pyyaml_cannot_build_never_stops_the_import(g3: Path) -> None:
    """`x: !!bool maybe` made PyYAML raise KeyError out of the walk: every pass failed and nothing was imported."""
    inbox = g3 / "fcop" / "_lifecycle" / "inbox"
    task(inbox / "TASK-20260101-001-ADMIN-to-DEV.md", subject="Good")
    task(inbox / "TASK-20260101-002-ADMIN-to-DEV.md", subject="Bad", extra="x: !!bool maybe\n")
    r = run("fcop", "import", cwd=g3)
    assert r.code == 0, r.out
    assert r.json["tasks"] == 1
    assert [(k["file"].rpartition("/")[2], k["reason"]) for k in r.json["kept"]] == [
        ("TASK-20260101-002-ADMIN-to-DEV.md", "malformed_front_matter")]
    assert show(g3, "TASK-20260101-001")["state"] == "inbox"


def test_the_spill_lives_in_the_state_folder_and_a_short_write_is_continued(g3: Path, monkeypatch) -> None:
    """Not in $TMPDIR (a tmpfs /tmp holds it in RAM); os.pwrite may write less than asked: the rest follows."""
    from taskkernel.coordinator.folders import importer as importer_module

    lc = g3 / "fcop" / "_lifecycle"
    for n in range(1, 4):
        task(lc / "inbox" / f"TASK-20260101-00{n}-ADMIN-to-DEV.md", subject=f"Job {n}", body=f"Body {n} " * 50)
    dirs: list[object] = []
    made = importer_module.tempfile.TemporaryFile

    def spy(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        dirs.append(kwargs.get("dir"))
        return made(*args, **kwargs)

    pwrite = os.pwrite
    monkeypatch.setattr(importer_module.tempfile, "TemporaryFile", spy)
    monkeypatch.setattr(importer_module.os, "pwrite", lambda fd, data, offset: pwrite(fd, bytes(data[:7]), offset))
    db = CliContext(workspace_path=str(g3)).database()
    importer = Importer.for_workspace(build_kernel(db, Workspace.load(g3)), open_workspace(g3), FileTracker(db), g3,
                                      STATE_DIR)
    report = importer.run()
    monkeypatch.undo()
    assert dirs == [g3 / STATE_DIR]
    assert sum(report.tasks.values()) == 3 and not report.refused and not report.kept
    for n in range(1, 4):
        doc = show(g3, f"TASK-20260101-00{n}")
        assert doc["subject"] == f"Job {n}" and (f"Body {n} " * 50).strip() in doc["body"]


def test_a_long_parent_chain_plans_in_linear_steps() -> None:
    """`_depth` walked every task's whole chain (20k tasks in a chain: 51 s) and `_break_cycles` too: a 3,000-task
    chain now costs a step per task (lookups counted, not time)."""
    from types import SimpleNamespace

    from taskkernel.coordinator.folders.importer import _depth, _Run

    class Counting(dict):
        lookups = 0

        def __getitem__(self, key):  # noqa: ANN001, ANN204
            Counting.lookups += 1
            return super().__getitem__(key)

    n = 3000
    found = Counting()
    for i in range(n):
        found[f"T{i}"] = SimpleNamespace(id=f"T{i}", parent=f"T{i - 1}" if i else None, file=None)
    warnings: list[str] = []
    run_ = SimpleNamespace(_warn=lambda f, w, m: warnings.append(w))
    _Run._break_cycles(run_, found)  # type: ignore[arg-type]
    assert not warnings and Counting.lookups <= 2 * n
    Counting.lookups = 0
    memo: dict[str, int] = {}
    depths = [_depth(found, task_id, memo) for task_id in sorted(found)]  # type: ignore[arg-type]
    assert Counting.lookups <= 3 * n
    assert sorted(depths) == list(range(n)) and memo["T2999"] == 2999
    found["T0"].parent = "T2999"  # a loop: cut once, where the walk came back
    Counting.lookups = 0
    _Run._break_cycles(run_, found)  # type: ignore[arg-type]
    assert warnings == ["parent_cycle"] and Counting.lookups <= 2 * n
    assert sum(t.parent is None for t in found.values()) == 1


def test_a_failing_pass_never_leaves_the_imports_walk_for_the_next(monkeypatch) -> None:
    """The import's walk stands as one pass's scan only: a pass that fails before using it drops it."""
    from taskkernel.coordinator.fcop.scan import ScanBatch
    from taskkernel.coordinator.folders.ingest import Ingest

    class Tracker:
        def stats(self):  # noqa: ANN202
            raise RuntimeError("database is locked")

    ingest = Ingest.__new__(Ingest)
    ingest.trusted, ingest.tracker, ingest._walked = None, Tracker(), ScanBatch()  # type: ignore[assignment]
    with pytest.raises(RuntimeError):
        ingest.run()
    assert ingest._walked is None
