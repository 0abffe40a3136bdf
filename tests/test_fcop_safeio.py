"""Safe writes, no-overwrite moves, max+1 numbering across every folder, and workspace detection."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import pytest

from taskkernel.coordinator.fcop import (
    EnvelopeKind,
    FcopError,
    FcopReason,
    Generation,
    TaskDraft,
    max_sequence,
    move_no_overwrite,
    open_workspace,
    read_bytes,
    rewrite,
    safe_join,
    write_new,
    write_report,
    write_task,
)
from taskkernel.coordinator.fcop.safeio import sha256_hex

DAY = "20260101"


def draft(**kw: str) -> TaskDraft:
    return TaskDraft(sender=kw.get("sender", "PM"), recipient=kw.get("recipient", "DEV"), subject="s", body="b")


def test_write_new_publishes_whole_and_never_overwrites(tmp_path: Path) -> None:
    target = tmp_path / "d" / "f.md"
    assert write_new(target, b"one") == sha256_hex(b"one")
    with pytest.raises(FcopError) as exc:
        write_new(target, b"two")
    assert exc.value.reason is FcopReason.TARGET_EXISTS and target.read_bytes() == b"one"
    assert sorted(os.listdir(target.parent)) == ["f.md"]  # no temp file left behind


def test_a_leftover_temp_file_is_never_reused(tmp_path: Path) -> None:
    target = tmp_path / "f.md"
    (tmp_path / ".f.md.tmp").write_bytes(b"half")  # a crash leftover, or a name planted in advance
    write_new(target, b"x")
    assert target.read_bytes() == b"x" and (tmp_path / ".f.md.tmp").read_bytes() == b"half"
    assert sorted(os.listdir(tmp_path)) == [".f.md.tmp", "f.md"]  # our own random temp is gone


def test_move_refuses_to_overwrite_and_resumes_a_half_done_move(tmp_path: Path) -> None:
    a, b = tmp_path / "inbox" / "T.md", tmp_path / "active" / "T.md"
    a.parent.mkdir()
    a.write_bytes(b"A")
    b.parent.mkdir()
    b.write_bytes(b"B")
    with pytest.raises(FcopError) as exc:
        move_no_overwrite(a, b)
    assert exc.value.reason is FcopReason.TARGET_EXISTS and (a.read_bytes(), b.read_bytes()) == (b"A", b"B")
    b.unlink()
    os.link(a, b)  # crashed after link, before unlink
    assert move_no_overwrite(a, b) == b and not a.exists() and b.read_bytes() == b"A"
    with pytest.raises(FcopError) as exc:
        move_no_overwrite(a, tmp_path / "done" / "T.md")
    assert exc.value.reason is FcopReason.SOURCE_MISSING


def test_rewrite_is_compare_and_swap(tmp_path: Path) -> None:
    f = tmp_path / "f.md"
    f.write_bytes(b"v1")
    rewrite(f, b"v2", expect_sha256=sha256_hex(b"v1"))
    with pytest.raises(FcopError) as exc:
        rewrite(f, b"v3", expect_sha256=sha256_hex(b"v1"))
    assert exc.value.reason is FcopReason.CONTENT_CHANGED and f.read_bytes() == b"v2"
    with pytest.raises(FcopError) as exc:
        rewrite(tmp_path / "gone.md", b"x", expect_sha256=sha256_hex(b"v1"))
    assert exc.value.reason is FcopReason.SOURCE_MISSING and not (tmp_path / "gone.md").exists()
    assert sorted(os.listdir(tmp_path)) == ["f.md"]


def test_reads_refuse_symlinks_fifos_and_oversize(tmp_path: Path) -> None:
    (tmp_path / "secret").write_bytes(b"s")
    (tmp_path / "link.md").symlink_to(tmp_path / "secret")
    os.mkfifo(tmp_path / "fifo.md")
    (tmp_path / "big.md").write_bytes(b"x" * 100)
    for name, reason in (("link.md", FcopReason.SYMLINK_REFUSED), ("fifo.md", FcopReason.NOT_REGULAR_FILE),
                         ("big.md", FcopReason.FILE_TOO_LARGE)):
        with pytest.raises(FcopError) as exc:
            read_bytes(tmp_path / name, 50)
        assert exc.value.reason is reason
    with pytest.raises(FileNotFoundError):
        read_bytes(tmp_path / "nope.md", 50)


def test_safe_join(tmp_path: Path) -> None:
    (tmp_path / "out").symlink_to("/")
    assert safe_join(tmp_path, "a/b.md") == tmp_path / "a" / "b.md"
    for rel, reason in (("../x", FcopReason.PATH_ESCAPE), ("a/../../x", FcopReason.PATH_ESCAPE),
                        ("/etc/passwd", FcopReason.PATH_ESCAPE), ("out/etc/passwd", FcopReason.SYMLINK_REFUSED)):
        with pytest.raises(FcopError) as exc:
            safe_join(tmp_path, rel)
        assert exc.value.reason is reason


def test_numbering_is_max_plus_one_over_every_folder_and_never_fills_gaps(tmp_path: Path) -> None:
    ws = open_workspace(tmp_path, create=True)
    (ws.stage_dir("archive") / f"TASK-{DAY}-007-PM-to-DEV.md").write_text("x")
    (ws.stage_dir("done") / f"TASK-{DAY}-002-PM-to-DEV.md").write_text("x")
    (ws.root / "history" / "2026-01-01" / f"TASK-{DAY}-009-A-to-B").mkdir(parents=True)
    (ws.stage_dir("inbox") / f".TASK-{DAY}-010-PM-to-QA.md.tmp").write_text("")  # a writer in flight
    (ws.root / "_quarantine").mkdir()
    (ws.root / "_quarantine" / f"TASK-{DAY}-004-x.md").write_text("x")
    (ws.root / "reports" / f"REPORT-{DAY}-050-DEV-to-PM.md").write_text("x")  # another kind: independent
    assert max_sequence(ws, EnvelopeKind.TASK, DAY) == 10
    first = write_task(ws, draft(), date=DAY)
    assert first.name.id == f"TASK-{DAY}-011" and first.path.parent == ws.stage_dir("inbox")
    assert write_report(ws, sender="DEV", recipient="PM", task_id=first.name.id, body="b",
                        date=DAY).name.id == f"REPORT-{DAY}-051"
    move_no_overwrite(first.path, ws.stage_dir("active") / first.path.name)  # fcop would now reuse 011
    assert write_task(ws, draft(), date=DAY).name.id == f"TASK-{DAY}-012"
    assert write_task(ws, draft(), date="20260102").name.id == "TASK-20260102-001"


def test_numbers_grow_past_999(tmp_path: Path) -> None:
    ws = open_workspace(tmp_path, create=True)
    (ws.stage_dir("done") / f"TASK-{DAY}-999-PM-to-DEV.md").write_text("x")
    assert write_task(ws, draft(), date=DAY).path.name == f"TASK-{DAY}-1000-PM-to-DEV.md"
    assert write_task(ws, draft(), date=DAY).name.sequence == 1001


def _writer(root: str, n: int, recipient: str) -> None:
    ws = open_workspace(root)
    for _ in range(n):
        write_task(ws, draft(recipient=recipient), date=DAY)


def test_concurrent_processes_get_distinct_numbers(tmp_path: Path) -> None:
    open_workspace(tmp_path, create=True)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), 10, r)) for r in ("DEV", "QA", "OPS", "PM")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    names = os.listdir(tmp_path / "fcop" / "_lifecycle" / "inbox")
    seqs = sorted(int(n.split("-")[2]) for n in names)
    assert seqs == list(range(1, 41)), names  # 40 files, 40 distinct numbers, no gaps, no temp files


def test_detection(tmp_path: Path) -> None:
    empty = open_workspace(tmp_path / "e")
    assert (empty.root, empty.generation) == (tmp_path / "e" / "fcop", Generation.EMPTY)
    g3 = open_workspace(tmp_path / "e", create=True)
    assert g3.generation is Generation.G3 and all(g3.stage_dir(s).is_dir() for s in ("inbox", "archive"))
    (tmp_path / "g2" / "docs" / "agents" / "log").mkdir(parents=True)
    assert open_workspace(tmp_path / "g2").generation is Generation.G2
    mixed = tmp_path / "m" / "fcop"
    (mixed / "_lifecycle").mkdir(parents=True)
    (mixed / "tasks").mkdir()
    with pytest.raises(FcopError) as exc:
        open_workspace(tmp_path / "m")
    assert exc.value.reason is FcopReason.MIXED_WORKSPACE
    assert open_workspace(tmp_path / "m", allow_mixed=True).generation is Generation.MIXED
    (tmp_path / "both" / "fcop").mkdir(parents=True)
    (tmp_path / "both" / "docs" / "agents").mkdir(parents=True)
    with pytest.raises(FcopError) as exc:
        open_workspace(tmp_path / "both")
    assert exc.value.reason is FcopReason.AMBIGUOUS_WORKSPACE_ROOT
    g4 = tmp_path / "g4" / "fcop"
    g4.mkdir(parents=True)
    (g4 / "fcop.json").write_text(json.dumps({"protocol": "fcop", "protocol_version": "4.0"}))
    assert open_workspace(tmp_path / "g4").generation is Generation.G4  # fcop's Core reads it (docs/fcop4.md)
    elsewhere = tmp_path / "g4-elsewhere" / "docs" / "agents"
    elsewhere.mkdir(parents=True)
    (elsewhere / "fcop.json").write_text(json.dumps({"protocol": "fcop", "protocol_version": "4.0"}))
    with pytest.raises(FcopError) as exc:  # the Core reads G4 only at <project>/fcop
        open_workspace(tmp_path / "g4-elsewhere")
    assert exc.value.reason is FcopReason.UNSUPPORTED_WORKSPACE_GENERATION
    (g4 / "fcop.json").write_text("{not json")
    with pytest.raises(FcopError) as exc:
        open_workspace(tmp_path / "g4")
    assert exc.value.reason is FcopReason.MALFORMED_CONFIG


def test_g2_workspace_gets_new_tasks_in_tasks_folder(tmp_path: Path) -> None:
    (tmp_path / "fcop" / "tasks").mkdir(parents=True)
    ws = open_workspace(tmp_path)
    published = write_task(ws, draft(), date=DAY)
    assert published.path.parent == tmp_path / "fcop" / "tasks"
    assert not tmp_path.joinpath("fcop", "_lifecycle").exists()  # never makes a G2 tree MIXED
    assert not any(p.name.endswith(".tmp") for p in ws.root.rglob("*"))


@pytest.mark.parametrize("bad", [
    {"sender": "pm"}, {"recipient": "../../etc"}, {"priority": "P7"}, {"extra": {"sender": "ADMIN"}},
    {"extra": {"transitions": []}}, {"slot": "x/../y"}, {"slug": "Bad Slug"},
])
def test_writer_refuses_what_it_could_not_write_canonically(tmp_path: Path, bad: dict[str, object]) -> None:
    ws = open_workspace(tmp_path, create=True)
    fields: dict[str, object] = {"sender": "PM", "recipient": "DEV", "subject": "s", "body": "b", **bad}
    with pytest.raises(FcopError) as exc:
        write_task(ws, TaskDraft(**fields))  # type: ignore[arg-type]
    assert exc.value.reason is FcopReason.INVALID_FIELD_VALUE
    assert not any(ws.stage_dir("inbox").iterdir())


def test_an_entry_that_cannot_be_stated_or_read_is_an_io_error(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder readable but not searchable (entry.stat() EACCES) or a read failing with EIO: FcopError(io_error),
    never a bare OSError out of the safe layer (review of 84a5775)."""
    from taskkernel.coordinator.fcop import safeio

    (tmp_path / "f.md").write_bytes(b"x")

    class Entry:
        name = "f.md"

        def stat(self, *, follow_symlinks: bool = True) -> os.stat_result:
            raise PermissionError(13, "Permission denied")

    class Entries:
        def __enter__(self) -> Entries:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def __iter__(self):  # noqa: ANN204
            return iter([Entry()])

    monkeypatch.setattr(os, "scandir", lambda fd: Entries())
    with pytest.raises(FcopError) as info:
        safeio.list_dir(tmp_path)
    assert info.value.reason is FcopReason.IO_ERROR and info.value.path == tmp_path
    monkeypatch.undo()

    def eio(fd: int, n: int) -> bytes:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "read", eio)
    with pytest.raises(FcopError) as info:
        safeio.read_bytes(tmp_path / "f.md", 100)
    assert info.value.reason is FcopReason.IO_ERROR
