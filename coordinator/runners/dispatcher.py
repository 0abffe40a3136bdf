"""Dispatch: claim inbox tasks for roles that have a runner, wake agents, run them under leases.

Dispatch is a claim submitted through the kernel on the agent's behalf (the agent is recorded
as `by`); the claim's outbox row, written in the same transaction, becomes a run in the run
ledger. A run is judged by what it left on its task, not by its exit code alone (runners/outcomes.py:
`no_report`, `no_decision`). Runs are retried with exponential backoff up to the role's bound; after
that the task gets a `blocked` report with the reason and the agent's last output: never a silent
infinite retry, never a silent stall. A review run is never started for a role that cannot decide.

A run happens once even across coordinator crashes: whoever takes over an expired lease first
revokes the previous holder's token (`stale_lease`) and terminates its agent, and only then runs.
"""

from __future__ import annotations

import re
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from taskkernel.coordinator.config import NOT_TEAM, Isolation
from taskkernel.coordinator.runners.command import (
    ErrorCode,
    Outcome,
    Supervision,
    host_identity,
    run_command,
    terminate_group,
)
from taskkernel.coordinator.runners.config import RunnerKind, RunnerSpec
from taskkernel.coordinator.runners.inputs import RunInputs
from taskkernel.coordinator.runners.ledger import ClaimedRun, Orphan, Purpose, RunLedger
from taskkernel.coordinator.runners.outcomes import (
    blocked_body,
    file_blocked,
    last_output,
    merge_base_of,
    missing_outcome,
    still_relevant,
    undecidable,
    worktree_base,
)
from taskkernel.coordinator.runners.pool import Running, RunPool
from taskkernel.coordinator.runners.presets import ProfileRunner, preset_of
from taskkernel.coordinator.runners.prompt import CONTINUE_TEMPLATE, build_prompt, prompt_fields, resume_section
from taskkernel.coordinator.worktrees.effects import WORKTREE_EFFECT, WorktreeEffects
from taskkernel.coordinator.worktrees.git import GitError
from taskkernel.coordinator.worktrees.manager import Worktrees
from taskkernel.kernel.commands import EffectRule, TaskCommandKernel
from taskkernel.kernel.credentials import STALE_LEASE, issue_token, revoke_hash, revoke_token, token_hash
from taskkernel.kernel.goals import GoalService
from taskkernel.kernel.logging import get_logger
from taskkernel.kernel.model.commands import CommandType
from taskkernel.kernel.model.principal import Principal
from taskkernel.kernel.outbox import OutboxRelay
from taskkernel.kernel.sessionlog import SessionLog
from taskkernel.kernel.store.schema import tasks
from taskkernel.kernel.usage import Feature, UsageRecord, record_usage
from taskkernel.kernel.usage import install as install_usage

if TYPE_CHECKING:  # each runner kind's own modules load with its first run (_execute)
    from taskkernel.coordinator.runners.launch import Launch
    from taskkernel.coordinator.runners.live import RunOutput
    from taskkernel.coordinator.runners.scripted import ScriptedAgent

log = get_logger(__name__)

WAKE_EFFECT = "agent_wake"
WAKE_RULE = EffectRule(WAKE_EFFECT, frozenset({
    "task_claimed", "task_submitted", "task_rejected", "task_reopened", "task_approved", "task_archived",
    "task_force_archived", "task_retried"}))
ORPHAN_GRACE_S = 5.0  # between SIGTERM and SIGKILL for an agent a crashed coordinator left running
NEVER_STARTED = frozenset({ErrorCode.BINARY_MISSING, ErrorCode.SPAWN_FAILED, ErrorCode.CONFIG_INVALID})  # no agent
PERSON_OR_SHUTDOWN = frozenset({ErrorCode.STOPPED_BY_PERSON, ErrorCode.INTERRUPTED})  # says nothing of the CLI
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|AUTH|CREDENTIAL", re.IGNORECASE)


