"""Reads that scale (issue 11, item 7): the first page of `task list` and `verify` on a large store, measured from
outside, in separate processes, against a baseline measured in the same run.

    python bench/reads.py [--events 200000] [--db PATH] [--keep] [--runs 1]

Builds a SQLite store of about ``--events`` events (default 200k, ~37k tasks; ``--events 1000000`` is the issue's
size) quickly: one task of each lifecycle shape is written by the real kernel, then copied under new task ids and
idempotency keys through the kernel's own append path (EventStore.append: the real links and sealed head), with
receipts and task rows copied alike, many commands per write transaction and the tasks' events interleaved in
global order. `verify` accepts the result. ``--db PATH`` reuses a store built before (built there if missing).

Then, each in its own process (``python -m taskkernel --db sqlite:///…``), wall time, CPU time and peak RSS
(``os.wait4`` in a small launcher: the child's own ``ru_maxrss``): the baseline (a bare python, ``python -c "import
sqlalchemy"``, a raw sqlite3 ``count(*)`` over events); ``task list`` (its first page: ``--limit 50`` when the CLI
knows it, else the whole list as it exists); ``task list --all --json`` when the CLI knows ``--all``; the core read
API (kernel/queries.py: the first page, with and without a state, and every task streamed as JSON lines) when the
checkout has it; and ``verify``. Prints one JSON object with every figure and the ratios against ``import
sqlalchemy``. The targets of issue 11 (first page <= 1 s and <= 100 MB at 1M events; the full list and verify in
constant memory) are checked here, never in timed unit tests.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from taskkernel.kernel.commands import TaskCommandKernel  # noqa: E402
from taskkernel.kernel.model.principal import LOCAL_OWNER, Principal  # noqa: E402
from taskkernel.kernel.store.db import Database  # noqa: E402
from taskkernel.kernel.store.events import NewEvent  # noqa: E402
from taskkernel.kernel.store.schema import metadata  # noqa: E402
from taskkernel.roles.registry import RoleRegistry  # noqa: E402

PM = Principal("PM", "pm-agent")
MARK = "BENCHKEY"  # the idempotency-key prefix of the template, replaced per copy
# Lifecycle shapes (the command sequence after create_task); their mix averages about 5.4 events per task.
SHAPES: dict[str, list[str]] = {
    "inbox": [],
    "active": ["claim"],
    "review": ["claim", "report", "submit"],
    "done": ["claim", "report", "submit", "approve"],
    "archive": ["claim", "report", "submit", "approve", "archive"],
    "rework": ["claim", "report", "submit", "reject", "report", "submit", "approve", "archive"],
}
MIX = ["archive", "rework", "done", "archive", "review", "rework", "active", "archive", "inbox", "archive"]
LIST_KEYS = ("task_id", "state", "revision", "round", "sender", "recipient", "subject", "priority", "risk_level",
             "parent", "root", "thread_key")


def make_kernel(db: Database) -> TaskCommandKernel:
    return TaskCommandKernel(db, RoleRegistry.for_team("PM", ["PM", "DEV", "QA", "OPS"], load_plugins=False))


@dataclass
class Command:
    """One accepted command of a template task: its events (texts) and its receipt row."""

    stream_version: int  # the stream's version before the command
    events: list[tuple[str, str]]  # (event_type, data text)
    meta: str
    receipt: tuple[Any, ...]  # idempotency_key, command_type, semantic_digest, principal, task_id, result


@dataclass
class Template:
    task_id: str
    commands: list[Command]
    task_row: tuple[Any, ...]  # state, revision, round, parent, root, recipient, doc


def build_templates(tmp: Path) -> dict[str, Template]:
    """Write one task of each shape with the real kernel and read back everything it stored."""
    db = Database(f"sqlite:///{tmp / 'template.db'}", "process")
    db.create_schema(metadata)
    kernel = make_kernel(db)
    ids: dict[str, str] = {}
    for shape, steps in SHAPES.items():
        r = kernel.submit({"type": "create_task", "idempotency_key": f"{MARK}-{shape}-0",
                           "payload": {"sender": "ADMIN", "recipient": "PM", "subject": f"bench task ({shape})",
                                       "body": "Do the thing and report what was done. " * 4}}, LOCAL_OWNER)
        assert r.status == "accepted", r
        tid = ids[shape] = str(r.task_id)
        for n, step in enumerate(steps, 1):
            doc = kernel.task(tid)
            assert doc is not None
            kind, payload, who = {
                "claim": ("claim", {}, PM), "submit": ("submit", {}, PM), "approve": ("approve", {}, LOCAL_OWNER),
                "report": ("submit_report", {"status": "done", "body": "evidence: tests pass"}, PM),
                "reject": ("reject", {"reason": "needs another pass"}, LOCAL_OWNER),
                "archive": ("archive", {"reason": "finished"}, LOCAL_OWNER)}[step]
            r = kernel.submit({"type": kind, "task_id": tid, "thread_key": doc["thread_key"],
                               "expected_revision": doc["revision"], "round": doc["round"],
                               "idempotency_key": f"{MARK}-{shape}-{n}", "payload": payload}, who)
            assert r.status == "accepted", (shape, step, r)
    out: dict[str, Template] = {}
    with db.read() as conn:
        for shape, tid in ids.items():
            commands: list[Command] = []
            for key, ctype, digest, principal, task_id, result, first, last in conn.exec_driver_sql(
                    "SELECT idempotency_key, command_type, semantic_digest, principal, task_id, result, first_pos,"
                    " last_pos FROM receipts WHERE task_id = ? ORDER BY first_pos", (tid,)):
                rows = conn.exec_driver_sql("SELECT stream_version, event_type, data, meta FROM events WHERE "
                                            "global_pos BETWEEN ? AND ? ORDER BY global_pos", (first, last)).all()
                commands.append(Command(rows[0][0] - 1, [(r[1], r[2]) for r in rows], rows[0][3],
                                        (key, ctype, digest, principal, task_id, result)))
            row = conn.exec_driver_sql("SELECT state, revision, round, parent, root, recipient, doc FROM tasks "
                                       "WHERE task_id = ?", (tid,)).one()
            out[shape] = Template(tid, commands, tuple(row))
    db.dispose()
    return out


def build_store(path: Path, target_events: int, wave: int = 2000,
                chain_key: bytes | None = None) -> dict[str, int]:
    """Copy the templates under new ids until about ``target_events`` events are written. Tasks are written in
    waves of ``wave``: every task's first command, then every task's second one, …, so streams interleave."""
    with tempfile.TemporaryDirectory() as tmp:
        templates = build_templates(Path(tmp))
    db = Database(f"sqlite:///{path}", "process", chain_key=chain_key)
    db.create_schema(metadata)
    store = make_kernel(db).store
    mix = [templates[s] for s in MIX]
    per_cycle = sum(len(e.events) for t in mix for e in t.commands)
    n_tasks = max(1, round(target_events * len(mix) / per_cycle))
    written = 0
    insert_receipt = ("INSERT INTO receipts (idempotency_key, command_type, semantic_digest, principal, task_id, "
                      "result, first_pos, last_pos, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)")
    insert_task = ("INSERT INTO tasks (task_id, state, revision, round, parent, root, recipient, doc, last_pos) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)")
    for start in range(0, n_tasks, wave):
        batch = [(i, mix[i % len(mix)]) for i in range(start, min(n_tasks, start + wave))]
        last_pos: dict[int, int] = {}
        with db.write() as uow:
            receipts: list[tuple[Any, ...]] = []
            for step in range(max(len(t.commands) for _, t in batch)):
                for i, t in batch:
                    if step >= len(t.commands):
                        continue
                    c = t.commands[step]
                    tid = f"TASK-20250101-{i + 1:06d}"

                    def swap(text: str, t: Template = t, tid: str = tid, i: int = i) -> str:
                        return text.replace(t.task_id, tid).replace(f"{MARK}-", f"B{i}-")

                    meta = json.loads(swap(c.meta))
                    recorded = store.append(uow, f"task:{tid}", c.stream_version,
                                            [NewEvent(et, json.loads(swap(d))) for et, d in c.events], meta,
                                            verified_version=True)
                    first, last = recorded[0].global_pos, recorded[-1].global_pos
                    key, ctype, digest, principal, _task, result = c.receipt
                    receipts.append((swap(key), ctype, digest, principal, tid, swap(result), first, last,
                                     meta["recorded_at"]))
                    last_pos[i] = last
                    written += len(recorded)
            uow.sql_many(insert_receipt, receipts)
            uow.sql_many(insert_task, [
                (f"TASK-20250101-{i + 1:06d}", *t.task_row[:3], t.task_row[3],
                 t.task_row[4].replace(t.task_id, f"TASK-20250101-{i + 1:06d}"), t.task_row[5],
                 t.task_row[6].replace(t.task_id, f"TASK-20250101-{i + 1:06d}").replace(f"{MARK}-", f"B{i}-"),
                 last_pos[i]) for i, t in batch])
    db.dispose()
    return {"events": written, "tasks": n_tasks}


ENV = dict(os.environ)  # the children's environment (--pythonpath measures another checkout's CLI)
CWD = tempfile.gettempdir()  # not the repository: `python -m taskkernel` would import from the working directory


# A small launcher measures each child: a child forked from this (large) process would count this process's pages
# in its peak RSS until it execs, so the launcher, which imports nothing heavy, forks and waits instead.
LAUNCHER = """
import json, os, sys, time
out, err = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), os.open(sys.argv[2], os.O_WRONLY)
start = time.perf_counter()
pid = os.fork()
if pid == 0:
    os.dup2(out, 1)
    os.dup2(err, 2)
    os.execv(sys.argv[3], sys.argv[3:])
