"""`taskkernel fcop import [--dry-run]`: take an existing FCoP workspace in as history (docs/import-and-migrate.md).

`taskkernel up` runs the same import on its first pass; this command runs it on its own, or shows what it
would do (`--dry-run`: nothing stored, nothing written). Only the workspace owner (unscoped ADMIN) may import.
A file or folder it could not read makes the status `incomplete` and is named, with its reason, on both outputs:
the import runs once, so this report is where the owner learns what is missing.
"""

from __future__ import annotations

import typer

from taskkernel.coordinator.cli.common import emit, get_ctx, reject, say, warn
from taskkernel.coordinator.cli.output import oneline
from taskkernel.coordinator.fcop import FcopError, Generation, open_workspace
from taskkernel.coordinator.folders.importer import Importer, is_imported
from taskkernel.coordinator.folders.tracking import FileTracker
from taskkernel.coordinator.workspace import STATE_DIR


def fcop_import(ctx: typer.Context,
                dry_run: bool = typer.Option(False, "--dry-run", help="Show what would be imported; change nothing.")
                ) -> None:
    """Import the workspace's existing tasks, reports, reviews and issues as history (once)."""
    c = get_ctx(ctx)
    ws = c.workspace()
    c.database(writes=not dry_run)
    c.require_admin("fcop import")
    kernel = c.kernel()
    try:
        fcop = open_workspace(ws.root, allow_mixed=True)
    except FcopError as exc:  # G4, ambiguous roots, a linked root
        reject(exc.reason.value, exc.message)
    if fcop.generation is Generation.G4:  # through fcop's own Core, as `up` imports it (docs/fcop4.md)
        from taskkernel.coordinator.fcop4.adapter import G4Adapter

        g4 = G4Adapter(kernel, ws.root, ws.state_dir)
        already = not dry_run and is_imported(kernel.db, g4.root_key)
        report = g4.import_history(dry_run=dry_run)
    else:
        importer = Importer.for_workspace(kernel, fcop, FileTracker(kernel.db), ws.root, STATE_DIR)
        already = not dry_run and importer.imported()
        try:
            report = importer.run(dry_run=dry_run)
        except FcopError as exc:
            reject(exc.reason.value, exc.message)
    out = report.wire()
    emit({"status": out.pop("status"), "already_imported": already, "generation": fcop.generation.value, **out},
         generic=False)
    if already:
        say("already imported: `taskkernel up` takes new files as they come")
        return
    verb = "would import" if dry_run else "imported"
    say(f"{verb} {out['tasks']} task(s) {out['tasks_by_state']}, {sum(out['records'].values())} "
                 f"record(s), {out['evidence']} evidence file(s); {len(out['refused'])} refused, "
                 f"{len(out['kept'])} kept as they are, {len(out['skipped'])} skipped unread, "
                 f"{len(out['warnings'])} warning(s)")
    if report.skipped:
        warn(("incomplete", "yellow"), f": {len(report.skipped)} file(s) or folder(s) not read, so what they hold "
             "is not in the kernel:")
        for s in report.skipped:
            warn(f"  {oneline(s['file'])}: {s['reason']} ({oneline(s['message'])})")
