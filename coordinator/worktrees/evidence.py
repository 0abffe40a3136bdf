"""The diff a done report carries, recorded by the kernel's own pipeline (docs/agents.md).

It is a guard in the kernel's sense (it runs after every other check of a command, inside its transaction) that
refuses nothing: for a `done` report on a task with a worktree, it commits what the agent left uncommitted and
puts the diff against the base into the report's event (``diff``). Every process builds the kernel with it
(compose.py), so a report by MCP, the CLI or a REPORT file is recorded the same way; the agent cannot supply
the field itself (the report's payload has none), so the diff is the coordinator's evidence, not the agent's claim.
A refused command commits nothing: the checks before this one stop it first.
"""

from __future__ import annotations

from typing import Any

from taskkernel.coordinator.worktrees.manager import Worktrees
from taskkernel.kernel.commands import EVIDENCE_KEY
from taskkernel.kernel.model.commands import Command, CommandType, ReportPayload
from taskkernel.kernel.model.principal import Principal
from taskkernel.kernel.store.db import UnitOfWork


class DiffEvidence:
    def __init__(self, worktrees: Worktrees) -> None:
        self.worktrees = worktrees

    def __call__(self, uow: UnitOfWork, cmd: Command, doc: dict[str, Any] | None, principal: Principal) -> None:
        if cmd.type is not CommandType.SUBMIT_REPORT or doc is None:
            return
        payload = cmd.validated_payload()
        if not isinstance(payload, ReportPayload) or payload.status.value != "done":
            return
        diff = self.worktrees.evidence(doc["task_id"], doc["round"], principal.agent, conn=uow.conn)
        if diff is not None:
            uow.cache.setdefault(EVIDENCE_KEY, {})["diff"] = diff