_, status, usage = os.wait4(pid, 0)
print(json.dumps({"s": time.perf_counter() - start, "cpu_s": usage.ru_utime + usage.ru_stime,
                  "maxrss_kb": usage.ru_maxrss,
                  "exit": os.waitstatus_to_exitcode(status)}))
"""


def measure(argv: list[str], out: Path | None = None) -> dict[str, Any]:
    """Run ``argv`` in its own process; wall time, CPU time (steadier than wall time on a busy machine), the child's
    own peak RSS (``os.wait4``), exit code, stdout size.
    stderr goes to a file, as it does when nobody watches: a CLI that renders for a terminal pays for it here."""
    out = out or Path(os.devnull)
    with tempfile.NamedTemporaryFile() as stderr:
        launched = subprocess.run([sys.executable, "-c", LAUNCHER, str(out), stderr.name, *argv], env=ENV, cwd=CWD,
                                  capture_output=True, text=True, check=True)
        measured = json.loads(launched.stdout)
        err_bytes = os.path.getsize(stderr.name)
        stderr.seek(max(0, err_bytes - 600))
        tail = stderr.read().decode(errors="replace")
    result = {"s": round(measured["s"], 3), "cpu_s": round(measured["cpu_s"], 3),
              "peak_mb": round(measured["maxrss_kb"] / 1024, 1), "exit": measured["exit"],
              "stdout_bytes": out.stat().st_size if out != Path(os.devnull) else 0, "stderr_bytes": err_bytes}
    if measured["exit"] != 0:
        result["stderr_tail"] = tail
    return result


# The core read API (kernel/queries.py) in a process of its own, as a CLI built on it would use it.
CORE_PAGE = """
import sys
from taskkernel.kernel.queries import page_tasks
from taskkernel.kernel.store.db import Database
page = page_tasks(Database(sys.argv[1]), state=sys.argv[2] or None, limit=50)
print(len(page.rows), page.next_cursor)
"""
CORE_ALL = """
import json, sys
from taskkernel.kernel.queries import iter_tasks
from taskkernel.kernel.store.db import Database
write = sys.stdout.write
for row in iter_tasks(Database(sys.argv[1])):
    write(json.dumps(row, ensure_ascii=False) + "\\n")
