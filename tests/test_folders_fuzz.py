"""Fuzz the whole ingest path: hostile files in a live workspace never stop the coordinator,
every refused file is quarantined intact with a reason, and nothing is deleted."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings

from taskkernel.coordinator.fcop import parse_filename
from tests.coord_support import coordinator, make_workspace
from tests.test_fcop_fuzz import _BASE, file_specs

Spec = list[tuple[str, str, tuple[str, bytes]]]


def _all_bytes(root: Path) -> dict[str, int]:
    """Every regular file's content digest -> how many copies exist (so moves are fine, losses are not)."""
    seen: dict[str, int] = {}
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            seen[digest] = seen.get(digest, 0) + 1
    return seen


def _ingest_hostile(specs: Spec) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ws = make_workspace(Path(tmp) / "ws", {})
        fcop = ws.root / "fcop"
        written: dict[Path, bytes] = {}
        for folder, name, (what, data) in specs:
            path = fcop / folder / name
            if os.path.lexists(path):
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            if what == "file":
                path.write_bytes(data)
                written[path] = data
            elif what == "fifo":
                os.mkfifo(path)
            else:
                path.symlink_to(Path(tmp) / "elsewhere")
        c = coordinator(ws)
        c.run_once()  # must not raise
        c.run_once()  # and a second pass finds nothing new to do
        assert sum(p.progress for p in c.run_once()) == 0
        surviving = _all_bytes(ws.root)
        for path, data in written.items():
            name = parse_filename(path.name)
            if name is not None and c.kernel.task(name.id) is not None and name.kind.value == "TASK":
                continue  # taken in: the projection owns this file now (body kept, transitions appended)
            assert surviving.get(hashlib.sha256(data).hexdigest()), f"content of {path.name!r} was lost"
        q = fcop / "_quarantine"
        for moved in (q.iterdir() if q.is_dir() else []):
            if not moved.name.endswith(".reason.md"):
                assert moved.with_name(moved.name + ".reason.md").is_file() or any(
                    p.name.startswith(moved.name) and p.name.endswith(".reason.md") for p in q.iterdir())


@settings(_BASE, max_examples=40)
@given(file_specs)
def test_hostile_files_never_stop_ingest(specs: Spec) -> None:
    _ingest_hostile(specs)


@pytest.mark.soak
@settings(_BASE, max_examples=1500)
@given(file_specs)
def test_soak_hostile_files_never_stop_ingest(specs: Spec) -> None:
    _ingest_hostile(specs)
