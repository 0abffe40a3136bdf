"""Crash test: several processes, each with several threads, accept into one session and are SIGKILLed.

A child prints ``ACK <input_id> <seq>`` only after ``accept`` returned, i.e. after commit. After
the kill, the stored sequences must be exactly 1..N (no gap, no duplicate), the counter row must
agree, and every acknowledged input must be stored with the sequence it was acknowledged with.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import sqlalchemy as sa

from taskkernel.kernel.sessionlog import SessionLog
from taskkernel.kernel.sessionlog.tables import session_counter, session_input
from taskkernel.kernel.store.db import Database
from tests.cli_support import cli_env

CHILD = r"""
import sys, threading
from taskkernel.kernel.store.db import Database
from taskkernel.kernel.sessionlog import SessionLog

url, session, prefix, nthreads = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
log = SessionLog(Database(url))
out = threading.Lock()

def work(t):
    i = 0
    while True:
        iid = f"{prefix}-{t}-{i}"
        res = log.accept(session, {"input_id": iid, "kind": "queued", "payload": {"text": iid}})
        with out:
            sys.stdout.write(f"ACK {iid} {res.accept_seq}\n")
            sys.stdout.flush()
        i += 1

threads = [threading.Thread(target=work, args=(t,)) for t in range(nthreads)]
for th in threads:
    th.start()
for th in threads:
    th.join()
"""

PROCESSES = 3
THREADS = 3
ACKS_BEFORE_KILL = 25  # per process


class Child:
    def __init__(self, url: str, prefix: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", CHILD, url, "s", prefix, str(THREADS)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env())
        self.acks: dict[str, int] = {}
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.endswith("\n") and line.startswith("ACK "):  # a torn last line acknowledges nothing
                _, iid, seq = line.split()
                self.acks[iid] = int(seq)


@pytest.mark.slow
def test_killed_accepters_leave_gapless_sequences_and_keep_every_ack(any_url: str) -> None:
    db = Database(any_url)
    SessionLog(db)  # create the tables before the children race for them
    children = [Child(any_url, f"p{n}") for n in range(PROCESSES)]
    deadline = time.monotonic() + 60
    while any(len(c.acks) < ACKS_BEFORE_KILL for c in children):
        dead = [c for c in children if c.proc.poll() is not None]
        assert not dead, dead[0].proc.stderr.read() if dead[0].proc.stderr else "child died"
        assert time.monotonic() < deadline, "children did not make progress"
        time.sleep(0.02)
    for c in children:  # mid-flight: every child has threads inside open transactions
        os.kill(c.proc.pid, signal.SIGKILL)
    for c in children:
        c.proc.wait(timeout=30)
        c.reader.join(timeout=30)
        assert c.proc.returncode == -signal.SIGKILL

    acks = {k: v for c in children for k, v in c.acks.items()}
    with db.read() as conn:
        rows = dict(conn.execute(sa.select(session_input.c.input_id, session_input.c.seq)
                                 .where(session_input.c.session_id == "s")).all())
        last_seq = conn.execute(sa.select(session_counter.c.last_seq)
                                .where(session_counter.c.session_id == "s")).scalar_one()
    assert sorted(rows.values()) == list(range(1, len(rows) + 1)), "sequences must be gapless and unique"
    assert last_seq == len(rows)
    missing = {k: v for k, v in acks.items() if rows.get(k) != v}
    assert not missing, f"acknowledged but not stored as acknowledged: {missing}"
    assert len(rows) >= PROCESSES * ACKS_BEFORE_KILL

    log = SessionLog(db)
    assert log.replay("s").known
    some = next(iter(acks))
    retry = log.accept("s", {"input_id": some, "kind": "queued", "payload": {"text": some}})
    assert (retry.status, retry.accept_seq) == ("replayed", acks[some])
    assert log.accept("s", {"input_id": "after", "kind": "queued", "payload": {"text": "x"}}).accept_seq == last_seq + 1
    db.dispose()
