"""What each page and API route of the board reads: the CLI's reads, composed; nothing here writes.

Every list is bounded (a page of tasks per column, a capped tree, the latest runs and outcomes), so a page costs
the same with ten tasks or ten thousand (bench/serve.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from taskkernel.coordinator.config import RunnerSpec
from taskkernel.coordinator.inbox import approval_refusals
from taskkernel.coordinator.runners.history import page_runs, run_detail
from taskkernel.coordinator.runners.inputs import RunInputs
from taskkernel.coordinator.runners.live import latest_events, read_events
from taskkernel.coordinator.showing import task_show
from taskkernel.coordinator.web.patchlines import patch_lines
from taskkernel.coordinator.workspace import Workspace
from taskkernel.kernel.history import history_note
from taskkernel.kernel.instructions import check_reader
from taskkernel.kernel.model.principal import LOCAL_OWNER, Principal
from taskkernel.kernel.model.task import TaskState
from taskkernel.kernel.permissions import permission_scope
from taskkernel.kernel.queries import (
    BLOCKED,
    PatchRefused,
    doc_text,
    event_reader,
    page_tasks,
    read_patch,
    state_counts,
    task_document,
    task_history,
)
from taskkernel.kernel.reasons import KernelError
from taskkernel.kernel.sessionlog import SessionLog, SessionLogError
from taskkernel.kernel.sessionlog.interchange import record_json
from taskkernel.kernel.store.db import Database
from taskkernel.kernel.store.schema import tasks
from taskkernel.kernel.store.schema import usage as usage_table
from taskkernel.kernel.usage import GROUPINGS, summarize
from taskkernel.scheduler.admin import Schedules
from taskkernel.scheduler.authority import creator_role
from taskkernel.scheduler.clockjump import recent_clamps
from taskkernel.scheduler.ledger import Ledger

COLUMNS = tuple(s.value for s in TaskState)  # inbox, active, review, done, archive: the board's columns
CARDS_PER_COLUMN = 50
PATCH_SHOWN = 256 * 1024  # bytes of a patch the task page shows; the file has it all
TREE_DEPTH = 4
TREE_WIDTH = 100
GRANT_KINDS = ("allow", "revoke")
LIVE_SHOWN = 200  # a task page's live output: its agents' newest events (the pane keeps that many as more come)


@dataclass(frozen=True)
class Filters:
    """The board's filters: recipient role, root task, risk level (None: any)."""

    role: str | None = None
    root: str | None = None
    risk: str | None = None

    def query(self) -> dict[str, str | None]:
        return {"role": self.role, "root": self.root, "risk": self.risk}


def board(db: Database, grant_sessions: frozenset[str] | None, filters: Filters,
          per_column: int = CARDS_PER_COLUMN) -> dict[str, Any]:
    """Each column's count and first cards, read in one transaction (the counts are those of the cards shown). A
    review card says who decides it (``done_authority``: ``ADMIN`` is a person) and whether its approval would be
    refused for want of a human's grant (``needs_grant``: the kernel's own guard asked, as `taskkernel inbox` asks
    it). The counts come from the ``(state, task_id)`` index and every list stops at a page, so the page costs the
    same at any size of the table (tests/test_web_board.py checks each statement's plan)."""
    columns: dict[str, Any] = {}
    with db.read() as conn:
        counts = state_counts(db, conn, **filters.query())
        for state in COLUMNS:
            if state == TaskState.ACTIVE.value:  # the listing's `active` leaves out the blocked: they lead this column
                cards = _active_column(db, conn, filters, per_column)
            else:
                page = page_tasks(db, conn, state=state, limit=per_column, **filters.query())
                cards = {"tasks": page.rows, "next_cursor": page.next_cursor, "next_state": state}
            columns[state] = {"count": counts[state], **cards}
        in_review = columns[TaskState.REVIEW.value]["tasks"]
        if in_review:
            deciders = done_authorities(conn, db.is_postgres, [r["task_id"] for r in in_review])
            for row in in_review:
                row["done_authority"] = deciders.get(row["task_id"])
    reviews = [r for r in in_review if r["risk_level"] in ("high", "irreversible")]
    if reviews:
        with approval_refusals(db, grant_sessions) as refusal:
            for row in reviews:  # the guard reads risk_level and task_id, which a row has
                row["needs_grant"] = refusal(row, LOCAL_OWNER) is not None
    return columns


