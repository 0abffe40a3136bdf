"""`taskkernel verify`: the hash chain, every read model and the task folders against the events."""

from __future__ import annotations

from pathlib import Path

import typer

from kernel.cli.common import Exit, emit, get_ctx, stderr
from kernel.cli.wiring import build_kernel
from kernel.commands import TaskCommandKernel
from kernel.verify import VerifyReport
from kernel.verify import verify as verify_store


def _verify_folders(kernel: TaskCommandKernel, root: Path, report: VerifyReport, repair: bool) -> None:
    """The folders are a projection too: each task's TASK file must sit in the stage the log says."""
    from kernel.fcop import FcopError, open_workspace
    from kernel.folders.check import check_folders, repair_folders
    from kernel.folders.projection import Projection
    from kernel.folders.tracking import FileTracker

    try:
        projection = Projection(kernel, open_workspace(root, allow_mixed=True), FileTracker(kernel.db))
    except FcopError as exc:
        report.problems.append({"kind": "folder", "position": 0, "detail": str(exc)})
        return
    drifts = check_folders(projection)
    if drifts and repair:
        report.repaired += repair_folders(projection, drifts)
        drifts = check_folders(projection)
    report.problems.extend({"kind": "folder", "position": d.position, "task_id": d.task_id, "detail": d.detail}
                           for d in drifts)
    report.problems.sort(key=lambda p: p["position"])


def verify(ctx: typer.Context, repair: bool = typer.Option(False, "--repair",
                                                          help="Rebuild drifted projections from events.")) -> None:
    """Check the hash chain, every read model and the task folders against the events; exit 2 at the first
    break. --repair rebuilds drifted read models and moves drifted TASK files back where the log says."""
    c = get_ctx(ctx)
    kernel = build_kernel(c)
    report = verify_store(kernel.db, kernel.store, repair=repair)
    ws = c.optional_workspace()
    if ws is not None and ws.fcop_dir.is_dir() and report.ok:
        _verify_folders(kernel, ws.root, report, repair)
    emit(report.as_json())
    if report.ok:
        stderr.print(f"[green]verified[/green] {report.events} events, {report.tasks} tasks"
                     + (f", repaired {report.repaired}" if report.repaired else ""))
        return
    stderr.print(f"[red]broken[/red] at position {report.first_broken_position}: {report.problems[0]['detail']}")
    raise typer.Exit(int(Exit.REJECTED))
