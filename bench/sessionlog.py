"""Session log benchmark: accept throughput and replay speed, each against a baseline in the same run.

    python bench/sessionlog.py            # 2 000 accepts, replay of 1 000 000 inputs
    python bench/sessionlog.py --quick    # smoke run with small sizes

1. Accept: ``SessionLog.accept`` (counter row + input row, idempotency check, one transaction,
   SQLite WAL + synchronous=FULL) vs raw ``sqlite3`` inserts of the same rows with the same
   durability, one transaction per row. The ratio is the price of the guarantees.
2. Replay: ``replay(records, reducer="inputs")`` over records in shuffled storage order vs a plain
   ``sorted()`` of the same tuples. Target: >= 500 000 inputs/s.
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from taskkernel.kernel.canonical import canonical_json, digest, utc_now_iso  # noqa: E402
from taskkernel.kernel.sessionlog import Rec, SessionLog, replay  # noqa: E402
from taskkernel.kernel.store.db import Database  # noqa: E402

REPLAY_TARGET = 500_000  # inputs per second


def bench_accept(n: int, workdir: Path) -> None:
    inputs = [{"input_id": f"i{i}", "kind": "message", "payload": {"text": f"input number {i}"}} for i in range(n)]

    db = Database(f"sqlite:///{workdir / 'log.db'}", durability="full")
    log = SessionLog(db)
    t0 = time.perf_counter()
    for inp in inputs:
        log.accept("bench", inp)
    ours = time.perf_counter() - t0
    db.dispose()

    raw = sqlite3.connect(workdir / "raw.db", isolation_level=None)
    raw.execute("PRAGMA journal_mode=WAL")
    raw.execute("PRAGMA synchronous=FULL")
    raw.execute("CREATE TABLE session_input (session_id TEXT, seq INTEGER, input_id TEXT, kind TEXT, payload TEXT,"
                " content_digest TEXT, received_at TEXT, PRIMARY KEY (session_id, seq))")
    t0 = time.perf_counter()
    for seq, inp in enumerate(inputs, 1):
        raw.execute("BEGIN IMMEDIATE")
        raw.execute("INSERT INTO session_input VALUES (?, ?, ?, ?, ?, ?, ?)",
                    ("bench", seq, inp["input_id"], inp["kind"], canonical_json(inp["payload"]),
                     digest({"kind": inp["kind"], "payload": inp["payload"]}), utc_now_iso()))
        raw.execute("COMMIT")
    base = time.perf_counter() - t0
    raw.close()

    print(f"accept: {n} inputs, one transaction each, WAL + synchronous=FULL")
    print(f"  SessionLog.accept     {n / ours:10,.0f} accepts/s")
    print(f"  raw sqlite3 insert    {n / base:10,.0f} inserts/s")
    print(f"  ratio (ours / raw)    {base / ours:10.2f}x of raw throughput")


def bench_replay(n: int) -> bool:
    records = [Rec(seq, f"i{seq}", "message", {"text": "x"}, True, False, n) for seq in range(1, n + 1)]
    random.Random(42).shuffle(records)  # storage order != acceptance order

    t0 = time.perf_counter()
    baseline = sorted(records)
    base = time.perf_counter() - t0
    t0 = time.perf_counter()
    result = replay(records, reducer="inputs")
    ours = time.perf_counter() - t0
    assert result.known and len(result.order) == n and result.state[0][0] == baseline[0]

    rate = n / ours
    print(f"replay: {n:,} inputs in shuffled storage order, reducer 'inputs'")
    print(f"  replay()              {rate:12,.0f} inputs/s  ({ours:.3f} s)")
    print(f"  sorted() baseline     {n / base:12,.0f} inputs/s  ({base:.3f} s)")
    print(f"  ratio (ours / sorted) {base / ours:12.2f}x of sorted() throughput")
    ok = rate >= REPLAY_TARGET
    print(f"  target >= {REPLAY_TARGET:,} inputs/s: {'met' if ok else 'MISSED'}")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    args = parser.parse_args()
    accepts, inputs = (200, 50_000) if args.quick else (2_000, 1_000_000)
    with tempfile.TemporaryDirectory() as tmp:
        bench_accept(accepts, Path(tmp))
    ok = bench_replay(inputs)
    return 0 if ok or args.quick else 1


if __name__ == "__main__":
    raise SystemExit(main())