def _active_column(db: Database, conn: Connection, filters: Filters, per_column: int) -> dict[str, Any]:
    """The active column: its blocked tasks first (what needs someone), then the others, both in task id order."""
    blocked = page_tasks(db, conn, state=BLOCKED, limit=per_column, **filters.query())
    room = per_column - len(blocked.rows)
    if blocked.next_cursor is not None:  # blocked tasks fill the column and more follow: their next page
        return {"tasks": blocked.rows, "next_cursor": blocked.next_cursor, "next_state": BLOCKED}
    if room == 0:  # exactly a column of blocked tasks: the others from their first page
        return {"tasks": blocked.rows, "next_cursor": None, "next_state": "active"}
    rest = page_tasks(db, conn, state="active", limit=room, **filters.query())
    return {"tasks": blocked.rows + rest.rows, "next_cursor": rest.next_cursor, "next_state": "active"}


def done_authorities(conn: Connection, postgres: bool, task_ids: list[str]) -> dict[str, str | None]:
    """Who decides each task (its ``authority.done_authority``), read in one query."""
    decider = doc_text(("authority", "done_authority"), postgres)
    return dict(conn.execute(sa.select(tasks.c.task_id, decider).where(tasks.c.task_id.in_(task_ids))).all())


def task_page(db: Database, ws: Workspace | None, log: SessionLog, inputs: RunInputs, task_id: str,
              reader: Principal | None = None) -> dict[str, Any] | None:
    """Everything the task page shows: the `task show` document, the timeline with each event's actor, the
    instructions given to its agent (for a reader who may list them; how many in ``instructions_given``), the
    reports with their bodies and diffs, the children as a tree, gate verdicts, usage, runs, its agents' newest live
    output, and the grants the kernel's guard consults: those ``reader`` may read in full, how many there are in
    ``grants_held``."""
    doc = task_show(db, task_id)
    if doc is None:
        return None
    events = task_history(db, task_id)
    reports = [{**r, "body": r.get("body") or "",  # `task show`'s document carries each report's body
                "patch": patch_text(ws, r["diff"]) if ws is not None and r.get("diff") else None}
               for r in doc.get("reports", ())]
    timeline = [{"global_pos": ev.global_pos, "revision": ev.stream_version, "type": ev.type, "at": ev.recorded_at,
                 "by": ev.data.get("by") or ev.meta.get("actor"), "reason": ev.data.get("reason"),
                 "status": ev.data.get("status"), "round": ev.data.get("round"),
                 "note": history_note(ev.type, ev.data)} for ev in events]
    told = inputs.timeline(task_id)
    grants = grants_for(log, task_id)
    live = latest_events(db, task_id, LIVE_SHOWN)
    return {"task": doc, "timeline": timeline, "instructions": told if allowed(check_reader, reader, doc) else [],
            "instructions_given": len(told), "reports": reports, "children": children_tree(db, task_id),
            "gate": gate_verdicts(db, task_id), "grants": readable_grants(log, reader, grants),
            "grants_held": len(grants), "usage": task_usage(db, task_id),
            "runs": page_runs(db, task_id=task_id, limit=20).rows,
            "live": live, "live_cursor": live_cursor(live[-1]["run_id"], live[-1]["n"]) if live else None}


def allowed(check: Callable[[Principal, dict[str, Any]], None], who: Principal | None, doc: dict[str, Any]) -> bool:
    """Whether ``check`` (kernel/instructions.py: who may instruct the task, who may list what it was told) lets
    ``who`` through; nobody signed in never passes."""
    if who is None:
        return False
    try:
        check(who, doc)
    except KernelError:
        return False
    return True


def live_cursor(run_id: str, n: int) -> str:
    """Where a read of a task's live output goes on from: ``RUN_ID:N``, the last event it returned."""
    return f"{run_id}:{n}"


def parse_live_cursor(cursor: str) -> tuple[str, int] | None:
    """``(run_id, n)`` of a ``live_cursor``; None: not one."""
    run_id, _, n = cursor.rpartition(":")
    return (run_id, int(n)) if run_id and n.isdigit() else None


