"""`taskkernel usage`: who spent what (rolled up to root tasks, roles, features, agents)."""

from __future__ import annotations

import sys
from datetime import UTC, datetime

import typer
from rich.console import Console
from rich.table import Table

from taskkernel.coordinator.cli.common import Exit, emit, fail, get_ctx
from taskkernel.kernel.usage import GROUPINGS, summarize
from taskkernel.kernel.usage import install as install_usage

TOP_N = 10


def _utc_iso(text: str) -> str:
    """``--since`` as the recorded timestamps are written (UTC, microseconds, Z), so the comparison is
    by time and not by spelling; a naive time is UTC."""
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        fail(Exit.USAGE, f"--since {text!r} is not an ISO date or time (e.g. 2026-11-30 or 2026-11-30T23:59Z)")
    when = when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)
    return when.isoformat(timespec="microseconds")[:-6] + "Z"


def usage(ctx: typer.Context,
          by: str = typer.Option("root", "--by", help=f"Group by: {', '.join(GROUPINGS)}."),
          since: str = typer.Option(None, "--since", help="Only usage recorded at or after this ISO time (UTC)."),
          as_json: bool = typer.Option(False, "--json", help="JSON instead of a table."),
          top: bool = typer.Option(False, "--top", help=f"Only the {TOP_N} largest owners.")) -> None:
    """Usage per owner: units of work, wall time, tokens and cost."""
    if by not in GROUPINGS:
        fail(Exit.USAGE, f"--by must be one of {', '.join(GROUPINGS)}")
    if since is not None:
        since = _utc_iso(since)
    db = get_ctx(ctx).database()
    install_usage(db)
    rows = summarize(db, by, since)
    total = {k: sum(r[k] for r in rows) for k in ("units", "wall_ms", "tokens_in", "tokens_out")}
    total["cost_usd"] = round(sum(r["cost_usd"] for r in rows), 6)
    shown = rows[:TOP_N] if top else rows
    if as_json:
        emit({"by": by, "since": since, "rows": shown, "total": total})
        return
    table = Table(by, "units", "wall s", "tokens in", "tokens out", "cost $",
                  title=f"usage by {by}" + (f" (top {TOP_N})" if top else ""))
    for r in shown + [{"owner": "TOTAL", **total}]:
        table.add_row(str(r["owner"]), str(r["units"]), f"{r['wall_ms'] / 1000:.1f}", str(r["tokens_in"]),
                      str(r["tokens_out"]), f"{r['cost_usd']:.4f}")
    Console(file=sys.stdout, markup=False, highlight=False).print(table)  # data is never markup
