"""Incremental scanning and the settled check: half-written files are never handed out."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import taskkernel.coordinator.fcop.scan as scan_module
from taskkernel.coordinator.fcop import (
    EntryStatus,
    FcopReason,
    FcopWorkspace,
    Scanner,
    TaskDraft,
    open_workspace,
    write_task,
)

GOOD = b"---\nprotocol: fcop\nversion: 1\nsender: ADMIN\nrecipient: PM\n---\n\nbody\n"
NAME = "TASK-20260101-001-ADMIN-to-PM.md"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def ws(tmp_path: Path) -> FcopWorkspace:
    return open_workspace(tmp_path, create=True)


def put(path: Path, data: bytes, mtime: float) -> None:
    path.write_bytes(data)
    os.utime(path, (mtime, mtime))


def test_fresh_file_waits_for_a_second_identical_look(ws: FcopWorkspace) -> None:
    clock = Clock()
    scanner = Scanner(ws, settle_s=1.0, grace_s=5.0, clock=clock)
    path = ws.stage_dir("inbox") / NAME
    put(path, GOOD, clock.now)
    assert [e.rel for e in scanner.scan().pending] == [f"_lifecycle/inbox/{NAME}"]
    clock.now += 0.5
    assert scanner.scan().pending and not scanner.scan().ready
    clock.now += 0.6
    ready = scanner.scan().ready
    assert [(e.stage, e.envelope.id) for e in ready if e.envelope] == [("inbox", "TASK-20260101-001")]
    clock.now += 10
    batch = scanner.scan()
    assert not (batch.ready or batch.pending or batch.invalid)  # handed out once


def test_a_file_still_being_written_is_not_handed_out(ws: FcopWorkspace) -> None:
    clock = Clock()
    scanner = Scanner(ws, settle_s=1.0, grace_s=5.0, clock=clock)
    path = ws.stage_dir("inbox") / NAME
    half = GOOD[:30]
    put(path, half, clock.now)
    for step in range(4):  # the writer keeps appending: the key changes every look
        clock.now += 2
        put(path, GOOD[: 30 + 5 * (step + 1)], clock.now)
        batch = scanner.scan()
        assert not batch.ready and not batch.invalid and batch.pending
    clock.now += 2
    put(path, GOOD, clock.now)
    assert scanner.scan().pending
    clock.now += 1
    assert [e.status for e in scanner.scan().ready] == [EntryStatus.READY]


def test_an_unparsable_file_gets_the_longer_grace_then_is_invalid(ws: FcopWorkspace) -> None:
    clock = Clock()
    scanner = Scanner(ws, settle_s=1.0, grace_s=5.0, clock=clock)
    put(ws.stage_dir("inbox") / NAME, b"---\nprotocol: fcop\n", clock.now)
    scanner.scan()
    clock.now += 2
    assert scanner.scan().pending
    clock.now += 4
    invalid = scanner.scan().invalid
    assert [e.error.reason for e in invalid if e.error] == [FcopReason.MISSING_FRONT_MATTER]


def test_a_file_that_arrived_by_rename_is_ready_at_first_look(ws: FcopWorkspace) -> None:
    clock = Clock()
    scanner = Scanner(ws, settle_s=1.0, grace_s=5.0, clock=clock)
    put(ws.stage_dir("inbox") / NAME, GOOD, clock.now - 30)
    put(ws.stage_dir("inbox") / "TASK-20260101-002-ADMIN-to-PM.md", b"", clock.now - 30)
    batch = scanner.scan()
    assert [e.rel.rsplit("/")[-1] for e in batch.ready] == [NAME]
    assert [e.error.reason for e in batch.invalid if e.error] == [FcopReason.EMPTY_FILE]


def test_our_own_writes_are_ready_once_settled(ws: FcopWorkspace) -> None:
    published = write_task(ws, TaskDraft(sender="PM", recipient="DEV", subject="s", body="b"))
    scanner = Scanner(ws, settle_s=0, grace_s=0)
    assert [e.path for e in scanner.scan().ready] == [published.path]


def test_incremental_parse_once_and_removed(ws: FcopWorkspace, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = scan_module.parse_envelope

    def counting(name: str, data: bytes, **kw: int) -> object:
        calls.append(name)
        return real(name, data, **kw)

    monkeypatch.setattr(scan_module, "parse_envelope", counting)
    scanner = Scanner(ws, settle_s=0, grace_s=0)
    for n in range(1, 4):
        put(ws.stage_dir("inbox") / f"TASK-20260101-00{n}-ADMIN-to-PM.md", GOOD, 1000)
    assert len(scanner.scan().ready) == 3 and len(calls) == 3
    assert scanner.scan().ready == [] and len(calls) == 3  # unchanged files are not re-read
    src = ws.stage_dir("inbox") / NAME
    os.rename(src, ws.stage_dir("active") / NAME)
    batch = scanner.scan()
    assert batch.removed == [f"_lifecycle/inbox/{NAME}"]
    assert [(e.stage, e.rel) for e in batch.ready] == [("active", f"_lifecycle/active/{NAME}")]


def test_ignored_ghost_symlink_misplaced_and_nested(ws: FcopWorkspace) -> None:
    inbox = ws.stage_dir("inbox")
    put(inbox / f".{NAME}.tmp", b"partial", 1000)
    put(inbox / ".hidden.md", GOOD, 1000)
    put(inbox / "notes.txt", b"hello", 1000)
    put(inbox / "README.md", b"# batch", 1000)
    (inbox / "TASK-20260101-009-ADMIN-to-PM.md").symlink_to("/etc/passwd")
    put(ws.root / "reports" / NAME, GOOD, 1000)
    report = b"---\nprotocol: fcop\nversion: 1\nsender: PM\nrecipient: ADMIN\nreferences: [TASK-20260101-003]\n---\n"
    put(ws.stage_dir("archive") / "REPORT-20260101-001-PM-to-ADMIN.md", report, 1000)  # fcop 3.x tolerates it
    (inbox / "batch-1").mkdir()
    put(inbox / "batch-1" / "TASK-20260101-003-ADMIN-to-PM.md", GOOD, 1000)
    (ws.root / "shared").mkdir()
    put(ws.root / "shared" / NAME, GOOD, 1000)  # not a folder envelopes live in: never scanned
    scanner = Scanner(ws, settle_s=0, grace_s=0)
    batch = scanner.scan()
    assert sorted(e.rel for e in batch.ghosts) == ["_lifecycle/inbox/README.md", "_lifecycle/inbox/notes.txt"]
    assert sorted((e.rel, e.error.reason) for e in batch.invalid if e.error) == [
        ("_lifecycle/inbox/TASK-20260101-009-ADMIN-to-PM.md", FcopReason.SYMLINK_REFUSED),
        (f"reports/{NAME}", FcopReason.MISPLACED_FILE)]
    assert [(e.rel, e.stage) for e in batch.ready] == [
        ("_lifecycle/archive/REPORT-20260101-001-PM-to-ADMIN.md", "archive"),
        ("_lifecycle/inbox/batch-1/TASK-20260101-003-ADMIN-to-PM.md", "inbox")]
    assert scanner.scan().ghosts == []  # warned once


def test_a_file_vanishing_between_listing_and_reading_is_just_gone(ws: FcopWorkspace,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    path = ws.stage_dir("inbox") / NAME
    put(path, GOOD, 1000)
    real = scan_module.read_at

    def vanishing(fd: int, name: str, max_bytes: int, shown: Path) -> bytes:
        os.unlink(shown)
        return real(fd, name, max_bytes, shown)

    monkeypatch.setattr(scan_module, "read_at", vanishing)
    batch = Scanner(ws, settle_s=0, grace_s=0).scan()
    assert not (batch.ready or batch.invalid or batch.pending)


def test_folders_never_looked_into_are_named_in_every_batch_while_they_stay(ws: FcopWorkspace, tmp_path: Path) -> None:
    """The import lists what it did not read from ``ScanBatch.refused``: a folder link, and a folder deeper than
    the scans look (its files are never read), each with its reason, on every scan (a fresh scanner sees all)."""
    deep = ws.stage_dir("archive").joinpath("a", "b", "c", "d")
    put_in = deep / "e" / NAME
    put_in.parent.mkdir(parents=True)
    put(put_in, GOOD, 1000)
    put(deep / NAME, GOOD, 1000)  # four folders below the stage: still read
    (tmp_path / "elsewhere").mkdir()
    (ws.root / "tasks").mkdir()
    (ws.root / "tasks" / "linked").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    scanner = Scanner(ws, settle_s=0, grace_s=0)
    for _ in range(2):
        batch = scanner.scan()
        assert {rel: e.reason for rel, e in batch.refused.items()} == {
            "_lifecycle/archive/a/b/c/d/e": FcopReason.FOLDER_TOO_DEEP, "tasks/linked": FcopReason.SYMLINK_REFUSED}
    assert [e.rel for e in Scanner(ws, settle_s=0, grace_s=0).scan().ready] == [
        f"_lifecycle/archive/a/b/c/d/{NAME}"]


# -- review of 84a5775: one file or folder never stops the walk ------------------------------------

BAD_NAME = "TASK-20260101-002-ADMIN-to-PM.md"


@pytest.mark.parametrize("value", ["!!bool maybe", "!!int ''", "!!float ''", "!!int '-'"])
def test_a_typed_scalar_pyyaml_cannot_build_refuses_its_file_only(ws: FcopWorkspace, value: str) -> None:
    inbox = ws.stage_dir("inbox")
    put(inbox / NAME, GOOD, 1000.0)
    put(inbox / BAD_NAME, f"---\nprotocol: fcop\nversion: 1\nsender: ADMIN\nrecipient: PM\nx: {value}\n---\n"
        .encode(), 1000.0)
    batch = Scanner(ws, settle_s=0, grace_s=0).scan()
    assert [e.path.name for e in batch.ready] == [NAME]
    assert [(e.path.name, e.error.reason) for e in batch.invalid if e.error] == [
        (BAD_NAME, FcopReason.MALFORMED_FRONT_MATTER)]


def test_a_parser_crash_on_one_file_refuses_that_file_only(ws: FcopWorkspace,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    inbox = ws.stage_dir("inbox")
    put(inbox / NAME, GOOD, 1000.0)
    put(inbox / BAD_NAME, GOOD, 1000.0)
    parse = scan_module.parse_envelope

    def crashing(name, data, **kwargs):  # noqa: ANN001, ANN003, ANN202
        if name == BAD_NAME:
            raise KeyError("maybe")
        return parse(name, data, **kwargs)

    monkeypatch.setattr(scan_module, "parse_envelope", crashing)
    batch = Scanner(ws, settle_s=0, grace_s=0).scan()
    assert [e.path.name for e in batch.ready] == [NAME]
    assert [(e.path.name, e.error.reason) for e in batch.invalid if e.error] == [
        (BAD_NAME, FcopReason.MALFORMED_FRONT_MATTER)]


def test_a_folder_that_cannot_be_listed_is_refused_and_the_walk_goes_on(ws: FcopWorkspace,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder readable but not searchable (entry.stat() PermissionError), or EIO: refused with io_error."""
    inbox = ws.stage_dir("inbox")
    put(inbox / NAME, GOOD, 1000.0)
    locked = inbox / "batch"
    locked.mkdir()
    put(locked / BAD_NAME, GOOD, 1000.0)
    real_scandir = os.scandir

    class Entry:
        def __init__(self, entry: os.DirEntry[str]) -> None:
            self.name = entry.name

        def stat(self, *, follow_symlinks: bool = True) -> os.stat_result:
            raise PermissionError(13, "Permission denied")

    class Entries:
        def __init__(self, fd: int) -> None:
            self.it = real_scandir(fd)

        def __enter__(self) -> Entries:
            return self

        def __exit__(self, *exc: object) -> None:
            self.it.close()

        def __iter__(self):  # noqa: ANN204
            return (Entry(e) for e in self.it)

    def scandir(fd):  # noqa: ANN001, ANN202
        if isinstance(fd, int) and os.path.samestat(os.fstat(fd), os.stat(locked)):
            return Entries(fd)
        return real_scandir(fd)

    monkeypatch.setattr(os, "scandir", scandir)
    batch = Scanner(ws, settle_s=0, grace_s=0).scan()
    assert [e.path.name for e in batch.ready] == [NAME]
    assert {rel: e.reason for rel, e in batch.refused.items()} == {"_lifecycle/inbox/batch": FcopReason.IO_ERROR}

    def failing(fd, shown=None):  # noqa: ANN001, ANN202
        raise OSError(5, "Input/output error")  # an OSError the safe layer did not name

    monkeypatch.setattr(scan_module, "list_fd", failing)
    batch = Scanner(ws, settle_s=0, grace_s=0).scan()
    assert not batch.ready and batch.refused and all(
        e.reason is FcopReason.IO_ERROR for e in batch.refused.values())


def test_a_file_that_cannot_be_read_is_refused_and_the_walk_goes_on(ws: FcopWorkspace,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    inbox = ws.stage_dir("inbox")
    put(inbox / NAME, GOOD, 1000.0)
    put(inbox / BAD_NAME, GOOD + b"x", 1000.0)
    real_read = os.read
    size = len(GOOD) + 1

    def read(fd: int, n: int) -> bytes:
        if os.fstat(fd).st_size == size:
            raise OSError(5, "Input/output error")
        return real_read(fd, n)

    monkeypatch.setattr(os, "read", read)
    batch = Scanner(ws, settle_s=0, grace_s=0).scan()
    assert [e.path.name for e in batch.ready] == [NAME]
    assert [(e.path.name, e.error.reason) for e in batch.invalid if e.error] == [(BAD_NAME, FcopReason.IO_ERROR)]