def live_output(db: Database, task_id: str, after: tuple[str, int] | None, limit: int) -> dict[str, Any] | None:
    """The task's runs' live events, oldest first: those stored after ``after`` (at most ``limit``; ``more``: ask
    again from ``cursor``), or without it the newest ``limit``. None: no such task."""
    if task_document(db, task_id) is None:
        return None
    if after is None:
        events, more = latest_events(db, task_id, limit), False
    else:
        events = read_events(db, task_id=task_id, after=after, limit=limit)
        more = len(events) >= limit
    last = (events[-1]["run_id"], events[-1]["n"]) if events else after
    return {"status": "ok", "task_id": task_id, "events": events, "cursor": live_cursor(*last) if last else None,
            "more": more}


def patch_text(ws: Workspace, diff: dict[str, Any]) -> dict[str, Any]:
    """The patch a done report's diff names, proven as `task diff` proves it (kernel/queries.py ``read_patch``):
    ``{text, truncated, lines}`` (``lines``: each with its kind and anchor, web/patchlines.py) or ``{error}``."""
    data = read_patch(ws.root, ws.state_dir / "evidence", diff)
    if isinstance(data, PatchRefused):
        return {"error": data.message}
    text = data[:PATCH_SHOWN].decode("utf-8", errors="replace")
    return {"text": text, "truncated": len(data) > PATCH_SHOWN, "lines": patch_lines(text)}


def children_tree(db: Database, task_id: str, depth: int = TREE_DEPTH) -> list[dict[str, Any]]:
    """The task's children, theirs below them, to ``depth`` levels, at most TREE_WIDTH per task."""
    page = page_tasks(db, parent=task_id, limit=TREE_WIDTH)
    return [{**row, "children": children_tree(db, row["task_id"], depth - 1) if depth > 1 else [],
             "more": page.next_cursor is not None and i == len(page.rows) - 1} for i, row in enumerate(page.rows)]


def gate_verdicts(db: Database, task_id: str) -> list[dict[str, Any]]:
    """The execution gate's decisions on the task's `perform` commands (stream ``gate:<task>``), oldest first."""
    with db.read() as conn:
        return [{"global_pos": ev.global_pos, "at": ev.recorded_at, **ev.data}
                for ev in event_reader().read_stream(conn, f"gate:{task_id}")]


def grants_for(log: SessionLog, task_id: str) -> list[dict[str, Any]]:
    """The grants and revocations scoped to the task in the grant sessions: what the kernel's guard consults."""
    scope = permission_scope(task_id)
    found = []
    for session in sorted(log.admin_sessions):
        for r in log.records(session):
            if r.kind in GRANT_KINDS and r.payload.get("scope") == scope:
                found.append({"session": session, "seq": r.seq, "input_id": r.input_id, "kind": r.kind,
                              "permission": r.payload.get("permission"), "accepted_by": r.accepted_by,
                              "received_at": r.received_at, "accepted": r.accepted})
    return found


def readable_grants(log: SessionLog, reader: Principal | None, grants: list[dict[str, Any]]
                    ) -> list[dict[str, Any]]:
    """The grants whose session ``reader`` may read (the grant sessions are ADMIN's): a page shows others only
    that the task has some, not who gave them."""
    readable: dict[str, bool] = {}
    for g in grants:
        if g["session"] not in readable:
            readable[g["session"]] = reader is not None and _may_read(log, g["session"], reader)
    return [g for g in grants if readable[g["session"]]]


def _may_read(log: SessionLog, session: str, reader: Principal) -> bool:
    try:
        log.check_read(session, reader)
    except SessionLogError:
        return False
    return True


def task_usage(db: Database, task_id: str) -> dict[str, Any]:
    """What the task's runs and automations cost: units, wall time, tokens, dollars."""
    u = usage_table.c
    with db.read() as conn:
        row = conn.execute(sa.select(sa.func.count(), sa.func.sum(u.wall_ms), sa.func.sum(u.tokens_in),
                                     sa.func.sum(u.tokens_out), sa.func.sum(u.cost_usd))
                           .where(u.task_id == task_id)).one()
    return {"units": row[0], "wall_ms": int(row[1] or 0), "tokens_in": int(row[2] or 0),
            "tokens_out": int(row[3] or 0), "cost_usd": round(float(row[4] or 0.0), 6)}


