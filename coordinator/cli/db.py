"""`taskkernel db`: the database schema's revision, and upgrading it (docs/migrations.md).

`db current` is for anyone who may open the database. `db upgrade` changes the schema every process of the
workspace relies on: it is the workspace owner's (an unscoped ADMIN credential), like minting credentials.
"""

from __future__ import annotations

import typer

from taskkernel.coordinator.cli.common import emit, get_ctx, reject, say

app = typer.Typer(no_args_is_help=True, help="The database schema: its revision, and upgrading it.")


@app.command("current")
def current(ctx: typer.Context) -> None:
    """The database's schema revision and this taskkernel's (head); behind: `taskkernel db upgrade` is due."""
    from taskkernel.coordinator import schema

    found = schema.status(get_ctx(ctx).database())
    emit({"status": "ok", **found.wire()}, generic=False)
    if found.ahead:
        say(("ahead", "red"), f": the database is at {found.current}, which this taskkernel does not know "
                              f"(its newest is {found.head}); a newer release upgraded it")
    elif found.behind:
        say(("behind", "yellow"), f": the database is at {found.current}, this taskkernel at {found.head}; "
                                  "run `taskkernel db upgrade`")
    else:
        say(("current", "green"), f": the database is at {found.current}, this taskkernel's revision")


@app.command("upgrade")
def upgrade(ctx: typer.Context) -> None:
    """Upgrade the database schema to this taskkernel's revision (the workspace owner or an unscoped ADMIN).
    All migrations run in one transaction under the writer lock; a second run changes nothing."""
    from taskkernel.coordinator import schema
    from taskkernel.kernel.reasons import KernelError

    c = get_ctx(ctx)
    c.database(writes=True)
    c.require_admin("upgrading the database schema")
    try:
        before, after = schema.upgrade(c.database())
    except KernelError as exc:
        reject(exc.reason.value, exc.message, head=schema.HEAD)
    changed = before.current != after.current
    emit({"status": "ok", "from": before.current, "to": after.current, "head": after.head, "upgraded": changed},
         generic=False)
    if changed:
        say(("upgraded", "green"), f" the database schema from {before.current or 'nothing'} to {after.current}")
    else:
        say(("current", "green"), f": the database is already at {after.current}; nothing to do")
