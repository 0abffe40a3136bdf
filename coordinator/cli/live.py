"""The live view of `taskkernel up` on a terminal: what a supervisor needs to see, refreshed after each pass.

Sections, most urgent first: the runs **running** here (elapsed against their timeout), **retries due** (a
failed attempt waiting for its backoff), **blocked tasks** (active or in review, their reason), **stalled tasks**
(runs of the round ended and nothing moves them: coordinator/inbox.py ``stalled``), tasks **waiting for a human**
(a review whose done authority has no runner, may not approve, or is the scripted leader and approving would
merge; an inbox/active task whose recipient has no runner), the **last refusals and quarantines**, and the stages
failing now. Above them one line of task counts per state.

It stays cheap however large the store: every refresh is one read transaction (one snapshot) of a few bounded
queries, at most ``rows`` rows per section with "+N more", and the running runs and refusals come from memory
(the pool, and a small ring buffer fed by a structlog processor: the coordinator's own log events, never its
text). Nothing here writes.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from taskkernel.coordinator.cli.output import oneline, safe
from taskkernel.coordinator.config import OnApprove, RunnerKind
from taskkernel.coordinator.inbox import stalled
from taskkernel.coordinator.runners.ledger import RunState
from taskkernel.coordinator.tables import runs, worktrees
from taskkernel.kernel.logging import get_logger
from taskkernel.kernel.model.commands import CommandType
from taskkernel.kernel.queries import blocked_now, doc_text
from taskkernel.kernel.store.schema import tasks

if TYPE_CHECKING:
    from taskkernel.coordinator.loop import Coordinator
    from taskkernel.kernel.store.db import Database

log = get_logger(__name__)

ROWS = 8  # rows per section at most; the rest is "+N more"
RING = 5  # refusals and quarantines kept
STATES = ("inbox", "active", "blocked", "review", "done", "archive")  # active here means active and not blocked
# The coordinator's log events that say something was refused or quarantined, and the field naming what.
NOTICES: Mapping[str, tuple[str, ...]] = {
    "dispatch_refused": ("task_id",),  # the kernel refused a claim the dispatcher made for a role
    "blocked_report_refused": ("run_id",),  # the blocked report of a run that gave up was refused
    "fcop.quarantined": ("rel",),  # a file that does not parse, moved to the quarantine
    "quarantine_failed": ("rel",),
    "fcop.not_applied": ("rel",),  # a well-formed file whose command the kernel refused
    "fcop.moved_back": ("rel",),  # a file moved to a stage its task cannot go to, moved back
    "fcop.import_refused": ("file",),
    "fcop.refused": ("path", "op"),  # a write the safe file layer refused (a symlink, …)
}


@dataclass(frozen=True)
class Notice:
    """A refusal or a quarantine as the view lists it."""

    at: float  # epoch seconds
    event: str
    subject: str
    reason: str


class Notices:
    """The last ``size`` refusals and quarantines, kept by a structlog processor (any thread may log)."""

    def __init__(self, size: int = RING) -> None:
        self._ring: deque[Notice] = deque(maxlen=size)
        self._lock = threading.Lock()

    def __call__(self, _logger: Any, _method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        fields = NOTICES.get(str(event.get("event")))
        if fields is not None:
            subject = next((str(event[f]) for f in fields if event.get(f)), "")
            with self._lock:
                self._ring.append(Notice(time.time(), str(event["event"]), subject, str(event.get("reason") or "")))
        return event

    def recent(self) -> list[Notice]:
        """Newest first."""
        with self._lock:
            return list(reversed(self._ring))


@contextmanager
def watching_notices(size: int = RING) -> Iterator[Notices]:
    """Keep the refusals and quarantines logged meanwhile (at the level logging lets through: `up` logs INFO).

    The processor goes into the process's structlog chain in place, before the renderer, so the loggers already
    in use (structlog caches them) see it too; it is taken out again at the end."""
    import structlog

    log.bind()  # the kernel's set-up (kernel/logging.py) happens at a logger's first use: have it done first
    notices = Notices(size)
    chain = structlog.get_config()["processors"]
    if not isinstance(chain, list):  # not the kernel's set-up: leave the chain alone, show no notices
        yield notices
        return
    chain.insert(max(0, len(chain) - 1), notices)
    try:
        yield notices
    finally:
        chain.remove(notices)


def rows_for(height: int) -> int:
    """Rows per section that fit a terminal of ``height`` lines (at least 2, at most ROWS)."""
    return max(2, min(ROWS, (height - 16) // 5))


def live_view(coordinator: Coordinator, totals: Mapping[str, int], notices: Notices | None = None, *,
              rows: int = ROWS, now: float | None = None) -> RenderableType:
    """The whole view: title, counts, then each section (empty ones say so in one line or are left out); data
    under the terminal rule (output.py), cell by cell and again as a whole."""
    t = time.time() if now is None else now
    snap = read_snapshot(coordinator.db, set(coordinator.dispatcher.specs), rows, undecided=deciders(coordinator))
    root = str(coordinator.workspace.root)
    title = Text.assemble(("taskkernel up", "bold"), f": {oneline(root)}")
    if coordinator.failing:
        title.append(" ")
        title.append("(degraded)", "bold red")
    counts = Text(" · ".join(f"{s} {snap.states.get(s, 0)}" for s in STATES))
    counts.append("   " + " · ".join(f"{k} {v}" for k, v in totals.items()), "dim")
    parts: list[RenderableType] = [title, counts, _running(coordinator, rows, t), *_sections(snap, t)]
    if notices is not None and (recent := notices.recent()):
        table = _table("Last refusals and quarantines", "at", "event", "what", "reason")
        for n in recent:
            table.add_row(Text(time.strftime("%H:%M:%S", time.localtime(n.at))), Text(n.event),
                          Text(oneline(n.subject)), Text(oneline(n.reason)))
        parts.append(table)
    for f in coordinator.failing.values():
        parts.append(Text.assemble(("failing", "red"), f" {f.stage}: {f.error}: {oneline(f.message)}"))
    return safe(Group(*parts))


@dataclass
class Snapshot:
    """What one read transaction found: task counts, and each section's first rows and total."""

    states: dict[str, int]
    retries: list[dict[str, Any]]
    retries_total: int
    blocked: list[dict[str, Any]]
    waiting: list[dict[str, Any]]
    waiting_total: int
    blocked_total: int = 0  # active and in review
    stalled: list[dict[str, Any]] | None = None
    stalled_total: int = 0


