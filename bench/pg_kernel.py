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
import hashlib
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import psycopg
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.kernel import LIFECYCLE, STEPS, Grouped, Sequential, interleaved  # noqa: E402
from taskkernel.kernel.canonical import canonical_json, utc_now_iso  # noqa: E402
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


class RawPg:
    """bench/kernel.py's Raw on psycopg: the same rows, one transaction per command."""

    steps = STEPS

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(sa.make_url(url).set(drivername="postgresql").render_as_string(False))
        self.tail, self.i = (0, "0" * 64), 0

    def _commit(self, stream: str, version: int, kind: str, data: dict[str, Any], key: str,
                doc: dict[str, Any]) -> None:
        at = utc_now_iso()
        data_text = canonical_json(data)
        meta = canonical_json({"actor": "dev-1", "command_id": key, "command_type": kind, "recorded_at": at})
        result = canonical_json({"status": "accepted", "task_id": doc["task_id"], "revision": version})
        doc.update(revision=version, updated_at=at)
        pos, prev = self.tail
        h = hashlib.sha256("\x1f".join((prev, str(pos + 1), stream, str(version), kind, data_text, meta, at))
                           .encode()).hexdigest()
        with self.conn.transaction():
            cur = self.conn.cursor()
            cur.execute("INSERT INTO events VALUES (%s, %s, %s, %s, 1, %s, %s, %s, %s)",
                        (pos + 1, stream, version, kind, data_text, meta, at, h))
            cur.execute("INSERT INTO receipts VALUES (%s, %s, %s, 'ADMIN', %s, %s, %s, %s, %s)",
                        (key, kind, h, doc["task_id"], result, pos + 1, pos + 1, at))
            text = canonical_json(doc)
            if version == 1:
                cur.execute("INSERT INTO tasks VALUES (%s, 'inbox', 1, 0, NULL, %s, 'DEV', %s, %s)",
                            (doc["task_id"], doc["task_id"], text, pos + 1))
            else:
                cur.execute("UPDATE tasks SET state = %s, revision = %s, round = %s, doc = %s, last_pos = %s "
                            "WHERE task_id = %s", (doc["state"], version, doc["round"], text, pos + 1, doc["task_id"]))
        self.tail = (pos + 1, h)

    def lifecycle(self) -> None:
        self.i += 1
        tid = f"TASK-20260101-{self.i:03d}"
        doc: dict[str, Any] = {"task_id": tid, "thread_key": tid, "parent": None, "root": tid, "sender": "ADMIN",
                               "recipient": "DEV", "subject": f"task {self.i}", "body": "do the thing",
                               "state": "inbox", "round": 0, "reports": []}
        self._commit(f"task:{tid}", 1, "task_created", {**doc, "by": "ADMIN:local-owner"}, f"raw-{self.i}", doc)
        for kind, revision, _, payload, who, event_type, state in LIFECYCLE:
            data = {"by": who.id, "from": doc["state"], "round": 1, **(payload or {})}
            doc.update(state=state, round=1)
            self._commit(f"task:{tid}", revision + 1, event_type, data, f"raw-{kind}-{self.i}", doc)

    def run(self, lifecycles: int) -> None:
        for _ in range(lifecycles):
            self.lifecycle()


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
