"""`taskkernel usage`: who spent what (rolled up to root tasks, roles, features, agents)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import typer

from taskkernel.coordinator.cli.common import Exit, emit, fail, get_ctx, show
from taskkernel.coordinator.cli.output import oneline
from taskkernel.kernel.usage import GROUPINGS, summarize
from taskkernel.kernel.usage import install as install_usage
from taskkernel.kernel.usage import since_utc as parse_since

TOP_N = 10


def since_utc(text: str, now: datetime | None = None) -> str:
    """``--since`` as the ledger writes timestamps (kernel.usage.since_utc), or a usage error."""
    when = parse_since(text, now)
    if when is None:
        fail(Exit.USAGE, f"--since {text!r} is neither an ISO date or time (2026-11-30, 2026-11-30T23:59Z) "
                         "nor an age (30m, 24h, 7d, 2w)")
    return when


def usage(ctx: typer.Context,
          by: str = typer.Option("root", "--by", help=f"Group by: {', '.join(GROUPINGS)}."),
          since: str = typer.Option(None, "--since", help="Only usage since an ISO time or an age (30m, 24h, 7d)."),
          top: bool = typer.Option(False, "--top", help=f"Only the {TOP_N} largest owners.")) -> None:
    """Usage per owner: units of work, wall time, tokens and cost."""
    if by not in GROUPINGS:
        fail(Exit.USAGE, f"--by must be one of {', '.join(GROUPINGS)}")
    if since is not None:
        since = since_utc(since)
    db = get_ctx(ctx).database()
    install_usage(db)
    rows = summarize(db, by, since)
    total = {k: sum(r[k] for r in rows) for k in ("units", "wall_ms", "tokens_in", "tokens_out")}
    total["cost_usd"] = round(sum(r["cost_usd"] for r in rows), 6)
    shown = rows[:TOP_N] if top else rows
    emit({"by": by, "since": since, "rows": shown, "total": total}, lambda doc: _render(doc, top))


def _render(doc: dict[str, Any], top: bool) -> None:
    from rich.table import Table
    from rich.text import Text

    table = Table(doc["by"], "units", "wall s", "tokens in", "tokens out", "cost $",
                  title=f"usage by {doc['by']}" + (f" (top {TOP_N})" if top else ""))
    for r in [*doc["rows"], {"owner": "TOTAL", **doc["total"]}]:
        table.add_row(Text(oneline(str(r["owner"]))), str(r["units"]), f"{r['wall_ms'] / 1000:.1f}",
                      str(r["tokens_in"]), str(r["tokens_out"]), f"{r['cost_usd']:.4f}")
    show(table)