"""


def core(script: str, db_path: Path, *args: str) -> list[str]:
    return [sys.executable, "-c", script, f"sqlite:///{db_path}", *args]


def cli(db_path: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "taskkernel", "--db", f"sqlite:///{db_path}", *args]


def cli_knows(db_path: Path, *args: str) -> bool:
    """Whether `task list` accepts these options (an unknown option is a usage error)."""
    r = subprocess.run(cli(db_path, "task", "list", *args, "--help"), capture_output=True, text=True, env=ENV,
                       cwd=CWD)
    return r.returncode == 0


def best(runs: int, argv: list[str], out: Path | None = None) -> dict[str, Any]:
    results = [measure(argv, out) for _ in range(runs)]
    return min(results, key=lambda r: r["s"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--db", type=Path, help="store to reuse (built there if missing)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary store and print its path")
    ap.add_argument("--runs", type=int, default=1, help="runs per measurement (the fastest is reported)")
    ap.add_argument("--only", choices=("list", "verify"), help="measure only the listings or only `verify`")
    ap.add_argument("--pythonpath", help="run the CLI from this checkout (PYTHONPATH), e.g. an older commit's "
                                         "`git archive` to compare before and after")
    args = ap.parse_args()
    if args.pythonpath:
        ENV["PYTHONPATH"] = args.pythonpath
    tmp = Path(tempfile.mkdtemp(prefix="tk-reads-"))
    db_path = args.db or tmp / "reads.db"
    report: dict[str, Any] = {}
    if not db_path.exists():
        t0 = time.perf_counter()
        report["store"] = build_store(db_path, args.events)
        report["store"]["build_s"] = round(time.perf_counter() - t0, 1)
    with sqlite3.connect(db_path) as con:
        report["store"] = {**report.get("store", {}),
                           "events": con.execute("SELECT count(*) FROM events").fetchone()[0],
                           "tasks": con.execute("SELECT count(*) FROM tasks").fetchone()[0],
                           "file_mb": round(db_path.stat().st_size / 2**20, 1)}
    some_task = sqlite3.connect(db_path).execute("SELECT task_id FROM tasks LIMIT 1").fetchone()[0]
    measure(cli(db_path, "task", "show", some_task))  # warm-up: creates the other components' tables once
    base = {
        "python_startup": best(args.runs, [sys.executable, "-c", "pass"]),
        "import_sqlalchemy": best(args.runs, [sys.executable, "-c", "import sqlalchemy"]),
        "sqlite3_count": best(args.runs, [sys.executable, "-c", "import sqlite3, sys; sqlite3.connect(sys.argv[1])"
                                          ".execute('SELECT count(*) FROM events').fetchone()", str(db_path)]),
    }
    report["baseline"] = base
    if args.only != "verify":
        paged = cli_knows(db_path, "--limit", "50")
        first_page = ["task", "list", "--limit", "50"] if paged else ["task", "list"]
        report["task_list_first_page"] = {"argv": first_page, **best(args.runs, cli(db_path, *first_page),
                                                                     tmp / "page.json")}
        if cli_knows(db_path, "--all", "--json"):
            report["task_list_all_json"] = best(args.runs, cli(db_path, "task", "list", "--all", "--json"),
                                                tmp / "all.jsonl")
    has_core = subprocess.run([sys.executable, "-c", "import taskkernel.kernel.queries"], env=ENV, cwd=CWD,
                              capture_output=True).returncode == 0
    if args.only != "verify" and has_core:
        report["core_first_page"] = best(args.runs, core(CORE_PAGE, db_path, ""), tmp / "core-page.txt")
        report["core_first_page_state_done"] = best(args.runs, core(CORE_PAGE, db_path, "done"),
                                                    tmp / "core-page-done.txt")
        report["core_all_jsonl"] = best(args.runs, core(CORE_ALL, db_path), tmp / "core-all.jsonl")
    if args.only != "list":
        report["verify"] = best(args.runs, cli(db_path, "verify"), tmp / "verify.json")
        report["verify"]["status"] = json.loads((tmp / "verify.json").read_text() or "{}").get("status")
    floor = base["import_sqlalchemy"]
    report["ratios_vs_import_sqlalchemy"] = {
        name: {"time": round(r["s"] / floor["s"], 1), "memory": round(r["peak_mb"] / floor["peak_mb"], 1)}
        for name, r in report.items() if isinstance(r, dict) and "peak_mb" in r}
    if "task_list_first_page" in report:
        page = report["task_list_first_page"]
        report["targets"] = {"first_page_le_1s": page["s"] <= 1.0, "first_page_le_100mb": page["peak_mb"] <= 100}
    print(json.dumps(report, indent=1))
    if args.keep or args.db:
        print(f"store: {db_path}", file=sys.stderr)
    else:
        for f in tmp.iterdir():
            f.unlink()
        tmp.rmdir()


if __name__ == "__main__":
    main()