@dataclass(frozen=True)
class Undecided:
    """Roles with a runner whose agent will not decide a review: ``cannot`` may not approve; ``scripted`` run the
    built-in scripted agent, which never approves a merge, and ``merging`` drive tasks whose approval merges."""

    cannot: frozenset[str] = frozenset()
    scripted: frozenset[str] = frozenset()
    merging: frozenset[str] = frozenset()


def deciders(coordinator: Coordinator) -> Undecided:
    specs, roles = coordinator.dispatcher.specs, coordinator.kernel.roles
    return Undecided(frozenset(r for r in specs if not roles.get(r).may_issue(CommandType.APPROVE)),
                     frozenset(r for r, s in specs.items() if s.runner == RunnerKind.SCRIPTED),
                     frozenset(r for r, s in specs.items() if s.on_approve is OnApprove.MERGE))


def read_snapshot(db: Database, runners: set[str], rows: int, undecided: Undecided | None = None) -> Snapshot:
    """One snapshot, bounded queries: counts per state, the first ``rows`` retries due (soonest first), blocked,
    stalled and waiting-for-a-human tasks (task id order), and how many of each there are."""
    pg = db.is_postgres
    u = undecided or Undecided()
    is_blocked = blocked_now(pg)
    marker = doc_text(("blocked", "report_id"), pg)
    any_blocked = sa.and_(tasks.c.state.in_(("active", "review")), marker.is_not(None))
    retrying = sa.and_(runs.c.state == RunState.PENDING.value, runs.c.attempt >= 1)
    decider = sa.func.coalesce(doc_text(("authority", "done_authority"), pg), "")
    merges = sa.and_(decider.in_(sorted(u.scripted)), doc_text(("authority", "driver"), pg).in_(sorted(u.merging)),
                     sa.exists().where(worktrees.c.task_id == tasks.c.task_id, worktrees.c.state != "archived"))
    waiting = sa.or_(
        sa.and_(tasks.c.state == "review", sa.or_(decider.not_in(sorted(runners)), decider.in_(sorted(u.cannot)),
                                                  merges)),
        sa.and_(tasks.c.state.in_(("inbox", "active")), tasks.c.recipient.not_in(sorted(runners)), marker.is_(None)))
    with db.snapshot() as conn:
        states = {str(s): int(n) for s, n in conn.execute(
            sa.select(tasks.c.state, sa.func.count()).group_by(tasks.c.state))}
        states["blocked"] = int(conn.execute(sa.select(sa.func.count()).where(is_blocked)).scalar_one())
        blocked_total = int(conn.execute(sa.select(sa.func.count()).where(any_blocked)).scalar_one())
        states["active"] = states.get("active", 0) - states["blocked"]
        retries = [dict(r._mapping) for r in conn.execute(
            sa.select(runs.c.task_id, runs.c.role, runs.c.attempt, runs.c.max_attempts, runs.c.not_before,
                      runs.c.error_code).where(retrying).order_by(runs.c.not_before, runs.c.run_id).limit(rows))]
        retries_total = len(retries) if len(retries) < rows else int(conn.execute(
            sa.select(sa.func.count()).select_from(runs).where(retrying)).scalar_one())
        blocked = [dict(r._mapping) for r in conn.execute(
            sa.select(tasks.c.task_id, doc_text(("authority", "driver"), pg).label("driver"),
                      doc_text(("blocked", "reason"), pg).label("reason"))
            .where(any_blocked).order_by(tasks.c.task_id).limit(rows))]
        found = [dict(r._mapping) for r in conn.execute(
            sa.select(tasks.c.task_id, tasks.c.state, tasks.c.recipient,
                      doc_text(("authority", "done_authority"), pg).label("done_authority"),
                      doc_text(("subject",), pg).label("subject"), merges.label("merges"))
            .where(waiting).order_by(tasks.c.task_id).limit(rows))]
        waiting_total = len(found) if len(found) < rows else int(conn.execute(
            sa.select(sa.func.count()).select_from(tasks).where(waiting)).scalar_one())
        stuck, stuck_total = stalled(conn, pg, None, rows)
    for r in found:
        r["why"] = _why_waiting(r, runners, u)
    return Snapshot(states, retries, retries_total, blocked, found, waiting_total, blocked_total, stuck, stuck_total)


