"""Kernel throughput against raw sqlite3 and the `eventsourcing` library on the same workload, in the same run.

    python bench/kernel.py [--n 3000] [--durability full|process] [--quick]

The workload is a task's whole lifecycle, six commands: create -> claim -> report (done) -> submit -> approve ->
archive (the driver DEV claims, reports and submits; ADMIN approves and archives). Variants alternate in chunks so
disk noise hits them alike:

(a) raw sqlite3 writing the same rows (event, receipt, task row) for each command, one transaction per command,
    same pragmas, a SHA-256 link per event, the task document held in memory (no read, no check): the floor;
(a8) the same with 8 threads, each with its own connection (it reads the chain's tail in its transaction);
(b) TaskCommandKernel sequentially (every check, receipt, events, keyed HMAC chain and sealed head, read model,
    commit), and (b') the same with the legacy unkeyed chain, to show what the key costs;
(c) 8 concurrent submitters through the group committer;
(a8c, cc) raw's 8 threads and the group committer's 8 submitters again on create-only commands (one create each):
    the workload issue 29 measured the group commit's 5x on, where the goal is kept; the lifecycle's ratio is
    reported beside it, without a target;
(e) `eventsourcing` 9.5.6 (its SQLite persistence) running an aggregate with the same six transitions;
(f) the kernel's own rows in plain sqlite3 (``KernelRows``): the read, HMAC link, head seal, receipt and document
    every accepted command writes, without a check: ``cpu_ratio_kernel_rows_vs_raw`` is what the design's record
    costs against raw's, ``cpu_ratio_vs_kernel_rows`` what the checks and the Python around them add.

CPU per command (``time.process_time``) is measured for the sequential variants; ``targets`` holds issue 29's goal
1 (kernel CPU per command against raw's, throughput against eventsourcing, group commit against raw's 8 threads on
create-only commands: ``group_vs_raw_8_threads``) next to the earlier ones; ``group_vs_raw_8_threads_lifecycle`` is
the same comparison on the lifecycle, each against its own baseline of the same run. Also projection rebuild speed
over 100k events, and the event store alone (``store_append_per_s``: Database.write + EventStore.append, keyed, 1
and 64 events per transaction), where the sealed chain head's per-transaction cost shows (``head_us``: the CPU
part, checking and re-sealing it).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from taskkernel.kernel.canonical import canonical_json, utc_now_iso  # noqa: E402
from taskkernel.kernel.commands import TaskCommandKernel  # noqa: E402
from taskkernel.kernel.groupcommit import GroupCommitter  # noqa: E402
from taskkernel.kernel.model.principal import LOCAL_OWNER, Principal  # noqa: E402
from taskkernel.kernel.projections import rebuild_tasks  # noqa: E402
from taskkernel.kernel.store.chain import ChainHead, ChainKey, legacy_link  # noqa: E402
from taskkernel.kernel.store.db import Database  # noqa: E402
from taskkernel.kernel.store.events import EventStore, NewEvent  # noqa: E402
from taskkernel.kernel.store.schema import metadata  # noqa: E402
from taskkernel.roles.registry import RoleRegistry  # noqa: E402

DEV = Principal("DEV", "dev-1")
STEPS = 6  # commands per lifecycle
# After the create: (command, expected revision, round, payload, who), then the event type and the state it leaves.
LIFECYCLE = (("claim", 1, 0, None, DEV, "task_claimed", "active"),
             ("submit_report", 2, 1, {"status": "done", "body": "did the thing"}, DEV, "report_submitted", "active"),
             ("submit", 3, 1, None, DEV, "task_submitted", "review"),
             ("approve", 4, 1, None, LOCAL_OWNER, "task_approved", "done"),
             ("archive", 5, 1, {"reason": "finished"}, LOCAL_OWNER, "task_archived", "archive"))


def create_cmd(i: int, prefix: str, recipient: str = "PM") -> dict:
    return {"type": "create_task", "idempotency_key": f"{prefix}-{i}",
            "payload": {"sender": "ADMIN", "recipient": recipient, "subject": f"task {i}", "body": "do the thing"}}


def kernel_lifecycle(submit: Callable[[dict, Principal], Any], i: int, prefix: str) -> None:
    """The six commands of one task through ``submit`` (the kernel's, or the group committer's)."""
    r = submit(create_cmd(i, prefix, "DEV"), LOCAL_OWNER)
    assert r.status == "accepted", r
    for kind, revision, round_, payload, who, _, _ in LIFECYCLE:
        r = submit({"type": kind, "task_id": r.task_id, "expected_revision": revision, "round": round_,
                    "idempotency_key": f"{prefix}-{kind}-{i}", **({"payload": payload} if payload else {})}, who)
        assert r.status == "accepted", r


def fresh_db(tmp: Path, name: str, durability: str, keyed: bool = True) -> Database:
    db = Database(f"sqlite:///{tmp / name}", durability, chain_key=os.urandom(32) if keyed else None)
    db.create_schema(metadata)
    return db


def make_kernel(db: Database) -> TaskCommandKernel:
    return TaskCommandKernel(db, RoleRegistry.for_team("PM", ["PM", "DEV", "QA", "OPS"], load_plugins=False))


def raw_rows(stream: str, version: int, kind: str, data: dict, key: str, doc: dict
             ) -> Callable[[int, str], tuple[str, list[tuple[str, tuple[Any, ...]]]]]:
    """What the raw baseline writes for one command, encoded before its transaction; called with the position
    and hash of the event before it (read in the transaction), it gives the new event's SHA-256 link and the
    statements (``?`` placeholders) for the event, the receipt and the task row (the document is held in memory)."""
    at = utc_now_iso()
    data_text = canonical_json(data)
    meta = canonical_json({"actor": "dev-1", "command_id": key, "command_type": kind, "recorded_at": at})
    result = canonical_json({"status": "accepted", "task_id": doc["task_id"], "revision": version})
    doc.update(revision=version, updated_at=at)

    def after(pos: int, prev: str) -> tuple[str, list[tuple[str, tuple[Any, ...]]]]:
        h = hashlib.sha256("\x1f".join((prev, str(pos + 1), stream, str(version), kind, data_text, meta, at))
                           .encode()).hexdigest()
        text = canonical_json(doc)
        task = (("INSERT INTO tasks VALUES (?, 'inbox', 1, 0, NULL, ?, 'DEV', ?, ?)",
                 (doc["task_id"], doc["task_id"], text, pos + 1)) if version == 1 else
                ("UPDATE tasks SET state = ?, revision = ?, round = ?, doc = ?, last_pos = ? WHERE task_id = ?",
                 (doc["state"], version, doc["round"], text, pos + 1, doc["task_id"])))
        return h, [("INSERT INTO events VALUES (?, ?, ?, ?, 1, ?, ?, ?, ?)",
                    (pos + 1, stream, version, kind, data_text, meta, at, h)),
                   ("INSERT INTO receipts VALUES (?, ?, ?, 'ADMIN', ?, ?, ?, ?, ?)",
                    (key, kind, h, doc["task_id"], result, pos + 1, pos + 1, at)), task]
    return after


class Raw:
    """Same schema, same rows as the kernel's lifecycle, plain sqlite3, one transaction per command, each of
    ``threads`` threads on its own connection (more than one: the chain's tail is read in each transaction)."""

    def __init__(self, tmp: Path, durability: str, threads: int = 1, create_only: bool = False,
                 label: str = "raw") -> None:
        path = tmp / f"{label}-{threads}{'-create' if create_only else ''}.db"
        self.steps = 1 if create_only else STEPS  # commands per unit of work
        fresh_db(tmp, path.name, durability).dispose()
        self.cons = [sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=60)
                     for _ in range(threads)]
        for con in self.cons:
            con.execute("PRAGMA journal_mode=WAL")
            con.execute(f"PRAGMA synchronous={'FULL' if durability == 'full' else 'NORMAL'}")
        self.tail, self.i, self.counter = (0, "0" * 64), 0, threading.Lock()

    def _next(self) -> int:
        with self.counter:
            self.i += 1
            return self.i

    def _commit(self, con: sqlite3.Connection, stream: str, version: int, kind: str, data: dict, key: str,
                doc: dict) -> None:
        rows = raw_rows(stream, version, kind, data, key, doc)
        con.execute("BEGIN IMMEDIATE")
        pos, prev = self.tail if len(self.cons) == 1 else con.execute(
            "SELECT global_pos, hash FROM events ORDER BY global_pos DESC LIMIT 1").fetchone() or (0, "0" * 64)
        h, statements = rows(pos, prev)
        for sql, params in statements:
            con.execute(sql, params)
        con.execute("COMMIT")
        self.tail = (pos + 1, h)

    def lifecycle(self, con: sqlite3.Connection) -> None:
        i = self._next()
        tid = f"TASK-20260101-{i:03d}"
        stream = f"task:{tid}"
        doc: dict[str, Any] = {"task_id": tid, "thread_key": tid, "parent": None, "root": tid, "sender": "ADMIN",
                               "recipient": "DEV", "subject": f"task {i}", "body": "do the thing", "priority": "P2",
                               "risk_level": "low", "references": [], "cost_tier": "standard", "budget": None,
                               "authority": {"driver": "DEV", "done_authority": "ADMIN", "archive_authority": "ADMIN"},
                               "state": "inbox", "round": 0, "reports": [], "blocked": None}
        self._commit(con, stream, 1, "task_created", {**doc, "by": "ADMIN:local-owner"}, f"raw-{i}", doc)
        if self.steps == 1:
            return
        for kind, revision, _, payload, who, event_type, state in LIFECYCLE:
            data = {"by": who.id, "from": doc["state"], "round": 1, **(payload or {})}
            if kind == "submit_report":
                doc["reports"].append({"report_id": f"{tid}/r1/1", "round": 1, "status": "done", "by": who.id})
            doc.update(state=state, round=1)
            self._commit(con, stream, revision + 1, event_type, data, f"raw-{kind}-{i}", doc)

    def run(self, units: int) -> None:
        _spread(units, [lambda con=con: self.lifecycle(con) for con in self.cons])


