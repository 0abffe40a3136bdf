"""The kernel's write path on PostgreSQL against raw psycopg writing the same rows, in the same run (issue 30,
item 6).

    python bench/pg_kernel.py [--n 1200] [--quick]    # TASKKERNEL_BENCH_PG: a server URL (default: local)

The workload is bench/kernel.py's: a task's whole lifecycle, six commands. Variants, alternating in chunks so the
server's noise hits them alike, each in a throwaway schema:

(r) raw psycopg: one transaction per command writing the event (SHA-256 link), the receipt and the task row with
    the document held in memory: no read, no check, no lock;
(k) TaskCommandKernel sequentially: every check, the keyed chain, the sealed head, the writer lock;
(g) 8 submitters through the group committer.

Goals: ``sequential_vs_raw`` >= 0.9 and ``group_vs_raw`` >= 3 (commands per second against raw's sequential).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import psycopg
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.kernel import STEPS, Grouped, Raw, Sequential, interleaved, raw_rows  # noqa: E402
from taskkernel.kernel.store.db import Database, with_pg_schema  # noqa: E402
from taskkernel.kernel.store.schema import metadata  # noqa: E402

SERVER = os.environ.get("TASKKERNEL_BENCH_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
GOALS = {"sequential_vs_raw": 0.9, "group_vs_raw": 3.0}


class PgStores:
    """Throwaway schemas on the server, dropped at the end."""

    def __init__(self) -> None:
        self.engine = sa.create_engine(SERVER, isolation_level="AUTOCOMMIT")
        self.schemas: list[str] = []

    def fresh(self) -> str:
        name = f"bench_{uuid.uuid4().hex[:12]}"
        with self.engine.connect() as conn:
            conn.exec_driver_sql(f"CREATE SCHEMA {name}")
        self.schemas.append(name)
        url = with_pg_schema(SERVER, name)
        db = Database(url, "full")
        db.create_schema(metadata)
        db.dispose()
        return url

    def close(self) -> None:
        with self.engine.connect() as conn:
            for name in self.schemas:
                conn.exec_driver_sql(f"DROP SCHEMA {name} CASCADE")
        self.engine.dispose()


class RawPg(Raw):
    """bench/kernel.py's Raw on psycopg: the same rows, one transaction per command."""

    def __init__(self, url: str) -> None:  # Raw makes SQLite files; this one holds a psycopg connection
        self.conn = psycopg.connect(sa.make_url(url).set(drivername="postgresql").render_as_string(False))
        self.steps, self.cons = STEPS, [None]
        self.tail, self.i, self.counter = (0, "0" * 64), 0, threading.Lock()

    def _commit(self, con: Any, stream: str, version: int, kind: str, data: dict[str, Any], key: str,
                doc: dict[str, Any]) -> None:
        rows = raw_rows(stream, version, kind, data, key, doc)
        h, statements = rows(*self.tail)
        with self.conn.transaction():
            cur = self.conn.cursor()
            for sql, params in statements:
                cur.execute(sql.replace("?", "%s"), params)
        self.tail = (self.tail[0] + 1, h)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1200, help="commands per variant (lifecycles of six)")
    ap.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    args = ap.parse_args()
    rounds = 4 if args.quick else 8
    if args.quick:
        args.n = 240
    stores = PgStores()
    try:
        runners: dict[str, Any] = {"raw": RawPg(stores.fresh())}
        seq_db, group_db = (Database(stores.fresh(), "full", chain_key=os.urandom(32)) for _ in range(2))
        runners["seq"], runners["group"] = Sequential(seq_db), Grouped(group_db)
        rates = interleaved(runners, args.n // STEPS, rounds)
        runners["group"].gc.close()
        runners["raw"].conn.close()
        seq_db.dispose()
        group_db.dispose()
    finally:
        stores.close()
    raw, seq, grp = rates["raw"][0], rates["seq"][0], rates["group"][0]
    result = {"store": "postgresql", "commands": args.n // STEPS // rounds * rounds * STEPS,
              "raw_psycopg_per_s": round(raw), "kernel_sequential_per_s": round(seq),
              "kernel_group_commit_8_per_s": round(grp),
              "sequential_vs_raw": round(seq / raw, 3), "group_vs_raw": round(grp / raw, 3), "targets": GOALS}
    print(json.dumps(result, indent=2))
    missed = [k for k, goal in GOALS.items() if result[k] < goal]
    if missed:
        print(f"goals missed: {', '.join(missed)}", file=sys.stderr)


if __name__ == "__main__":
    main()
