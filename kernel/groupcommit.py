"""Group commit: many concurrent submitters, one writer thread, one transaction (one fsync) per batch.

Each caller blocks until the batch holding its command has committed, so "accepted" still
means durable. Order inside a batch is arrival order; every command is judged against the
state left by the ones before it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

from taskkernel.kernel.commands import TaskCommandKernel
from taskkernel.kernel.model.commands import Command, CommandResult
from taskkernel.kernel.model.principal import Principal

_Item = tuple[Mapping[str, Any] | Command, Principal | None, "Future[CommandResult]"]
_STOP = object()


class GroupCommitter:
    def __init__(self, kernel: TaskCommandKernel, max_batch: int = 64, linger: float = 0.0002) -> None:
        self.kernel = kernel
        self.max_batch = max_batch
        # How long the writer waits for one more command before committing what it has: submitters
        # woken by the previous commit need a moment to hand in their next command.
        self.linger = linger
        self._queue: queue.Queue[Any] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="taskkernel-group-commit", daemon=True)
        self._thread.start()

    def submit(self, command: Mapping[str, Any] | Command, principal: Principal | None) -> CommandResult:
        fut: Future[CommandResult] = Future()
        self._queue.put((command, principal, fut))
        return fut.result()

    def close(self) -> None:
        self._queue.put(_STOP)
        self._thread.join()

    def __enter__(self) -> GroupCommitter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> None:
        expected = 1  # how many submitters were active last time: worth waiting for that many
        while True:
            first = self._queue.get()
            if first is _STOP:
                return
            batch: list[_Item] = [first]
            stop = False
            while len(batch) < self.max_batch:
                try:
                    # linger only until the batch is as large as the last one; then take what is there
                    wait = self.linger if len(batch) < expected else 0.0
                    nxt = self._queue.get(timeout=wait) if wait else self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP:
                    stop = True
                    break
                batch.append(nxt)
            expected = len(batch)
            self._commit(batch)
            if stop:
                return

    def _commit(self, batch: list[_Item]) -> None:
        try:
            results = self.kernel.submit_batch([(cmd, principal) for cmd, principal, _ in batch])
        except Exception:  # noqa: BLE001 - the batch rolled back: give every command its own transaction
            for cmd, principal, fut in batch:
                try:
                    fut.set_result(self.kernel.submit(cmd, principal))
                except Exception as exc:  # noqa: BLE001 - only this caller sees its command's failure
                    fut.set_exception(exc)
            return
        for (_, _, fut), result in zip(batch, results, strict=True):
            fut.set_result(result)
