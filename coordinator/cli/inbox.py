"""`taskkernel inbox`: what waits for a role, read without building the command kernel.

The lists are read by coordinator/inbox.py (shared with the web board's "Needs you").

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
    """What waits for your role: reviews to decide, approvals that need a grant, blocked and stalled tasks, and
    (every role) effects given up on.

    JSON: {"status": "ok", "role", "reviews", "needs_grant", "blocked", "stalled", "dead_letters", "counts",
    "truncated"}; reviews, needs_grant and blocked entries are task rows as `task list` prints them, plus
    done_authority and waits_for_person (reviews, needs_grant), the grant's permission, why and grant_command
    (needs_grant), driver (blocked); stalled entries: task_id, state, round, subject, waiting_on, last_run, cause;
    dead_letters: effect_key, effect, task_id, attempts, last_error, failed_at. Exit 0."""
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
    found = waiting(c.database(), ws.grant_sessions if ws else None, who, principal, limit, workspace=ws)
    emit({"status": "ok", "role": who, **found}, _render)


def _render(doc: dict[str, Any]) -> None:
    from taskkernel.kernel.queries import shown_state

    counts = doc["counts"]
    say((doc["role"] or "every role", "bold"), f": {counts['reviews']} review(s) to decide, "
        f"{counts['needs_grant']} need a grant, {counts['blocked']} blocked, {counts['stalled']} stalled, "
        f"{counts['dead_letters']} effect(s) given up")
    for name, title, extra in (("reviews", "reviews to decide", "done_authority"),
                               ("blocked", "blocked tasks", "driver")):
        if doc[name]:
            show(table_of([{"task": r["task_id"], "state": shown_state(r), extra: r[extra],
                            "route": f"{r['sender']}→{r['recipient']}", "risk": r["risk_level"],
                            "subject": r["subject"], **({"reason": r["blocked"]["reason"]} if r.get("blocked") else {}),
                            **({"waits for a person": r["waits_for_person"]} if r.get("waits_for_person") else {})}
                           for r in doc[name]], title=title))
    if doc["stalled"]:
        show(table_of([{"task": r["task_id"], "state": r["state"], "waiting on": r["waiting_on"],
                        "subject": r["subject"], "cause": r["cause"]} for r in doc["stalled"]], title="stalled tasks"))
    if doc["dead_letters"]:
        show(table_of([{"effect": r["effect_key"], "task": r["task_id"] or "", "attempts": r["attempts"],
                        "failed at": r["failed_at"] or "", "last error": r["last_error"] or ""}
                       for r in doc["dead_letters"]], title="effects given up (dead letters)"))
    for r in doc["needs_grant"]:
        say(("needs a grant", "yellow"), f" {r['task_id']} ({r['risk_level']} risk): {oneline(r['subject'])}")
        say(f"  {r['grant_command']}")
    if doc["truncated"]:
        say("a list was cut at --limit: the summary line counts every task")