class KernelRows(Raw):
    """The floor of the kernel's own design, in plain sqlite3: every statement and digest an accepted command
    writes and no check may drop (issue 29, goal 1), and no check. Per command: the one read of receipt, task
    document and sealed head; the event (HMAC-SHA256 link), the task row (its document read back and decoded),
    the receipt (semantic digest, result JSON); the head row re-sealed (a second HMAC) -- the meta the kernel
    records (actor, role, causation, correlation). What is left between this and the kernel is the checks, the
    command's validation and the Python around them."""

    def __init__(self, tmp: Path, durability: str) -> None:
        super().__init__(tmp, durability, label="kernel-rows")
        self.key = ChainKey(os.urandom(32))
        self.head = ChainHead(0, "0" * 64, self.key.head_seal(0, "0" * 64)).encode()
        self.cons[0].execute("INSERT INTO store_meta (name, value) VALUES ('head', ?)", (self.head,))

    def _commit(self, con: sqlite3.Connection, stream: str, version: int, kind: str, data: dict, key: str,
                doc: dict) -> None:
        at = utc_now_iso()
        semantic = hashlib.sha256(canonical_json({"type": kind, "key": key, "data": data}).encode()).hexdigest()
        con.execute("BEGIN IMMEDIATE")
        _, _, text, head = con.execute(
            "SELECT r.semantic_digest, r.result, (SELECT doc FROM tasks WHERE task_id = ?), (SELECT value FROM "
            "store_meta WHERE name = 'head') FROM (SELECT 1) AS one LEFT JOIN receipts r ON r.idempotency_key = ?",
            (doc["task_id"], key)).fetchone()
        if text is not None:
            orjson.loads(text)
        pos, prev = self.tail
        if head != self.head:
            raise AssertionError("the head row changed under the floor")
        data_text = canonical_json(data)
        meta = canonical_json({"actor": "dev-1", "role": "DEV", "command_id": key, "command_type": kind,
                               "causation_id": key, "correlation_id": doc["root"], "recorded_at": at})
        h = self.key.link(prev, pos + 1, stream, version, kind, 1, data_text, meta, at)
        con.execute("INSERT INTO events VALUES (?, ?, ?, ?, 1, ?, ?, ?, ?)",
                    (pos + 1, stream, version, kind, data_text, meta, at, h))
        doc.update(revision=version, updated_at=at)
        text = canonical_json(doc)
        if version == 1:
            con.execute("INSERT INTO tasks VALUES (?, 'inbox', 1, 0, NULL, ?, 'DEV', ?, ?)",
                        (doc["task_id"], doc["task_id"], text, pos + 1))
        else:
            con.execute("UPDATE tasks SET state = ?, revision = ?, round = ?, recipient = ?, doc = ?, last_pos = ? "
                        "WHERE task_id = ?", (doc["state"], version, doc["round"], "DEV", text, pos + 1,
                                              doc["task_id"]))
        result = canonical_json({"status": "accepted", "message": f"{kind} accepted", "task_id": doc["task_id"],
                                 "revision": version, "round": doc["round"], "events": [pos + 1]})
        con.execute("INSERT INTO receipts VALUES (?, ?, ?, 'ADMIN:local-owner', ?, ?, ?, ?, ?)",
                    (key, kind, semantic, doc["task_id"], result, pos + 1, pos + 1, at))
        self.head = ChainHead(pos + 1, h, self.key.head_seal(pos + 1, h)).encode()
        con.execute("UPDATE store_meta SET value = ? WHERE name = 'head'", (self.head,))
        con.execute("COMMIT")
        self.tail = (pos + 1, h)


