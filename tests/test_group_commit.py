"""Group commit keeps every command's verdict while sharing transactions."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from taskkernel.kernel.groupcommit import GroupCommitter
from taskkernel.kernel.store.db import Database
from taskkernel.kernel.verify import verify
from tests.kernel_harness import ADMIN, PM, Harness


def test_concurrent_submitters_through_group_commit(any_db: Database) -> None:
    h = Harness(any_db)
    with GroupCommitter(h.kernel) as gc:
        def create(i: int) -> str:
            r = gc.submit({"type": "create_task", "idempotency_key": f"g{i}",
                           "payload": {"sender": "ADMIN", "recipient": "PM", "subject": f"t{i}"}}, ADMIN)
            assert r.status == "accepted"
            return str(r.task_id)

        with ThreadPoolExecutor(8) as pool:
            ids = list(pool.map(create, range(80)))
        assert len(set(ids)) == 80
        # same revision from 8 threads: one claim wins inside or across batches
        tid = ids[0]
        cmds = [{"type": "claim", "task_id": tid, "thread_key": tid, "expected_revision": 1, "round": 0,
                 "idempotency_key": f"claim-{i}"} for i in range(8)]
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda c: gc.submit(c, PM), cmds))
    assert [r.status for r in results].count("accepted") == 1
    assert h.event_count() == 81
    assert verify(h.db, h.kernel.store).ok
