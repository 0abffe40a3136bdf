"""What waits for a role: reviews to decide, approvals that need a grant, blocked tasks it drives.

Read without building the command kernel, for `taskkernel inbox` and the web board's "Needs you". Three lists, each
in task id order: ``reviews`` (tasks in review whose ``done_authority`` is the role: the role decides them),
``needs_grant`` (those of the reviews the kernel would refuse to approve right now with ``permission_required``:
judged by the kernel's own guard, kernel/permissions.py ``HumanGrantGuard``, against the session log as it is now,
each with the exact `taskkernel session accept …` command that grants it, built by kernel/verbs.py ``grant_hint``
as the refusal's hint is) and ``blocked`` (active tasks the role drives, ``authority.driver``, whose latest report
of the round is blocked: kernel/model/task.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing, contextmanager
from typing import Any

from taskkernel.kernel.model.commands import Command, CommandType
from taskkernel.kernel.model.principal import Principal
from taskkernel.kernel.permissions import HumanGrantGuard
from taskkernel.kernel.queries import iter_documents, row_of
from taskkernel.kernel.reasons import KernelError, ReasonCode
from taskkernel.kernel.sessionlog import SessionLog
from taskkernel.kernel.store.db import Database, UnitOfWork
from taskkernel.kernel.verbs import grant_hint

SECTIONS = ("reviews", "needs_grant", "blocked")


def waiting(db: Database, grant_sessions: frozenset[str] | None, role: str | None, principal: Principal,
            limit: int) -> dict[str, Any]:
    """The three lists for ``role`` (None: every role), each cut at ``limit``, their totals and whether a list was
    cut. ``grant_sessions``: the workspace's (None: the defaults), as coordinator/compose.py gives them to the
    kernel."""
    lists: dict[str, list[dict[str, Any]]] = {name: [] for name in SECTIONS}
    counts = dict.fromkeys(SECTIONS, 0)

    def keep(name: str, entry: dict[str, Any]) -> None:
        counts[name] += 1
        if len(lists[name]) < limit:
            lists[name].append(entry)

    with closing(iter_documents(db, "review", done_authority=role)) as reviews, \
            approval_refusals(db, grant_sessions) as refusal:
        for doc in reviews:
            entry = {**row_of(doc), "done_authority": doc["authority"]["done_authority"]}
            keep("reviews", entry)
            why = refusal(doc, principal)
            if why is not None:
                keep("needs_grant", {**entry, **why})
    with closing(iter_documents(db, "blocked", driver=role)) as blocked:
        for doc in blocked:
            keep("blocked", {**row_of(doc), "driver": doc["authority"]["driver"]})
    return {**lists, "counts": counts, "truncated": any(counts[n] > len(lists[n]) for n in SECTIONS)}


class _Refusals:
    """The kernel's human-grant guard, asked about `approve` on one task after another in one read transaction."""

    def __init__(self, guard: HumanGrantGuard, uow: UnitOfWork) -> None:
        self.guard, self.uow = guard, uow

    def __call__(self, doc: dict[str, Any], principal: Principal) -> dict[str, Any] | None:
        """``{permission, why, grant_command}`` when approving the task now would be ``permission_required``."""
        approve = Command(type=CommandType.APPROVE, task_id=doc["task_id"], expected_revision=doc["revision"],
                          round=doc["round"], idempotency_key="inbox")
        try:
            self.guard(self.uow, approve, doc, principal)
        except KernelError as exc:
            if exc.reason is not ReasonCode.PERMISSION_REQUIRED:
                raise
            return {"permission": CommandType.APPROVE.value, "why": exc.message,
                    "grant_command": grant_hint(CommandType.APPROVE, doc["task_id"], self.guard.default_session)}
        return None


@contextmanager
def approval_refusals(db: Database, grant_sessions: frozenset[str] | None) -> Iterator[_Refusals]:
    """The guard exactly as coordinator/compose.py gives it to the kernel (the workspace's grant sessions), over
    a read transaction: the guard only reads the session log."""
    guard = HumanGrantGuard(SessionLog(db, grant_sessions) if grant_sessions is not None else SessionLog(db))
    with db.read() as conn:
        yield _Refusals(guard, UnitOfWork(conn, db.dialect))
