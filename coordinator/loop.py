"""The coordinator (`taskkernel up`): wires the adapters around the kernel and drives them.

One pass = dispatch new tasks, relay wake-ups, run due agents. `run_once` repeats passes
until nothing moves (for scripts and tests); `run` keeps going until stopped. A stage that fails
is contained to its pass but never silent: it is logged, and the pass says which stage failed and
why, so `up --once` can exit degraded and `up` can show it live.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from taskkernel.coordinator.automations import Automations
from taskkernel.coordinator.compose import build_kernel
from taskkernel.coordinator.fcop import safeio
from taskkernel.coordinator.folders.adapter import FolderAdapter
from taskkernel.coordinator.runners.config import runner_specs
from taskkernel.coordinator.runners.dispatcher import Dispatcher
from taskkernel.coordinator.runners.tools import PERFORM_EFFECT, ToolExecutor
from taskkernel.coordinator.workspace import Workspace
from taskkernel.kernel.logging import get_logger
from taskkernel.kernel.outbox import OutboxRelay
from taskkernel.kernel.sessionlog import SessionLog
from taskkernel.kernel.store.db import Database

log = get_logger(__name__)


@dataclass(frozen=True)
class StageFailure:
    """A stage that raised during a pass: its name and the error's class and first words (no traceback)."""

    stage: str
    error: str
    message: str

    @classmethod
    def of(cls, stage: str, exc: BaseException) -> StageFailure:
        return cls(stage, type(exc).__name__, " ".join(str(exc).split())[:300])


@dataclass
class PassStats:
    dispatched: int = 0
    wakes: int = 0
    runs: int = 0
    failed: list[StageFailure] = field(default_factory=list)
    extra: dict[str, int] = field(default_factory=dict)

    @property
    def progress(self) -> int:
        return self.dispatched + self.wakes + self.runs + sum(self.extra.values())


Stage = Callable[[], int]
REFUSED = "_refused"  # suffix of the entries for writes the safe file layer refused (e.g. "ledger_refused")
_CORE_FIELDS = {"dispatch": "dispatched", "wakes": "wakes", "runs": "runs"}  # stage -> PassStats field


