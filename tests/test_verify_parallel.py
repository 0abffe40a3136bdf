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
from taskkernel.kernel.store.events import NewEvent
from taskkernel.kernel.store.schema import metadata
from taskkernel.roles.registry import RoleRegistry

PM = Principal("PM", "pm-agent")
KEY = os.urandom(32)

# argv: database URL, chain key (hex; empty: none), mode, range size. Prints {"proven": …, "sequential": report,
# "parallel": report, "integrity_checks": how often the parallel verify ran the integrity check}.
# mode "alone": the sequential checks may not run for the parallel report; "late": a command commits once the
# parent has read its snapshot, before the workers read theirs; "kill": the worker handed the last range of task
# streams is SIGKILLed. The address space is bounded (1 GiB): what would grow with a key span fails fast.
PROVE = """
import json, os, resource, signal, sys
import taskkernel.kernel.verify as verify_module
from taskkernel.kernel import verify_parallel
from taskkernel.kernel.commands import TaskCommandKernel
from taskkernel.kernel.model.principal import LOCAL_OWNER
from taskkernel.kernel.store.db import Database
from taskkernel.kernel.store.events import NewEvent
from taskkernel.kernel.verify import verify
from taskkernel.roles.registry import RoleRegistry

resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
url, key, mode, span = sys.argv[1], bytes.fromhex(sys.argv[2]) or None, sys.argv[3], int(sys.argv[4])
verify_parallel.PARALLEL_FROM, verify_parallel.SPAN = 0, span
db = Database(url, "process", chain_key=key)
kernel = TaskCommandKernel(db, RoleRegistry.for_team("PM", ["PM", "DEV"], load_plugins=False))
sound_chain, streams_hold, parent = verify_parallel._sound_chain, verify_parallel._streams_hold, os.getpid()


def commit_meanwhile(*args):
    r = kernel.submit({"type": "create_task", "idempotency_key": "late", "payload": {
        "sender": "ADMIN", "recipient": "PM", "subject": "late", "body": "x"}}, LOCAL_OWNER)
    assert r.status == "accepted", r
    return sound_chain(*args)


def killed_on_the_last_range(con, store, lo, hi):
    if hi == verify_parallel._STREAM_END and os.getpid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)
    return streams_hold(con, store, lo, hi)


verify_parallel._sound_chain = commit_meanwhile if mode == "late" else sound_chain
verify_parallel._streams_hold = killed_on_the_last_range if mode == "kill" else streams_hold
out = {"proven": verify_parallel.prove_in_parallel(db, kernel.store, 2) is not None}
verify_parallel._sound_chain = sound_chain
out["sequential"] = verify(db, kernel.store, workers=1).as_json()
if mode == "alone":
    def not_called(*_):
        raise AssertionError("the sequential checks ran")
    verify_module._verify = not_called
integrity, checks = db.integrity_problems, []
db.integrity_problems = lambda: checks.append(1) or integrity()
out["parallel"] = verify(db, kernel.store, workers=2).as_json()
out["integrity_checks"] = len(checks)
print(json.dumps(out))
"""


def prove(path: Path, mode: str = "", span: int = 7, key: bytes | None = KEY, timeout: float = 300) -> dict[str, Any]:
    r = subprocess.run([sys.executable, "-c", PROVE, f"sqlite:///{path}", (key or b"").hex(), mode, str(span)],
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout.splitlines()[-1]))  # after any log line (structlog unconfigured: stdout)


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


def build(path: Path, tasks: int = 12, key: bytes | None = KEY) -> tuple[Database, TaskCommandKernel]:
    """``tasks`` tasks of every lifecycle shape; after the eighth, eight events of a goal stream (not a task's: only
    the chain covers them), at positions 18 to 25, across the edge of two 7-position ranges (21 | 22)."""
    db = Database(f"sqlite:///{path}", "process", chain_key=key)
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
        if i == 7:
            with db.write() as uow:
                for n in range(8):
                    kernel.store.append_at_head(uow, "goal:g1", [NewEvent("goal_note", {"n": n})],
                                                {"actor": "kernel", "role": "SYSTEM", "command_id": f"g{n}"})
    return db, kernel


