"""`task retry`: one way to try a task again (docs/runs.md, "Trying again").

A retry records ``task_retried`` {round, reason, by}: the fold lifts the round's block and the coordinator's wake
rule turns the event into a fresh run — the driver's (execute) for an active task, the done authority's (review) for
a task in review. It is refused where another run cannot help, each with the reason a person acts on:

- a done task is finished (``task_terminal``; reopen it to work again), an archived one too, and an inbox task has
  no run to repeat (``illegal_transition``, the lifecycle's check);
- the role that would run has no runner, or its runner cannot start here, or a run of the task is already queued
  or running, or no agent may decide the review (``retry_cannot_help``): only the coordinator knows its runners and
  runs, so that check is injected (``RetryGuard``; the core imports no adapter), and its message says what to do;
- a run's task-scoped token may not retry (``role_not_authorized``): an agent retrying its own task would multiply
  its runs and their attempts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from taskkernel.kernel.model.commands import Command, CommandType
from taskkernel.kernel.model.principal import Principal
from taskkernel.kernel.model.task import TaskState
from taskkernel.kernel.reasons import KernelError, ReasonCode
from taskkernel.kernel.store.db import UnitOfWork

EXECUTE, REVIEW = "execute", "review"  # the run a retry makes due (the dispatcher's purposes)
# (the retry's connection, the task, role, purpose) -> why a run of that role cannot help now (what to do), or None.
RunnerCheck = Callable[[Any, dict[str, Any], str, str], str | None]


def who_runs(doc: dict[str, Any]) -> tuple[str, str]:
    """The role a retry wakes and the purpose of its run: the driver works an active task, the done authority
    reviews one in review."""
    if doc["state"] == TaskState.REVIEW.value:
        return doc["authority"]["done_authority"], REVIEW
    return doc["authority"]["driver"], EXECUTE


def finished_refusal(cmd: Command, doc: dict[str, Any] | None) -> KernelError | None:
    """A retry of a done task: its work was approved, no run is due (check 5, as an archived task's)."""
    if cmd.type is not CommandType.RETRY or doc is None or doc["state"] != TaskState.DONE.value:
        return None
    return KernelError(ReasonCode.TASK_TERMINAL, f"{doc['task_id']} is done (approved): a retry runs nothing; "
                       f"to work on it again, `taskkernel task reopen {doc['task_id']} --reason …`")


class RetryGuard:
    """Check 10 for ``retry``: refused ``retry_cannot_help`` when ``check`` says the role that would run cannot."""

    def __init__(self, check: RunnerCheck) -> None:
        self.check = check

    def __call__(self, uow: UnitOfWork, cmd: Command, doc: dict[str, Any] | None, principal: Principal) -> None:
        if cmd.type is not CommandType.RETRY or doc is None:
            return
        if principal.task_id is not None:  # an agent retrying its own task would multiply its runs and attempts
            raise KernelError(ReasonCode.ROLE_NOT_AUTHORIZED, f"a retry of {doc['task_id']} is a person's decision "
                              "(or an unscoped tool's): a run's task-scoped token may not retry")
        role, purpose = who_runs(doc)
        why = self.check(uow.conn, doc, role, purpose)
        if why is not None:
            raise KernelError(ReasonCode.RETRY_CANNOT_HELP,
                              f"a retry of {doc['task_id']} would wait for a {purpose} run by {role}, and {why}")
