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
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from taskkernel.coordinator.compose import build_kernel
from taskkernel.coordinator.fcop import safeio
from taskkernel.coordinator.folders.adapter import FolderAdapter, open_folders
from taskkernel.coordinator.folders.projection import PROJECT_EFFECT
from taskkernel.coordinator.hosts import HostRegistry, plan_for
from taskkernel.coordinator.runners.config import runner_specs
from taskkernel.coordinator.runners.dispatcher import Dispatcher
from taskkernel.coordinator.runners.pool import Running
from taskkernel.coordinator.runners.tools import PERFORM_EFFECT, ToolExecutor
from taskkernel.coordinator.workspace import Workspace
from taskkernel.kernel.logging import get_logger
from taskkernel.kernel.outbox import OutboxRelay
from taskkernel.kernel.store import listen
from taskkernel.kernel.store.db import Database
from taskkernel.kernel.store.schema import outbox

if TYPE_CHECKING:
    from taskkernel.coordinator.automations import Automations
    from taskkernel.coordinator.fcop4.adapter import G4Adapter

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

    @property
    def refused(self) -> bool:
        """A write the safe file layer refused (``scan_refused``, …): one entry per operation and reason."""
        return self.stage.endswith(REFUSED)

    @property
    def key(self) -> str:
        """Where ``Coordinator.failing`` keeps it: a stage's last failure replaces its previous one; a refused
        operation holds one entry per reason, since several refusals of one operation can stand at once."""
        return f"{self.stage}:{self.error}" if self.refused else self.stage


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


@dataclass
class Shutdown:
    """How `run` ended: ``stopped`` (every run finished in the grace) or ``interrupted`` (runs were stopped),
    and the runs that were running when the stop began."""

    status: str
    running_at_stop: list[dict[str, object]]


Stage = Callable[[], int]
ONCE_WAIT_MAX_S = 300.0  # up --once waits for retries due within this by default
COMMIT_POLL_S = 0.05  # how often `run` looks at the event log's head (SQLite)
# PostgreSQL: every commit wakes `run` by NOTIFY (kernel/store/listen.py); the head is still looked at this often,
# for the time the listening connection is lost
COMMIT_FALLBACK_S = 1.0
REFUSED = "_refused"  # suffix of the entries for writes the safe file layer refused (e.g. "ledger_refused")
_AFTER_RUNS = ("project", "ledger")  # stages a pass runs after starting the due runs
PROJECTION_WAIT_S = 30.0  # how long a run waits for its TASK file to be projected before starting anyway
INGEST_WAIT_S = 10.0  # how long, beyond the settle time, a finished run waits for the files it wrote to be taken in
_CORE_FIELDS = {"dispatch": "dispatched", "wakes": "wakes", "runs": "runs"}  # stage -> PassStats field
# taskkernel.scheduler.tables' name for it: importing that package loads the whole scheduler (APScheduler included)
SCHEDULE_TABLE = "schedule"