def test_a_sound_store_is_proven_by_the_workers_alone(tmp_path: Path) -> None:
    build(tmp_path / "s.db")
    out = prove(tmp_path / "s.db", "alone")
    assert out["proven"] and out["parallel"] == out["sequential"]
    assert out["sequential"]["status"] == "ok" and out["sequential"]["tasks"] == 12
    ranges = list(verify_parallel._ranges(sqlite3.connect(tmp_path / "s.db"), out["sequential"]["events"]))
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
    # only the chain sees these: the fold reads no meta, no hash, no other stream, and this recorded_at is a goal's
    "event meta edited, its command kept": sql("UPDATE events SET meta = '{\"a\":1,' || substr(meta, 2) "
                                               "WHERE global_pos = 10"),
    "event recorded_at edited": sql("UPDATE events SET recorded_at = '2001-01-01T00:00:00Z' WHERE global_pos = 19"),
    "task event recorded_at edited": sql("UPDATE events SET recorded_at = '2001-01-01T00:00:00Z' "
                                         "WHERE global_pos = 12"),
    "stored hash of a middle event edited": sql("UPDATE events SET hash = substr(hash, 2) || substr(hash, 1, 1) "
                                                "WHERE global_pos = 12"),
    "goal event edited, mid range": sql("UPDATE events SET data = '{\"n\":99}' WHERE global_pos = 19"),
    "goal event edited, last of a range": sql("UPDATE events SET data = '{\"n\":99}' WHERE global_pos = 21"),
    "goal event edited, first of a range": sql("UPDATE events SET data = '{\"n\":99}' WHERE global_pos = 22"),
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
    assert out["integrity_checks"] == 1  # the fallback takes the parallel proof's findings


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
    out = prove(tmp_path / "s.db", "late")  # committed after the parent's snapshot, before the forks
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


def test_a_worker_killed_on_the_last_range_sends_verify_to_the_sequential_checks_promptly(tmp_path: Path) -> None:
    """A worker that dies (SIGKILL, out of memory, a crash) owes an answer its process sentinel will never give:
    verify does not wait for it forever (the timeout fails the test), it runs the sequential checks."""
    build(tmp_path / "s.db")
    out = prove(tmp_path / "s.db", "kill", timeout=120)
    assert not out["proven"] and out["parallel"] == out["sequential"]
    assert out["sequential"]["status"] == "ok" and out["integrity_checks"] == 1


INTERRUPT = """
import json, os, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C as a shell gives it, whatever ran this one ignored
from taskkernel.kernel import verify_parallel
from taskkernel.kernel.commands import TaskCommandKernel
from taskkernel.kernel.store.db import Database
from taskkernel.roles.registry import RoleRegistry

verify_parallel.PARALLEL_FROM, verify_parallel.SPAN = 0, 7
db = Database(sys.argv[1], "process", chain_key=bytes.fromhex(sys.argv[2]))
kernel = TaskCommandKernel(db, RoleRegistry.for_team("PM", ["PM", "DEV"], load_plugins=False))
db.integrity_problems = lambda: time.sleep(40) or []  # a check of a large file, still running at Ctrl-C
streams_hold, parent = verify_parallel._streams_hold, os.getpid()


def interrupted(con, store, lo, hi):
    if hi == verify_parallel._STREAM_END:
        os.kill(parent, signal.SIGINT)
    return streams_hold(con, store, lo, hi)


verify_parallel._streams_hold = interrupted
start = time.monotonic()
try:
    verify_parallel.prove_in_parallel(db, kernel.store, 2)
    out = "returned"
except KeyboardInterrupt:
    out = "interrupted"
print(json.dumps({"out": out, "s": time.monotonic() - start}))
"""


def test_ctrl_c_does_not_wait_for_the_integrity_check(tmp_path: Path) -> None:
    build(tmp_path / "s.db")
    r = subprocess.run([sys.executable, "-c", INTERRUPT, f"sqlite:///{tmp_path / 's.db'}", KEY.hex()],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.splitlines()[-1])
    assert out["out"] == "interrupted" and out["s"] < 20, out


def test_a_receipt_rowid_far_from_the_others_costs_no_more_ranges(tmp_path: Path) -> None:
    """Receipt ranges are cut at stored rowids, not over min..max: a rowid near 2**63 (sound, by the sequential
    checks) neither exhausts memory (the proof runs in 1 GiB) nor stops the proof."""
    build(tmp_path / "s.db")
    with sqlite3.connect(tmp_path / "s.db") as con:
        con.execute("UPDATE receipts SET rowid = 9223372036854775000 WHERE rowid = 28")
    out = prove(tmp_path / "s.db", "alone")
    assert out["proven"] and out["parallel"] == out["sequential"] and out["sequential"]["status"] == "ok"
    ranges = list(verify_parallel._ranges(sqlite3.connect(tmp_path / "s.db"), out["sequential"]["events"]))
    assert [r for r in ranges if r[0] == "receipts"] == [("receipts", None, 9223372036854775000),
                                                         ("receipts", 9223372036854775000, None)]


