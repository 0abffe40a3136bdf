"""`taskkernel verify` end to end on a large store, against the floor of reading that store, in the same run.

    python bench/verify.py [--events 1000000] [--small 100000] [--runs 1] [--quick] [--before CHECKOUT]

Builds (once, cached under $TASKKERNEL_BENCH_DIR or /tmp) a workspace whose store holds about ``--events`` events
and one of about ``--small`` events: `taskkernel init`, then the store written by bench/reads.py's builder (one task
of each lifecycle shape by the real kernel, copied under new ids through EventStore.append, many commands per write
transaction) with the workspace's chain key, so every link is the keyed HMAC a workspace verifies. The FCoP folders
are removed: this measures the store's proof, not a folder check of tasks that have no files.

Then, each in its own process measured from outside (bench/reads.py's launcher: wall time, CPU time of the process
and its children, the peak RSS of the largest process, ``ru_maxrss`` of the waited children):
- ``floor_select``: python sqlite3 streaming ``SELECT *`` over the events table, the least any verify must read;
- ``verify``: the whole ``taskkernel verify`` command in the workspace, start-up included, on both stores.
Prints one JSON object: events/s end to end, the ratio of verify's time to the floor's, the peak RSS at the small
and the large store (flat memory: the ratio stays near 1), and the issue's targets (issue 29, goal 2).
``--before CHECKOUT``: also `verify` on the large store from another checkout (e.g. ``git archive HEAD`` unpacked:
the code before a change), in the same rounds, as ``verify_large_before``.
``--quick``: 150k and 60k events, for a smoke run: both past PARALLEL_FROM, so both proven in parallel (the memory
ratio compares one code path at two sizes, not the parallel proof with the sequential checks).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import reads  # noqa: E402

from taskkernel.kernel.private import read_secret  # noqa: E402
from taskkernel.kernel.verify_parallel import PARALLEL_FROM, default_workers  # noqa: E402

TARGET_EVENTS_PER_S = 100_000
FLAT_MEMORY = 1.25  # peak RSS at the large store over the small one
FLOOR = ("import sqlite3, sys\n"
         "for _ in sqlite3.connect(sys.argv[1]).execute('SELECT * FROM events'):\n"
         "    pass\n")


def bench_dir() -> Path:
    root = Path(os.environ.get("TASKKERNEL_BENCH_DIR") or tempfile.gettempdir()) / "taskkernel-bench-verify"
    root.mkdir(parents=True, exist_ok=True)
    return root


def workspace(events: int) -> Path:
    """A workspace holding about ``events`` events, built once (a finished build leaves a ``built`` marker)."""
    ws = bench_dir() / f"ws-{events}"
    if (ws / "built").exists():
        return ws
    shutil.rmtree(ws, ignore_errors=True)
    ws.mkdir()
    subprocess.run([sys.executable, "-m", "taskkernel", "init", "--team", "solo", "--json", str(ws)], check=True,
                   capture_output=True, cwd=reads.CWD)
    shutil.rmtree(ws / "fcop")
    db_path = ws / ".taskkernel" / "kernel.db"
    db_path.unlink()
    key = read_secret(ws / ".taskkernel" / "chain.key")
    reads.build_store(db_path, events, chain_key=key)
    reads.measure(tk(ws, "task", "list", "--limit", "1"))  # creates the other components' tables once
    (ws / "built").touch()
    return ws


def tk(ws: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "taskkernel", "--workspace", str(ws), *args]


def best(runs: int, argv: list[str], out: Path | None = None) -> dict[str, Any]:
    return min((reads.measure(argv, out) for _ in range(runs)), key=lambda r: r["s"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--small", type=int, default=100_000, help="the smaller store, to show memory is flat")
    ap.add_argument("--runs", type=int, default=1, help="rounds (interleaved); the fastest of each is reported")
    ap.add_argument("--quick", action="store_true", help="150k and 60k events (both proven in parallel)")
    ap.add_argument("--before", help="a checkout whose `verify` runs too (PYTHONPATH), for before/after")
    args = ap.parse_args()
    if args.quick:
        args.events, args.small = 150_000, 60_000
    if (args.small >= PARALLEL_FROM) != (args.events >= PARALLEL_FROM):
        ap.error(f"--small and --events on the same side of PARALLEL_FROM ({PARALLEL_FROM}): one code path")
    stores = {"small": workspace(args.small), "large": workspace(args.events)}
    out = Path(tempfile.mkdtemp(prefix="tk-verify-"))
    rounds: dict[str, list[dict[str, Any]]] = {}
    for _ in range(args.runs):  # interleaved, so a busy moment hits every figure alike
        for size, ws in stores.items():
            db_file = str(ws / ".taskkernel" / "kernel.db")
            rounds.setdefault(f"floor_select_{size}", []).append(
                reads.measure([sys.executable, "-c", FLOOR, db_file]))
            rounds.setdefault(f"verify_{size}", []).append(reads.measure(tk(ws, "verify", "--json"),
                                                                         out / f"{size}.json"))
        if args.before:
            reads.ENV["PYTHONPATH"] = args.before
            rounds.setdefault("verify_large_before", []).append(reads.measure(tk(stores["large"], "verify")))
            del reads.ENV["PYTHONPATH"]
    report: dict[str, Any] = {name: min(runs, key=lambda r: r["s"]) for name, runs in rounds.items()}
    for size in stores:
        doc = json.loads((out / f"{size}.json").read_text() or "{}")
        report[f"verify_{size}"].update(status=doc.get("status"), events=doc.get("events"), tasks=doc.get("tasks"),
                                        chain=doc.get("chain"))
    shutil.rmtree(out)
    large, small = report["verify_large"], report["verify_small"]
    events_per_s = round((large["events"] or 0) / large["s"])
    report["verify_workers"] = default_workers()
    report["verify_events_per_s"] = events_per_s
    report["verify_cpu_us_per_event"] = round(large["cpu_s"] / max(1, large["events"] or 0) * 1e6, 2)
    report["ratio_verify_to_floor_select"] = round(large["s"] / report["floor_select_large"]["s"], 2)
    report["peak_mb_large_over_small"] = round(large["peak_mb"] / small["peak_mb"], 2)
    if args.before:
        report["speedup_over_before"] = round(report["verify_large_before"]["s"] / large["s"], 2)
    report["targets"] = {"verify_events_per_s": TARGET_EVENTS_PER_S, "peak_mb_large_over_small": FLAT_MEMORY,
                         "met": {"events_per_s": events_per_s >= TARGET_EVENTS_PER_S,
                                 "flat_memory": report["peak_mb_large_over_small"] <= FLAT_MEMORY,
                                 "verified": large["status"] == small["status"] == "ok"}}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
