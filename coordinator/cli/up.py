"""`taskkernel up`: run the coordinator over a workspace.

A stage that failed is never reported as ok, nor is an effect the outbox relay gave up on (a dead letter, e.g. a
merge the base checkout's local edits block): `--once` exits 1 with ``"status": "degraded"``, the failed stages and
the dead letters, each with its last error (`taskkernel effects retry KEY` once the cause is fixed); the
long-running form keeps going and shows the failing stages in its live view (coordinator/cli/live.py; the
coordinator logs each failure as a structured line either way).
"""

from __future__ import annotations

import asyncio
import re
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from taskkernel.coordinator.cli.common import Exit, emit, fail, fail_config, get_ctx, say
from taskkernel.coordinator.cli.output import oneline, people
from taskkernel.coordinator.config import HOST_NAME, ConfigError
from taskkernel.coordinator.fcop import FcopError
from taskkernel.coordinator.loop import Coordinator, PassStats, Shutdown, StageFailure
from taskkernel.coordinator.workspace import Workspace, WorkspaceNotFound
from taskkernel.kernel.logging import prefer_level
from taskkernel.kernel.outbox import dead_letters

if TYPE_CHECKING:
    from rich.live import Live

    from taskkernel.coordinator.cli.live import Notices


def up(ctx: typer.Context, workspace: Path = typer.Argument(None, help="Workspace root (default: search upwards)."),
       once: bool = typer.Option(False, "--once", help="Process everything pending, then exit."),
       once_wait: float = typer.Option(None, "--once-wait", min=0, max=86400,
                                       help="With --once: wait up to this many seconds for retries that fall due "
                                            "(default: the longest backoff a role's retry can have, at most 300)."),
       host: str = typer.Option(None, "--host", envvar="TASKKERNEL_HOST",
                                help="This machine's name in a team on one shared store: with [hosts.NAME] tables "
                                     "it runs agents only for that table's roles (default: the machine's name; "
                                     "docs/hosts.md).")
       ) -> None:
    """Run the coordinator: folders, dispatcher, agents and automations."""
    c = get_ctx(ctx)
    if host is not None and not re.fullmatch(HOST_NAME, host):
        fail(Exit.USAGE, f"--host {host!r} is not a host name (letters, digits, '.', '_' and '-', at most 63)",
             error="invalid_host_name")
    prefer_level("INFO")  # a line per run start, end, retry and block, unless TASKKERNEL_LOG_LEVEL says otherwise
    if workspace is not None:
        c.workspace_path = str(workspace)
    try:
        ws = Workspace.locate(c.workspace_path)
    except ConfigError as exc:
        fail_config(exc)
    except WorkspaceNotFound as exc:
        fail(Exit.USAGE, str(exc))
    db = c.current_database()  # refused while the schema is behind (or ahead of) this code
    try:
        coordinator = Coordinator(ws, db, settle_s=0.0 if once else 1.0, grace_s=0.0 if once else 5.0, host=host)
    except FcopError as exc:  # e.g. unsupported_workspace_generation (G4), mixed or ambiguous roots
        fail(Exit.REJECTED, str(exc), reason=exc.reason.value)
    except ConfigError as exc:  # a [roles.X] table for a role the team lacks, a runner that cannot run, a host
        # [hosts] lacks
        fail_config(exc)
    except ValueError as exc:  # a bad team (fcop.json)
        fail(Exit.USAGE, str(exc))
    if once:
        stopped: list[dict[str, object]] = []

        def stop_once(signum: int, _frame: object) -> None:  # the agents are stopped; their runs are due again
            named = {r["run_id"] for r in stopped}
            stopped.extend(r.describe() for r in coordinator.interrupt_once() if r.run.run_id not in named)

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, stop_once)
        passes = coordinator.run_once(once_wait=once_wait)
        done: dict[str, object] = {"passes": len(passes), "dispatched": sum(p.dispatched for p in passes),
                                   "wakes": sum(p.wakes for p in passes), "runs": sum(p.runs for p in passes),
                                   "pending": [_pending(r) for r in coordinator.dispatcher.ledger.pending()]}
        if not coordinator.dispatcher.accepting:  # a signal ended it
            emit({"status": "interrupted", "running_at_stop": stopped, **done})
            say(("interrupted", "yellow"), f": {len(stopped)} run(s) stopped; they run again at the next start")
            raise typer.Exit(130)
        failed = _failed_stages([f for p in passes for f in p.failed])
        dead = dead_letters(db)
        if failed or dead:
            emit({"status": "degraded", "failed_stages": failed, "dead_letters": dead, **done})
            say(("degraded", "red"), f": {len(failed)} stage failure(s), {len(dead)} dead letter(s); processed: {done}")
            for d in dead:
                say(("dead letter", "red"), f" {d['effect_key']} ({d['effect']}"
                    + (f", task {d['task_id']}" if d["task_id"] else "")
                    + f") after {d['attempts']} attempt(s): {oneline(d['last_error'] or '')}")
            if dead:
                say("fix the cause, then: taskkernel effects retry KEY (see taskkernel effects list)")
            raise typer.Exit(int(Exit.INTERNAL))
        emit({"status": "ok", **done})
        say(f"processed: {done}")
        return
    stop, force = asyncio.Event(), asyncio.Event()
    totals: dict[str, int] = {"passes": 0}

    def count(stats: PassStats) -> None:
        totals["passes"] += 1
        for name, value in {"dispatched": stats.dispatched, "wakes": stats.wakes, "runs": stats.runs,
                            **stats.extra}.items():
            totals[name] = totals.get(name, 0) + value

    def on_signal(sig: signal.Signals) -> None:
        if not stop.is_set():
            stop.set()  # no run starts from now; the running ones get [kernel] shutdown_grace to finish
            running = coordinator.dispatcher.pool.running()
            say(("stopping", "yellow"), f": {len(running)} run(s) still running"
                + (f" ({', '.join(r.run.task_id for r in running)}); Ctrl-C again stops them now" if running else ""))
        else:  # a second Ctrl-C or SIGTERM: terminate the agents (TERM, kill_grace, KILL), runs due at next start
            force.set()

    async def main() -> Shutdown:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal, sig)
        say(("coordinator up", "green"), f" for {ws.root} (Ctrl-C to stop)")
        console = people()  # the live view goes where lines for people go
        if not console.is_terminal:
            return await coordinator.run(stop, on_pass=count, force=force)
        from rich.live import Live  # the view and what it reads: only for a terminal

        from taskkernel.coordinator.cli.live import watching_notices

        # While the view is up, rich sends what is written to a terminal's sys.stdout/sys.stderr (the log lines:
        # kernel/logging.py writes to the current sys.stderr) to the console above the view instead of under it,
        # where the next refresh would paint over it; a stream that is not a terminal (`2>up.log`) stays as it is.
        with watching_notices() as notices, Live(console=console, refresh_per_second=2,
                                                 redirect_stdout=sys.stdout.isatty(),
                                                 redirect_stderr=sys.stderr.isatty()) as live:
            view = _LiveView(coordinator, totals, notices, live)
            view.refresh()

            def show(stats: PassStats) -> None:
                count(stats)
                view.refresh()

            return await coordinator.run(stop, on_pass=show, force=force)

    shutdown = asyncio.run(main())
    emit({"status": shutdown.status, "running_at_stop": shutdown.running_at_stop, **totals})
    if shutdown.status == "interrupted":
        raise typer.Exit(130)