def runs_view(db: Database, ws: Workspace | None, limit: int = 50) -> dict[str, Any]:
    """Runs now (with elapsed and the role's timeout), retries due, recent failures with their last log lines."""
    roles: dict[str, RunnerSpec] = ws.config.roles if ws is not None else {}
    running = page_runs(db, state="running", limit=limit).rows
    for r in running:
        spec = roles.get(r["role"])
        r["timeout_s"] = spec.timeout if spec is not None else None
    failed = page_runs(db, state="failed", limit=limit).rows + page_runs(db, state="blocked", limit=limit).rows
    failed.sort(key=lambda r: r["created_at"], reverse=True)
    for r in failed[:10]:  # the latest failures carry their log's last lines
        r["log_tail"] = last_log_lines(run_detail(db, r["run_id"], ws.root if ws is not None else None))
    return {"running": running, "retrying": page_runs(db, state="retrying", limit=limit).rows,
            "failed": failed[:limit]}


def last_log_lines(detail: dict[str, Any] | None) -> list[str] | None:
    """The last lines the run's latest attempt wrote to stderr (else stdout), when its log is still there."""
    attempts = (detail or {}).get("attempts") or []
    if not attempts:
        return None
    tail = attempts[-1].get("stderr_tail") or attempts[-1].get("stdout_tail")
    return list(tail["lines"]) if tail else None


def schedules_view(db: Database, now: datetime | None = None) -> list[dict[str, Any]]:
    """Every schedule with its next fires, watermark and latest outcomes (missed ones with their reasons)."""
    from taskkernel.scheduler.tables import install

    install(db)
    schedules = Schedules(Ledger(db))
    now = now or datetime.now(UTC)
    out = []
    for s in schedules.all():
        view = schedules.view(s)
        try:
            upcoming = [] if s.paused or s.error else schedules.upcoming(s, now, 3)
        except Exception:  # noqa: BLE001 - a definition that no longer computes shows without next fires
            upcoming = []
        out.append({**view, "next": upcoming, "outcomes": schedules.outcomes(s, 10),
                    "clock_jumps": recent_clamps(schedules.ledger, s.id, 10), "faults": schedules.faults(s, 10),
                    "manager_role": creator_role(s.spec)})  # who besides ADMIN may pause and resume it
    return out


def usage_view(db: Database, by: str = "root", since: str | None = None) -> dict[str, Any]:
    """`usage --by` plus spend per owner per UTC day, for the charts."""
    from taskkernel.kernel.usage import install

    install(db)
    rows = summarize(db, by, since)
    total: dict[str, float] = {k: sum(r[k] for r in rows) for k in ("units", "wall_ms", "tokens_in", "tokens_out")}
    total["cost_usd"] = round(sum(r["cost_usd"] for r in rows), 6)
    u = usage_table.c
    col = u[GROUPINGS[by]]
    day = sa.func.substr(u.recorded_at, 1, 10)
    q = sa.select(day, col, sa.func.sum(u.tokens_in + u.tokens_out), sa.func.sum(u.cost_usd)).group_by(day, col)
    if since:
        q = q.where(u.recorded_at >= since)
    with db.read() as conn:
        days = [{"day": d, "owner": o, "tokens": int(t or 0), "cost_usd": round(float(c or 0.0), 6)}
                for d, o, t, c in conn.execute(q.order_by(day))]
    return {"by": by, "since": since, "rows": rows, "total": total, "days": days}


def session_inputs(log: SessionLog, session: str) -> list[dict[str, Any]] | None:
    """A session's inputs in acceptance order (refused and unsequenced inputs last, in storage order), each as
    `session export` writes it; None: no such session."""
    records = log.records(session)
    if not records and not log.exists(session):
        return None
    ordered = sorted((r for r in records if r.seq is not None), key=lambda r: r.seq or 0)
    ordered += [r for r in records if r.seq is None]
    return [record_json(session, r) for r in ordered]


def log_position(db: Database) -> int:
    """The global position of the last committed event (0: none yet)."""
    from taskkernel.kernel.store.events import log_end

    with db.read() as conn:
        return int(log_end(conn)[0])


def task_file(db: Database, ws: Workspace | None, task_id: str) -> str | None:
    """The task's FCoP TASK file as text (rendered from its events when it has none), or None: no such task."""
    from taskkernel.coordinator.mcp.resources import task_markdown

    return task_markdown(db, ws, task_id)