class Coordinator:
    def __init__(self, workspace: Workspace, db: Database, *, owner: str | None = None, settle_s: float = 1.0,
                 grace_s: float = 5.0, host: str | None = None) -> None:
        self.workspace = workspace
        self.db = db
        self.kernel = build_kernel(db, workspace)
        team = workspace.team()
        roles = self.kernel.roles
        handlers = {code: spec.handler for code in roles.codes() if (spec := roles.get(code)).handler}
        # A runner for a role the team lacks, a program not installed, an OS user it cannot become, a host name
        # taskkernel.toml's [hosts] lacks: refused here (ConfigError, a ValueError: `up` exits 64), never found out
        # when a task's run fails.
        specs = runner_specs(workspace.config, root=workspace.root, roles=roles)
        self.host = plan_for(workspace.config, host, {role: spec.concurrency for role, spec in specs.items()})
        self.owner = owner or f"{self.host.name}:{os.getpid()}"
        self._wake_soon: Callable[[], None] = lambda: None  # set by `run`: a finished run wakes the loop
        self._once_stopped = threading.Event()  # `run_once` waiting for a retry ends at once on a signal
        self.dispatcher = Dispatcher(self.kernel, workspace.root, specs,
                                     owner=self.owner, leader=team.leader, handlers=handlers,
                                     task_file=self._task_file, max_runs=self.host.max_runs,
                                     slots=dict(self.host.slots),
                                     on_run_done=lambda: self._wake_soon(), settled=self._projected,
                                     files_taken=self._files_taken,
                                     worktree_excludes=workspace.config.worktrees.patterns())
        self.stages: dict[str, Stage] = {}  # further adapters (scheduler) register here
        self.failing: dict[str, StageFailure] = {}  # by StageFailure.key: what fails now, for logs and the live view
        self.add_stage("host", HostRegistry(db, self.host, self.owner).beat)
        folder_cfg = workspace.config.folders
        self.folders: FolderAdapter | G4Adapter | None = None
        self._settle_s = settle_s
        self._ingest_done = threading.Condition()
        self._ingested_from = float("-inf")  # when the last finished ingest pass began (time.time())
        self._pass_wanted = threading.Event()  # a run's worker waits for a pass (run_once passes only when asked)
        if folder_cfg.enabled:
            self.folders = open_folders(self.kernel, workspace.root, settle_s=settle_s, grace_s=grace_s,
                                        submit_on_done_report=folder_cfg.submit_on_done_report)
            self.add_stage("ingest", self._ingest)
        self.tools = OutboxRelay(db, {PERFORM_EFFECT: ToolExecutor(self.kernel, workspace.root)})
        self.add_stage("actions", self.tools.run_pending)
        self._automations: Automations | None = None  # loaded with the first schedule (`automations`)
        self.add_stage("automations", self._tick_automations)  # `run` replaces it by the scheduler's own timer
        if self.folders is not None:
            self.add_stage("project", self.folders.project_pass)
            self.add_stage("ledger", self.folders.ledger_pass)

    @property
    def automations(self) -> Automations:
        """The scheduler wired to this coordinator's kernel, loaded when first needed: a workspace without a
        schedule never imports it (APScheduler, trigger maths)."""
        if self._automations is None:
            from taskkernel.coordinator.automations import Automations
            from taskkernel.kernel.sessionlog import SessionLog

            self._automations = Automations(self.kernel, self.owner, self.workspace.config.scheduler.as_mapping(),
                                            session_log=SessionLog(self.db, self.workspace.grant_sessions))
        return self._automations

    def _scheduled(self) -> bool:
        """Has the workspace ever had a schedule (removed ones included: their occurrences may still be
        running)? Until it has, there is nothing for the scheduler to do."""
        if self._automations is not None:
            return True
        try:
            with self.db.read() as conn:
                return conn.exec_driver_sql(f"SELECT 1 FROM {SCHEDULE_TABLE} LIMIT 1").first() is not None
        except (sa.exc.OperationalError, sa.exc.ProgrammingError):
            with self.db.read() as conn:  # a database made table by table: the scheduler makes its own when used
                if sa.inspect(conn).has_table(SCHEDULE_TABLE):
                    raise
            return False

    def _tick_automations(self) -> int:
        """The automations stage (`run_once`): one durable scheduler pass, once there is a schedule."""
        return self.automations.tick() if self._scheduled() else 0

    async def _run_automations(self, stop: asyncio.Event, poll_seconds: float) -> None:
        """The scheduler's own timer (`run`), started once the workspace has a schedule (looked for every
        ``poll_seconds``; another process may add the first one while this one runs)."""
        while True:
            try:
                if await asyncio.to_thread(self._scheduled):
                    automations = await asyncio.to_thread(lambda: self.automations)  # its tables made off the loop
                    break
            except Exception as exc:  # noqa: BLE001 - a failed look or set-up (a locked store): again a poll later
                log.warning("scheduler_start_failed", error=f"{type(exc).__name__}: {exc}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), poll_seconds)
            if stop.is_set():
                return
        await automations.run(stop)

    def _task_file(self, doc: dict[str, Any]) -> Path:
        """The agent reads its TASK file where the projection put it."""
        if self.folders is not None:
            path = self.folders.projection.find(doc["task_id"]) or self.folders.projection.place(doc["task_id"])
            if path is not None:
                return path
        return self.dispatcher.fallback_task_file(doc)

    def _projected(self, position: int, stop: threading.Event) -> None:
        """Wait (a run's worker thread) until the folders reflect the event at ``position``: its projection is
        done, has failed once, or PROJECTION_WAIT_S passed. Runs start as soon as their own TASK file is in
        place, while the projection works through the rest, instead of after a whole projection stage."""
        if self.folders is None:
            return
        key = f"{PROJECT_EFFECT}:{position}"
        deadline = time.monotonic() + PROJECTION_WAIT_S
        while time.monotonic() < deadline and not stop.is_set():
            with self.db.read() as conn:
                row = conn.execute(sa.select(outbox.c.status, outbox.c.last_error)
                                   .where(outbox.c.effect_key == key)).first()
            if row is None or row.status not in ("pending", "claimed") or row.last_error is not None:
                return  # projected, or failing (a refused write is retried, and reported, by its own stage)
            self._wake_soon()
            time.sleep(0.02)
        if not stop.is_set():
            log.warning("run_started_before_projection", position=position, waited_s=PROJECTION_WAIT_S)

    def _ingest(self) -> int:
        """The ingest stage, noting when each pass that finished began (``_files_taken`` waits on it)."""
        assert self.folders is not None
        began = time.time()
        try:
            return self.folders.ingest_pass()
        finally:
            with self._ingest_done:
                self._ingested_from = max(self._ingested_from, began)
                self._ingest_done.notify_all()

    def _files_taken(self, since: float, stop: threading.Event) -> None:
        """Wait (a run's worker thread) until an ingest pass that began once the files written before ``since`` had
        settled has finished, or INGEST_WAIT_S passed: an agent that reports with a REPORT file (FCoP) is judged by
        its report, not as a run that left none (``no_report``)."""
        if self.folders is None:
            return
        ready = since + self._settle_s
        deadline = time.monotonic() + self._settle_s + INGEST_WAIT_S
        with self._ingest_done:
            while self._ingested_from < ready and time.monotonic() < deadline and not stop.is_set():
                self._pass_wanted.set()
                self._wake_soon()
                self._ingest_done.wait(0.05)

    def add_stage(self, name: str, stage: Stage) -> None:
        self.stages[name] = stage

    def pass_once(self) -> PassStats:
        """One pass over every stage. A stage that fails is logged and skipped for this pass: the
        coordinator keeps running, and the work it left (outbox rows, leases) is retried later."""
        stats = PassStats()
        # Runs start before the projection stage: each run's worker waits for its own TASK file to be in place
        # (`_projected`), so agents start as their files land instead of after the whole batch.
        later = {name: self.stages[name] for name in _AFTER_RUNS if name in self.stages}
        stages: list[tuple[str, Stage]] = [*((n, s) for n, s in self.stages.items() if n not in later),
                                           ("dispatch", self.dispatcher.dispatch_new),
                                           ("wakes", self.dispatcher.relay_wakes),
                                           ("runs", self.dispatcher.run_due), *later.items()]
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
        refused = [StageFailure(f"{op}{REFUSED}", reason, f"{count} write(s) refused, last at {path}")
                   for (op, reason), (count, path) in safeio.drain_refusals().items()]
        for failure in refused:  # every reason of every operation: two refusals of one write both show
            self._failed(stats, failure, traceback=False)
        standing = {f.key for f in refused}
        for key, failure in [(k, f) for k, f in self.failing.items() if f.refused and k not in standing]:
            del self.failing[key]
            log.warning("coordinator_stage_recovered", stage=failure.stage, error=failure.error)
        return stats

    def _failed(self, stats: PassStats, failure: StageFailure, traceback: bool = True) -> None:
        """Record and log a failure: with its traceback when new, as one line while it repeats."""
        stats.failed.append(failure)
        repeated = self.failing.get(failure.key) == failure
        self.failing[failure.key] = failure
        log.error("coordinator_stage_failed", stage=failure.stage, error=failure.error, message=failure.message,
                  repeated=repeated, exc_info=traceback and not repeated)

    def run_once(self, max_passes: int = 10_000, once_wait: float | None = None) -> list[PassStats]:
        """Process everything pending, waiting for the runs started meanwhile and, once none runs, for retries
        due within ``once_wait`` seconds from then (default ONCE_WAIT_MAX_S); retries due later are left
        pending (the ledger says which). A shutdown (``interrupt_once``) ends it once the running agents are
        stopped."""
        limit = ONCE_WAIT_MAX_S if once_wait is None else once_wait
        pool, roles = self.dispatcher.pool, list(self.dispatcher.slots)  # the roles whose runs this host takes
        history = []
        for _ in range(max_passes):
            finished = pool.finished
            stats = self.pass_once()
            history.append(stats)
            if stats.progress or pool.finished != finished:  # a run that ended mid-pass left work to see
                continue
            if len(pool):  # until a run ends (its task moved, or a slot is free), or one waits for a pass
                while not pool.wait(finished, timeout=0.05) and not self._pass_wanted.is_set():
                    pass
                self._pass_wanted.clear()
                continue
            wait_s = self.dispatcher.ledger.next_due_in(roles) if self.dispatcher.accepting else None
            if wait_s is None:
                break
            if wait_s > limit or (wait_s <= 0 and stats.runs == 0):  # later than the wait, or due but not taken
                break
            if self._once_stopped.wait(max(0.0, wait_s) + 0.01):
                break
        return history

    def interrupt_once(self) -> list[Running]:
        """Stop `run_once` (a signal): no run starts, the running agents are stopped (SIGTERM, kill_grace,
        SIGKILL) and their runs are due again at the next start."""
        self.dispatcher.drain()
        self._once_stopped.set()
        return self.dispatcher.pool.stop_all()

    async def run(self, stop: asyncio.Event, poll_seconds: float = 1.0,
                  on_pass: Callable[[PassStats], None] | None = None, force: asyncio.Event | None = None,
                  shutdown_grace: float | None = None) -> Shutdown:
        """Work until ``stop``: a pass after every burst of file changes (watchfiles), every commit (the event
        log's head, looked at every COMMIT_POLL_S; on PostgreSQL a NOTIFY, and a look every COMMIT_FALLBACK_S),
        every finished run, and at least every ``poll_seconds``.
        Then shut down: start no run, let the running ones finish for ``shutdown_grace`` seconds (default
        ``[kernel] shutdown_grace``) while the other stages go on, and stop those still running when the grace
        ends or ``force`` is set (SIGTERM, the role's kill_grace, SIGKILL): their runs are due again at the
        next start."""
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()

        def wake_soon() -> None:
            loop.call_soon_threadsafe(wake.set)

        self._wake_soon = wake_soon
        watchers = [asyncio.create_task(self._watch_commits(stop, wake))]
        if self.folders is not None:
            watchers.append(asyncio.create_task(self._watch(stop, wake)))
        self.stages.pop("automations", None)
        scheduler = asyncio.create_task(self._run_automations(stop, poll_seconds))
        force = force or asyncio.Event()
        try:
            while not stop.is_set():
                await self._pass(wake, on_pass, poll_seconds, stop)
            shutdown = await self._shut_down(wake, on_pass, force, poll_seconds, shutdown_grace)
        finally:
            stop.set()
            self.dispatcher.pool.close()
            self._wake_soon = lambda: None
            await scheduler
            for watcher in watchers:
                watcher.cancel()
                try:
                    await watcher
                except asyncio.CancelledError:
                    pass
                except Exception as exc:  # noqa: BLE001 - a watcher that died is said; the stop still completes
                    log.warning("watcher_failed", error=f"{type(exc).__name__}: {exc}"[:300])
        log.info("coordinator_stopped", owner=self.owner, status=shutdown.status)
        return shutdown

    async def _pass(self, wake: asyncio.Event, on_pass: Callable[[PassStats], None] | None, poll_seconds: float,
                    *events: asyncio.Event) -> None:
        """One pass, then (when it moved nothing) a wait for a wake-up, one of ``events``, or the poll."""
        wake.clear()
        stats = await asyncio.to_thread(self.pass_once)
        if on_pass is not None:
            on_pass(stats)
        if stats.progress == 0:
            waiters = [asyncio.create_task(e.wait()) for e in (wake, *events)]
            await asyncio.wait(waiters, timeout=poll_seconds, return_when=asyncio.FIRST_COMPLETED)
            for w in waiters:
                w.cancel()

    async def _shut_down(self, wake: asyncio.Event, on_pass: Callable[[PassStats], None] | None,
                         force: asyncio.Event, poll_seconds: float, grace: float | None) -> Shutdown:
        running = self.dispatcher.drain()
        shutdown = Shutdown("stopped", [r.describe() for r in running])
        if not running:
            return shutdown
        grace_s = self.workspace.config.kernel.shutdown_grace if grace is None else grace
        log.warning("shutdown_waiting", running=shutdown.running_at_stop, grace_s=grace_s)
        deadline = time.monotonic() + grace_s
        while len(self.dispatcher.pool) and not force.is_set() and time.monotonic() < deadline:
            await self._pass(wake, on_pass, min(poll_seconds, max(0.0, deadline - time.monotonic())), force)
        if len(self.dispatcher.pool):
            shutdown.status = "interrupted"
            stopping = self.dispatcher.pool.stop_all()
            log.warning("shutdown_interrupting", runs=[r.run.run_id for r in stopping],
                        why="second signal" if force.is_set() else f"grace of {grace_s:g}s ended")
            await asyncio.to_thread(self.dispatcher.pool.wait)
        await asyncio.to_thread(self.pass_once)  # what the last runs committed reaches the folders
        return shutdown

    async def _watch_commits(self, stop: asyncio.Event, wake: asyncio.Event) -> None:
        """Wake the loop when the event log grows (a command from another process or host, an agent's report)."""
        listening = None
        if self.db.is_postgres:  # a commit anywhere NOTIFYs: the head's poll is only the fallback
            listening = listen.on_commit(self.db.engine.url, self._wake_soon)
        try:
            last, failing = None, False
            while not stop.is_set():
                try:
                    head = await asyncio.to_thread(self._event_head)
                except Exception as exc:  # noqa: BLE001 - a store briefly away (a restart): said once, looked again
                    if not failing:
                        log.warning("commit_watch_failed", error=f"{type(exc).__name__}: {exc}"[:300])
                    failing = True
                else:
                    if failing:
                        log.info("commit_watch_recovered")
                    if last is not None and head != last:
                        wake.set()
                    last, failing = head, False
                await asyncio.sleep(COMMIT_POLL_S if listening is None else COMMIT_FALLBACK_S)
        finally:
            if listening is not None:
                listening.close()

    def _event_head(self) -> int:
        with self.db.read() as conn:
            return int(conn.exec_driver_sql("SELECT max(global_pos) FROM events").scalar() or 0)

    async def _watch(self, stop: asyncio.Event, wake: asyncio.Event) -> None:
        from watchfiles import awatch

        assert self.folders is not None
        async for _changes in awatch(self.folders.fcop.root, stop_event=stop, debounce=50, step=20):
            wake.set()
