"""Usage ledger: every unit of work (agent run, automation fire, background job) with its owner.

Rows are inserted, never updated, so concurrent completions can neither double-count nor lose
usage; totals are sums over rows. The owner is the root task (the goal), plus task, round,
role, agent and feature, so every figure rolls up to whoever asked for the work. A figure is stored
exactly or not at all: counts are integers within ±2**53 (64-bit columns on PostgreSQL too), costs
finite, so a runner reporting nonsense cannot poison a sum or a budget.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

import sqlalchemy as sa

from taskkernel.kernel.canonical import JSON_SAFE_INT, utc_now_iso
from taskkernel.kernel.store.db import Database, UnitOfWork
from taskkernel.kernel.store.schema import metadata
from taskkernel.kernel.store.schema import usage as usage_table


class Feature(StrEnum):
    FOREGROUND = "foreground"
    AUTOMATION = "automation"
    BACKGROUND = "background"


@dataclass(frozen=True)
class UsageRecord:
    usage_id: str
    role: str
    agent: str
    feature: Feature
    root_task: str | None = None
    task_id: str | None = None
    round: int | None = None
    wall_ms: int = 0
    exit_code: int | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0

    def __post_init__(self) -> None:
        for name in ("wall_ms", "tokens_in", "tokens_out"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= JSON_SAFE_INT:
                raise ValueError(f"usage {name}={value!r} is not a count within 0..2**53")
        if not isinstance(self.cost_usd, int | float) or not (math.isfinite(self.cost_usd) and self.cost_usd >= 0):
            raise ValueError(f"usage cost_usd={self.cost_usd!r} is not a finite non-negative amount")


def install(db: Database) -> None:
    """Create the core's tables, the usage ledger among them, if missing (``Database.create_schema``)."""
    db.create_schema(metadata)


def record_usage(uow: UnitOfWork, rec: UsageRecord) -> bool:
    """Insert once per usage_id (inside the caller's transaction); False if it was already recorded."""
    exists = uow.conn.execute(sa.select(usage_table.c.usage_id).where(usage_table.c.usage_id == rec.usage_id)
                              ).first()
    if exists:
        return False
    uow.conn.execute(usage_table.insert().values(
        usage_id=rec.usage_id, root_task=rec.root_task, task_id=rec.task_id, round=rec.round, role=rec.role,
        agent=rec.agent, feature=rec.feature.value, wall_ms=rec.wall_ms, exit_code=rec.exit_code,
        tokens_in=rec.tokens_in, tokens_out=rec.tokens_out, cost_usd=rec.cost_usd, recorded_at=utc_now_iso()))
    return True


GROUPINGS = {"root": "root_task", "task": "task_id", "role": "role", "feature": "feature", "agent": "agent"}


def summarize(db: Database, by: str = "root", since: str | None = None) -> list[dict[str, Any]]:
    col = usage_table.c[GROUPINGS[by]]
    q = sa.select(col.label("owner"), sa.func.count().label("units"), sa.func.sum(usage_table.c.wall_ms),
                  sa.func.sum(usage_table.c.tokens_in), sa.func.sum(usage_table.c.tokens_out),
                  sa.func.sum(usage_table.c.cost_usd)).group_by(col)
    if since:
        q = q.where(usage_table.c.recorded_at >= since)
    with db.read() as conn:
        rows = conn.execute(q).all()
    out = [{"owner": r[0], "units": r[1], "wall_ms": int(r[2] or 0), "tokens_in": int(r[3] or 0),
            "tokens_out": int(r[4] or 0), "cost_usd": round(float(r[5] or 0.0), 6)} for r in rows]
    return sorted(out, key=lambda r: (-r["cost_usd"], -r["tokens_in"] - r["tokens_out"], -r["wall_ms"]))


_AGO = re.compile(r"^(\d{1,6})\s*([smhdw])$")
_UNIT = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def since_utc(text: str, now: datetime | None = None) -> str | None:
    """A ``since`` bound as the ledger writes timestamps (UTC, microseconds, Z), so rows compare by time and
    not by spelling: ISO 8601 (a naive time is UTC) or an age (``90s``, ``30m``, ``24h``, ``7d``, ``2w`` before
    now). None when the text is neither, or names a time out of the calendar's range (year 1 in a zone east of
    UTC, an age longer than the era)."""
    ago = _AGO.match(text.strip().lower())
    try:
        if ago:
            when = (now or datetime.now(UTC)) - timedelta(**{_UNIT[ago.group(2)]: int(ago.group(1))})
        else:
            when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
        when = when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)
    except (ValueError, OverflowError):
        return None
    return when.isoformat(timespec="microseconds")[:-6] + "Z"
