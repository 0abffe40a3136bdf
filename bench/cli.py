"""CLI start-up benchmark: what a person or an agent waits for per call, against baselines measured in the same run
(issues 11 and 29).

    python bench/cli.py              # 15 rounds, median
    python bench/cli.py --quick      # 5 rounds

Each command runs in a fresh process through the installed entry point (`taskkernel`, the console script), in a
workspace with one task; the commands and the baselines take turns, round after round, so a busy machine slows
them alike. Baselines: a bare Python start (``python -c "import sys"``) and ``task show``'s library floor
(``python -c "import sqlalchemy, pydantic, typer"``, the libraries any command of ours stands on).

Goals (issue 11, ratio to the bare start): ``--version`` <= 3x (answered before any heavy import), ``--help`` <=
10x (only the command table, no command imported), ``task show ID`` <= 30x. Issue 29 goal 4a: ``task show ID`` <=
1.2x its library floor (``task_show_vs_library_floor``; the CPU ratio is printed beside it, steadier on a loaded
machine). That is the call a user meets: taskkernel.toml's values come from the cache of its last validation
(docs/config.md#cache, written by `init`); ``task show (cold cache)`` is the same call with the cache deleted
before each run (the first call after an edit of the file), reported beside it without a goal. ``task list`` and
``up --once`` are reported without a goal. Prints a table, then one JSON document
(``targets`` holds the goals), then the goals missed, if any.

    python bench/cli.py --instructions   # also the same ratio in instructions (valgrind's callgrind)

``--instructions`` counts the instructions of one ``task show`` and one library floor (``PYTHONHASHSEED=0``,
after the timed rounds wrote the bytecode caches): ``task_show_vs_library_floor_instructions``, a figure a busy
machine does not move.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOALS = {"--version": 3.0, "--help": 10.0, "task show": 30.0}  # issue 11: ratio to the bare start
FLOOR_GOAL = 1.2  # issue 29 goal 4a: task show over its library floor
COLD = "cold"  # a row's first word: delete taskkernel.toml's validation cache before each run

# An installed package has its bytecode compiled (pip does it); a shell with PYTHONDONTWRITEBYTECODE would
# measure compiling our sources on every call instead. The warm-up round writes the caches.
CHILD_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def timed(argv: list[str], cwd: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of one fresh process running ``argv``."""
    if argv[0] == COLD:  # the first call after an edit of taskkernel.toml: no cache of its validation
        (cwd / ".taskkernel" / "config-cache.json").unlink(missing_ok=True)
        argv = argv[1:]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, env=CHILD_ENV)
    elapsed = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return elapsed, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def measure(rows: dict[str, list[str]], cwd: Path, rounds: int) -> dict[str, tuple[float, float]]:
    """Median (wall, CPU) per row over ``rounds`` interleaved rounds, after a warm-up round (page cache,
    bytecode caches); every other round runs the rows in reverse order."""
    seen: dict[str, list[tuple[float, float]]] = {name: [] for name in rows}
    for i in range(rounds + 1):
        for name in (list(rows) if i % 2 else list(reversed(rows))):
            took = timed(rows[name], cwd)
            if i:
                seen[name].append(took)
    return {name: (statistics.median(t[0] for t in runs), statistics.median(t[1] for t in runs))
            for name, runs in seen.items()}


def instructions(argv: list[str], cwd: Path) -> int:
    """Instructions one fresh process running ``argv`` executes (callgrind's total; the process's own, not its
    children's)."""
    with tempfile.TemporaryDirectory(prefix="bench-cli-cg-") as tmp:
        out = Path(tmp) / "callgrind.out"
        done = subprocess.run(["valgrind", "--tool=callgrind", "--trace-children=no", "--dump-instr=no",
                               f"--callgrind-out-file={out}", *argv], cwd=cwd, capture_output=True, text=True,
                              env={**CHILD_ENV, "PYTHONHASHSEED": "0"})
        if done.returncode != 0:
            raise SystemExit(f"valgrind {' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
        totals = [line for line in out.read_text().splitlines() if line.startswith(("summary:", "totals:"))]
        return int(totals[0].split()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="5 rounds instead of 15")
    parser.add_argument("--instructions", action="store_true",
                        help="also count task show's and the floor's instructions (valgrind)")
    options = parser.parse_args()
    rounds = 5 if options.quick else 15
    if options.instructions and shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind")
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
        rows = {"python": [sys.executable, "-c", "import sys"],
                "library floor": [sys.executable, "-c", "import sqlalchemy, pydantic, typer"],
                "--version": [exe, "--version"], "--help": [exe, "--help"],
                "task show": [exe, "task", "show", task_id],
                "task show (cold cache)": [COLD, exe, "task", "show", task_id], "task list": [exe, "task", "list"],
                "up --once": [exe, "up", "--once"]}
        took = measure(rows, ws, rounds)
        counted = {name: instructions(rows[name], ws) for name in ("library floor", "task show")
                   } if options.instructions else {}
    baseline, floor = took["python"], took["library floor"]
    print(f"baseline  python -c 'import sys'  {baseline[0] * 1000:7.1f} ms   (median of {rounds}, "
          f"{os.cpu_count()} cores); library floor {floor[0] * 1000:.1f} ms")
    failed = []
    for name in ("--version", "--help", "task show", "task show (cold cache)", "task list", "up --once"):
        ratio = took[name][0] / baseline[0]
        goal = GOALS.get(name)
        verdict = "" if goal is None else (f"  goal <= {goal:.0f}x " + ("ok" if ratio <= goal else "MISSED"))
        if goal is not None and ratio > goal:
            failed.append(name)
        shown = "task show ID" if name.startswith("task show") else " ".join(rows[name][1:])
        print(f"{name:<24}{shown:<16}"
              f"{took[name][0] * 1000:7.1f} ms  {ratio:5.1f}x{verdict}")
    show_vs_floor = took["task show"][0] / floor[0]
    if show_vs_floor > FLOOR_GOAL:
        failed.append("task show vs library floor")
    print(json.dumps({
        "rounds": rounds, "python_s": round(baseline[0], 4), "library_floor_s": round(floor[0], 4),
        **{f"{name.strip('-').replace(' ', '_')}_s": round(took[name][0], 4) for name in GOALS},
        "task_show_cold_cache_s": round(took["task show (cold cache)"][0], 4),
        "task_list_s": round(took["task list"][0], 4), "up_once_s": round(took["up --once"][0], 4),
        "ratio_to_python": {name: round(took[name][0] / baseline[0], 3) for name in GOALS},
        "task_show_vs_library_floor": round(show_vs_floor, 3),
        "task_show_vs_library_floor_cpu": round(took["task show"][1] / floor[1], 3),
        "task_show_cold_cache_vs_library_floor": round(took["task show (cold cache)"][0] / floor[0], 3),
        **({"library_floor_instructions": counted["library floor"], "task_show_instructions": counted["task show"],
            "task_show_vs_library_floor_instructions": round(counted["task show"] / counted["library floor"], 3)}
           if counted else {}),
        "targets": {"ratio_to_python": GOALS, "task_show_vs_library_floor": FLOOR_GOAL}}, indent=2))
    if failed:
        print(f"goals missed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
