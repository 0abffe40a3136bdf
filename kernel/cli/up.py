"""`taskkernel up`: run the coordinator over a workspace."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import typer

from kernel.cli.common import Exit, emit, fail, get_ctx, stderr
from kernel.coordinator import Coordinator
from kernel.fcop import FcopError
from kernel.workspace import Workspace, WorkspaceNotFound


def up(ctx: typer.Context, workspace: Path = typer.Argument(None, help="Workspace root (default: search upwards)."),
       once: bool = typer.Option(False, "--once", help="Process everything pending, then exit.")) -> None:
    """Run the coordinator: folders, dispatcher, agents and automations."""
    c = get_ctx(ctx)
    if workspace is not None:
        c.workspace_path = str(workspace)
    try:
        ws = Workspace.locate(c.workspace_path)
    except WorkspaceNotFound as exc:
        fail(Exit.USAGE, str(exc))
    try:
        coordinator = Coordinator(ws, c.database(), settle_s=0.0 if once else 1.0, grace_s=0.0 if once else 5.0)
    except FcopError as exc:  # e.g. unsupported_workspace_generation (G4), mixed or ambiguous roots
        fail(Exit.REJECTED, f"{exc.reason.value}: {exc}", reason=exc.reason.value)
    except ValueError as exc:  # a bad [roles.X] table
        fail(Exit.USAGE, str(exc))
    if once:
        passes = coordinator.run_once()
        totals = {"passes": len(passes), "dispatched": sum(p.dispatched for p in passes),
                  "wakes": sum(p.wakes for p in passes), "runs": sum(p.runs for p in passes)}
        emit({"status": "ok", **totals})
        stderr.print(f"processed: {totals}")
        return
    stop = asyncio.Event()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        stderr.print(f"[green]coordinator up[/green] for {ws.root} (Ctrl-C to stop)")
        await coordinator.run(stop)

    asyncio.run(main())
    emit({"status": "stopped"})
