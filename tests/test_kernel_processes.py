"""Real processes: concurrent submitters against one revision, and SIGKILL at random moments."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from taskkernel.kernel.store.db import Database
from taskkernel.kernel.verify import verify
from tests.cli_support import taskkernel
from tests.kernel_harness import ADMIN, Harness

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def worker(url: str, *args: str, **kw: object) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tests.procs.kernel_worker", url, *args], cwd=ROOT, env=ENV,
                            text=True, stdout=subprocess.PIPE, **kw)  # type: ignore[call-overload]


@pytest.mark.parametrize("n", [6])
def test_processes_racing_on_one_revision_exactly_one_wins(any_url: str, n: int) -> None:
    h = Harness(Database(any_url))
    tid = h.create().task_id
    h.cmd("claim", tid, ADMIN)
    h.report(tid, ADMIN)
    h.cmd("submit", tid, ADMIN)
    rev = h.kernel.task(tid)["revision"]
    start_at = time.time() + 3.0  # every process is up and waiting before the gun
    kinds = [("approve", {}), ("reject", {"reason": "no"}), ("amend", {"subject": "x"})]
    procs = []
    for i in range(n):
        kind, payload = kinds[i % len(kinds)]
        cmd = {"type": kind, "task_id": tid, "thread_key": tid, "expected_revision": rev, "round": 1,
               "idempotency_key": f"race-{i}", "payload": payload}
        procs.append(worker(any_url, "once", str(start_at), "ADMIN", json.dumps(cmd)))
    results = [json.loads(p.communicate(timeout=60)[0].strip().splitlines()[-1]) for p in procs]
    assert [r["status"] for r in results].count("accepted") == 1, results
    assert {r["reason"] for r in results if r["status"] != "accepted"} == {"stale_task_revision"}
    assert h.kernel.task(tid)["revision"] == rev + 1
    assert verify(h.db, h.kernel.store).ok
    h.db.dispose()


def _plan(n_tasks: int, reports_per_task: int) -> list[dict]:
    """Creates with fixed keys, then claims and report chains whose revisions the driver tracks."""
    return ([{"kind": "create", "i": i} for i in range(n_tasks)]
            + [{"kind": "claim", "i": i} for i in range(n_tasks)]
            + [{"kind": "report", "i": i, "j": j} for j in range(reports_per_task) for i in range(n_tasks)])


@pytest.mark.slow
def test_sigkill_at_random_moments_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'crash.db'}"
    rng = random.Random(20261130)
    plan = _plan(n_tasks=12, reports_per_task=10)
    task_ids: dict[int, str] = {}
    revisions: dict[int, int] = {}
    acked: dict[str, dict] = {}
    kills = 0
    step = 0
    proc = None

    def command_for(item: dict) -> tuple[dict, str]:
        i = item["i"]
        if item["kind"] == "create":
            return {"type": "create_task", "idempotency_key": f"create-{i}",
                    "payload": {"sender": "ADMIN", "recipient": "PM", "subject": f"task {i}"}}, "ADMIN"
        tid = task_ids[i]
        base = {"task_id": tid, "thread_key": tid, "expected_revision": revisions[i]}
        if item["kind"] == "claim":
            return {**base, "type": "claim", "round": 0, "idempotency_key": f"claim-{i}"}, "PM"
        return {**base, "type": "submit_report", "round": 1, "idempotency_key": f"report-{i}-{item['j']}",
                "payload": {"status": "in_progress", "body": f"step {item['j']}"}}, "PM"

    while step < len(plan) or kills < 30:
        if proc is None:
            proc = worker(url, "serve", stdin=subprocess.PIPE)
            assert json.loads(proc.stdout.readline())["ready"]
            kill_after = rng.uniform(0.0, 0.08)
            started = time.monotonic()
        if step >= len(plan):  # all work done: keep killing idle/restarting processes until 30 kills
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            kills, proc = kills + 1, None
            continue
        command, role = command_for(plan[step])
        proc.stdin.write(json.dumps({"command": command, "role": role}) + "\n")
        proc.stdin.flush()
        if time.monotonic() - started >= kill_after:
            # kill while the command may be anywhere between read, commit and reply
            time.sleep(rng.uniform(0.0, 0.004))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            line = proc.stdout.read().strip().splitlines()
            kills, proc = kills + 1, None
            if not line:
                continue  # no acknowledgement: the driver retries the same key
            reply = json.loads(line[-1])
        else:
            reply = json.loads(proc.stdout.readline())
        assert reply["status"] in ("accepted", "replayed"), reply
        key = command["idempotency_key"]
        acked[key] = reply
        i = plan[step]["i"]
        task_ids.setdefault(i, reply["task_id"])
        revisions[i] = reply["revision"]
        step += 1
    if proc is not None:
        proc.kill()
        proc.wait()

    assert kills >= 30
    db = Database(url)
    with db.read() as conn:
        per_key = dict(conn.exec_driver_sql(
            "SELECT json_extract(meta, '$.command_id'), count(*) FROM events GROUP BY 1").all())
        receipts = conn.exec_driver_sql("SELECT count(*) FROM receipts").scalar()
    assert set(per_key) == set(acked), "every acknowledged command is stored, and nothing else"
    assert set(per_key.values()) == {1}, "no command was applied twice"
    assert receipts == len(acked) == len(plan)
    db.dispose()
    cli = taskkernel("--db", url, "verify", cwd=ROOT)
    assert cli.returncode == 0, cli.stdout + cli.stderr
    assert json.loads(cli.stdout)["events"] == len(plan)