class Coordinator:
    def __init__(self, workspace: Workspace, db: Database, *, owner: str | None = None, settle_s: float = 1.0,
                 grace_s: float = 5.0) -> None:
        self.workspace = workspace
        self.db = db
        self.kernel = build_kernel(db, workspace)
        team = workspace.team()
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}"
        roles = self.kernel.roles
        handlers = {code: spec.handler for code in roles.codes() if (spec := roles.get(code)).handler}
        # A runner for a role the team lacks, a program not installed, an OS user it cannot become: refused
        # here (ConfigError, a ValueError: `up` exits 64), never found out when a task's run fails.
        specs = runner_specs(workspace.config, root=workspace.root, roles=roles)
        self.dispatcher = Dispatcher(self.kernel, workspace.root, specs,
                                     owner=self.owner, leader=team.leader, handlers=handlers,
                                     task_file=self._task_file)
        self.stages: dict[str, Stage] = {}  # further adapters (scheduler) register here
        self.failing: dict[str, StageFailure] = {}  # stages whose last run failed, for logs and the live view
        folder_cfg = workspace.config.folders
        self.folders: FolderAdapter | None = None
        if folder_cfg.enabled:
            self.folders = FolderAdapter(self.kernel, workspace.root, settle_s=settle_s, grace_s=grace_s,
                                         submit_on_done_report=folder_cfg.submit_on_done_report)
            self.add_stage("ingest", self.folders.ingest_pass)
        self.tools = OutboxRelay(db, {PERFORM_EFFECT: ToolExecutor(self.kernel, workspace.root)})
        self.add_stage("actions", self.tools.run_pending)
        self.automations = Automations(self.kernel, self.owner, workspace.config.scheduler.as_mapping(),
                                       session_log=SessionLog(db, workspace.grant_sessions))
        self.add_stage("automations", self.automations.tick)  # `run` replaces it by the scheduler's own timer
        if self.folders is not None:
            self.add_stage("project", self.folders.project_pass)
            self.add_stage("ledger", self.folders.ledger_pass)

    def _task_file(self, doc: dict[str, Any]) -> Path:
        """The agent reads its TASK file where the projection put it."""
        if self.folders is not None:
            path = self.folders.projection.find(doc["task_id"]) or self.folders.projection.place(doc["task_id"])
            if path is not None:
                return path
        return self.dispatcher.fallback_task_file(doc)

    def add_stage(self, name: str, stage: Stage) -> None:
        self.stages[name] = stage

    def pass_once(self) -> PassStats:
        """One pass over every stage. A stage that fails is logged and skipped for this pass: the
        coordinator keeps running, and the work it left (outbox rows, leases) is retried later."""
        stats = PassStats()
        stages: list[tuple[str, Stage]] = [*self.stages.items(), ("dispatch", self.dispatcher.dispatch_new),
                                           ("wakes", self.dispatcher.relay_wakes), ("runs", self.dispatcher.run_due)]
        for name, stage in stages:
            try:
                done = stage()
            except Exception as exc:  # noqa: BLE001 - one bad input must not stop the coordinator
                self._failed(stats, StageFailure.of(name, exc))
                continue
            if self.failing.pop(name, None) is not None:
                log.warning("coordinator_stage_recovered", stage=name)
            if name in _CORE_FIELDS:
                setattr(stats, _CORE_FIELDS[name], done)
            else:
                stats.extra[name] = done
        refused = {f"{op}{REFUSED}": (reason, count, path)
                   for (op, reason), (count, path) in safeio.drain_refusals().items()}
        for name, (reason, count, path) in refused.items():
            self._failed(stats, StageFailure(name, reason, f"{count} write(s) refused, last at {path}"),
                         traceback=False)
        for name in [n for n in self.failing if n.endswith(REFUSED) and n not in refused]:
            del self.failing[name]
            log.warning("coordinator_stage_recovered", stage=name)
        return stats

    def _failed(self, stats: PassStats, failure: StageFailure, traceback: bool = True) -> None:
        """Record and log a failure: with its traceback when new, as one line while it repeats."""
        stats.failed.append(failure)
        repeated = self.failing.get(failure.stage) == failure
        self.failing[failure.stage] = failure
        log.error("coordinator_stage_failed", stage=failure.stage, error=failure.error, message=failure.message,
                  repeated=repeated, exc_info=traceback and not repeated)

    def run_once(self, max_passes: int = 500) -> list[PassStats]:
        """Process everything pending, then return (runs that back off into the future are left due)."""
        history = []
        for _ in range(max_passes):
            stats = self.pass_once()
            history.append(stats)
            if stats.progress == 0:
                break
        return history

    async def run(self, stop: asyncio.Event, poll_seconds: float = 1.0,
                  on_pass: Callable[[PassStats], None] | None = None) -> None:
        """Work until ``stop``: a pass after every burst of file changes (watchfiles), and at least every
        ``poll_seconds`` as the safety net (timers, settling files, other coordinators' work)."""
        wake = asyncio.Event()
        watcher = asyncio.create_task(self._watch(stop, wake)) if self.folders is not None else None
        self.stages.pop("automations", None)
        scheduler = asyncio.create_task(self.automations.run(stop))
        try:
            while not stop.is_set():
                wake.clear()
                stats = await asyncio.to_thread(self.pass_once)
                if on_pass is not None:
                    on_pass(stats)
                if stats.progress == 0:
                    waiters = [asyncio.create_task(stop.wait()), asyncio.create_task(wake.wait())]
                    await asyncio.wait(waiters, timeout=poll_seconds, return_when=asyncio.FIRST_COMPLETED)
                    for w in waiters:
                        w.cancel()
        finally:
            stop.set()
            await scheduler
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
        log.info("coordinator_stopped", owner=self.owner)

    async def _watch(self, stop: asyncio.Event, wake: asyncio.Event) -> None:
        from watchfiles import awatch

        assert self.folders is not None
        async for _changes in awatch(self.folders.fcop.root, stop_event=stop, debounce=50, step=20):
            wake.set()
