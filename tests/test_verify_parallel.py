"""`verify`'s parallel proof (kernel/verify_parallel.py, issue 29 goal 2): a sound store is proven by worker
processes over key ranges, and whatever is not plainly sound — every tamper the sequential checks find, an error, a
snapshot another command moved — goes to the sequential checks, so the report is the one they give, word for word.

Workers are forked, which only a process without threads may do (a pytest worker has some), so each proof runs in
a process of its own (``PROVE``), with the threshold and range size lowered so that a small store is cut into many
ranges of every kind."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from taskkernel.kernel import verify_parallel
from taskkernel.kernel.commands import TaskCommandKernel
from taskkernel.kernel.model.principal import LOCAL_OWNER, Principal
from taskkernel.kernel.store.db import Database
from taskkernel.kernel.store.schema import metadata
from taskkernel.roles.registry import RoleRegistry

PM = Principal("PM", "pm-agent")
KEY = os.urandom(32)

# argv: database URL, chain key (hex), mode. Prints {"proven": …, "sequential": report, "parallel": report}.
# mode "alone": the sequential checks may not run for the parallel report; "late": a command commits once the
# parent has read its snapshot, before the workers read theirs.
PROVE = """
import json, sys
import taskkernel.kernel.verify as verify_module
from taskkernel.kernel import verify_parallel
from taskkernel.kernel.commands import TaskCommandKernel
from taskkernel.kernel.model.principal import LOCAL_OWNER
from taskkernel.kernel.store.db import Database
from taskkernel.kernel.verify import verify
from taskkernel.roles.registry import RoleRegistry

verify_parallel.PARALLEL_FROM, verify_parallel.SPAN = 0, 7
url, key, mode = sys.argv[1], bytes.fromhex(sys.argv[2]), sys.argv[3]
db = Database(url, "process", chain_key=key)
kernel = TaskCommandKernel(db, RoleRegistry.for_team("PM", ["PM", "DEV"], load_plugins=False))
ranges = verify_parallel._ranges


def commit_meanwhile(con, end):
    r = kernel.submit({"type": "create_task", "idempotency_key": "late", "payload": {
        "sender": "ADMIN", "recipient": "PM", "subject": "late", "body": "x"}}, LOCAL_OWNER)
    assert r.status == "accepted", r
    return ranges(con, end)


verify_parallel._ranges = commit_meanwhile if mode == "late" else ranges
out = {"proven": verify_parallel.prove_in_parallel(db, kernel.store, 2) is not None}
verify_parallel._ranges = ranges
out["sequential"] = verify(db, kernel.store, workers=1).as_json()
if mode == "alone":
    def not_called(*_):
        raise AssertionError("the sequential checks ran")
    verify_module._verify = not_called
