"""Cold parse of FCoP task/report files: taskkernel's file layer vs fcop's own v3 reader, same files, same run.

    python bench/ingest_files.py [--n 5000] [--rounds 3] [--quick]

Builds a G3 workspace with n/2 TASK files (in ``_lifecycle/inbox/``, where
fcop's ``list_tasks`` looks) and n/2 REPORT files, then times, alternating:
(a) ``fcop.compatibility.v3.project.Project`` ``list_tasks(status="all")`` +
``list_reports(status="all")`` (the baseline), and (b) a cold
``taskkernel.coordinator.fcop.Scanner.scan()`` (reads, size-checks, parses and validates every
file into pydantic models). Prints files/s for each and the ratio b/a (higher
is better for taskkernel). The event-commit latency part lives elsewhere.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from taskkernel.coordinator.fcop import Scanner, open_workspace  # noqa: E402

TASK = """---
protocol: fcop
version: 1
sender: PM
recipient: {to}
priority: P{p}
thread_key: thread-{t}
subject: Task number {i}
transitions:
- at: '2026-01-01T00:00:{s:02d}.000000+00:00'
  from: null
  to: inbox
  by: PM
  tool: create_task
---

Do thing {i}. Acceptance: it works, tests pass, docs updated.
"""
REPORT = """---
protocol: fcop
version: 1
sender: {to}
recipient: PM
priority: P2
references:
- TASK-{d}-{seq:03d}
status: done
---

Finished task {i}; see workspace/out-{i}/.
"""


def build(root: Path, n: int) -> None:
    ws = open_workspace(root, create=True)
    roles = ("DEV", "QA", "OPS")
    for i in range(n // 2):
        day, seq = f"202601{1 + i // 999:02d}", 1 + i % 999
        to = roles[i % 3]
        (ws.stage_dir("inbox") / f"TASK-{day}-{seq:03d}-PM-to-{to}.md").write_text(
            TASK.format(to=to, p=i % 4, t=i % 50, i=i, s=i % 60))
        (ws.root / "reports" / f"REPORT-{day}-{seq:03d}-{to}-to-PM.md").write_text(
            REPORT.format(to=to, d=day, seq=seq, i=i))


def run_fcop(root: Path) -> int:
    from fcop.compatibility.v3.project import Project

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        project = Project(root)
        return len(project.list_tasks(status="all")) + len(project.list_reports(status="all"))


def run_ours(root: Path) -> int:
    batch = Scanner(open_workspace(root), settle_s=0, grace_s=0).scan()
    assert not batch.invalid and not batch.pending
    return len(batch.ready)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="smoke run: 400 files, 1 round")
    args = ap.parse_args()
    n, rounds = (400, 1) if args.quick else (args.n, args.rounds)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        build(root, n)
        times: dict[str, list[float]] = {"fcop v3 Project (baseline)": [], "taskkernel Scanner": []}
        for _ in range(rounds):
            for label, fn in (("fcop v3 Project (baseline)", run_fcop), ("taskkernel Scanner", run_ours)):
                t0 = time.perf_counter()
                count = fn(root)
                times[label].append(time.perf_counter() - t0)
                assert count == n, f"{label} saw {count} of {n} files"
    print(f"cold parse of {n} TASK/REPORT files, median of {rounds} round(s)")
    med = {k: statistics.median(v) for k, v in times.items()}
    for label, t in med.items():
        print(f"  {label:28s} {t * 1000:8.1f} ms  {n / t:9.0f} files/s")
    print(f"  ratio taskkernel/fcop speed: {med['fcop v3 Project (baseline)'] / med['taskkernel Scanner']:.2f}x")


if __name__ == "__main__":
    main()
