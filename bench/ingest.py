"""Folder ingest through the coordinator, against fcop's own v3 reader in the same run.

    python bench/ingest.py [--files 5000] [--watch 100] [--quick]

1. Cold ingest: a workspace holding N/2 TASK files and N/2 REPORT files (one per task, from its
   driver) is ingested into the kernel (parse, create_task, claim, submit_report, submit: every
   command committed with fsync). Baseline: fcop's v3 `Project` listing the same tasks and reports.
2. Watch latency: with `taskkernel up`'s loop running (watchfiles + settle check), TASK files are
   written one at a time; latency = file published -> its create_task event committed (p50/p99).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kernel.cli.common import CliContext  # noqa: E402
from kernel.coordinator import Coordinator  # noqa: E402
from kernel.workspace import Workspace, init_workspace  # noqa: E402


def day_seq(i: int) -> tuple[str, int]:
    """FCoP numbers at most 999 files per kind and day: spread larger sets over several days."""
    return f"202611{1 + (i - 1) // 999:02d}", (i - 1) % 999 + 1


def task_id(i: int) -> str:
    day, seq = day_seq(i)
    return f"TASK-{day}-{seq:03d}"


def task_text(i: int) -> str:
    return (f"---\nprotocol: fcop\nversion: 1\nsender: ADMIN\nrecipient: PM\npriority: P2\nsubject: Job {i}\n"
            f"thread_key: bench-{i}\n---\nDo job {i}.\n")


def report_text(i: int) -> str:
    return (f"---\nprotocol: fcop\nversion: 1\nsender: PM\nrecipient: ADMIN\npriority: P2\nreferences:\n"
            f"- {task_id(i)}\nstatus: done\n---\nJob {i} done.\n")


def workspace(root: Path, n_tasks: int, durability: str) -> Workspace:
    init_workspace(root, "dev-team")
    (root / "taskkernel.toml").write_text(f'[kernel]\ndurability = "{durability}"\n')
    fcop = root / "fcop"
    for i in range(1, n_tasks + 1):
        day, seq = day_seq(i)
        (fcop / "_lifecycle" / "inbox" / f"TASK-{day}-{seq:03d}-ADMIN-to-PM.md").write_text(task_text(i))
        (fcop / "reports" / f"REPORT-{day}-{seq:03d}-PM-to-ADMIN.md").write_text(report_text(i))
    return Workspace.load(root)


def cold(tmp: Path, n_files: int, durability: str) -> dict[str, float]:
    n_tasks = n_files // 2
    ws = workspace(tmp / "cold", n_tasks, durability)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from fcop.compatibility.v3.project import Project

        t0 = time.perf_counter()
        project = Project(ws.root)
        listed = len(project.list_tasks(status="all")) + len(project.list_reports())
        baseline = time.perf_counter() - t0
    coordinator = Coordinator(ws, CliContext(workspace_path=str(ws.root)).database(), settle_s=0, grace_s=0)
    assert coordinator.folders is not None
    t0 = time.perf_counter()
    while coordinator.folders.ingest_pass():
        pass
    ours = time.perf_counter() - t0
    assert listed == n_files, f"fcop listed {listed} of {n_files} files"
    states = {coordinator.kernel.task(task_id(i))["state"] for i in (1, n_tasks)}
    assert states == {"review"}, states
    return {"files": n_files, "fcop_listed": listed, "fcop_v3_list_s": round(baseline, 3),
            "taskkernel_ingest_s": round(ours, 3), "files_per_s": round(n_files / ours),
            "commands_per_s": round(n_tasks * 4 / ours),
            "ratio_ingest_time_vs_fcop_listing": round(ours / baseline, 2)}


def watch(tmp: Path, count: int, settle_s: float) -> dict[str, float]:
    ws = workspace(tmp / f"watch-{settle_s}", 0, "full")
    coordinator = Coordinator(ws, CliContext(workspace_path=str(ws.root)).database(), settle_s=settle_s, grace_s=5.0)
    stop = asyncio.Event()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=lambda: loop.run_until_complete(coordinator.run(stop, poll_seconds=0.25)))
    thread.start()
    time.sleep(0.5)
    inbox = ws.root / "fcop" / "_lifecycle" / "inbox"
    latencies = []
    for i in range(1, count + 1):
        name = f"{task_id(i)}-ADMIN-to-PM.md"
        tmp_file = inbox / f".{name}.tmp"
        tmp_file.write_text(task_text(i))
        published = time.perf_counter()
        tmp_file.rename(inbox / name)
        while coordinator.kernel.task(task_id(i)) is None:
            time.sleep(0.002)
        latencies.append(time.perf_counter() - published)
    loop.call_soon_threadsafe(stop.set)
    thread.join()
    q = statistics.quantiles(latencies, n=100)
    return {"settle_s": settle_s, "files": count, "p50_ms": round(q[49] * 1000, 1), "p99_ms": round(q[98] * 1000, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=5000)
    ap.add_argument("--watch", type=int, default=100)
    ap.add_argument("--durability", choices=["full", "process"], default="full")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.files, args.watch = 400, 20
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        result = {"cold_ingest": cold(tmp, args.files, args.durability),
                  "watch_latency": [watch(tmp, args.watch, s) for s in (1.0, 0.1)]}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
