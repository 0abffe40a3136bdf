"""Kernel throughput against raw sqlite3 writing the same rows, measured in the same run.

    python bench/kernel.py [--n 3000] [--durability full|process] [--quick]

Prints accepted commands/s for (a) raw sqlite3, one transaction per command, inserting the
same rows (event, receipt, task row) with the same pragmas; (b) TaskCommandKernel sequentially
(full validation, receipt, events, projection, commit); (c) 8 concurrent submitters through the
group committer; and (d) projection rebuild speed over 100k events. Ratios are against (a).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kernel.canonical import canonical_json, sha256_hex, utc_now_iso  # noqa: E402
from kernel.commands import TaskCommandKernel  # noqa: E402
from kernel.groupcommit import GroupCommitter  # noqa: E402
from kernel.model.principal import LOCAL_OWNER  # noqa: E402
from kernel.projections import rebuild_tasks  # noqa: E402
from kernel.store.db import Database  # noqa: E402
from kernel.store.schema import metadata  # noqa: E402
from roles.registry import RoleRegistry  # noqa: E402


def create_cmd(i: int, prefix: str) -> dict:
    return {"type": "create_task", "idempotency_key": f"{prefix}-{i}",
            "payload": {"sender": "ADMIN", "recipient": "PM", "subject": f"task {i}", "body": "do the thing"}}


def fresh_db(tmp: Path, name: str, durability: str) -> Database:
    db = Database(f"sqlite:///{tmp / name}", durability)
    db.create_schema(metadata)
    return db


def bench_raw(tmp: Path, n: int, durability: str) -> float:
    """Same schema, same rows, plain sqlite3, one transaction per command."""
    path = tmp / "raw.db"
    fresh_db(tmp, "raw.db", durability).dispose()
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute(f"PRAGMA synchronous={'FULL' if durability == 'full' else 'NORMAL'}")
    prev = "0" * 64
    start = time.perf_counter()
    for i in range(n):
        tid = f"TASK-20260101-{i + 1:03d}"
        doc = canonical_json({"task_id": tid, "subject": f"task {i}", "state": "inbox", "revision": 1})
        data, meta, at = canonical_json(create_cmd(i, "raw")["payload"]), "{}", utc_now_iso()
        h = sha256_hex(prev + data)
        con.execute("BEGIN IMMEDIATE")
        con.execute("INSERT INTO events VALUES (?, ?, 1, 'task_created', 1, ?, ?, ?, ?)",
                    (i + 1, f"task:{tid}", data, meta, at, h))
        con.execute("INSERT INTO receipts VALUES (?, 'create_task', ?, 'ADMIN', ?, '{}', ?, ?, ?)",
                    (f"raw-{i}", h, tid, i + 1, i + 1, at))
        con.execute("INSERT INTO tasks VALUES (?, 'inbox', 1, 0, NULL, ?, 'PM', ?, ?)", (tid, tid, doc, i + 1))
        con.execute("COMMIT")
        prev = h
    elapsed = time.perf_counter() - start
    con.close()
    return n / elapsed


def make_kernel(db: Database) -> TaskCommandKernel:
    return TaskCommandKernel(db, RoleRegistry.for_team("PM", ["PM", "DEV", "QA", "OPS"], load_plugins=False))


def bench_sequential(tmp: Path, n: int, durability: str) -> float:
    kernel = make_kernel(fresh_db(tmp, "seq.db", durability))
    start = time.perf_counter()
    for i in range(n):
        assert kernel.submit(create_cmd(i, "seq"), LOCAL_OWNER).status == "accepted"
    return n / (time.perf_counter() - start)


def bench_group(tmp: Path, n: int, durability: str, submitters: int = 8) -> float:
    kernel = make_kernel(fresh_db(tmp, "group.db", durability))
    per = n // submitters
    with GroupCommitter(kernel) as gc:
        def run(worker: int) -> None:
            for i in range(per):
                assert gc.submit(create_cmd(worker * per + i, "grp"), LOCAL_OWNER).status == "accepted"

        threads = [threading.Thread(target=run, args=(w,)) for w in range(submitters)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - start
    return per * submitters / elapsed


def bench_rebuild(tmp: Path, events: int) -> float:
    """Rebuild task projections from `events` events (creates, claims and reports)."""
    db = fresh_db(tmp, "rebuild.db", "process")
    kernel = make_kernel(db)
    tasks = events // 5
    with GroupCommitter(kernel, max_batch=512) as gc:
        def load(offset: int, count: int) -> None:
            for i in range(offset, offset + count):
                r = gc.submit(create_cmd(i, "rb"), LOCAL_OWNER)
                tid = r.task_id
                gc.submit({"type": "claim", "task_id": tid, "thread_key": tid, "expected_revision": 1, "round": 0,
                           "idempotency_key": f"rbc-{i}"}, LOCAL_OWNER)
                for j in range(3):
                    gc.submit({"type": "submit_report", "task_id": tid, "thread_key": tid,
                               "expected_revision": 2 + j, "round": 1, "idempotency_key": f"rbr-{i}-{j}",
                               "payload": {"status": "in_progress", "body": "x" * 40}}, LOCAL_OWNER)
        threads = [threading.Thread(target=load, args=(k * tasks // 8, tasks // 8)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    with db.read() as conn:
        total = conn.exec_driver_sql("SELECT count(*) FROM events").scalar()
        start = time.perf_counter()
        docs, _ = rebuild_tasks(kernel.store, conn)
        elapsed = time.perf_counter() - start
    assert len(docs) == tasks
    return total / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--durability", choices=["full", "process"], default="full")
    ap.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    args = ap.parse_args()
    if args.quick:
        args.n, args.events = 400, 5000
    with tempfile.TemporaryDirectory(dir=os.environ.get("TASKKERNEL_BENCH_DIR")) as d:
        tmp = Path(d)
        raw = bench_raw(tmp, args.n, args.durability)
        seq = bench_sequential(tmp, args.n, args.durability)
        grp = bench_group(tmp, args.n, args.durability)
        rebuild = bench_rebuild(tmp, args.events)
    result = {"durability": args.durability, "commands": args.n,
              "raw_sqlite3_per_s": round(raw), "kernel_sequential_per_s": round(seq),
              "kernel_group_commit_8_per_s": round(grp),
              "ratio_sequential": round(seq / raw, 3), "ratio_group_commit": round(grp / raw, 3),
              "rebuild_events_per_s": round(rebuild),
              "targets": {"ratio_sequential": 0.5, "ratio_group_commit": 1.0, "rebuild_events_per_s": 100_000}}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
