"""`taskkernel runs list|show|follow`: the run ledger and a run's live output, for people and scripts (docs/runs.md,
docs/live-output.md).

Reads only (coordinator/runners/history.py, runners/live.py): the database is opened, the kernel never built. Text
an agent or its coordinator wrote (an error, a log line, a live event) goes out with control characters escaped and
cut to a bound, in JSON as on a terminal, so a log can neither break a line nor drive the terminal.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import typer

from taskkernel.coordinator.cli.common import Exit, emit, fail, get_ctx, reject, say, show
from taskkernel.coordinator.cli.output import human_mode, oneline, write_json

VIEW_STATES = ("queued", "running", "retrying", "done", "failed", "blocked")  # = history.VIEW_STATES (tested)
ERROR_CHARS = 300  # last_error, after escaping
LINE_CHARS = 400  # one log line, after escaping

app = typer.Typer(no_args_is_help=True,
                  help="Agent runs: what runs, retries, failed or is blocked, and each attempt.")


def bounded(text: str | None, limit: int) -> str | None:
    """``text`` on one line (output.oneline's escapes) and at most ``limit`` characters (then ``…``)."""
    if text is None:
        return None
    line = oneline(text)
    return line if len(line) <= limit else line[:limit - 1] + "…"


def _clean(row: dict[str, Any]) -> dict[str, Any]:
    return {**row, "last_error": bounded(row.get("last_error"), ERROR_CHARS)}


@app.command("list")
def runs_list(ctx: typer.Context,
              state: str | None = typer.Option(None, "--state", help=f"Only runs in this state: "
                                                                       f"{', '.join(VIEW_STATES)}."),
              task: str | None = typer.Option(None, "--task", help="Only the runs of this task."),
              limit: int = typer.Option(50, "--limit", help="Runs per page (1 to 1000)."),
              cursor: str | None = typer.Option(None, "--cursor",
                                                help="Continue after the page that printed this cursor."),
              ) -> None:
    """Runs, newest first, one page at a time (JSON: an array)."""
    if state is not None and state not in VIEW_STATES:
        fail(Exit.USAGE, f"--state {state!r} is not a run state; choose one of {', '.join(VIEW_STATES)}")
    from taskkernel.coordinator.runners.history import RunQueryError, page_runs

    db = get_ctx(ctx).current_database(writes=False)
    try:
        page = page_runs(db, state=state, task_id=task, limit=limit, after=cursor)
    except RunQueryError as exc:
        fail(Exit.USAGE, str(exc))
    emit([_clean(r) for r in page.rows], _render_list)
    if page.next_cursor is not None:  # the stable line scripts read (stderr in JSON mode), as `task list` prints
        say(f"next page: --cursor {page.next_cursor}")


def _render_list(rows: list[dict[str, Any]]) -> None:
    from rich.table import Table
    from rich.text import Text

    from taskkernel.coordinator.cli.output import people

    colours = {"running": "cyan", "retrying": "yellow", "done": "green", "failed": "red", "blocked": "red"}
    now = datetime.now(UTC)
    cells = [(r["run_id"], r["role"], r["state"], f"{r['attempt']}/{r['max_attempts']}",
              "" if r["exit_code"] is None else str(r["exit_code"]), _when(r, now),
              " ".join(p for p in (r["error_code"], r["last_error"]) if p)) for r in rows]
    headers = ("run", "role", "state", "try", "exit", "when", "error")  # the run id names task, round, purpose
    table = Table(*headers)
    widths = [max([len(h), *(len(c[i]) for c in cells)]) for i, h in enumerate(headers[:-1])]
    for column, width in zip(table.columns, widths, strict=False):  # one line per run, every column whole
        column.no_wrap, column.min_width = True, width
    error = table.columns[-1]  # but the error, cut to what is left (`runs show` has all of it)
    error.no_wrap, error.overflow = True, "ellipsis"
    error.max_width = max(10, people().width - sum(widths) - 3 * len(headers) - 1)
    for c in cells:
        table.add_row(*(Text(v) for v in c[:2]), Text(c[2], style=colours.get(c[2], "")), *(Text(v) for v in c[3:]))
    show(table)
    say(f"{len(rows)} run(s)")


def _ago(stamp: str | None, now: datetime) -> str:
    """How far a ledger timestamp is from now, for a table: ``3m ago``, ``in 59m``, ``2d ago``."""
    try:
        then = datetime.fromisoformat((stamp or "").replace("Z", "+00:00"))
    except ValueError:
        return stamp or ""
    seconds = (then if then.tzinfo else then.replace(tzinfo=UTC)) - now
    s = abs(seconds.total_seconds())
    amount = (f"{s:.0f}s" if s < 90 else f"{s / 60:.0f}m" if s < 5400 else f"{s / 3600:.0f}h" if s < 129600
              else f"{s / 86400:.0f}d")
    return f"in {amount}" if seconds.total_seconds() > 0 else f"{amount} ago"


def _when(r: dict[str, Any], now: datetime) -> str:
    if r["state"] == "running" and r["elapsed_s"] is not None:
        return f"for {_ago(r['started_at'], now).removesuffix(' ago')}"
    if r["state"] == "retrying":
        return f"retry {_ago(r['retry_at'], now)}"
    if r["ended_at"]:
        return f"ended {_ago(r['ended_at'], now)}"
    return f"queued {_ago(r['created_at'], now)}"


@app.command("show")
def runs_show(ctx: typer.Context, run_id: str = typer.Argument(..., metavar="RUN_ID",
                                                                help="A run id from `taskkernel runs list`.")
              ) -> None:
    """One run: its state, every attempt (exit code, wall time, tokens, cost, the tail of its logs) and totals."""
    from taskkernel.coordinator.runners.history import run_detail

    c = get_ctx(ctx)
    db = c.current_database(writes=False)
    ws = c.optional_workspace()
    doc = run_detail(db, run_id, ws.root if ws is not None else None)
    if doc is None:
        reject("run_not_found", f"no run {bounded(run_id, 200)} (see `taskkernel runs list`)")
    doc = _clean(doc)
    for attempt in doc["attempts"]:
        for stream in ("stdout_tail", "stderr_tail"):
            t = attempt[stream]
            if t is not None:
                t["lines"] = [bounded(line, LINE_CHARS) for line in t["lines"]]
    emit(doc, _render_show)


def _render_show(doc: dict[str, Any]) -> None:
    from rich.table import Table
    from rich.text import Text

    from taskkernel.coordinator.cli.output import table_of

    say(f"{doc['run_id']} ", (doc["state"], "bold"),
        f" attempt {doc['attempt']}/{doc['max_attempts']}: {doc['role']} {doc['purpose']} {doc['task_id']} "
        f"round {doc['round']}")
    facts = ("error_code", "last_error", "exit_code", "created_at", "started_at", "ended_at", "elapsed_s",
             "retry_at", "lease_owner", "lease_until", "heartbeat_at")
    show(table_of({k: doc[k] for k in facts if doc.get(k) is not None}))
    table = Table("attempt", "exit", "wall s", "tokens in", "tokens out", "cost $", title="attempts")
    for a in doc["attempts"]:
        recorded = a["recorded"]
        table.add_row(str(a["attempt"]), "" if a["exit_code"] is None else str(a["exit_code"]),
                      f"{a['wall_ms'] / 1000:.1f}" if recorded else "", str(a["tokens_in"]) if recorded else "",
                      str(a["tokens_out"]) if recorded else "", f"{a['cost_usd']:.4f}" if recorded else "")
    t = doc["totals"]
    table.add_row("TOTAL", "", f"{t['wall_ms'] / 1000:.1f}", str(t["tokens_in"]), str(t["tokens_out"]),
                  f"{t['cost_usd']:.4f}")
    show(table)
    for a in doc["attempts"]:
        for stream in ("stdout", "stderr"):
            tail = a[f"{stream}_tail"]
            if tail is None or not tail["lines"]:
                continue
            more = " (last lines)" if tail["truncated"] else ""
            say((f"attempt {a['attempt']} {stream}{more}", "bold"), f"  {a['logs'][stream]}")
            for line in tail["lines"]:
                show(Text("  " + line))


FOLLOW_POLL_S = 0.2  # how often `runs follow` looks for new events, as `task watch` does
_KIND_STYLES = {"error": "red", "tool_call": "cyan", "tool_result": "dim", "usage": "green"}


@app.command("follow")
def runs_follow(ctx: typer.Context,
                run_id: str = typer.Argument(..., metavar="RUN_ID", help="A run id from `taskkernel runs list`."),
                timeout: float | None = typer.Option(None, "--timeout", min=0, help=(
                    "Give up after this many seconds: exit 1 (error code timeout) unless the run ended by then.")),
                ) -> None:
    """A run's live output: its events so far, then each as it is stored (JSON: one line per event), until the
    run is done, failed or blocked (exit 0); SIGINT/SIGTERM end it quietly with exit 0."""
    from taskkernel.coordinator.cli.kernel_cmds import _quiet_stop
    from taskkernel.coordinator.runners.live import ACTIVE_STATES, MAX_READ, read_events, run_state

    deadline = None if timeout is None else time.monotonic() + timeout
    db = get_ctx(ctx).current_database(writes=False)
    state = run_state(db, run_id)
    if state is None:
        reject("run_not_found", f"no run {bounded(run_id, 200)} (see `taskkernel runs list`)")
    after = 0
    with _quiet_stop() as stop:
        while not stop.requested:
            state = run_state(db, run_id) or state  # before the events: a run seen ended had stored them all
            events = read_events(db, run_id=run_id, after=after, limit=MAX_READ)
            for event in events:
                print_run_event(event)
                after = event["n"]
            if len(events) == MAX_READ:
                continue  # more are there already
            if state not in ACTIVE_STATES:
                say(f"{bounded(run_id, 200)} is {state}")
                return
            if deadline is not None and time.monotonic() >= deadline:
                break
            time.sleep(FOLLOW_POLL_S)
    fail(Exit.INTERNAL, f"{bounded(run_id, 200)} is still {state} after {timeout:g} s (--timeout)", error="timeout",
         run_id=run_id, state=state)


def print_run_event(event: dict[str, Any]) -> None:
    """One event: a JSON line for scripts, a readable line on a terminal (time, kind, tool, text on one line)."""
    if not human_mode():
        write_json(event)
        return
    when = event["at"][11:19]  # HH:MM:SS of the UTC stamp
    tool = f" {oneline(event['tool'])}" if event["tool"] and event["kind"] != "tool_call" else ""
    say(f"{when} ", (f"{event['kind']:<11}", _KIND_STYLES.get(event["kind"], "")), f"{tool} {oneline(event['text'])}")
