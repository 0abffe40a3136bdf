"""Issue 29, goal 3: what `up --once` holds per file. The scanner keeps one packed record per file (the live scans
need it), the live ingest no copy of folder_stats, the ledger and views are written as the tasks are read.
Memory is measured with tracemalloc at two sizes (bytes per extra file: deterministic, not a timing)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from taskkernel.coordinator.cli.common import CliContext
from taskkernel.coordinator.compose import build_kernel
from taskkernel.coordinator.fcop import FcopError, FcopReason, Scanner, open_workspace
from taskkernel.coordinator.fcop.safeio import Staged
from taskkernel.coordinator.folders.importer import Importer
from taskkernel.coordinator.folders.tracking import FileTracker
from taskkernel.coordinator.loop import Coordinator
from taskkernel.coordinator.workspace import STATE_DIR, Workspace
from tests.cli_support import cli_env, run


def history(project: Path, n: int) -> int:
    """``n`` TASK files over three stages (one folder holding most of them) and a REPORT on every second one."""
    lc = project / "fcop" / "_lifecycle"
    for i in range(1, n + 1):
        tid = f"TASK-202601{1 + (i - 1) // 999:02d}-{(i - 1) % 999 + 1:03d}"
        stage = "archive" if i % 10 == 0 else "done" if i % 10 == 8 else "inbox"
        (lc / stage).mkdir(parents=True, exist_ok=True)
        (lc / stage / f"{tid}-ADMIN-to-DEV.md").write_text(
            f"---\nprotocol: fcop\nversion: 1\nsender: ADMIN\nrecipient: DEV\nsubject: Job {i}\n---\n"
            + "Do the work. " * 40 + "\n", encoding="utf-8")
        if i % 2 == 0:
            (project / "fcop" / "reports").mkdir(parents=True, exist_ok=True)
            (project / "fcop" / "reports" / f"REPORT{tid[4:]}-DEV-to-ADMIN.md").write_text(
                f"---\nprotocol: fcop\nversion: 1\nsender: DEV\nrecipient: ADMIN\nstatus: done\n"
                f"references:\n- {tid}\n---\ndone\n", encoding="utf-8")
    return n + n // 2


def traced(fn: Callable[[], object]) -> tuple[int, int]:
    """(peak, retained) bytes allocated by ``fn`` and still held after it (what it returns included)."""
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        kept = fn()
        gc.collect()
        retained, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del kept
    return peak - base, retained - base


def per_extra_file(tmp_path: Path, measure: Callable[[Path], tuple[int, int]]) -> tuple[float, float]:
    """(peak, retained) bytes per extra file between 200 and 800 tasks (300 and 1,200 files)."""
    sizes = []
    for n in (10, 200, 800):  # the first, discarded, loads what a first run imports
        project = tmp_path / f"p{n}"
        assert run("init", str(project), cwd=tmp_path).code == 0
        files = history(project, n)
        sizes.append((files, *measure(project)))
    (small, small_peak, small_kept), (large, large_peak, large_kept) = sizes[1:]
    return (large_peak - small_peak) / (large - small), (large_kept - small_kept) / (large - small)


def test_the_scanner_keeps_a_packed_record_per_file(tmp_path: Path) -> None:
    """Its stat key, digest and flags in one bytes object (about 110 bytes, was ≈ 450 as objects) beside the
    file's path: what later scans need to leave an unchanged file unread."""
    def scanned(project: Path) -> tuple[int, int]:
        scanner = Scanner(open_workspace(project), settle_s=0, grace_s=0)

        def scan() -> Scanner:
            batch = scanner.scan()
            assert not batch.invalid and len(batch.ready) == len(scanner._seen)
            return scanner
        return traced(scan)

    _, kept = per_extra_file(tmp_path, scanned)
    assert kept < 300, f"{kept:.0f} bytes held per file after a scan"  # was 529
    scanner = Scanner(open_workspace(tmp_path / "p200"), settle_s=0, grace_s=0)
    scanner.scan()
    assert all(type(v) is bytes and sys.getsizeof(v) <= 120 for v in scanner._seen.values())


def test_up_once_holds_little_per_file_to_the_end(tmp_path: Path) -> None:
    """The whole first `up --once` (import, live ingest, folder_stats, ledger and views): the peak grows by a small
    bound per extra file and, once done, little more than the scanner's packed record is held."""
    def up_once(project: Path) -> tuple[int, int]:
        coordinator = Coordinator(Workspace.load(project), CliContext(workspace_path=str(project)).database(),
                                  settle_s=0.0, grace_s=0.0)
        coordinator.folders.importer.batch_size = 100  # type: ignore[union-attr] # a batch: the same at both sizes

        def once() -> Coordinator:
            coordinator.run_once()
            return coordinator
        measured = traced(once)
        assert sum(coordinator.folders.last_import.tasks.values()) > 0  # type: ignore[union-attr]
        return measured

    peak, kept = per_extra_file(tmp_path, up_once)
    assert peak < 1000, f"{peak:.0f} peak bytes per extra file"
    assert kept < 500, f"{kept:.0f} bytes per extra file held after `up --once`"  # was 809 (peak 1,419)


