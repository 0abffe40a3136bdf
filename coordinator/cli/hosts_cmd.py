"""`taskkernel hosts`: the team's machines on one shared store (docs/hosts.md): each coordinator's last heartbeat,
whether it is live, the roles it runs agents for, its slots and the runs it holds now."""

from __future__ import annotations

from typing import Any

import typer

from taskkernel.coordinator.cli.common import emit, get_ctx, say, show


def hosts(ctx: typer.Context) -> None:
    """The team's machines on one store: each host's heartbeat, roles, slots and running runs."""
    from taskkernel.coordinator.hosts import LIVE_FOR_S, listing

    emit({"hosts": listing(get_ctx(ctx).current_database(writes=False)), "live_within_s": LIVE_FOR_S},
         _render)


def _render(doc: dict[str, Any]) -> None:
    from rich.table import Table
    from rich.text import Text

    rows = doc["hosts"]
    if not rows:
        say("no host has run `taskkernel up` on this store yet")
        return
    table = Table("host", "live", "last heartbeat", "roles", "slots", "max runs", "running", title="hosts")
    for h in rows:
        live = Text("live", "green") if h["live"] else Text(f"silent {h['heartbeat_age_s']:g}s", "red")
        roles = ", ".join(h["roles"]) if h["roles"] is not None else "every role"
        slots = ", ".join(f"{role} {n}" for role, n in h["slots"].items())
        running = ", ".join(f"{r['task_id']} ({r['role']})" for r in h["running"]) or "-"
        table.add_row(Text(h["host"]), live, Text(h["heartbeat_at"]), Text(roles), Text(slots), str(h["max_runs"]),
                      Text(running))
    show(table)
