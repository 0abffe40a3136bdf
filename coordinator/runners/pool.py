"""Where agent runs execute: a pool of worker threads off the coordinator's loop, with a global limit
(``[kernel] max_runs``) and per-role slots (``[roles.X] concurrency``).

The pool only decides how many runs this coordinator starts at once; which run may start is still the run
ledger's decision (a claim under a lease with a fencing token), so exactly-once is unchanged. Ingest,
projection, the scheduler and other roles keep going while agents run: a pass never waits for an agent.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from taskkernel.coordinator.runners.ledger import ClaimedRun
from taskkernel.kernel.logging import get_logger

log = get_logger(__name__)


@dataclass(frozen=True)
class Running:
    """A run in progress here: what the live view and a shutdown report show."""

    run: ClaimedRun
    agent: str
    timeout: float | None  # the command runner's limit (None: a scripted agent, run in process)
    started: float = field(default_factory=time.time)  # epoch seconds
    stop: threading.Event = field(default_factory=threading.Event)

    def describe(self, now: float | None = None) -> dict[str, object]:
        return {"run_id": self.run.run_id, "task_id": self.run.task_id, "role": self.run.role, "agent": self.agent,
                "attempt": self.run.attempt, "elapsed_s": round((now or time.time()) - self.started, 1),
                "timeout_s": self.timeout}


class RunPool:
    def __init__(self, max_runs: int, concurrency: Mapping[str, int],
                 on_done: Callable[[], None] | None = None) -> None:
        self.max_runs = max_runs
        self.concurrency = dict(concurrency)
        self.on_done = on_done  # wakes the coordinator: a slot is free, the task may have moved
        self._executor = ThreadPoolExecutor(max_workers=max_runs, thread_name_prefix="taskkernel-run")
        self._running: dict[str, Running] = {}
        self.finished = 0  # runs ended so far: a pass that saw this change may have missed what they committed
        self._lock = threading.RLock()  # re-entrant: a signal handler (up --once) may stop runs mid-call
        self._finished = threading.Condition(self._lock)

    def free(self) -> tuple[int, dict[str, int]]:
        """(free runs in all, free slots per role)."""
        with self._lock:
            busy: dict[str, int] = {}
            for r in self._running.values():
                busy[r.run.role] = busy.get(r.run.role, 0) + 1
            total = self.max_runs - len(self._running)
        return total, {role: max(0, n - busy.get(role, 0)) for role, n in self.concurrency.items()}

    def start(self, running: Running, work: Callable[[Running], None]) -> None:
        with self._lock:
            self._running[running.run.run_id] = running
        future = self._executor.submit(work, running)
        future.add_done_callback(lambda f: self._done(running, f))

    def held(self) -> frozenset[str]:
        """The runs running here: the ledger must not hand one of them to this coordinator again."""
        with self._lock:
            return frozenset(self._running)

    def _done(self, running: Running, future: Future[None]) -> None:
        if (exc := future.exception()) is not None:  # the work's own handler failed: never silently
            log.error("run_worker_failed", run_id=running.run.run_id, error=f"{type(exc).__name__}: {exc}",
                      exc_info=exc)
        with self._lock:
            self._running.pop(running.run.run_id, None)
            self.finished += 1
            self._finished.notify_all()
        if self.on_done is not None:
            self.on_done()

    def running(self) -> list[Running]:
        with self._lock:
            return sorted(self._running.values(), key=lambda r: r.started)

    def __len__(self) -> int:
        with self._lock:
            return len(self._running)

    def wait(self, seen: int | None = None, timeout: float | None = None) -> bool:
        """Until a run ends after ``finished`` was ``seen`` (None: every run has ended); False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while self._running if seen is None else self.finished == seen:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._finished.wait(left)
            return True

    def stop_all(self) -> list[Running]:
        """Ask every running agent to be stopped now (SIGTERM, the role's kill_grace, SIGKILL)."""
        running = self.running()
        for r in running:
            r.stop.set()
        return running

    def close(self) -> None:
        self.stop_all()
        self._executor.shutdown(wait=True)