class Sequential:
    steps = STEPS

    def __init__(self, db: Database) -> None:
        self.kernel = make_kernel(db)
        self.i = 0

    def run(self, lifecycles: int) -> None:
        for _ in range(lifecycles):
            self.i += 1
            kernel_lifecycle(self.kernel.submit, self.i, "seq")


class Grouped:
    """`submitters` threads, each running its own tasks' lifecycles (or only creating tasks: ``create_only``),
    through the group committer."""

    def __init__(self, db: Database, submitters: int = 8, create_only: bool = False) -> None:
        self.gc = GroupCommitter(make_kernel(db))
        self.submitters, self.i, self.counter = submitters, 0, threading.Lock()
        self.steps = 1 if create_only else STEPS

    def lifecycle(self) -> None:
        with self.counter:
            self.i += 1
            i = self.i
        if self.steps == 1:
            r = self.gc.submit(create_cmd(i, "grc", "DEV"), LOCAL_OWNER)
            assert r.status == "accepted", r
        else:
            kernel_lifecycle(self.gc.submit, i, "grp")

    def run(self, units: int) -> None:
        _spread(units, [self.lifecycle] * self.submitters)


def _spread(units: int, workers: list[Callable[[], None]]) -> None:
    """``units`` units of work (lifecycles, or creates) shared among the workers (one thread each when there are
    several)."""
    if len(workers) == 1:
        for _ in range(units):
            workers[0]()
        return
    per = [units // len(workers) + (k < units % len(workers)) for k in range(len(workers))]
    threads = [threading.Thread(target=lambda w=w, n=n: [w() for _ in range(n)])
               for w, n in zip(workers, per, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


class EventSourcing:
    """`eventsourcing` 9.5.6 with its SQLite persistence: one aggregate per task, the same six transitions, each
    command a read of the aggregate's events (no snapshots) and one write transaction. Its SQLite connections use
    WAL and SQLite's default synchronous=FULL (its settings offer no other), whatever ``--durability`` says.
    What it checks: the aggregate's version (optimistic concurrency per aggregate) and the lifecycle edge of each
    transition. What it does not: no idempotency receipt, principal, authority, revision/round from the caller,
    keyed hash chain or sealed head, inline read model, outbox or payload limits."""

    steps = STEPS

    def __init__(self, tmp: Path) -> None:
        from eventsourcing.application import Application

        os.environ.pop("PERSISTENCE_MODULE", None)
        self.app = Application(env={"PERSISTENCE_MODULE": "eventsourcing.sqlite",
                                    "SQLITE_DBNAME": str(tmp / "eventsourcing.db")})
        self.task_class = _es_task_class()
        self.i = 0

    def lifecycle(self) -> None:
        self.i += 1
        app = self.app
        task = self.task_class(f"task {self.i}", "do the thing", "ADMIN", "DEV")
        app.save(task)
        for kind, _, _, payload, who, _, _ in LIFECYCLE:
            current = app.repository.get(task.id)
            getattr(current, kind)(who.id, **(payload or {}))
            app.save(current)

    def run(self, lifecycles: int) -> None:
        for _ in range(lifecycles):
            self.lifecycle()


def _es_task_class() -> type:
    from eventsourcing.domain import Aggregate, event

    class EsTask(Aggregate):
        @event("Created")
        def __init__(self, subject: str, body: str, sender: str, recipient: str) -> None:
            self.subject, self.body, self.sender, self.recipient = subject, body, sender, recipient
            self.state, self.round, self.reports = "inbox", 0, []

        def _edge(self, sources: tuple[str, ...], kind: str) -> None:
            if self.state not in sources:
                raise ValueError(f"{kind} is not allowed while the task is {self.state}")

        def claim(self, by: str) -> None:
            self._edge(("inbox",), "claim")
            self._claimed(by)

        @event("Claimed")
        def _claimed(self, by: str) -> None:
            self.state, self.round = "active", self.round + 1

        def submit_report(self, by: str, status: str, body: str) -> None:
            self._edge(("active", "review"), "submit_report")
            self._reported(by, status, body)

        @event("Reported")
        def _reported(self, by: str, status: str, body: str) -> None:
            self.reports.append({"round": self.round, "status": status, "by": by})

        def submit(self, by: str) -> None:
            self._edge(("active",), "submit")
            if not any(r["round"] == self.round and r["status"] == "done" for r in self.reports):
                raise ValueError("submit needs a done report")
            self._submitted(by)

        @event("Submitted")
        def _submitted(self, by: str) -> None:
            self.state = "review"

        def approve(self, by: str) -> None:
            self._edge(("review",), "approve")
            self._approved(by)

        @event("Approved")
        def _approved(self, by: str) -> None:
            self.state = "done"

        def archive(self, by: str, reason: str) -> None:
            self._edge(("done",), "archive")
            self._archived(by, reason)

        @event("Archived")
        def _archived(self, by: str, reason: str) -> None:
            self.state = "archive"

    return EsTask


def statements_per_command(kernel: TaskCommandKernel) -> float:
    """SQL statements the kernel's write connection runs for one lifecycle, per command (raw's: BEGIN, three
    writes, COMMIT)."""
    seen: list[str] = []
    with kernel.db.write() as uow:  # the idle writer the next command takes
        driver: Any = uow.conn.connection.driver_connection
    driver.set_trace_callback(seen.append)
    kernel_lifecycle(kernel.submit, 10**9, "traced")
    driver.set_trace_callback(None)
    return len(seen) / STEPS


def interleaved(runners: dict[str, Any], lifecycles: int, rounds: int) -> dict[str, tuple[float, float]]:
    """Run the variants in alternating chunks so disk noise hits them alike, each the same number of commands
    (``lifecycles`` lifecycles' worth; a runner's ``steps`` are its commands per unit of work); returns
    (commands/s, CPU µs per command) each (the CPU figure is the whole process's: meaningful for the sequential
    variants)."""
    spent = {name: [0.0, 0.0] for name in runners}
    chunk = max(1, lifecycles // rounds)
    for _ in range(rounds):
        for name, runner in runners.items():
            t0, c0 = time.perf_counter(), time.process_time()
            runner.run(chunk * STEPS // runner.steps)
            spent[name][0] += time.perf_counter() - t0
            spent[name][1] += time.process_time() - c0
    commands = chunk * rounds * STEPS
    return {name: (commands / wall, cpu / commands * 1e6) for name, (wall, cpu) in spent.items()}


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
    ap.add_argument("--n", type=int, default=3000, help="commands per variant (lifecycles of six)")
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--durability", choices=["full", "process"], default="full")
    ap.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    args = ap.parse_args()
    rounds, tries = 10, 3
    if args.quick:
        args.n, args.events, rounds, tries = 240, 5000, 4, 1
    with tempfile.TemporaryDirectory(dir=os.environ.get("TASKKERNEL_BENCH_DIR")) as d:
        tmp = Path(d)
        runners = {"raw": Raw(tmp, args.durability), "floor": KernelRows(tmp, args.durability),
                   "seq": Sequential(fresh_db(tmp, "seq.db", args.durability)),
                   "seq_legacy": Sequential(fresh_db(tmp, "seq-legacy.db", args.durability, keyed=False)),
                   "es": EventSourcing(tmp), "raw_8": Raw(tmp, args.durability, threads=8),
                   "group": Grouped(fresh_db(tmp, "group.db", args.durability)),
                   "raw_8_create": Raw(tmp, args.durability, threads=8, create_only=True),
                   "group_create": Grouped(fresh_db(tmp, "group-create.db", args.durability), create_only=True)}
        rates = interleaved(runners, args.n // STEPS, rounds)
        runners["group"].gc.close()
        runners["group_create"].gc.close()
        statements = statements_per_command(runners["seq"].kernel)
        (raw, raw_cpu), (seq, seq_cpu), (legacy, _) = rates["raw"], rates["seq"], rates["seq_legacy"]
        floor_cpu = rates["floor"][1]
        es, raw8, grp = rates["es"][0], rates["raw_8"][0], rates["group"][0]
        raw8_create, grp_create = rates["raw_8_create"][0], rates["group_create"][0]
        rebuild = bench_rebuild(tmp, args.events)
        appends = {f"{k}_per_txn": round(max(store_append_per_s(tmp, k, args.n * 2, args.durability, run)
                                             for run in range(tries)))  # best of 3: the least disturbed run
                   for k in (1, 64)}
    result = {"durability": args.durability, "commands": args.n // STEPS // rounds * rounds * STEPS,
              "workload": "create, claim, report, submit, approve, archive",
              "raw_sqlite3_per_s": round(raw), "kernel_sequential_per_s": round(seq),
              "eventsourcing_per_s": round(es),
              "cpu_us_per_command": {"raw_sqlite3": round(raw_cpu, 1), "kernel_rows_floor": round(floor_cpu, 1),
                                     "kernel": round(seq_cpu, 1),
                                     "eventsourcing": round(rates["es"][1], 1)},
              "statements_per_command": {"raw_sqlite3": 5, "kernel": round(statements, 2)},
              "kernel_sequential_legacy_chain_per_s": round(legacy),
              "hmac_chain_cost": round(legacy / seq - 1, 3),  # relative slowdown of the keyed chain
              "link_us": {"hmac_sha256": round(link_us(ChainKey(os.urandom(32)).link), 2),
                          "sha256": round(link_us(legacy_link), 2)},
              "raw_sqlite3_8_threads_per_s": round(raw8), "kernel_group_commit_8_per_s": round(grp),
              "create_only_raw_sqlite3_8_threads_per_s": round(raw8_create),
              "create_only_kernel_group_commit_8_per_s": round(grp_create),
              "store_append_per_s": appends, "head_us": round(head_us(), 2),
              "ratio_sequential": round(seq / raw, 3), "ratio_group_commit": round(grp / raw, 3),
              "cpu_ratio_vs_raw": round(seq_cpu / raw_cpu, 3),
              # what the kernel's rows alone cost against raw's, and the checks on top of them (no target)
              "cpu_ratio_kernel_rows_vs_raw": round(floor_cpu / raw_cpu, 3),
              "cpu_ratio_vs_kernel_rows": round(seq_cpu / floor_cpu, 3), "vs_eventsourcing": round(seq / es, 3),
              # the goal, on create-only commands as issue 29 measured it; the lifecycle's figure beside it
              "group_vs_raw_8_threads": round(grp_create / raw8_create, 3),
              "group_vs_raw_8_threads_lifecycle": round(grp / raw8, 3),
              "rebuild_events_per_s": round(rebuild),
              "targets": {"ratio_sequential": 0.5, "ratio_group_commit": 1.0, "rebuild_events_per_s": 100_000,
                          # issue 29, goal 1: at most, at least, at least
                          "cpu_ratio_vs_raw": 1.5, "vs_eventsourcing": 1.3, "group_vs_raw_8_threads": 5.0},
              "group_workloads": {"group_vs_raw_8_threads": "create-only (the goal)",
                                  "group_vs_raw_8_threads_lifecycle": "the six-command lifecycle (no target)"}}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