RANGES = """
import resource, sqlite3, sys
from taskkernel.kernel import verify_parallel
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
try:
    print(len(list(verify_parallel._ranges(sqlite3.connect(sys.argv[1]), int(sys.argv[2])))))
except Exception as exc:
    print(type(exc).__name__)
"""


def test_a_legacy_store_with_an_event_far_past_the_others_is_not_cut_into_ranges(tmp_path: Path) -> None:
    """An unkeyed store (no head row required) whose log jumps to position 2**62: cutting the chain's ranges stops
    at the first that begins past a gap (rather than cutting 2**62 / SPAN of them), and the sequential checks report
    the gap."""
    build(tmp_path / "s.db", key=None)
    with sqlite3.connect(tmp_path / "s.db") as con:
        con.execute("INSERT INTO events SELECT 4611686018427387904, 'goal:far', 1, event_type, schema_version, data, "
                    "meta, recorded_at, hash FROM events WHERE global_pos = 18")
        con.execute("DELETE FROM store_meta WHERE name = 'head'")
    r = subprocess.run([sys.executable, "-c", RANGES, str(tmp_path / "s.db"), str(2**62)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "_NotProven", (r.stdout, r.stderr)
    out = prove(tmp_path / "s.db", key=None)
    assert not out["proven"] and out["parallel"] == out["sequential"]
    assert out["sequential"]["reason"] == "hash_chain", out["sequential"]


def test_several_tasks_share_a_stream_range(tmp_path: Path) -> None:
    """At 24 events a range, four tasks a stream range: a sound store is proven, a stored task no event backs in
    the middle of a range (between its second and third task) is not."""
    build(tmp_path / "s.db")
    with verify_range_size(24):
        ranges = list(verify_parallel._ranges(sqlite3.connect(tmp_path / "s.db"), 36))
    assert len([r for r in ranges if r[0] == "streams"]) == 3
    out = prove(tmp_path / "s.db", "alone", span=24)
    assert out["proven"] and out["sequential"]["status"] == "ok" and out["sequential"]["tasks"] == 12
    with sqlite3.connect(tmp_path / "s.db") as con:
        second = con.execute("SELECT task_id FROM tasks ORDER BY task_id LIMIT 1 OFFSET 1").fetchone()[0]
        con.execute("INSERT INTO tasks SELECT ? || 'a', state, revision, round, parent, root, recipient, doc, "
                    "last_pos FROM tasks WHERE task_id = ?", (second, second))
    out = prove(tmp_path / "s.db", span=24)
    assert not out["proven"] and out["parallel"] == out["sequential"] and out["sequential"]["status"] == "broken"


class verify_range_size:  # noqa: N801 - a context manager read as a phrase
    def __init__(self, span: int) -> None:
        self.span, self.saved = span, verify_parallel.SPAN

    def __enter__(self) -> None:
        verify_parallel.SPAN = self.span

    def __exit__(self, *_: object) -> None:
        verify_parallel.SPAN = self.saved


def test_receipts_are_read_with_the_sequential_checks_json(tmp_path: Path) -> None:
    """A receipt result orjson refuses (NaN) but json reads, sound by the sequential checks: proven all the same."""
    build(tmp_path / "s.db")
    with sqlite3.connect(tmp_path / "s.db") as con:
        con.execute("UPDATE receipts SET result = '{\"x\":NaN,' || substr(result, 2) WHERE rowid = 4")
    out = prove(tmp_path / "s.db", "alone")
    assert out["proven"] and out["parallel"] == out["sequential"] and out["sequential"]["status"] == "ok"


@pytest.mark.parametrize("text", ['{"revision": 18446744073709551617, "command_id": "c"}', '{"revision": NaN}',
                                  '{"revision": -9223372036854775809}', '{"revision": 1.0}', '{"revision": 3}',
                                  '{"command_id": "\\ud800"}', '[1]'])
def test_a_receipt_is_read_with_json_semantics(text: str) -> None:
    expected, read = json.loads(text), verify_parallel._receipt_loads(text)
    assert repr(read) == repr(expected) or (read != read and expected != expected)


def test_a_failure_of_the_proof_is_logged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db, kernel = build(tmp_path / "s.db", tasks=2)
    seen: list[tuple[str, str]] = []

    class Log:
        def info(self, event: str, **_: Any) -> None:
            seen.append(("info", event))

        def warning(self, event: str, **_: Any) -> None:
            seen.append(("warning", event))

    def fail(*_: Any) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(verify_parallel, "_log", Log())
    monkeypatch.setattr(verify_parallel.threading, "active_count", lambda: 1)
    monkeypatch.setattr(verify_parallel, "_prove", fail)
    assert verify_parallel.prove_in_parallel(db, kernel.store, 2) is None
    assert seen == [("warning", "verify_parallel_failed")]
