"""`taskkernel effects list|retry`: the outbox effects the relay gave up on (dead letters), and trying one again.

An effect (a merge on approval, a folder projection, an authorized action) is retried by the relay a few times;
one that still fails is kept as a dead letter with its last error instead of being dropped. `list` is where a
person finds them (`up --once` names them too, and exits degraded); `retry` puts one back once its cause is fixed,
and the next `up` pass runs it. Retrying is ADMIN's: it re-runs a side effect the kernel already decided on, on
the coordinator's own authority, so a run's token (task-scoped) may not.
"""

from __future__ import annotations

from typing import Any

import typer

from taskkernel.coordinator.cli.common import emit, get_ctx, reject, say, show
from taskkernel.coordinator.cli.runs import ERROR_CHARS, bounded

app = typer.Typer(no_args_is_help=True,
                  help="Outbox effects that exhausted their attempts (dead letters): list them, retry one.")


@app.command("list")
def effects_list(ctx: typer.Context) -> None:
    """Every dead letter, oldest first: its key, effect, task, attempts, when it failed and its last error."""
    from taskkernel.kernel.outbox import dead_letters

    rows = dead_letters(get_ctx(ctx).current_database(writes=False))
    emit({"effects": rows}, _render_list)


def _render_list(doc: dict[str, Any]) -> None:
    from rich.table import Table
    from rich.text import Text

    rows = doc["effects"]
    if not rows:
        say(("no dead letters", "green"), ": every outbox effect ran or is still being tried")
        return
    table = Table("effect key", "effect", "task", "tries", "failed at", "last error", title="dead letters")
    table.columns[-1].overflow = "fold"
    for r in rows:
        table.add_row(Text(r["effect_key"]), Text(r["effect"]), Text(r["task_id"] or ""), str(r["attempts"]),
                      Text(r["failed_at"] or ""), Text(bounded(r["last_error"], ERROR_CHARS) or ""))
    show(table)
    say(f"{len(rows)} dead letter(s); after fixing the cause: taskkernel effects retry KEY")


@app.command("retry")
def effects_retry(ctx: typer.Context, key: str = typer.Argument(
        ..., metavar="KEY", help="An effect key from `taskkernel effects list`.")) -> None:
    """Put a dead letter back to pending with its attempts cleared (ADMIN); the next `up` pass runs it."""
    from taskkernel.kernel.outbox import retry_dead_letter

    c = get_ctx(ctx)
    db = c.current_database()  # writes: checked intact, and refused while the schema is behind this code
    who = c.require_admin("retrying an outbox effect")
    refused = retry_dead_letter(db, key, who.id)
    if refused is not None:
        reject(refused.code, refused.message, effect_key=key)
    emit({"status": "queued", "effect_key": key}, generic=False)
    say(("queued", "green"), f" {key}: the next `taskkernel up` pass runs it again")
