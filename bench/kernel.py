"""Kernel throughput against raw sqlite3 writing the same rows, measured in the same run.

    python bench/kernel.py [--n 3000] [--durability full|process] [--quick]

Prints accepted commands/s (variants alternate in chunks so disk noise hits them alike)
for (a) raw sqlite3, one transaction per command, inserting the
same rows (event, receipt, task row) with the same pragmas; (b) TaskCommandKernel sequentially
(full validation, receipt, events, projection, commit) with the keyed HMAC chain workspaces use, and
(b') the same with the legacy unkeyed chain, to show what the key costs; (c) 8 concurrent submitters
through the group committer; and (d) projection rebuild speed over 100k events. Ratios are against (a).
Also the event store alone (``store_append_per_s``: Database.write + EventStore.append, keyed, 1 and 64 events
per transaction), where the sealed chain head's per-transaction cost shows (one read and one UPDATE of the head
row; ``head_us``: the CPU part, checking and re-sealing it).
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
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from taskkernel.kernel.canonical import canonical_json, sha256_hex, utc_now_iso  # noqa: E402
from taskkernel.kernel.commands import TaskCommandKernel  # noqa: E402
from taskkernel.kernel.groupcommit import GroupCommitter  # noqa: E402
from taskkernel.kernel.model.principal import LOCAL_OWNER  # noqa: E402
from taskkernel.kernel.projections import rebuild_tasks  # noqa: E402
from taskkernel.kernel.store.chain import ChainHead, ChainKey, legacy_link  # noqa: E402
from taskkernel.kernel.store.db import Database  # noqa: E402
from taskkernel.kernel.store.events import EventStore, NewEvent  # noqa: E402
from taskkernel.kernel.store.schema import metadata  # noqa: E402
from taskkernel.roles.registry import RoleRegistry  # noqa: E402


def create_cmd(i: int, prefix: str) -> dict:
    return {"type": "create_task", "idempotency_key": f"{prefix}-{i}",
            "payload": {"sender": "ADMIN", "recipient": "PM", "subject": f"task {i}", "body": "do the thing"}}


def fresh_db(tmp: Path, name: str, durability: str, keyed: bool = True) -> Database:
    db = Database(f"sqlite:///{tmp / name}", durability, chain_key=os.urandom(32) if keyed else None)
    db.create_schema(metadata)
    return db


class RawBaseline:
    """Same schema, same rows, plain sqlite3, one transaction per command."""

    def __init__(self, tmp: Path, durability: str) -> None:
        fresh_db(tmp, "raw.db", durability).dispose()
        self.con = sqlite3.connect(tmp / "raw.db", isolation_level=None)
        self.con.execute("PRAGMA journal_mode=WAL")
        self.con.execute(f"PRAGMA synchronous={'FULL' if durability == 'full' else 'NORMAL'}")
        self.prev, self.i = "0" * 64, 0

    def run(self, n: int) -> None:
        con = self.con
        for _ in range(n):
            i = self.i = self.i + 1
            tid = f"TASK-20260101-{i:03d}"
            doc = canonical_json({"task_id": tid, "subject": f"task {i}", "state": "inbox", "revision": 1})
            data, meta, at = canonical_json(create_cmd(i, "raw")["payload"]), "{}", utc_now_iso()
            h = sha256_hex(self.prev + data)
            con.execute("BEGIN IMMEDIATE")
            con.execute("INSERT INTO events VALUES (?, ?, 1, 'task_created', 1, ?, ?, ?, ?)",
                        (i, f"task:{tid}", data, meta, at, h))
            con.execute("INSERT INTO receipts VALUES (?, 'create_task', ?, 'ADMIN', ?, '{}', ?, ?, ?)",
                        (f"raw-{i}", h, tid, i, i, at))
            con.execute("INSERT INTO tasks VALUES (?, 'inbox', 1, 0, NULL, ?, 'PM', ?, ?)", (tid, tid, doc, i))
            con.execute("COMMIT")
            self.prev = h


def make_kernel(db: Database) -> TaskCommandKernel:
    return TaskCommandKernel(db, RoleRegistry.for_team("PM", ["PM", "DEV", "QA", "OPS"], load_plugins=False))


class Sequential:
    def __init__(self, tmp: Path, durability: str, keyed: bool = True) -> None:
        self.kernel = make_kernel(fresh_db(tmp, f"seq-{keyed}.db", durability, keyed))
        self.i = 0

    def run(self, n: int) -> None:
        for _ in range(n):
            self.i += 1
            assert self.kernel.submit(create_cmd(self.i, "seq"), LOCAL_OWNER).status == "accepted"


class Grouped:
    """`submitters` threads submitting concurrently through the group committer."""

    def __init__(self, tmp: Path, durability: str, submitters: int = 8) -> None:
        self.gc = GroupCommitter(make_kernel(fresh_db(tmp, "group.db", durability)))
        self.submitters, self.i = submitters, 0

    def run(self, n: int) -> None:
        per = n // self.submitters
        base = self.i
        self.i += per * self.submitters

        def work(w: int) -> None:
            for k in range(per):
                assert self.gc.submit(create_cmd(base + w * per + k, "grp"), LOCAL_OWNER).status == "accepted"

        threads = [threading.Thread(target=work, args=(w,)) for w in range(self.submitters)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def interleaved(runners: dict[str, Any], n: int, rounds: int) -> dict[str, float]:
    """Run the variants in alternating chunks so disk noise hits them alike; returns commands/s each."""
    spent = dict.fromkeys(runners, 0.0)
    done = dict.fromkeys(runners, 0)
    chunk = max(8, n // rounds)
    for _ in range(rounds):
        for name, runner in runners.items():
            t0 = time.perf_counter()
            runner.run(chunk)
            spent[name] += time.perf_counter() - t0
            done[name] += chunk - (chunk % 8 if name == "group" else 0)
    return {name: done[name] / spent[name] for name in runners}


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


def link_us(link: Any, n: int = 20_000) -> float:
    """Microseconds per chain link over a typical event (the only per-event work the key adds)."""
    data, meta = canonical_json(create_cmd(1, "l")["payload"]), canonical_json({"actor": "ADMIN:owner"})
    start = time.perf_counter()
    for i in range(n):
        link("0" * 64, i, "task:TASK-20260101-001", 1, "task_created", 3, data, meta, "2026-01-01T00:00:00Z")
    return (time.perf_counter() - start) / n * 1e6


def store_append_per_s(tmp: Path, per_txn: int, events: int, durability: str, run: int) -> float:
    """Events/s through the event store alone: one write transaction per ``per_txn`` appends, keyed chain."""
    db = fresh_db(tmp, f"append-{per_txn}-{run}.db", durability)
    store = EventStore()
    data, meta = create_cmd(1, "a")["payload"], {"actor": "ADMIN:owner"}
    version = 0
    start = time.perf_counter()
    for _ in range(events // per_txn):
        with db.write() as uow:
            for _ in range(per_txn):
                store.append(uow, "task:TASK-20260101-001", version, [NewEvent("task_amended", data)], meta,
                             verified_version=True)
                version += 1
    elapsed = time.perf_counter() - start
    db.dispose()
    return version / elapsed


def head_us(n: int = 20_000) -> float:
    """Microseconds of CPU per write transaction for the chain head: decode and check it, then re-seal it."""
    key = ChainKey(os.urandom(32))
    text = ChainHead(41, "a" * 64, key.head_seal(41, "a" * 64)).encode()
    start = time.perf_counter()
    for i in range(n):
        head = ChainHead.decode(text)
        assert head is not None and head.sealed_by(key.head_seal)
        f"{i} {head.hash} {key.head_seal(i, head.hash)}"  # noqa: B018 - what Chain.seal_head formats
    return (time.perf_counter() - start) / n * 1e6


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
        runners = {"raw": RawBaseline(tmp, args.durability), "seq": Sequential(tmp, args.durability),
                   "seq_legacy": Sequential(tmp, args.durability, keyed=False), "group": Grouped(tmp, args.durability)}
        rates = interleaved(runners, args.n, rounds=10)
        runners["group"].gc.close()
        raw, seq, legacy, grp = rates["raw"], rates["seq"], rates["seq_legacy"], rates["group"]
        rebuild = bench_rebuild(tmp, args.events)
        appends = {f"{k}_per_txn": round(max(store_append_per_s(tmp, k, args.n * 2, args.durability, run)
                                             for run in range(3)))  # best of 3: the least disturbed run
                   for k in (1, 64)}
    result = {"durability": args.durability, "commands": args.n,
              "raw_sqlite3_per_s": round(raw), "kernel_sequential_per_s": round(seq),
              "kernel_sequential_legacy_chain_per_s": round(legacy),
              "hmac_chain_cost": round(legacy / seq - 1, 3),  # relative slowdown of the keyed chain
              "link_us": {"hmac_sha256": round(link_us(ChainKey(os.urandom(32)).link), 2),
                          "sha256": round(link_us(legacy_link), 2)},
              "kernel_group_commit_8_per_s": round(grp),
              "store_append_per_s": appends, "head_us": round(head_us(), 2),
              "ratio_sequential": round(seq / raw, 3), "ratio_group_commit": round(grp / raw, 3),
              "rebuild_events_per_s": round(rebuild),
              "targets": {"ratio_sequential": 0.5, "ratio_group_commit": 1.0, "rebuild_events_per_s": 100_000}}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