class Dispatcher:
    def __init__(self, kernel: TaskCommandKernel, workspace: Path, specs: dict[str, RunnerSpec], *,
                 owner: str, leader: str, handlers: dict[str, ScriptedAgent] | None = None,
                 task_file: Callable[[dict[str, Any]], Path] | None = None,
                 goals: GoalService | None = None, max_runs: int = 4,
                 on_run_done: Callable[[], None] | None = None,
                 settled: Callable[[int, threading.Event], None] | None = None,
                 worktree_excludes: list[str] | None = None,
                 files_taken: Callable[[float, threading.Event], None] | None = None,
                 slots: dict[str, int] | None = None) -> None:
        self.kernel = kernel
        self.db = kernel.db
        self.workspace = workspace
        self.specs = specs
        self.leader = leader
        self.handlers = handlers or {}
        self.task_file = task_file or self.fallback_task_file
        self.settled = settled  # waits until the files reflect the event at a position (the folder projection)
        self.files_taken = files_taken  # waits until files written before a time are taken in (the folder ingest)
        self.goals = goals or GoalService(self.db, kernel.store)
        leases = {role: spec.lease_seconds for role, spec in specs.items()}
        self.ledger = RunLedger(self.db, owner, lease_seconds=max(leases.values(), default=660.0),
                                role_leases=leases)
        self.host = host_identity()
        self.worktrees = Worktrees(self.db, workspace, worktree_excludes)
        self.relay = OutboxRelay(self.db, {WAKE_EFFECT: self._on_wake,
                                           WORKTREE_EFFECT: WorktreeEffects(kernel, self.worktrees, specs)})
        # The roles whose runs this host takes, with its slots (coordinator/hosts.py); wake-ups, merges and inbox
        # claims are every role's, whichever host relays them.
        self.slots = slots if slots is not None else {role: spec.concurrency for role, spec in specs.items()}
        self.pool = RunPool(max_runs, self.slots, on_run_done)
        self.inputs = RunInputs(self.db, SessionLog(self.db), specs)
        self.accepting = True  # False once a shutdown began: running agents finish, none starts
        self.warned: set[str] = set()  # roles `up` said have waiting tasks and no runner
        self._unrun_checked = float("-inf")
        install_usage(self.db)

    # -- one pass of each stage -------------------------------------------------------------
    def dispatch_new(self) -> int:
        """Claim every inbox task addressed to a role that has a runner (only those are read: a pass costs
        the work there is, not the size of the inbox)."""
        if not self.accepting:  # a shutdown began: claim nothing no agent would work on
            return 0
        if not self.specs:
            self._warn_unrun()
            return 0
        with self.db.read() as conn:
            rows = conn.execute(sa.select(tasks.c.task_id, tasks.c.recipient).where(
                tasks.c.state == "inbox", tasks.c.recipient.in_(list(self.specs))).order_by(tasks.c.task_id)).all()
        claimed = 0
        for task_id, recipient in rows:
            spec = self.specs.get(recipient)
            doc = self.kernel.task(task_id)
            if spec is None or doc is None or doc["state"] != "inbox":
                continue
            r = self.kernel.submit({"type": "claim", "task_id": task_id, "thread_key": doc["thread_key"],
                                    "expected_revision": doc["revision"], "round": doc["round"],
                                    "idempotency_key": f"dispatch:{task_id}"}, self._principal(recipient))
            claimed += r.status == "accepted"
            if r.status == "rejected" and r.reason != "stale_task_revision":
                log.warning("dispatch_refused", task_id=task_id, reason=r.reason, message=r.message)
        self._warn_unrun()
        return claimed

    def _warn_unrun(self) -> None:
        """Say once per role that inbox tasks wait for a role no runner serves (at most one look a second)."""
        now = time.monotonic()
        if now < self._unrun_checked + 1.0:
            return
        self._unrun_checked = now
        with self.db.read() as conn:
            rows = conn.execute(sa.select(tasks.c.recipient, sa.func.count()).where(
                tasks.c.state == "inbox", tasks.c.recipient.not_in([*self.specs, *NOT_TEAM, *self.warned]))
                .group_by(tasks.c.recipient)).all()
        for role, waiting in rows:
            self.warned.add(role)
            log.warning("role_without_runner", role=role, waiting=waiting,
                        hint=f"tasks wait for {role}, which has no runner: add [roles.{role}] to taskkernel.toml "
                             f"(docs/agents.md), or work them by hand (taskkernel task claim <id>)")

    def relay_wakes(self) -> int:
        """Wake-ups into runs; none while a shutdown drains (their outbox rows wait for the next start)."""
        return self.relay.run_pending() if self.accepting else 0

    def run_due(self) -> int:
        """Start the due runs there are free slots for, each in the pool; returns how many started."""
        if not self.accepting:
            return 0
        total, per_role = self.pool.free()
        claimed = self.ledger.claim_due(total, slots=per_role, held=self.pool.held())
        for run in claimed:
            spec = self.specs[run.role]
            timeout = spec.timeout if spec.spawns else None
            self.pool.start(Running(run, self._agent_name(run.role), timeout), self._run_safely)
        return len(claimed)

    def _run_safely(self, running: Running) -> None:
        run = running.run
        log.info("run_started", run_id=run.run_id, task_id=run.task_id, role=run.role, agent=running.agent,
                 attempt=run.attempt, timeout_s=running.timeout)
        try:
            self._run(run, running.stop)
        except Exception as exc:  # noqa: BLE001 - a bug in one run must not starve the others
            log.exception("run_failed_internally", run_id=run.run_id)
            if run.attempt < run.max_attempts:
                self.ledger.retry_later(run, self.specs[run.role].backoff, f"internal error: {exc}", None,
                                        ErrorCode.INTERNAL_ERROR)
            else:
                self._give_up(run, f"internal error: {exc}", ErrorCode.INTERNAL_ERROR)

    def drain(self) -> list[Running]:
        """A shutdown began: start no run; what is still running."""
        self.accepting = False
        return self.pool.running()

    # -- wakes -------------------------------------------------------------------------------
    def _on_wake(self, key: str, payload: dict[str, Any]) -> None:
        doc = self.kernel.task(payload["task_id"])
        if doc is None:
            return
        targets: list[tuple[dict[str, Any], str, Purpose]] = []
        event = payload["event_type"]
        if event in ("task_approved", "task_archived") and doc["task_id"] == doc["root"]:
            self.goals.root_finished(doc["root"])
        retried = event == "task_retried"  # a person cleared the round's block: the task is due for a new run
        if event in ("task_claimed", "task_rejected", "task_reopened") or (retried and doc["state"] == "active"):
            targets.append((doc, doc["authority"]["driver"], Purpose.EXECUTE))
        elif event == "task_submitted" or (retried and doc["state"] == "review"):
            targets.append((doc, doc["authority"]["done_authority"], Purpose.REVIEW))
        if event in ("task_approved", "task_archived", "task_force_archived") and doc["parent"]:
            parent = self.kernel.task(doc["parent"])
            if parent is not None and parent["state"] == "active":
                targets.append((parent, parent["authority"]["driver"], Purpose.CHILDREN))
        with self.db.write() as uow:
            for target, role, purpose in targets:
                spec = self.specs.get(role)
                if spec is None or (purpose is Purpose.REVIEW and self._waits_for_person(role, target)):
                    continue
                # the round the event happened in, not the task's round now (a late relay must not
                # turn two events of different rounds into two runs of the same round); a retry's run id is keyed
                # by its own event, so it gets fresh attempts
                round_ = payload["round"] if target is doc else target["round"]
                run_id = f"{target['task_id']}:r{round_}:{purpose.value}:{payload['global_pos']}"
                self.ledger.enqueue(uow, run_id, target["task_id"], round_, role, purpose, spec.max_attempts)

    def _waits_for_person(self, role: str, doc: dict[str, Any]) -> bool:
        """Whether a review of ``doc`` by ``role`` is left for a person (logged with why): the role may not approve,
        or its scripted agent would approve a merge into the base branch (runners/outcomes.py ``undecidable``)."""
        spec = None if role in self.handlers else self.specs.get(role)  # a role package's reviewer decides itself
        why = undecidable(role, self.kernel.roles.get(role).may_issue(CommandType.APPROVE), spec,
                          merge_base_of(doc, self.specs, self._worktree_base))
        if why is not None:
            log.warning("review_waits_for_person", task_id=doc["task_id"], role=role, reason=why)
        return why is not None

    def _worktree_base(self, task_id: str) -> str | None:
        with self.db.read() as conn:
            return worktree_base(conn, task_id)

    # -- running -----------------------------------------------------------------------------
    def _run(self, run: ClaimedRun, stop: threading.Event) -> None:
        spec = self.specs[run.role]
        if run.orphan is not None and not self._reap(run, run.orphan) and not run.exhausted:
            return  # never run beside a survivor: the lease lapses and a later takeover tries again
        if self.settled is not None and run.source_pos is not None:
            self.settled(run.source_pos, stop)  # the agent reads its TASK file where its waking event put it
        doc = self.kernel.task(run.task_id)
        if doc is None or not still_relevant(run, doc) or (
                run.purpose is Purpose.REVIEW and self._waits_for_person(run.role, doc)):
            self.ledger.succeed(run, None)  # the world moved on, or no agent may decide: nothing to run
            return
        if run.exhausted:
            self._give_up(run, "attempts exhausted after repeated crashes or lost leases",
                          ErrorCode.ATTEMPTS_EXHAUSTED)
            return
        allowed, why = self.goals.allows_work(doc["root"])
        if not allowed:
            self._give_up(run, why or "goal ended", ErrorCode.GOAL_ENDED)
            return
        goal_id = self.goals.active_goal(doc["root"])  # the goal this run's verdict will be bound to
        outcome = self._execute(spec, run, doc, stop)
        missing = missing_outcome(self.kernel, run, len(doc["reports"])) if outcome.ok else None
        if missing is not None and self.files_taken is not None:  # its report may be a file not yet taken in
            self.files_taken(time.time(), stop)
            missing = missing_outcome(self.kernel, run, len(doc["reports"]))
        if missing is not None:
            outcome.ok, outcome.code, outcome.error = False, *missing
        self._record_usage(run, doc, outcome)
        log.info("run_finished", run_id=run.run_id, task_id=run.task_id, role=run.role, attempt=run.attempt,
                 ok=outcome.ok, exit_code=outcome.exit_code, wall_ms=outcome.wall_ms, error_code=outcome.code,
                 error=outcome.error)
        if outcome.fenced:
            log.warning("run_lease_lost", run_id=run.run_id, attempt=run.attempt)
            return  # the run is another coordinator's now; its verdict is theirs
        if outcome.code is ErrorCode.INTERRUPTED:
            self.ledger.interrupt(run, outcome.error or "interrupted")
            log.warning("run_interrupted", run_id=run.run_id, task_id=run.task_id, role=run.role)
            return  # due again at the next start; the attempt is not the agent's
        _, message = self.inputs.interrupt_handled(run.run_id, run.attempt)  # asked or not, this attempt is over
        if outcome.code is ErrorCode.STOPPED_BY_PERSON:
            self.ledger.stopped(run, outcome.error or "stopped")
            # resumed with the interrupt's message; without one the agent stays stopped until told or retried
            resumed = self.inputs.follow_up(run.task_id) if message is not None else None
            log.warning("run_stopped_by_person", run_id=run.run_id, task_id=run.task_id, role=run.role,
                        error=outcome.error, resumed_by=resumed)
            return
        if goal_id is not None:
            self.goals.record_run(goal_id, executed=outcome.ok)
        if outcome.ok:
            self.ledger.succeed(run, outcome.exit_code)
            if run.role == doc["authority"]["driver"] and (queued := self.inputs.follow_up(run.task_id)):
                log.info("run_follow_up", run_id=run.run_id, task_id=run.task_id, follow_up=queued)
        elif not outcome.retryable:
            self._give_up(run, f"{outcome.code}: {outcome.error}", outcome.code or ErrorCode.EXIT_CODE,
                          outcome.summary)
        elif run.attempt < run.max_attempts:
            delay = spec.backoff * (2 ** (run.attempt - 1))
            self.ledger.retry_later(run, delay, outcome.error or "failed", outcome.exit_code, outcome.code)
            log.warning("run_retry", run_id=run.run_id, task_id=run.task_id, role=run.role, attempt=run.attempt,
                        error_code=outcome.code, error=outcome.error, delay_s=delay)
        else:
            self._give_up(run, f"{run.attempt} attempts failed; last: {outcome.error}",
                          ErrorCode.ATTEMPTS_EXHAUSTED, outcome.summary)

    def _reap(self, run: ClaimedRun, orphan: Orphan) -> bool:
        """Fence out what the previous holder left: its token first (from then on the orphan's reports are
        refused `stale_lease`), then its process group. False when the orphan could not be stopped."""
        if orphan.token_hash:
            revoke_hash(self.db, orphan.token_hash, STALE_LEASE)
        if orphan.pgid is None:
            return True
        if orphan.host != self.host:  # another machine, or this one before a reboot: no pid to signal here
            log.warning("orphan_not_local", run_id=run.run_id, host=orphan.host, pgid=orphan.pgid)
            return True
        try:
            result = terminate_group(orphan.pgid, orphan.start, ORPHAN_GRACE_S)
        except OSError as exc:
            log.error("orphan_survived", run_id=run.run_id, pgid=orphan.pgid, error=str(exc))
            return False
        log.warning("orphan_reaped", run_id=run.run_id, pgid=orphan.pgid, result=result)
        return True

    def _execute(self, spec: RunnerSpec, run: ClaimedRun, doc: dict[str, Any], stop: threading.Event) -> Outcome:
        if stop.is_set():  # stopped before the agent started: nothing of it ran
            return Outcome(False, None, 0, "interrupted by a shutdown before the agent started",
                           code=ErrorCode.INTERRUPTED)
        principal = self._principal(run.role, task_id=run.task_id, round_=run.round)
        task_file = self.task_file(doc)
        if spec.runner == RunnerKind.SCRIPTED:
            from taskkernel.coordinator.runners.agent import AgentContext
            from taskkernel.coordinator.runners.scripted import agent_for

            agent = self.handlers.get(run.role) or agent_for(run.role, self.leader)
            ctx = AgentContext(self.kernel, principal, doc, run.purpose, run.run_id, self.workspace, task_file,
                               merges_into=merge_base_of(doc, self.specs, self._worktree_base))
            started = time.monotonic()
            try:
                summary = agent(ctx)
            except Exception as exc:  # noqa: BLE001 - an agent failure is an outcome, not a coordinator crash
                log.warning("scripted_agent_failed", run_id=run.run_id, error=traceback.format_exc(limit=3))
                return Outcome(False, 1, int((time.monotonic() - started) * 1000), f"agent raised: {exc}",
                               code=ErrorCode.AGENT_RAISED)
            return Outcome(True, 0, int((time.monotonic() - started) * 1000), summary=summary)
        from taskkernel.coordinator.runners.launch import LaunchProblem

        token = issue_token(self.db, run.role, principal.agent, task_id=run.task_id, round=run.round)
        launch: Launch | None = None
        try:
            if not self.ledger.attach_token(run, token_hash(token)):
                return Outcome(False, None, 0, "lease lost before the agent started", fenced=True,
                               code=ErrorCode.LEASE_LOST)
            log_dir = (self.workspace / ".taskkernel" / "runs" / run.run_id.replace(":", "_")
                       / f"attempt-{run.attempt}")
            try:
                launch = self._launch(spec, run, doc, token, task_file, log_dir)
            except LaunchProblem as exc:
                self.inputs.undeliver(run.run_id, run.attempt)  # no agent read the prompt that held them
                code = (ErrorCode.PLACEHOLDER_UNKNOWN if exc.placeholder else
                        ErrorCode.SPAWN_FAILED if exc.retryable else ErrorCode.CONFIG_INVALID)
                return Outcome(False, None, 0, str(exc), code=code)
            output = self._live_output(run, launch, token)
            supervision = Supervision(
                on_start=lambda pgid, start: self.ledger.attach_agent(run, self.host, pgid, start),
                heartbeat=lambda: self.ledger.renew(run), every_s=max(0.2, spec.lease_seconds / 3),
                beat=lambda: self.ledger.beat(run), since_beat=lambda: self.ledger.since_beat(run), stop=stop,
                output=output.feed, interrupted=lambda: self.inputs.interrupted_by(run.run_id, run.attempt))
            try:
                outcome = run_command(spec, launch, log_dir, supervision)
            finally:
                output.close()
            if outcome.code in NEVER_STARTED:
                self.inputs.undeliver(run.run_id, run.attempt)
            self._keep_conversation(spec, run, launch, outcome)
            return outcome
        finally:
            if launch is not None:
                launch.cleanup()
            revoke_token(self.db, token)  # the credential lives exactly as long as the run

    def _keep_conversation(self, spec: RunnerSpec, run: ClaimedRun, launch: Launch, outcome: Outcome) -> None:
        """Keep the conversation the CLI printed for the task's next run by this role; a resumed attempt that
        failed forgets it (its conversation may be what fails), so the retry starts cold."""
        if not launch.preset.resumes() or outcome.fenced:
            return
        if outcome.session is not None:
            self.inputs.keep_cli_session(run.task_id, run.role, spec.runner, outcome.session, run.run_id)
        elif launch.resume_session is not None and not outcome.ok and outcome.code not in PERSON_OR_SHUTDOWN:
            self.inputs.keep_cli_session(run.task_id, run.role, spec.runner, None, run.run_id)

    def _live_output(self, run: ClaimedRun, launch: Launch, token: str) -> RunOutput:
        """The run's stdout read into typed events as it grows, with every secret the agent was handed (its token,
        its provider's keys) redacted."""
        from taskkernel.coordinator.runners.live import RunOutput

        preset = launch.preset
        kind = preset.profile.output if isinstance(preset, ProfileRunner) else None
        secrets = [token, *(v for k, v in launch.env.items() if _SECRET_NAME.search(k))]
        return RunOutput(self.db, run_id=run.run_id, task_id=run.task_id, attempt=run.attempt, output_kind=kind,
                         secrets=secrets)

    def _launch(self, spec: RunnerSpec, run: ClaimedRun, doc: dict[str, Any], token: str, task_file: Path,
                log_dir: Path) -> Launch:
        """The run's working folder (its task's worktree under isolation), prompt, files, argv and environment."""
        from taskkernel.coordinator.runners.launch import LaunchProblem, prepare

        if spec.isolation_in(self.worktrees.repo is not None) is Isolation.WORKTREE:
            try:
                workdir = self.worktrees.workdir(self.worktrees.ensure(run.task_id, spec.base_branch), spec.cwd)
            except (GitError, OSError) as exc:
                retryable = not isinstance(exc, GitError) or exc.code == "git_failed"
                raise LaunchProblem(f"the task's worktree: {exc}", retryable=retryable) from None
        else:
            workdir = self.workspace / spec.cwd if spec.cwd else self.workspace
        fields = prompt_fields(doc, run.purpose, run.role, task=self.kernel.task,
                               history=((e.type, e.data) for e in self.kernel.history(run.task_id)), mcp=spec.mcp,
                               workdir=str(workdir))
        template, conversation = spec.prompt, None
        if run.role == doc["authority"]["driver"]:  # what the driver was told, and where it got to (seed 002)
            ran_before = self.ledger.ran_before(run)
            resumption = self.inputs.resumption(doc, run.run_id, run.attempt, first=not ran_before)
            fields["resume"] = resume_section(resumption) if resumption is not None else ""
            # the CLI's own conversation goes on where it was
            if ran_before and spec.resume_conversation and preset_of(spec).resumes():
                conversation = self.inputs.cli_session(run.task_id, run.role, spec.runner)
                template = CONTINUE_TEMPLATE if conversation else template
        placeholders = {"task_file": str(task_file), "task_id": run.task_id, "round": str(run.round),
                        "workspace": str(self.workspace), "role": run.role, "purpose": run.purpose.value}
        # No database URL: the agent's `taskkernel` and its MCP server find the workspace by name.
        run_vars = {"TASKKERNEL_TOKEN": token, "TASKKERNEL_TASK_ID": run.task_id, "TASKKERNEL_ROUND": str(run.round),
                    "TASKKERNEL_TASK_FILE": str(task_file), "TASKKERNEL_WORKSPACE": str(self.workspace),
                    "TASKKERNEL_ROLE": run.role, "TASKKERNEL_PURPOSE": run.purpose.value}
        return prepare(spec, run_dir=log_dir, workdir=workdir, workspace=self.workspace, token=token,
                       prompt=build_prompt(template, fields), placeholders=placeholders, run_vars=run_vars,
                       resume_session=conversation)

    def _give_up(self, run: ClaimedRun, reason: str, code: ErrorCode, summary: str = "") -> None:
        """The run failed for good: recorded so in the ledger, and (ADR-0002's report gate: the session is over
        without the outcome it was for) said on the task by a `blocked` report quoting the agent's last output."""
        if not self.ledger.block(run, reason, code):
            return  # our lease was lost: whoever holds the run now decides
        log.error("run_blocked", run_id=run.run_id, task_id=run.task_id, role=run.role, error_code=code,
                  reason=reason)
        file_blocked(self.kernel, run, blocked_body(run, reason, last_output(self.workspace, run, summary)))

    def _record_usage(self, run: ClaimedRun, doc: dict[str, Any], outcome: Outcome) -> None:
        u = outcome.usage
        with self.db.write() as uow:
            record_usage(uow, UsageRecord(
                usage_id=f"run:{run.run_id}:{run.attempt}", role=run.role, agent=self._agent_name(run.role),
                feature=Feature.FOREGROUND, root_task=doc["root"], task_id=doc["task_id"], round=run.round,
                wall_ms=outcome.wall_ms, exit_code=outcome.exit_code, tokens_in=int(u.get("tokens_in", 0)),
                tokens_out=int(u.get("tokens_out", 0)), cost_usd=float(u.get("cost_usd", 0.0))))

    def _agent_name(self, role: str) -> str:
        spec = self.specs.get(role)
        return (spec.agent if spec and spec.agent else f"{role.lower()}-agent")

    def _principal(self, role: str, task_id: str | None = None, round_: int | None = None) -> Principal:
        return Principal(role, self._agent_name(role), task_id, round_)

    def fallback_task_file(self, doc: dict[str, Any]) -> Path:
        """Without a folder projection, render the task to a private file the agent can read."""
        path = self.workspace / ".taskkernel" / "tasks" / f"{doc['task_id']}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"---\ntask_id: {doc['task_id']}\nsender: {doc['sender']}\nrecipient: {doc['recipient']}\n"
                        f"round: {doc['round']}\n---\n# {doc['subject']}\n\n{doc['body']}\n", encoding="utf-8")
        return path