def test_the_live_scanner_takes_the_imports_records_without_a_copy(tmp_path: Path) -> None:
    """``absorb`` moves each record over (the import's scanner forgets it), so the two never both hold every file;
    the live scanner then reads none of those files again."""
    project = tmp_path / "p"
    assert run("init", str(project), cwd=tmp_path).code == 0
    files = history(project, 20)
    walked = Scanner(open_workspace(project), settle_s=0, grace_s=0)
    assert len(walked.scan().ready) == files
    live = Scanner(open_workspace(project))
    live.absorb(walked)
    assert not walked._seen and len(live._seen) == files
    again = live.scan()
    assert not again.ready and not again.pending and not again.removed


def test_folder_stats_follow_the_files_without_a_copy_in_the_ingest(tmp_path: Path) -> None:
    """A pass saves what it handled (every file first, then only changes), a file gone loses its row, and a new
    process trusts the rows: an unchanged file is not read again."""
    project = tmp_path / "p"
    assert run("init", str(project), cwd=tmp_path).code == 0
    files = history(project, 20)
    db = CliContext(workspace_path=str(project)).database()

    def coordinator() -> Coordinator:
        return Coordinator(Workspace.load(project), db, settle_s=0.0, grace_s=0.0)

    def rows() -> dict[str, tuple[tuple[int, int, int, int], str]]:
        return {rel: (key, sha) for rel, key, sha in FileTracker(db).stats()}

    time.sleep(2.1)  # a pass saves a file changed (its ctime) 2 s before it at the latest
    first = coordinator()
    first.run_once()
    assert first.folders.ingest.trusted is True  # type: ignore[union-attr]
    saved = rows()
    assert len(saved) == files
    changed, removed = first.folders.ingest.scanner.unsaved(older_than=2e9)  # type: ignore[union-attr]
    assert not list(changed) and not removed, "nothing left to save after the pass"

    inbox = project / "fcop" / "_lifecycle" / "inbox"
    gone = inbox / "TASK-20260101-001-ADMIN-to-DEV.md"
    gone.unlink()
    first.run_once()
    after = rows()
    assert "_lifecycle/inbox/TASK-20260101-001-ADMIN-to-DEV.md" in saved
    assert "_lifecycle/inbox/TASK-20260101-001-ADMIN-to-DEV.md" not in after
    assert len(after) == files - 1 and all(after[rel] == saved[rel] for rel in after)

    from taskkernel.coordinator.fcop import scan
    reads = []
    real = scan.read_at
    later = coordinator()
    try:
        scan.read_at = lambda *a: reads.append(a[1]) or real(*a)  # type: ignore[assignment]
        later.run_once()
    finally:
        scan.read_at = real
    assert reads == [], "an unchanged file is trusted from folder_stats, never read again"
    changed, removed = later.folders.ingest.scanner.unsaved(older_than=2e9)  # type: ignore[union-attr]
    assert not list(changed) and not removed, "the rows a new process trusts are saved, never written again"


@pytest.mark.parametrize("mtime_ns", [10**19, -(10**18)], ids=["year-2286", "year-1938"])
def test_any_mtime_an_agent_sets_is_ingested_and_stops_nothing(tmp_path: Path, mtime_ns: int) -> None:
    """The scanner packs a file's stat key into 64-bit words: a date beyond them (``touch -d 2286-11-20``) or
    before 1970 must neither stop the pass nor hide the other files."""
    project = tmp_path / "p"
    assert run("init", str(project), cwd=tmp_path).code == 0
    history(project, 1)
    assert run("up", "--once", cwd=project).code == 0
    inbox = project / "fcop" / "_lifecycle" / "inbox"
    os.utime(inbox / "TASK-20260101-001-ADMIN-to-DEV.md", ns=(0, mtime_ns))
    (inbox / "TASK-20260101-002-ADMIN-to-DEV.md").write_text(
        "---\nprotocol: fcop\nversion: 1\nsender: ADMIN\nrecipient: DEV\nsubject: Next\n---\nDo it.\n",
        encoding="utf-8")
    for _ in range(2):  # the pass that finds the date and the one after it
        up = run("up", "--once", cwd=project)
        assert up.code == 0 and "Traceback" not in up.err, (up.out, up.err)
    listed = run("task", "list", "--json", cwd=project)
    assert listed.code == 0, listed.err
    assert {"TASK-20260101-001", "TASK-20260101-002"} <= {t["task_id"] for t in listed.json}