def _why_waiting(r: dict[str, Any], runners: set[str], u: Undecided) -> str:
    who = (r["done_authority"] if r["state"] == "review" else r["recipient"]) or ""
    if who == "ADMIN":
        return "a person's"
    if who not in runners:
        return "no runner"
    return "may not approve" if who in u.cannot else "approval merges" if r["merges"] else ""


def _running(coordinator: Coordinator, rows: int, now: float) -> RenderableType:
    running = coordinator.dispatcher.pool.running()
    if not running:
        return Text("Running: nothing", style="dim")
    table = _table(f"Running ({len(running)})", "task", "role", "agent", "attempt", "elapsed / timeout")
    for r in running[:rows]:
        over = r.timeout is not None and now - r.started > r.timeout
        table.add_row(Text(r.run.task_id), Text(r.run.role), Text(oneline(r.agent)),
                      Text(f"{r.run.attempt}/{r.run.max_attempts}"),
                      Text(f"{span(now - r.started)} / {span(r.timeout) if r.timeout is not None else '-'}",
                           style="red" if over else ""))
    _more(table, len(running) - rows)
    return table


def _sections(snap: Snapshot, now: float) -> list[RenderableType]:
    out: list[RenderableType] = []
    if snap.retries:
        table = _table(f"Retries due ({snap.retries_total})", "task", "role", "attempt", "due", "error")
        for r in snap.retries:
            table.add_row(Text(r["task_id"]), Text(r["role"]), Text(f"{r['attempt']}/{r['max_attempts']}"),
                          Text(due_in(r["not_before"], now)), Text(oneline(r["error_code"] or "")))
        _more(table, snap.retries_total - len(snap.retries))
        out.append(table)
    if snap.blocked:
        table = _table(f"Blocked tasks ({snap.blocked_total})", "task", "driver", "reason")
        for r in snap.blocked:
            table.add_row(Text(r["task_id"]), Text(oneline(r["driver"] or "")), Text(oneline(r["reason"] or "")))
        _more(table, snap.blocked_total - len(snap.blocked))
        out.append(table)
    if snap.stalled:
        table = _table(f"Stalled tasks ({snap.stalled_total})", "task", "state", "waiting on", "cause")
        for r in snap.stalled:
            table.add_row(Text(r["task_id"]), Text(r["state"]), Text(oneline(r["waiting_on"] or "")),
                          Text(oneline(r["cause"])))
        _more(table, snap.stalled_total - len(snap.stalled))
        out.append(table)
    if snap.waiting:
        table = _table(f"Waiting for a human ({snap.waiting_total})", "task", "state", "who", "subject", "why")
        for r in snap.waiting:
            who = r["done_authority"] if r["state"] == "review" else r["recipient"]
            table.add_row(Text(r["task_id"]), Text(r["state"]), Text(oneline(who or "")),
                          Text(oneline(r["subject"] or "")), Text(r["why"], style="dim"))
        _more(table, snap.waiting_total - len(snap.waiting))
        out.append(table)
    return out


def _table(title: str, *columns: str) -> Table:
    table = Table(*columns, title=title, title_justify="left", title_style="bold", box=None, header_style="dim",
                  pad_edge=False, show_edge=False)
    for column in table.columns:
        column.overflow = "ellipsis"
        column.no_wrap = True
    return table


def _more(table: Table, more: int) -> None:
    if more > 0:
        table.add_row(Text(f"+{more} more", style="dim"))


def span(seconds: float) -> str:
    """A duration for people: ``12s``, ``4m05s``, ``2h07m``."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def due_in(stamp: str | None, now: float) -> str:
    """When a retry is due, from the ledger's ``not_before``: ``in 12s``, or ``now`` once it is due."""
    if not stamp:
        return "now"
    due = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()
    return "now" if due <= now else f"in {span(due - now + 0.999)}"
