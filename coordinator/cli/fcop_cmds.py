"""`taskkernel fcop …`: commands that change the FCoP folders as a whole (docs/import-and-migrate.md)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from taskkernel.coordinator.cli.common import CliContext, Exit, emit, fail, get_ctx, reject, say
from taskkernel.coordinator.cli.fcop_import import fcop_import
from taskkernel.coordinator.folders import migrate as migration
from taskkernel.coordinator.folders.importer import is_imported, root_key_of

if TYPE_CHECKING:
    from taskkernel.coordinator.workspace import Workspace
    from taskkernel.kernel.store.db import Database

app = typer.Typer(no_args_is_help=True, help="Whole-workspace FCoP operations (docs/import-and-migrate.md).")
app.command("import")(fcop_import)


@app.command("migrate")
def migrate(ctx: typer.Context,
            to: str = typer.Option(..., "--to", metavar="GENERATION", help="Target generation: g3 or g4."),
            dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan as JSON and write nothing.")
            ) -> None:
    """Convert the workspace's FCoP root in one atomic swap, the old root kept as a backup: G2 to g3, or G2/G3 to
    g4 (FCoP 4, through fcop's Core; docs/fcop4.md). Stop `taskkernel up` first. Only an unscoped ADMIN
    credential may migrate."""
    if to.lower() not in ("g3", "g4"):
        fail(Exit.USAGE, f"--to {to!r}: choose g3 (from G2) or g4 (from G2 or G3)")
    c = get_ctx(ctx)
    ws = c.workspace()
    c.database(writes=not dry_run)
    c.require_admin("migrating the FCoP workspace")
    try:
        if to.lower() == "g4":
            _migrate_g4(c, ws, dry_run)
        else:
            _migrate_g3(c, ws, dry_run)
    except migration.MigrateRefused as exc:
        reject(exc.reason, exc.message, **exc.extra)


def _imported_or_refuse(db: Database, root: Path, workspace_root: Path, why: str) -> None:
    if not is_imported(db, root_key_of(root, workspace_root)):
        raise migration.MigrateRefused(
            "not_imported", f"the workspace's history is not in the kernel yet: {why}. Run `taskkernel fcop import` "
            "(or `taskkernel up --once`) first, then migrate.")


def _migrate_g3(c: CliContext, ws: Workspace, dry_run: bool) -> None:
    db = c.database()
    plan = migration.plan(ws.root, ws.state_dir, migration.known_states(db), migration.tracked_origins(db))
    _imported_or_refuse(db, plan.root, ws.root, "without it an open task's stage would be guessed (every one to "
                        "the inbox)")
    if dry_run:
        emit({"status": "ok", "dry_run": True, **plan.as_json()}, generic=False)
        say(f"dry run: {len(plan.moves)} file(s) would move in {plan.root}, {plan.as_json()['unchanged']} stay; "
            f"the old root would be kept at {plan.backup}; nothing written")
        return
    result = migration.apply(plan, db)
    emit({"status": "ok", "dry_run": False, **plan.as_json(), "moved": len(plan.moves), "tracked": result.tracked,
          "swap": result.swap, "backup": str(result.backup)}, generic=False)
    say(("migrated", "green"), f" {plan.root} to G3: {len(plan.moves)} file(s) moved, "
                 f"{result.tracked} record(s) followed them; the old root is kept at {result.backup}")


def _migrate_g4(c: CliContext, ws: Workspace, dry_run: bool) -> None:
    from taskkernel.coordinator.fcop4.authority import profile_key
    from taskkernel.coordinator.fcop4.migrate import apply_g4, plan_g4

    kernel = c.kernel()
    plan = plan_g4(ws.root, ws.state_dir, kernel)
    _imported_or_refuse(kernel.db, plan.root, ws.root, "the new workspace is written from it")
    if dry_run:
        emit({"status": "ok", "dry_run": True, **plan.as_json()}, generic=False)
        say(f"dry run: {len(plan.docs)} task(s) would be written into a new FCoP 4 root at {ws.root / 'fcop'}, "
            f"{len(plan.kept)} stay in the kernel only; the old root would be kept in {plan.backup}; nothing written")
        return
    team_kept = _keep_team(ws)
    result = apply_g4(plan, kernel, profile_key(ws.state_dir))
    emit({"status": "ok", "dry_run": False, **plan.as_json(), "aliases": plan.aliases, "files": result.files,
          "swap": result.swap, "backup": str(result.backup), "team_to_config": team_kept}, generic=False)
    say(("migrated", "green"), f" {plan.root} to FCoP 4 at {ws.root / 'fcop'}: {len(plan.docs)} task(s) under new "
        f"TASK-<hex> ids (their old ids still answer), {len(plan.kept)} kept in the kernel only; the old root is "
        f"kept at {result.backup}")


def _keep_team(ws: Workspace) -> bool:
    """A G3 team lives in fcop.json, which the G4 manifest replaces: it goes to taskkernel.toml's ``[team]`` first
    (unless one is there), so the roles of open tasks still exist after the swap. True if it was written."""
    if ws.config.team is not None:
        return False
    team = ws.team()
    with open(ws.root / "taskkernel.toml", "a", encoding="utf-8") as fh:
        fh.write(team.toml().replace("(init took", "(migrate --to g4 kept the team of the G3 fcop.json; init took"))
    return True
