"""What a run left behind: every run ends in an outcome the kernel records (docs/runs.md, "Error codes").

A coding agent CLI can exit 0 having done nothing the kernel sees (the model answered without calling a tool; its
tools were not loaded yet). Judged by its exit code alone, that run "succeeded" and its task sat `active` (or in
`review`) for ever. So an ended run is judged by its task: an execute run whose task is still active in its round,
with no closing report since the attempt began and no open child to wait for, failed `no_report`; a review run
whose task is still in review in its round failed `no_decision`. Both are retried like any failure; a run that
gives up files a `blocked` report (as the task's driver, the one who may report) quoting the agent's last output.

A review run is never started for a role that cannot decide (``undecidable``): it could only fail.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from taskkernel.coordinator.config import OnApprove, RunnerKind, RunnerSpec
from taskkernel.coordinator.runners.command import ErrorCode
from taskkernel.coordinator.runners.history import run_log_dir, tail
from taskkernel.coordinator.runners.ledger import ClaimedRun, Purpose
from taskkernel.coordinator.tables import worktrees
from taskkernel.kernel.commands import TaskCommandKernel
from taskkernel.kernel.logging import get_logger
from taskkernel.kernel.model.principal import Principal
from taskkernel.kernel.text import terminal_text

log = get_logger(__name__)

STATE_FOR = {Purpose.EXECUTE: "active", Purpose.REVIEW: "review", Purpose.CHILDREN: "active"}
CLOSING = frozenset({"done", "blocked", "aborted"})  # reports that end a session (in_progress is a checkpoint)
OPEN = frozenset({"inbox", "active", "review"})
QUOTED_LINES = 10  # of each stream, in a blocked report
QUOTED_CHARS = 300  # per line, after escaping
COORDINATOR = "coordinator"  # the agent name the coordinator's own reports are recorded under


def still_relevant(run: ClaimedRun, doc: dict[str, Any]) -> bool:
    """The task is where the run's waking event left it: the state its purpose works on, in the run's round. A
    retry (``task_retried``) wakes a run of the round it clears, so it is judged the same way."""
    return doc["state"] == STATE_FOR[run.purpose] and doc["round"] == run.round


def missing_outcome(kernel: TaskCommandKernel, run: ClaimedRun, reports_before: int
                    ) -> tuple[ErrorCode, str] | None:
    """Why an attempt that ended well by its exit code still failed, or None: the task moved on, or the run left
    what its purpose asks for. ``reports_before``: how many reports the task had when the attempt began (the list
    only grows), so a report of an earlier attempt or of the coordinator (a merge conflict) does not count."""
    doc = kernel.task(run.task_id)
    if doc is None or not still_relevant(run, doc):
        return None
    if run.purpose is Purpose.REVIEW:
        return ErrorCode.NO_DECISION, (f"the reviewer ended without approving or rejecting (task still in review, "
                                       f"round {run.round})")
    if run.purpose is not Purpose.EXECUTE:
        return None
    new = [r for r in doc["reports"][reports_before:] if r["round"] == run.round and r["status"] in CLOSING]
    if new or any(child["state"] in OPEN for child in kernel.children(run.task_id)):
        return None  # reported, or split the work and waits for its children (their end wakes it again)
    return ErrorCode.NO_REPORT, (f"the agent ended without a done or blocked report (task still active, "
                                 f"round {run.round})")


def last_output(workspace: Path, run: ClaimedRun, summary: str) -> list[str]:
    """The agent's last output lines of this attempt, escaped as data and cut: its stdout and stderr tails (a
    command runner's logs), else what a scripted agent returned."""
    folder = run_log_dir(workspace, run.run_id)
    lines: list[str] = []
    for stream in ("stdout", "stderr"):
        found = tail(folder / f"attempt-{run.attempt}" / f"{stream}.log", QUOTED_LINES) if folder else None
        if found is not None and found.lines:
            lines += [f"{stream}:", *(f"> {_quoted(line)}" for line in found.lines)]
    if not lines and summary:
        lines = ["returned:", f"> {_quoted(summary)}"]
    return lines


def blocked_body(run: ClaimedRun, reason: str, output: list[str]) -> str:
    """A blocked report's body: the cause on its first line (what `inbox` and `task list` show), then the run and
    the agent's last output."""
    body = [f"{run.purpose.value} run of {run.role} gave up: {reason}",
            f"(run {run.run_id}, attempt {run.attempt} of {run.max_attempts})"]
    if output:
        body += ["", "The agent's last output:", *output]
    return "\n".join(body)


def file_blocked(kernel: TaskCommandKernel, run: ClaimedRun, body: str) -> None:
    """Put a `blocked` report on the run's task while it is still where the run found it. Filed as the task's
    driver (reports are the driver's, also on a task in review), scoped to the task and round; judged against the
    task as it is now, since the agent may have moved it before failing."""
    for _ in range(5):
        current = kernel.task(run.task_id)
        if current is None or not still_relevant(run, current):
            return
        principal = Principal(current["authority"]["driver"], COORDINATOR, run.task_id, run.round)
        result = kernel.submit({
            "type": "submit_report", "task_id": current["task_id"], "thread_key": current["thread_key"],
            "expected_revision": current["revision"], "round": current["round"],
            "idempotency_key": f"blocked:{run.run_id}",
            "payload": {"status": "blocked", "body": body}}, principal)
        if result.reason != "stale_task_revision":
            if not result.ok:
                log.error("blocked_report_refused", run_id=run.run_id, reason=result.reason, message=result.message)
            return


def undecidable(role: str, may_approve: bool, spec: RunnerSpec | None, merge_base: str | None) -> str | None:
    """Why no agent of ``role`` will decide a review (None: one may): the role may not approve at all, or its agent
    is the built-in scripted one and approving would merge the task's branch into ``merge_base`` (``merge_base_of``),
    which waits for a person or a configured reviewer role."""
    if not may_approve:
        return f"{role} may not approve: waiting for a person (ADMIN) to decide"
    if spec is not None and spec.runner == RunnerKind.SCRIPTED and merge_base is not None:
        return f"approval merges into {merge_base}: waiting for a person"
    return None


def worktree_base(conn: sa.Connection, task_id: str) -> str | None:
    """The base branch of the task's worktree while it has one (a merged one merges again after a reopen)."""
    if not sa.inspect(conn).has_table(worktrees.name):
        return None
    row = conn.execute(sa.select(worktrees.c.base_branch, worktrees.c.state)
                       .where(worktrees.c.task_id == task_id)).first()
    return row.base_branch if row is not None and row.state != "archived" else None


def merge_base_of(doc: dict[str, Any], specs: dict[str, RunnerSpec],
                  base_of: Callable[[str], str | None]) -> str | None:
    """The branch approving ``doc`` would merge into: its worktree's base when its driver's runner merges on
    approval (``base_of``: the recorded worktree's base branch of a task, None without one)."""
    driver = specs.get(doc["authority"]["driver"])
    if driver is None or driver.on_approve is not OnApprove.MERGE:
        return None
    return base_of(doc["task_id"])


def _quoted(line: str) -> str:
    shown = terminal_text(line)
    return shown if len(shown) <= QUOTED_CHARS else shown[:QUOTED_CHARS - 1] + "…"
