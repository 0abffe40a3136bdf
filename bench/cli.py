"""CLI start-up benchmark: what a person or an agent waits for per call, against a bare Python start measured
in the same run (issue 11).

    python bench/cli.py              # 15 runs per command, median
    python bench/cli.py --quick      # 5 runs

Each command runs in a fresh process through the installed entry point (`taskkernel`, the console script),
in a workspace with one task. Goals (ratio to ``python -c "import sys"``): ``--version`` <= 3x (answered
before any heavy import), ``--help`` <= 10x (only the command table, no command imported), ``task show ID``
<= 30x (its own libraries plus the read). ``task list`` is reported without a goal.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOALS = {"--version": 3.0, "--help": 10.0, "task show": 30.0}


# An installed package has its bytecode compiled (pip does it); a shell with PYTHONDONTWRITEBYTECODE would
# measure compiling our sources on every call instead. The warm-up run writes the caches.
CHILD_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def wall(argv: list[str], cwd: Path, runs: int) -> float:
    """Median wall time of ``argv`` over ``runs`` fresh processes (after one warm-up for the page cache and the
    bytecode caches)."""
    times = []
    for i in range(runs + 1):
        t0 = time.perf_counter()
        done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, env=CHILD_ENV)
        elapsed = time.perf_counter() - t0
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
        if i:
            times.append(elapsed)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="5 runs per command instead of 15")
    runs = 5 if parser.parse_args().quick else 15
    exe = shutil.which("taskkernel", path=str(Path(sys.executable).parent)) or shutil.which("taskkernel")
    if exe is None:
        raise SystemExit("the taskkernel console script is not installed (make setup)")
    with tempfile.TemporaryDirectory(prefix="bench-cli-") as tmp:
        ws = Path(tmp) / "ws"
        env_ok = subprocess.run([exe, "init", str(ws)], capture_output=True, text=True)
        if env_ok.returncode != 0:
            raise SystemExit(env_ok.stderr)
        made = subprocess.run([exe, "submit"], cwd=ws, capture_output=True, text=True, input=json.dumps({
            "type": "create_task", "idempotency_key": "bench", "payload": {
                "sender": "ADMIN", "recipient": "PM", "subject": "benchmark task"}}))
        task_id = json.loads(made.stdout)["task_id"]
        baseline = wall([sys.executable, "-c", "import sys"], ws, runs)
        rows = [("--version", [exe, "--version"]), ("--help", [exe, "--help"]),
                ("task show", [exe, "task", "show", task_id]), ("task list", [exe, "task", "list"])]
        print(f"baseline  python -c 'import sys'  {baseline * 1000:7.1f} ms   (median of {runs}, "
              f"{os.cpu_count()} cores)")
        failed = []
        for name, argv in rows:
            t = wall(argv, ws, runs)
            ratio = t / baseline
            goal = GOALS.get(name)
            verdict = "" if goal is None else (f"  goal <= {goal:.0f}x " + ("ok" if ratio <= goal else "MISSED"))
            if goal is not None and ratio > goal:
                failed.append(name)
            print(f"{name:<10}{' '.join(argv[1:]) if name != 'task show' else 'task show ID':<24}"
                  f"{t * 1000:7.1f} ms  {ratio:5.1f}x{verdict}")
        if failed:
            print(f"goals missed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
