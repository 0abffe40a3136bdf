"""The diff a done report carries, recorded by the kernel's own pipeline (docs/agents.md).

The git work (commit what the agent left uncommitted, diff against the base, write the patch) is slow on a big
repository, so it runs before the command's write transaction (``prepare``), and only for a caller that may
report on the task (its run's token, its driver's role, ADMIN): a stranger's report, refused later anyway, makes
no commit in someone's worktree. Inside the transaction, after every other check of the command, the guard
(``__call__``) records the prepared diff in the report's event (``diff``) if the worktree's head has not moved
since, and takes the diff again otherwise; it refuses nothing. Every process builds the kernel with it
(compose.py), so a report by MCP, the CLI or a REPORT file is recorded the same way. The agent cannot supply the
field itself (the report's payload has none): the diff is the coordinator's evidence, not the agent's claim.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from taskkernel.coordinator.worktrees.git import GitError
from taskkernel.coordinator.worktrees.manager import Worktree, Worktrees
from taskkernel.kernel.commands import EVIDENCE_KEY
from taskkernel.kernel.model.commands import Command, CommandType, ReportPayload
from taskkernel.kernel.model.principal import ADMIN, Principal
from taskkernel.kernel.queries import task_document
from taskkernel.kernel.store.db import UnitOfWork

_KEPT = 256  # prepared diffs of commands refused before the guard are dropped, oldest first


def _done_report(cmd: Command) -> bool:
    if cmd.type is not CommandType.SUBMIT_REPORT or cmd.task_id is None:
        return False
    payload = cmd.validated_payload()
    return isinstance(payload, ReportPayload) and payload.status.value == "done"


class DiffEvidence:
    def __init__(self, worktrees: Worktrees) -> None:
        self.worktrees = worktrees
        self._prepared: OrderedDict[tuple[str, str, str], tuple[int, dict[str, Any]]] = OrderedDict()
        self._lock = threading.Lock()

    def prepare(self, cmd: Command, principal: Principal | None) -> None:
        """Before the transaction: the diff of a done report on a task with a worktree, by a caller that may
        report on it."""
        if principal is None or not _done_report(cmd):
            return
        wt = self.worktrees.get(str(cmd.task_id))
        if wt is None:
            return
        doc = task_document(self.worktrees.db, wt.task_id)
        if doc is None or not (principal.task_id == doc["task_id"] or (
                principal.task_id is None and principal.role in (doc["authority"]["driver"], ADMIN))):
            return
        diff = self.worktrees.evidence(wt, doc["round"], principal.agent)
        with self._lock:
            self._prepared[(doc["task_id"], cmd.idempotency_key, principal.id)] = (doc["round"], diff)
            while len(self._prepared) > _KEPT:
                self._prepared.popitem(last=False)

    def __call__(self, uow: UnitOfWork, cmd: Command, doc: dict[str, Any] | None, principal: Principal) -> None:
        if doc is None or not _done_report(cmd):
            return
        wt = self.worktrees.get(doc["task_id"], uow.conn)
        if wt is None:
            return
        with self._lock:
            prepared = self._prepared.pop((doc["task_id"], cmd.idempotency_key, principal.id), None)
        diff = prepared[1] if prepared is not None and prepared[0] == doc["round"] else None
        if diff is not None and ("head" not in diff or self._head(wt) != diff["head"]):
            diff = None  # it failed (a lock git held a moment), or the branch moved since: take it again
        if diff is None:
            diff = self.worktrees.evidence(wt, doc["round"], principal.agent)
        uow.cache.setdefault(EVIDENCE_KEY, {})["diff"] = diff

    def _head(self, wt: Worktree) -> str | None:
        try:
            return self.worktrees.head(wt)
        except GitError:
            return None
