"""Whether a `task retry` can help here (kernel/retry.py asks; only the coordinator knows its runners and runs).

A retry makes one run due: the driver's for an active task, the done authority's for one in review. It cannot help,
and is refused ``retry_cannot_help`` with what to do instead, when:

- a run of the task is already queued or running (a second one would work the same worktree at the same time, and
  a retry during a backoff would not replace the waiting attempt): wait for it, or see `taskkernel runs list`;
- the review is ADMIN's, or the role may not approve, or its agent is the scripted one and approving would merge
  into the base (runners/outcomes.py ``undecidable``): a person decides it;
- the role has no runner, or its runner cannot start here (what `up` would refuse): fix the table.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from taskkernel.coordinator.config import TaskkernelConfig
from taskkernel.coordinator.runners.config import runner_problems
from taskkernel.coordinator.runners.ledger import RunState
from taskkernel.coordinator.runners.outcomes import merge_base_of, undecidable, worktree_base
from taskkernel.coordinator.tables import runs
from taskkernel.kernel.model.commands import CommandType
from taskkernel.kernel.model.principal import ADMIN
from taskkernel.kernel.retry import REVIEW, RunnerCheck
from taskkernel.roles.registry import RoleRegistry


def retry_check(config: TaskkernelConfig, root: Any, roles: RoleRegistry) -> RunnerCheck:
    """The check the kernel's RetryGuard runs inside the retry's transaction (``conn``), read from the workspace's
    taskkernel.toml as this process loaded it."""
    def check(conn: sa.Connection, doc: dict[str, Any], role: str, purpose: str) -> str | None:
        task_id = doc["task_id"]
        if sa.inspect(conn).has_table(runs.name) and (busy := conn.execute(
                sa.select(runs.c.run_id, runs.c.state, runs.c.not_before).where(
                    runs.c.task_id == task_id, runs.c.state.in_((RunState.PENDING.value, RunState.RUNNING.value)))
        ).first()) is not None:
            when = "is running" if busy.state == RunState.RUNNING.value else f"is queued (due {busy.not_before})"
            return f"its run {busy.run_id} {when}: wait for it (`taskkernel runs list`)"
        if purpose == REVIEW and role == ADMIN:
            return f"the review is ADMIN's: decide it (`taskkernel task approve|reject {task_id}`)"
        tables = {name.upper(): name for name in config.roles}
        name = tables.get(role)
        if name is None:
            by_hand = "approve or reject it by hand" if purpose == REVIEW else "work it by hand"
            return f"{role} has no runner: add [roles.{role}] to taskkernel.toml (docs/agents.md), or {by_hand}"
        specs = {code.upper(): spec for code, spec in config.roles.items()}
        merging = merge_base_of(doc, specs, lambda task: worktree_base(conn, task))
        if purpose == REVIEW and (why := undecidable(role, roles.get(role).may_issue(CommandType.APPROVE),
                                                     config.roles[name], merging)):
            return f"{why} (`taskkernel task approve|reject {task_id}`)"
        if problems := runner_problems(config, root).get(name):
            return (f"its runner cannot start: {'; '.join(p.text for p in problems)}; fix [roles.{name}] in "
                    "taskkernel.toml (`taskkernel doctor` lists every problem), then retry")
        return None
    return check
