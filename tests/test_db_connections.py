"""Write connections follow the work, not the thread: a pool of workers, an HTTP server or a recycled executor
submits from many threads over its life, and no thread may pin a connection after its work ends (issue 13:
the 16th distinct thread that ever submitted used to block 30 s and fail with a pool TimeoutError)."""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from taskkernel.coordinator.compose import build_kernel
from taskkernel.kernel.model.principal import LOCAL_OWNER
from taskkernel.kernel.store.db import MAX_IDLE_WRITERS, Database


def _create(db: Database, kernel: object, results: list[str]) -> None:
    result = kernel.submit({"type": "create_task", "idempotency_key": f"t-{uuid.uuid4()}",  # type: ignore[attr-defined]
                            "payload": {"sender": "ADMIN", "recipient": "DEV", "subject": "from a thread"}},
                           LOCAL_OWNER)
    results.append(result.status)


def test_a_hundred_short_lived_threads_each_submit_and_none_waits_for_a_connection(any_db: Database) -> None:
    kernel = build_kernel(any_db, None)
    results: list[str] = []
    started = time.monotonic()
    for i in range(100):  # one after another: each thread ends before the next starts, as a recycled executor's
        t = threading.Thread(target=_create, args=(any_db, kernel, results))
        t.start()
        t.join(timeout=60)
        assert not t.is_alive() and len(results) == i + 1, f"thread {i + 1} could not write"
    assert results == ["accepted"] * 100
    assert time.monotonic() - started < 60  # a pinned connection per thread would block 30 s at the 16th
    assert len(any_db._idle) <= MAX_IDLE_WRITERS  # noqa: SLF001 - what stays open between writes


def test_many_threads_at_once_share_the_pool(any_db: Database) -> None:
    """32 workers writing concurrently (twice the pool's size plus overflow) all finish: a write holds its
    connection only while it runs."""
    kernel = build_kernel(any_db, None)
    results: list[str] = []
    with ThreadPoolExecutor(32) as pool:
        for future in [pool.submit(_create, any_db, kernel, results) for _ in range(96)]:
            future.result(timeout=120)
    assert results.count("accepted") == 96