def test_staged_writes_only_changed_bytes_and_never_through_a_link(tmp_path: Path) -> None:
    target = tmp_path / "ledger" / "tasks.jsonl"
    staged = Staged(target)
    staged.write("a\n" * 50_000)  # above one chunk: written as it comes
    assert staged.commit() and target.read_text() == "a\n" * 50_000
    inode = target.stat().st_ino
    again = Staged(target)
    again.write("a\n" * 50_000)
    assert not again.commit() and target.stat().st_ino == inode, "the same bytes: the file is left as it is"
    other = Staged(target)
    other.write("b\n")
    assert other.commit() and target.read_text() == "b\n"
    dropped = Staged(target)
    dropped.write("c\n")
    dropped.discard()
    assert target.read_text() == "b\n"
    swapped = Staged(target)  # someone who may write ledger/ puts its own file under the temp name
    swapped.write("mine\n")
    (tmp_path / "theirs").write_text("x")
    os.replace(tmp_path / "theirs", target.parent / swapped._tmp)
    with pytest.raises(FcopError) as info:
        swapped.commit()
    assert info.value.reason is FcopReason.CONTENT_CHANGED
    target.write_text("b\n")
    assert sorted(p.name for p in target.parent.iterdir()) == ["tasks.jsonl"], "no temp file is left behind"

    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "ledger" / "views").symlink_to(tmp_path)
    with pytest.raises(FcopError) as info:
        Staged(tmp_path / "ledger" / "views" / "victim")
    assert info.value.reason is FcopReason.SYMLINK_REFUSED and victim.read_text() == "keep"
    link = tmp_path / "ledger" / "linked.md"
    link.symlink_to(victim)
    with pytest.raises(FcopError) as info:
        Staged(link)
    assert info.value.reason is FcopReason.SYMLINK_REFUSED and victim.read_text() == "keep"


def test_views_of_many_roles_are_written_within_a_small_descriptor_budget(tmp_path: Path) -> None:
    """Every role's view is written one file at a time: a team of some hundred roles must not run the process out
    of file descriptors (one staged file per role held two each, and the ledger failed with EMFILE)."""
    project = tmp_path / "p"
    assert run("init", str(project), cwd=tmp_path).code == 0
    inbox = project / "fcop" / "_lifecycle" / "inbox"
    inbox.mkdir(parents=True, exist_ok=True)
    roles = [f"R{i:03d}" for i in range(1, 81)]
    for i, role in enumerate(roles, 1):
        (inbox / f"TASK-20260101-{i:03d}-ADMIN-to-{role}.md").write_text(
            f"---\nprotocol: fcop\nversion: 1\nsender: ADMIN\nrecipient: {role}\nsubject: Job {i}\n---\nDo it.\n",
            encoding="utf-8")
    limit = "import resource; resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))"
    up = subprocess.run([sys.executable, "-c", f"{limit}; import runpy, sys; sys.argv = ['taskkernel', 'up', "
                         "'--once']; runpy.run_module('taskkernel', run_name='__main__')"],
                        cwd=project, capture_output=True, text=True, env=cli_env(), timeout=300)
    assert up.returncode == 0 and "Too many open files" not in up.stdout + up.stderr, (up.stdout, up.stderr)
    views = project / "fcop" / "ledger" / "views"
    assert {p.name for p in views.iterdir()} >= {f"{role}.todo.md" for role in roles}
    assert "Job 80" in (views / "R080.todo.md").read_text(encoding="utf-8")


def test_a_row_saved_with_a_pre_1970_or_far_future_key_is_trusted_or_reread_never_a_stop(tmp_path: Path) -> None:
    """folder_stats rows an earlier release saved hold the raw stat values (a negative mtime for a file an agent
    dated 1938, 10**19 for 2286): a new process packs them without error."""
    scanner = Scanner(open_workspace(tmp_path / "fcop"))
    rows = [("a.md", (10, -(10**18), 7, 5), "a" * 64), ("b.md", (10, 10**19, 8, 10**19), "b" * 64)]
    scanner.trust(rows)  # raised struct.error ("argument out of range") on the year-2286 row
    changed, removed = scanner.unsaved(older_than=0)
    assert not list(changed) and not removed, "trusted rows are what folder_stats holds"