out["parallel"] = verify(db, kernel.store, workers=2).as_json()
print(json.dumps(out))
"""


def prove(path: Path, mode: str = "") -> dict[str, Any]:
    r = subprocess.run([sys.executable, "-c", PROVE, f"sqlite:///{path}", KEY.hex(), mode], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout))


def submit(kernel: TaskCommandKernel, kind: str, key: str, task: str | None = None, who: Principal = LOCAL_OWNER,
           **payload: Any) -> str:
    cmd: dict[str, Any] = {"type": kind, "idempotency_key": key, "payload": payload}
    if task is not None:
        doc = kernel.task(task)
        assert doc is not None
        cmd.update(task_id=task, thread_key=doc["thread_key"], expected_revision=doc["revision"], round=doc["round"])
    r = kernel.submit(cmd, who)
    assert r.status == "accepted", r
    return str(r.task_id)


def build(path: Path, tasks: int = 12) -> tuple[Database, TaskCommandKernel]:
    db = Database(f"sqlite:///{path}", "process", chain_key=KEY)
    db.create_schema(metadata)
    kernel = TaskCommandKernel(db, RoleRegistry.for_team("PM", ["PM", "DEV"], load_plugins=False))
    for i in range(tasks):
        tid = submit(kernel, "create_task", f"c{i}", sender="ADMIN", recipient="PM", subject=f"task {i}",
                     body="do it")
        if i % 3:
            submit(kernel, "claim", f"a{i}", tid, PM)
        if i % 3 == 2:
            submit(kernel, "submit_report", f"r{i}", tid, PM, status="done", body="done")
            submit(kernel, "submit", f"s{i}", tid, PM)
    return db, kernel


def test_a_sound_store_is_proven_by_the_workers_alone(tmp_path: Path) -> None:
    build(tmp_path / "s.db")
    out = prove(tmp_path / "s.db", "alone")
    assert out["proven"] and out["parallel"] == out["sequential"]
    assert out["sequential"]["status"] == "ok" and out["sequential"]["tasks"] == 12
    ranges = verify_parallel._ranges(sqlite3.connect(tmp_path / "s.db"), out["sequential"]["events"])
    assert {kind for kind, _, _ in ranges} == {"chain", "receipts", "streams"}


def sql(*statements: str) -> Callable[[sqlite3.Connection], None]:
    def run(con: sqlite3.Connection) -> None:
        for s in statements:
            con.execute(s)
    return run


TAMPERS: dict[str, Callable[[sqlite3.Connection], None]] = {
    "event data edited": sql("UPDATE events SET data = replace(data, 'task 4', 'task X') WHERE global_pos = 9"),
    "middle event deleted": sql("DELETE FROM events WHERE global_pos = 8"),
    "newest event deleted": sql("DELETE FROM events WHERE global_pos = (SELECT max(global_pos) FROM events)"),
    "head row rewritten": sql("UPDATE store_meta SET value = '3 x y' WHERE name = 'head'"),
    "chain record removed": sql("DELETE FROM store_meta WHERE name = 'chain'"),
    "task document edited": sql("UPDATE tasks SET doc = replace(doc, 'do it', 'done') WHERE rowid = 5"),
    "task column edited": sql("UPDATE tasks SET state = 'done' WHERE rowid = 7"),
    "task row deleted": sql("DELETE FROM tasks WHERE rowid = 3"),
    "task row ahead": sql("UPDATE tasks SET last_pos = last_pos + 1000 WHERE rowid = 2"),
    "task row without events": sql("INSERT INTO tasks SELECT 'TASK-20300101-001', state, revision, round, parent, "
                                   "root, recipient, doc, last_pos FROM tasks WHERE rowid = 1"),
    "receipt revision edited": sql("UPDATE receipts SET result = replace(result, '\"revision\":1', "
                                   "'\"revision\":7') WHERE rowid = 4"),
    "receipt past the end": sql("UPDATE receipts SET last_pos = 10000 WHERE rowid = 6"),
    "receipt of another command": sql("UPDATE receipts SET idempotency_key = idempotency_key || 'x' "
                                      "WHERE rowid = 8"),
    "event before position 1": sql("INSERT INTO events SELECT 0, stream_id, 99, event_type, schema_version, data, "
                                   "meta, recorded_at, hash FROM events WHERE global_pos = 1"),
}


@pytest.mark.parametrize("tamper", sorted(TAMPERS))
def test_every_tamper_goes_to_the_sequential_checks_and_reads_as_they_report_it(tmp_path: Path,
                                                                                tamper: str) -> None:
    build(tmp_path / "s.db")
    with sqlite3.connect(tmp_path / "s.db") as con:
        TAMPERS[tamper](con)
    out = prove(tmp_path / "s.db")
    assert not out["proven"] and out["parallel"] == out["sequential"]
    assert tamper == "event before position 1" or out["sequential"]["status"] == "broken", out["sequential"]


def test_a_damaged_file_is_reported_as_the_sequential_checks_report_it(tmp_path: Path) -> None:
    build(tmp_path / "s.db", tasks=40)[0].dispose()
    with open(tmp_path / "s.db", "r+b") as f:  # a page in the middle of the file: data, not the schema
        f.seek(os.path.getsize(tmp_path / "s.db") // 2)
        f.write(b"\xff" * 4096)
    out = prove(tmp_path / "s.db")
    assert not out["proven"] and out["parallel"] == out["sequential"]
    assert out["sequential"]["reason"] == "database_corrupt"


def test_a_command_committed_before_the_workers_read_sends_verify_to_the_sequential_checks(tmp_path: Path) -> None:
    """The workers read their own snapshots: one that is not the parent's (another command's head) is never
    combined with the parent's figures."""
    build(tmp_path / "s.db")
    out = prove(tmp_path / "s.db", "late")
    assert not out["proven"]
    assert out["parallel"] == out["sequential"] and out["sequential"]["tasks"] == 13


def test_small_stores_one_worker_and_threads_stay_sequential(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    db, kernel = build(tmp_path / "s.db", tasks=2)
    monkeypatch.setattr(verify_parallel, "PARALLEL_FROM", 0)
    assert verify_parallel.prove_in_parallel(db, kernel.store, 1) is None
    monkeypatch.setattr(verify_parallel.threading, "active_count", lambda: 2)
    assert verify_parallel.prove_in_parallel(db, kernel.store, 2) is None
    monkeypatch.setattr(verify_parallel, "PARALLEL_FROM", 1000)
    monkeypatch.setattr(verify_parallel.threading, "active_count", lambda: 1)
    assert verify_parallel.prove_in_parallel(db, kernel.store, 2) is None


def test_a_range_holds_one_task_at_a_time(tmp_path: Path) -> None:
    """Memory follows a task, not the range: tracing the allocations of one range over every stream, every
    position and every receipt, four times the tasks peak no higher (deterministic, unlike a process's RSS)."""

    def peak(tasks: int) -> int:
        db, kernel = build(tmp_path / f"{tasks}.db", tasks)
        con = sqlite3.connect(tmp_path / f"{tasks}.db", isolation_level=None)
        end = con.execute("SELECT max(global_pos) FROM events").fetchone()[0]
        with db.snapshot() as conn:
            key_and_start = verify_parallel._sound_chain(db, conn)
        assert key_and_start is not None
        job = verify_parallel._Job(db, kernel.store, *key_and_start, end, ())
        tracemalloc.start()
        try:
            assert verify_parallel._streams_hold(con, kernel.store, "task:", "task;") == tasks
            assert verify_parallel._chain_holds(con, job, 1, end + 1)
            assert verify_parallel._receipts_hold(con, end, 0, end * 2)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    small, large = peak(15), peak(60)
    assert large < small * 1.25 + 16_384, (small, large)