def _pending(run: dict[str, object]) -> dict[str, object]:
    """A run still waiting after `up --once`: when it is due and why its last attempt failed."""
    return {"run_id": run["run_id"], "task_id": run["task_id"], "role": run["role"], "attempt": run["attempt"],
            "due": run["not_before"], "error_code": run["error_code"], "last_error": run["last_error"]}


def _failed_stages(failures: list[StageFailure]) -> list[dict[str, object]]:
    """One entry per distinct failure, in first-seen order, with the number of passes it happened in: every
    reason a stage failed for shows, however many passes repeated it. A stage that raised is told apart by its
    error and message; a refused write by its operation and reason (its message, the count and the latest path,
    changes from pass to pass: the entry keeps the latest)."""
    seen: dict[tuple[str, str, str], tuple[StageFailure, int]] = {}
    for f in failures:
        key = (f.stage, f.error, "" if f.refused else f.message)
        seen[key] = (f, seen[key][1] + 1 if key in seen else 1)  # a key keeps its first-seen place
    return [{"stage": f.stage, "error": f.error, "message": f.message, "passes": n} for f, n in seen.values()]


class _LiveView:
    """Redraws the view after a pass, at most every REFRESH_S (a burst of passes reads the store once)."""

    REFRESH_S = 0.5

    def __init__(self, coordinator: Coordinator, totals: dict[str, int], notices: Notices, live: Live) -> None:
        self.coordinator, self.totals, self.notices, self.live = coordinator, totals, notices, live
        self.last = float("-inf")

    def refresh(self) -> None:
        now = time.monotonic()
        if now - self.last < self.REFRESH_S:
            return
        self.last = now
        from rich.text import Text

        from taskkernel.coordinator.cli.live import live_view, rows_for

        try:
            view = live_view(self.coordinator, self.totals, self.notices,
                             rows=rows_for(self.live.console.height))
        except Exception as exc:  # noqa: BLE001 - the view must never stop the coordinator (a locked store, …)
            view = Text.assemble(("live view unavailable", "red"), f": {type(exc).__name__}: {oneline(str(exc))}")
        self.live.update(view)