def test_a_view_that_cannot_be_written_is_refused_and_the_others_still_are(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk while one view is written: that view is refused (io_error), its temp file and descriptors are
    gone, the other views are written."""
    from taskkernel.coordinator.folders import projection

    ledger = tmp_path / "ledger"
    before = len(os.listdir("/proc/self/fd"))
    out = projection._LedgerFiles(ledger)
    out.ledger("{}\n")
    for role, size in (("AAA", 80_000), ("BBB", 10)):
        out.view(role).todo(role, "x" * size + "\n")
    real_write = os.write

    def full_disk(fd: int, data: Any) -> int:
        if len(data) > 70_000:
            raise OSError(28, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", full_disk)
    written = out.commit()
    monkeypatch.undo()
    out.discard()
    assert written == 2 and len(os.listdir("/proc/self/fd")) == before
    assert sorted(p.name for p in (ledger / "views").iterdir()) == ["BBB.todo.md"]
    assert [str(p) for p in out.refused] == [str(ledger / "views" / "AAA.todo.md")]


def test_a_temp_file_swapped_for_a_folder_is_refused_and_leaks_nothing(tmp_path: Path) -> None:
    target = tmp_path / "ledger" / "tasks.jsonl"
    staged = Staged(target)
    staged.write("mine\n")
    tmp = target.parent / staged._tmp
    tmp.unlink()
    tmp.mkdir()
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(FcopError) as info:
        staged.commit()
    assert info.value.reason in (FcopReason.CONTENT_CHANGED, FcopReason.IO_ERROR)
    assert len(os.listdir("/proc/self/fd")) == before - 2 and not target.exists()
    staged.discard()  # idempotent: no descriptor closed twice


def importer_of(project: Path, batch_size: int = 100) -> Importer:
    db = CliContext(workspace_path=str(project)).database()
    importer = Importer.for_workspace(build_kernel(db, Workspace.load(project)), open_workspace(project),
                                      FileTracker(db), project, STATE_DIR)
    importer.batch_size = batch_size  # a page of the plan and a batch: the same at both sizes
    return importer


def test_the_import_decides_duplicates_parents_loops_and_reports(tmp_path: Path) -> None:
    """What the import's plan decides, in batches of two: of several files with one id the first by name (bytes) is
    the task and the others are refused; a parent is one level up, a missing one or a loop imported as a root (cut
    where the walk came back); a report about an unknown task is refused, one about an imported task attached."""
    project = tmp_path / "p"
    assert run("init", str(project), cwd=tmp_path).code == 0
    lc, reports = project / "fcop" / "_lifecycle", project / "fcop" / "reports"

    def task(where: Path, name: str, parent: str | None = None) -> None:
        where.mkdir(parents=True, exist_ok=True)
        recipient = name.rpartition("-to-")[2]
        (where / f"{name}.md").write_text(
            f"---\nprotocol: fcop\nversion: 1\nsender: ADMIN\nrecipient: {recipient}\nsubject: {name[5:17]}\n"
            + (f"parent: {parent}\n" if parent else "") + "---\nDo it.\n", encoding="utf-8")

    task(lc / "inbox", "TASK-20260101-001-ADMIN-to-DEV")
    task(lc / "inbox", "TASK-20260101-002-ADMIN-to-DEV", parent="TASK-20260101-001")
    task(lc / "inbox", "TASK-20260101-003-ADMIN-to-DEV", parent="TASK-20260101-009")
    task(lc / "inbox", "TASK-20260101-004-ADMIN-to-DEV", parent="TASK-20260101-005")
    task(lc / "inbox", "TASK-20260101-005-ADMIN-to-DEV", parent="TASK-20260101-004")
    task(lc / "inbox", "TASK-20260101-006-ADMIN-to-QA")
    task(lc / "done", "TASK-20260101-006-ADMIN-to-DEV")
    reports.mkdir(parents=True, exist_ok=True)
    for n, about in ((1, "TASK-20260101-002"), (2, "TASK-20260101-077")):
        (reports / f"REPORT-20260101-00{n}-DEV-to-ADMIN.md").write_text(
            f"---\nprotocol: fcop\nversion: 1\nsender: DEV\nrecipient: ADMIN\nstatus: done\nreferences:\n- {about}\n"
            "---\ndone\n", encoding="utf-8")
    importer = importer_of(project, batch_size=2)
    report = importer.run()
    assert dict(report.tasks) == {"inbox": 5, "done": 1} and dict(report.records) == {"report": 1}
    assert [(r["file"], r["reason"]) for r in report.refused] == [
        ("_lifecycle/inbox/TASK-20260101-006-ADMIN-to-QA.md", "duplicate_task_id"),
        ("reports/REPORT-20260101-002-DEV-to-ADMIN.md", "task_not_found")]
    assert [(w["file"].rpartition("/")[2][:17], w["warning"]) for w in report.warnings] == [
        ("TASK-20260101-003", "parent_not_found"), ("TASK-20260101-004", "parent_cycle")]
    docs = {t: importer.kernel.task(f"TASK-20260101-00{t}") for t in range(1, 7)}
    assert {t: (d or {}).get("parent") for t, d in docs.items()} == {
        1: None, 2: "TASK-20260101-001", 3: None, 4: None, 5: "TASK-20260101-004", 6: None}
    assert docs[6] is not None and docs[6]["recipient"] == "DEV" and docs[6]["state"] == "done"
