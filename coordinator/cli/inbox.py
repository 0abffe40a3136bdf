"""`taskkernel inbox`: what waits for a role, read without building the command kernel.

The three lists are read by coordinator/inbox.py (shared with the web board's "Needs you").

The role is the caller's (``CliContext.principal()``); an unscoped ADMIN (the local owner) sees every role, or
one with ``--role``. Anyone else may name only their own role (``role_not_authorized``).
"""

from __future__ import annotations

from typing import Any

import typer

from taskkernel.coordinator.cli.common import Exit, emit, fail, get_ctx, reject, say, show
from taskkernel.coordinator.cli.output import oneline, table_of

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000


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
    from taskkernel.coordinator.inbox import waiting
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
    ws = c.optional_workspace()
    found = waiting(c.database(), ws.grant_sessions if ws else None, who, principal, limit)
    emit({"status": "ok", "role": who, **found}, _render)


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
                            "subject": r["subject"], **({"reason": r["blocked"]["reason"]} if r.get("blocked") else {})}
                           for r in doc[name]], title=title))
    for r in doc["needs_grant"]:
        say(("needs a grant", "yellow"), f" {r['task_id']} ({r['risk_level']} risk): {oneline(r['subject'])}")
        say(f"  {r['grant_command']}")
    if doc["truncated"]:
        say("a list was cut at --limit: the summary line counts every task")
