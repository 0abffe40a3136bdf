"""`taskkernel inbox`: what waits for a role, read without building the command kernel.

Three lists, each in task id order: ``reviews`` (tasks in review whose ``done_authority`` is the role: the role
decides them), ``needs_grant`` (those of the reviews the kernel would refuse to approve right now with
``permission_required``: judged by the kernel's own guard, kernel/permissions.py ``HumanGrantGuard``, against
the session log as it is now, each with the exact `taskkernel session accept …` command that grants it, built by
kernel/verbs.py ``grant_hint`` as the refusal's hint is) and ``blocked`` (active tasks the role drives,
``authority.driver``, whose latest report of the round is blocked: kernel/model/task.py).

The role is the caller's (``CliContext.principal()``); an unscoped ADMIN (the local owner) sees every role, or
one with ``--role``. Anyone else may name only their own role (``role_not_authorized``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing, contextmanager
from typing import Any

import typer

from taskkernel.coordinator.cli.common import Exit, emit, fail, get_ctx, reject, say, show
from taskkernel.coordinator.cli.output import oneline, table_of

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
SECTIONS = ("reviews", "needs_grant", "blocked")


def inbox(ctx: typer.Context,
          role: str | None = typer.Option(None, "--role", help=(
              "Look at this role's inbox (an unscoped ADMIN, e.g. the local owner; anyone else only at their own). "
              "Default: your role; ADMIN: every role.")),
          limit: int = typer.Option(DEFAULT_LIMIT, "--limit", help=(
              f"At most this many tasks per list (1 to {MAX_LIMIT}); counts has every list's total."))) -> None:
    """What waits for your role: reviews to decide, approvals that need a grant, blocked tasks you drive.

    JSON: {"status": "ok", "role", "reviews", "needs_grant", "blocked", "counts", "truncated"}; each entry is a
    task row as `task list` prints it, plus done_authority (reviews, needs_grant), the grant's permission, why
    and grant_command (needs_grant), driver (blocked). Exit 0."""
    from taskkernel.kernel.reasons import ReasonCode

    if not 1 <= limit <= MAX_LIMIT:
        fail(Exit.USAGE, f"--limit takes 1 to {MAX_LIMIT}, not {limit}")
    c = get_ctx(ctx)
    principal = c.principal()
    asked = role.upper() if role else None
    if asked is not None and asked != principal.role and not principal.is_admin:
        reject(ReasonCode.ROLE_NOT_AUTHORIZED.value, f"only an unscoped ADMIN may look at another role's inbox "
               f"(caller: {principal.id}, asked for {asked})")
    who = asked or (None if principal.is_admin else principal.role)
    found = waiting(c, who, principal, limit)
    emit({"status": "ok", "role": who, **found}, _render)


def waiting(c: Any, role: str | None, principal: Any, limit: int) -> dict[str, Any]:
    """The three lists for ``role`` (None: every role), each cut at ``limit``, their totals and whether a list was
    cut."""
    from taskkernel.kernel.queries import iter_documents, row_of

    db = c.database()
    lists: dict[str, list[dict[str, Any]]] = {name: [] for name in SECTIONS}
    counts = dict.fromkeys(SECTIONS, 0)

    def keep(name: str, entry: dict[str, Any]) -> None:
        counts[name] += 1
        if len(lists[name]) < limit:
            lists[name].append(entry)

    with closing(iter_documents(db, "review", done_authority=role)) as reviews, _approval_refusals(c) as refusal:
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

    def __init__(self, guard: Any, uow: Any) -> None:
        self.guard, self.uow = guard, uow

    def __call__(self, doc: dict[str, Any], principal: Any) -> dict[str, Any] | None:
        """``{permission, why, grant_command}`` when approving the task now would be ``permission_required``."""
        from taskkernel.kernel.model.commands import Command, CommandType
        from taskkernel.kernel.reasons import KernelError, ReasonCode
        from taskkernel.kernel.verbs import grant_hint

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
def _approval_refusals(c: Any) -> Iterator[_Refusals]:
    """The guard exactly as coordinator/compose.py gives it to the kernel (the workspace's grant sessions), over
    a read transaction: the guard only reads the session log."""
    from taskkernel.kernel.permissions import HumanGrantGuard
    from taskkernel.kernel.sessionlog import SessionLog
    from taskkernel.kernel.store.db import UnitOfWork

    db = c.database()
    ws = c.optional_workspace()
    guard = HumanGrantGuard(SessionLog(db, ws.grant_sessions) if ws else SessionLog(db))
    with db.read() as conn:
        yield _Refusals(guard, UnitOfWork(conn, db.dialect))


def _render(doc: dict[str, Any]) -> None:
    from taskkernel.kernel.queries import shown_state

    counts = doc["counts"]
    say((doc["role"] or "every role", "bold"), f": {counts['reviews']} review(s) to decide, "
        f"{counts['needs_grant']} need a grant, {counts['blocked']} blocked")
    for name, title, extra in (("reviews", "reviews to decide", "done_authority"),
                               ("blocked", "blocked tasks", "driver")):
        if doc[name]:
            show(table_of([{"task": r["task_id"], "state": shown_state(r), extra: r[extra],
                            "route": f"{r['sender']}→{r['recipient']}", "risk": r["risk_level"],
                            "subject": oneline(r["subject"]),
                            **({"reason": oneline(r["blocked"]["reason"])} if r.get("blocked") else {})}
                           for r in doc[name]], title=title))
    for r in doc["needs_grant"]:
        say(("needs a grant", "yellow"), f" {r['task_id']} ({r['risk_level']} risk): {oneline(r['subject'])}")
        say(f"  {r['grant_command']}")
    if doc["truncated"]:
        say("a list was cut at --limit: the summary line counts every task")
