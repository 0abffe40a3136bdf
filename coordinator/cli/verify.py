"""`taskkernel verify`: the database file, the hash chain, every read model and the task folders against the
events. Always one JSON object and an exit code, also for a damaged database: never a traceback."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
import typer

from taskkernel.coordinator.cli.common import CliContext, Exit, emit, get_ctx, say, warn
from taskkernel.coordinator.cli.output import oneline
from taskkernel.kernel.model.upcasters import task_upcasters
from taskkernel.kernel.store.db import DatabaseCorrupt, is_corruption
from taskkernel.kernel.store.events import EventStore
from taskkernel.kernel.verify import VerifyReport, corrupt_report
from taskkernel.kernel.verify import verify as verify_store


def _verify_folders(c: CliContext, root: Path, report: VerifyReport, repair: bool) -> None:
    """The folders are a projection too: each task's TASK file must sit in the stage the log says, and each
    TASK file the adapter handled must belong to a task the log knows (docs/folders.md). Only they need the
    whole kernel (its folder projection), so only they build it."""
    from taskkernel.coordinator.fcop import FcopError, Generation, open_workspace
    from taskkernel.coordinator.folders.check import check_folders, repair_folders, unknown_task_files
    from taskkernel.coordinator.folders.projection import Projection
    from taskkernel.coordinator.folders.tracking import FileTracker

    try:
        fcop = open_workspace(root, allow_mixed=True)
    except FcopError as exc:
        report.add("folder", exc.reason.value, 0, exc.message)
        return
    kernel = c.kernel()
    if fcop.generation is Generation.G4:
        from taskkernel.coordinator.fcop4.check import verify_g4

        verify_g4(kernel, root, report)
        return
    projection = Projection(kernel, fcop, FileTracker(kernel.db))
    drifts = check_folders(projection)
    if drifts and repair:
        report.repaired += repair_folders(projection, drifts)
        drifts = check_folders(projection)
    for d in drifts:
        report.add("folder", d.reason, d.position, d.detail, task_id=d.task_id)
    report.unknown_task_files = unknown_task_files(projection)


def verify(ctx: typer.Context, repair: bool = typer.Option(False, "--repair",
                                                          help="Rebuild drifted projections from events.")) -> None:
    """Check the database file, the hash chain, every read model and the task folders against the events; exit
    2 at the first break. --repair rebuilds drifted read models and moves drifted TASK files back where the log
    says; it never touches events and refuses while the chain is not proven or the log may have lost events."""
    c = get_ctx(ctx)
    try:
        # the store as compose.py builds it (the same upcasters), without the command kernel's wiring
        report = verify_store(c.database(), EventStore(task_upcasters()), repair=repair)
        ws = c.optional_workspace()
        if ws is not None and ws.fcop_dir.is_dir() and report.ok:
            _verify_folders(c, ws.root, report, repair)
    except DatabaseCorrupt as exc:  # met while opening the other components' tables
        report = corrupt_report(str(exc))
    except sa.exc.DatabaseError as exc:  # a damaged page met outside the store checks (e.g. folder records)
        if not is_corruption(exc):
            raise
        report = corrupt_report(str(exc.orig))
    emit(report.as_json(), generic=False)
    if report.ok:
        say(("verified", "green"), f" {report.events} events, {report.tasks} tasks ({report.chain} chain)"
            + (f", repaired {report.repaired}" if report.repaired else ""))
        return
    first = next(p for p in report.problems if p["reason"] == report.reason)
    warn(("broken", "red"), f" ({report.reason}) at position {first['position']}: {oneline(str(first['detail']))}")
    if repair and report.chain_broken:
        warn(("refusing to repair", "red"), ": the chain is not proven, so the events cannot be trusted to rebuild "
            "anything from")
    elif repair and report.repair_refused:
        warn(("refusing to repair", "red"), ": a receipt or a stored task remembers more than the log holds, so the "
            "log may have lost events; rebuilding from it would hide the loss (docs/durability.md)")
    raise typer.Exit(int(Exit.REJECTED))
