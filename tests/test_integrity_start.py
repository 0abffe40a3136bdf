"""A database `verify` calls corrupt is never written to as if it were healthy (docs/cli.md, "Start-up integrity
check"): `up`, `up --once` and every CLI writer run SQLite's quick_check before they write and stop with the
rejection ``database_corrupt`` (exit 2), leaving the file as it was; `doctor` fails its database check.

The damage is one page overwritten in the middle of the file (as tests/test_security_store.py damages it): the
file still opens, and a command that never reads that page would otherwise carry on."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.cli_support import Run, run, taskkernel
from tests.test_security_store import workspace_with_tasks


def fingerprint(root: Path) -> dict[str, str]:
    """The database and its side files, as bytes: what a refused writer must leave alone."""
    state = root / ".taskkernel"
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(state.glob("kernel.db*"))}


@pytest.fixture(scope="module")
def damaged(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    root = tmp_path_factory.mktemp("integrity") / "ws"
    ids = workspace_with_tasks(root, 60)
    db_file = root / ".taskkernel" / "kernel.db"
    at = db_file.read_bytes().find(b"task 30")  # a page of table rows, never the schema's (whatever tables exist)
    assert at > 0
    with open(db_file, "r+b") as fh:
        fh.seek(at // 4096 * 4096)
        fh.write(b"\xff" * 4096)
    assert run("verify", cwd=root).json["reason"] == "database_corrupt"
    return root, ids


WRITERS: dict[str, tuple[str, ...]] = {
    "up --once": ("up", "--once"),
    "task create": ("task", "create", "--to", "PM", "--subject", "after the damage"),
    "task claim": ("task", "claim", "{first}"),
    "submit": ("submit",),
    "session accept": ("session", "accept", "notes", "--kind", "message", "--input-id", "i1", "--payload",
                       '{"text": "hello"}'),
    "token issue": ("token", "issue", "DEV"),
    "schedule pause": ("schedule", "pause", "nightly"),
}


@pytest.mark.parametrize("name", WRITERS)
def test_a_writer_stops_on_a_damaged_database_and_writes_nothing(damaged: tuple[Path, list[str]], name: str) -> None:
    root, ids = damaged
    before = fingerprint(root)
    command = {"type": "claim", "task_id": ids[0], "thread_key": ids[0], "expected_revision": 1, "round": 0,
               "idempotency_key": "after-damage", "payload": {}}
    args = [a.replace("{first}", ids[0]) for a in WRITERS[name]]
    proc = taskkernel(*args, cwd=root, stdin=json.dumps(command))
    r = Run(proc.returncode, proc.stdout, proc.stderr)
    assert (r.code, r.json["status"], r.json["reason"]) == (2, "rejected", "database_corrupt"), (r.out, r.err)
    assert "quick_check" in r.json["message"] and r.json["problems"], r.json
    assert r.err.startswith("rejected database_corrupt:") and "Traceback" not in r.err, r.err
    assert fingerprint(root) == before


def test_doctor_fails_the_database_check_of_a_damaged_database(damaged: tuple[Path, list[str]]) -> None:
    root, _ = damaged
    r = run("doctor", cwd=root)
    assert (r.code, r.json["status"]) == (2, "unhealthy"), r.out
    database = next(c for c in r.json["checks"] if c["name"] == "database")
    assert (database["status"], database["reason"]) == ("fail", "database_corrupt"), database
    assert "quick_check" in database["message"] and database["problems"], database
    assert "Traceback" not in r.err


def test_an_intact_database_passes_the_check(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    ids = workspace_with_tasks(root, 3)
    r = run("task", "claim", ids[0], cwd=root)
    assert (r.code, r.json["status"]) == (0, "accepted"), (r.out, r.err)
    database = next(c for c in run("doctor", cwd=root).json["checks"] if c["name"] == "database")
    assert database["status"] == "ok" and "intact" in database["message"], database
