"""Quarantine: the file moves with its bytes untouched, a reason lands beside it, nothing is overwritten."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from taskkernel.coordinator.fcop import FcopError, FcopReason, FcopWorkspace, open_workspace, quarantine
from taskkernel.coordinator.fcop.quarantining import sweep_notes

NAME = "TASK-20260101-001-ADMIN-to-PM.md"


@pytest.fixture
def ws(tmp_path: Path) -> FcopWorkspace:
    return open_workspace(tmp_path / "proj", create=True)


def reason_of(path: Path) -> dict[str, object]:
    text = path.read_text()
    return yaml.safe_load(text.split("---\n")[1])  # type: ignore[no-any-return]


def test_bytes_mode_and_mtime_are_preserved_and_reason_is_written(ws: FcopWorkspace) -> None:
    src = ws.stage_dir("inbox") / NAME
    src.write_bytes(b"---\nbroken: [\n---\n")
    os.chmod(src, 0o600)
    os.utime(src, (1234, 1234))
    before = os.stat(src)
    q = quarantine(ws, src, FcopReason.MALFORMED_FRONT_MATTER, "front matter is not valid YAML")
    assert not src.exists() and q.path == ws.quarantine_dir / f"quarantined-{NAME}"
    after = os.stat(q.path)
    assert (after.st_ino, after.st_mtime_ns, after.st_mode) == (before.st_ino, before.st_mtime_ns, before.st_mode)
    assert q.path.read_bytes() == b"---\nbroken: [\n---\n"
    assert q.reason_path.name == f"quarantined-{NAME}.reason.md"
    meta = reason_of(q.reason_path)
    assert meta["reason"] == "malformed_front_matter" and meta["source"] == f"_lifecycle/inbox/{NAME}"
    assert meta["size"] == 18 and len(str(meta["sha256"])) == 64
    assert "front matter is not valid YAML" in q.reason_path.read_text()


def test_collisions_get_numbered_names_and_nothing_is_overwritten(ws: FcopWorkspace) -> None:
    paths = []
    for i in range(3):
        src = ws.stage_dir("inbox") / NAME
        src.write_bytes(f"v{i}".encode())
        paths.append(quarantine(ws, src, FcopReason.EMPTY_FILE, "x").path)
    assert [p.name for p in paths] == [f"quarantined-{NAME}", f"quarantined-{NAME}".replace(".md", ".2.md"),
                                    f"quarantined-{NAME}".replace(".md", ".3.md")]
    assert [p.read_bytes() for p in paths] == [b"v0", b"v1", b"v2"]
    assert len(list(ws.quarantine_dir.glob("*.reason.md"))) == 3


def test_a_symlink_is_moved_as_a_link_never_followed(ws: FcopWorkspace, tmp_path: Path) -> None:
    target = tmp_path / "secret.txt"
    target.write_bytes(b"top secret")
    link = ws.stage_dir("inbox") / NAME
    link.symlink_to(target)
    q = quarantine(ws, link, FcopReason.SYMLINK_REFUSED, "symbolic links are never followed")
    assert q.path.is_symlink() and os.readlink(q.path) == str(target)
    assert target.read_bytes() == b"top secret" and "sha256" not in reason_of(q.reason_path)
    assert reason_of(q.reason_path)["symlink_target"] == str(target)


def test_hostile_names_and_fifos(ws: FcopWorkspace) -> None:
    inbox = ws.stage_dir("inbox")
    long_name = "TASK-" + "x" * 240 + ".md"
    odd_name = "TASK-\n\t\x1b[31m-..-é.md"
    for name in (long_name, odd_name):
        (inbox / name).write_bytes(b"data")
        q = quarantine(ws, inbox / name, FcopReason.BAD_FILENAME, "not an envelope name")
        assert q.path.read_bytes() == b"data" and len(os.fsencode(q.reason_path.name)) <= 255
        assert q.path.parent == ws.quarantine_dir and "\n" not in q.path.name
    raw_name = os.fsencode(str(inbox)) + b"/TASK-\xff\xfe-latin1.md"  # not UTF-8 at all
    with open(raw_name, "wb") as f:
        f.write(b"data")
    q = quarantine(ws, Path(os.fsdecode(raw_name)), FcopReason.BAD_FILENAME, "not an envelope name")
    assert q.path.read_bytes() == b"data" and reason_of(q.reason_path)["source"] == (
        "_lifecycle/inbox/TASK-\\xff\\xfe-latin1.md")
    os.mkfifo(inbox / NAME)
    q = quarantine(ws, inbox / NAME, FcopReason.NOT_REGULAR_FILE, "a FIFO")
    assert q.path.is_fifo()


def test_refuses_paths_outside_the_workspace_and_missing_sources(ws: FcopWorkspace, tmp_path: Path) -> None:
    outside = tmp_path / "outside.md"
    outside.write_bytes(b"x")
    with pytest.raises(FcopError) as exc:
        quarantine(ws, outside, FcopReason.BAD_FILENAME, "x")
    assert exc.value.reason is FcopReason.PATH_ESCAPE and outside.exists()
    with pytest.raises(FcopError) as exc:
        quarantine(ws, ws.stage_dir("inbox") / "gone.md", FcopReason.BAD_FILENAME, "x")
    assert exc.value.reason is FcopReason.SOURCE_MISSING
    assert not ws.quarantine_dir.exists() or not any(ws.quarantine_dir.iterdir())


def test_sweep_removes_only_notes_whose_file_left(ws: FcopWorkspace) -> None:
    src = ws.stage_dir("inbox") / NAME
    src.write_bytes(b"x")
    q = quarantine(ws, src, FcopReason.EMPTY_FILE, "x")
    odd = ws.stage_dir("inbox") / f"{NAME}.reason.md"  # a quarantined file named like a note keeps its note
    odd.write_bytes(b"y")
    kept = quarantine(ws, odd, FcopReason.BAD_FILENAME, "x")
    assert sweep_notes(ws) == []
    os.rename(q.path, src)  # moved back out to be retried
    assert sweep_notes(ws) == [q.reason_path]
    assert kept.path.read_bytes() == b"y" and kept.reason_path.is_file()


def test_no_exported_name_is_shadowed_by_a_submodule_of_the_same_name() -> None:
    """The package imports its names lazily: a submodule named like an exported function would replace it
    as the package attribute as soon as anything imported that submodule (fcop.quarantine was one)."""
    import pkgutil
    import subprocess
    import sys

    import taskkernel.coordinator.fcop as fcop
    from tests.cli_support import cli_env

    modules = {m.name for m in pkgutil.iter_modules(fcop.__path__)}
    assert not modules & set(fcop.__all__)
    probe = ("import importlib, taskkernel.coordinator.fcop as f\n"
             "for m in ('quarantining', 'scan', 'writer', 'parse'):\n"
             "    importlib.import_module('taskkernel.coordinator.fcop.' + m)\n"
             "assert all(not type(getattr(f, n)).__name__ == 'module' for n in f.__all__)\n")
    assert subprocess.run([sys.executable, "-c", probe], env=cli_env(), timeout=60).returncode == 0


def test_quarantined_envelopes_never_make_fcops_validator_call_the_workspace_invalid(ws: FcopWorkspace) -> None:
    from fcop.observation import validate_workspace

    (ws.root / "fcop.json").write_text('{"mode": "solo", "team": "solo", "leader": "ME", "roles": ["ME"]}')
    for i in range(2):
        src = ws.stage_dir("inbox") / NAME
        src.write_bytes(b"---\nbroken: [\n---\n")
        quarantine(ws, src, FcopReason.MALFORMED_FRONT_MATTER, f"try {i}")
    report = validate_workspace(ws.root.parent)  # the project: fcop finds fcop/ in it
    assert report["valid"], report["errors"]


def test_a_quarantine_an_older_version_kept_under_envelope_names_is_renamed_with_its_notes(
        ws: FcopWorkspace) -> None:
    from fcop.observation import validate_workspace

    (ws.root / "fcop.json").write_text('{"mode": "solo", "team": "solo", "leader": "ME", "roles": ["ME"]}')
    ws.quarantine_dir.mkdir()
    old = ws.quarantine_dir / NAME
    old.write_bytes(b"broken")
    (ws.quarantine_dir / f"{NAME}.reason.md").write_text("---\nreason: empty_file\n---\n")
    assert not validate_workspace(ws.root.parent)["valid"]
    assert sweep_notes(ws) == []
    assert sorted(p.name for p in ws.quarantine_dir.iterdir()) == [f"quarantined-{NAME}",
                                                                    f"quarantined-{NAME}.reason.md"]
    assert (ws.quarantine_dir / f"quarantined-{NAME}").read_bytes() == b"broken"
    assert validate_workspace(ws.root.parent)["valid"]
