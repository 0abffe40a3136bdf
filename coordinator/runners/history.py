"""What the run ledger says about agent runs, for people (`taskkernel runs list|show`, docs/runs.md).

Pure reads: the ``runs`` table (runners/ledger.py), the usage ledger (one row per attempt, ``run:<run_id>:<n>``,
kernel/usage.py) and each attempt's log files under ``.taskkernel/runs/``. Nothing here builds the kernel or
writes anything.

The ledger's four states are told apart further for a reader (``view_state``): a pending run is ``queued`` before
its first attempt and ``retrying`` after one; a blocked run ``failed`` when it used up its attempts
(``attempts_exhausted``, or no code at all: a row from before ``error_code`` existed) and is ``blocked`` when an
error no retry fixes stopped it at once. Listings are newest first (``created_at``, then ``run_id``), one page at
a time, keyed on that pair (never an offset) behind an opaque cursor that carries its filters.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import stat
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

import sqlalchemy as sa

from taskkernel.coordinator.tables import runs
from taskkernel.kernel.canonical import canonical_json
from taskkernel.kernel.store.db import Database
from taskkernel.kernel.store.schema import usage as usage_table

# what a reader sees, in the order a run goes through them
VIEW_STATES = ("queued", "running", "retrying", "done", "failed", "blocked")
EXHAUSTED = "attempts_exhausted"
DEFAULT_LIMIT = 50
MAX_LIMIT = 1000
TAIL_LINES = 20
MAX_ATTEMPTS_SHOWN = 100  # `runs show` lists the last this many attempts
TAIL_BYTES = 8192  # read at most this much of the end of a log: a log of gigabytes costs what a small one does
LIST_FIELDS = ("run_id", "task_id", "round", "role", "purpose", "state", "attempt", "max_attempts", "error_code",
               "last_error", "exit_code", "created_at", "started_at", "ended_at", "elapsed_s", "retry_at")
_CURSOR_VERSION = 1


class RunQueryError(ValueError):
    """A listing the caller cannot have as asked (unknown state, limit out of range, a cursor that is not one or
    is from another listing). The message says what to do; the CLI reports it as a usage error."""


class RunPage(NamedTuple):
    rows: list[dict[str, Any]]  # LIST_FIELDS of each run, newest first
    next_cursor: str | None  # None: this was the last page


def view_state(state: str, attempt: int, error_code: str | None) -> str:
    """The state a reader sees for a ledger row (an unknown ledger state is shown as it is)."""
    if state == "pending":
        return "retrying" if attempt >= 1 else "queued"
    if state == "succeeded":
        return "done"
    if state == "blocked":
        return "failed" if error_code in (None, EXHAUSTED) else "blocked"
    return state


def _state_clause(view: str) -> sa.ColumnElement[bool]:
    """The ledger rows shown as ``view`` (the inverse of ``view_state``)."""
    c = runs.c
    clauses: dict[str, sa.ColumnElement[bool]] = {
        "queued": sa.and_(c.state == "pending", c.attempt < 1),
        "retrying": sa.and_(c.state == "pending", c.attempt >= 1),
        "running": c.state == "running",
        "done": c.state == "succeeded",
        "failed": sa.and_(c.state == "blocked", sa.or_(c.error_code.is_(None), c.error_code == EXHAUSTED)),
        "blocked": sa.and_(c.state == "blocked", c.error_code.is_not(None), c.error_code != EXHAUSTED),
    }
    return clauses[view]


def _parse(stamp: str | None) -> datetime | None:
    if not stamp:
        return None
    try:
        t = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t


def run_row(r: Any, now: datetime | None = None) -> dict[str, Any]:
    """A ledger row as a reader sees it (LIST_FIELDS). ``started_at`` is when the current (or last) attempt became
    due: the dispatcher claims a due run on its next pass, so it started then, give or take a pass."""
    state = view_state(r.state, r.attempt, r.error_code)
    started = None
    if r.attempt >= 1 and state in ("running", "done", "failed", "blocked"):
        started = max(r.not_before, r.created_at)
    elapsed = None
    if state == "running" and (begun := _parse(started)) is not None:
        elapsed = max(0.0, round(((now or datetime.now(UTC)) - begun).total_seconds(), 3))
    return {"run_id": r.run_id, "task_id": r.task_id, "round": r.round, "role": r.role, "purpose": r.purpose,
            "state": state, "attempt": r.attempt, "max_attempts": r.max_attempts, "error_code": r.error_code,
            "last_error": r.last_error, "exit_code": r.exit_code, "created_at": r.created_at, "started_at": started,
            "ended_at": r.ended_at, "elapsed_s": elapsed, "retry_at": r.not_before if state == "retrying" else None}


def _filters(state: str | None, task_id: str | None) -> dict[str, str | None]:
    if state is not None and state not in VIEW_STATES:
        raise RunQueryError(f"{state!r} is not a run state; choose one of {', '.join(VIEW_STATES)}")
    return {"state": state, "task": task_id}


def encode_cursor(created_at: str, run_id: str, state: str | None, task_id: str | None) -> str:
    body = canonical_json({"v": _CURSOR_VERSION, "after": [created_at, run_id], **_filters(state, task_id)})
    return base64.urlsafe_b64encode(body.encode("utf-8")).decode("ascii").rstrip("=")


def decode_cursor(cursor: str, state: str | None, task_id: str | None) -> tuple[str, str]:
    """Where a cursor continues (created_at, run_id); RunQueryError if it is not one of ours or names other
    filters."""
    wanted = _filters(state, task_id)
    try:
        body = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("utf-8"))
        created_at, run_id = body["after"]
        made_for = {"state": body["state"], "task": body["task"]}
        if body["v"] != _CURSOR_VERSION or not (isinstance(created_at, str) and isinstance(run_id, str)):
            raise ValueError("unknown cursor version")
    except (ValueError, KeyError, TypeError, binascii.Error, UnicodeDecodeError, AttributeError):
        raise RunQueryError(f"{cursor[:40]!r} is not a cursor `runs list` printed; start again without a "
                            "cursor") from None
    if made_for != wanted:
        shown = ", ".join(f"--{k} {v}" for k, v in made_for.items() if v is not None) or "no filters"
        raise RunQueryError(f"this cursor continues a listing with {shown}: repeat those filters, or start again "
                            "without a cursor")
    return created_at, run_id


def _has_ledger(conn: sa.Connection) -> bool:
    """Whether the run ledger exists (a database made table by table gets it when a coordinator first runs)."""
    return sa.inspect(conn).has_table("runs")


def page_runs(db: Database, *, state: str | None = None, task_id: str | None = None, limit: int = DEFAULT_LIMIT,
              after: str | None = None, now: datetime | None = None) -> RunPage:
    """One page of runs, newest first, filtered by the reader's ``state`` and by ``task_id``, after the cursor
    ``after`` (a ``next_cursor`` of the same listing)."""
    if not 1 <= limit <= MAX_LIMIT:
        raise RunQueryError(f"a page holds 1 to {MAX_LIMIT} runs, not {limit}")
    _filters(state, task_id)
    q = sa.select(runs)
    if state is not None:
        q = q.where(_state_clause(state))
    if task_id is not None:
        q = q.where(runs.c.task_id == task_id)
    if after is not None:
        created_at, run_id = decode_cursor(after, state, task_id)
        q = q.where(sa.or_(runs.c.created_at < created_at,
                           sa.and_(runs.c.created_at == created_at, runs.c.run_id < run_id)))
    q = q.order_by(runs.c.created_at.desc(), runs.c.run_id.desc()).limit(limit + 1)
    with db.read() as conn:
        found = conn.execute(q).all() if _has_ledger(conn) else []
    now = now or datetime.now(UTC)
    rows = [run_row(r, now) for r in found[:limit]]
    more = len(found) > limit
    last = found[limit - 1] if more else None
    return RunPage(rows, encode_cursor(last.created_at, last.run_id, state, task_id) if last is not None else None)


def run_log_dir(workspace: Path, run_id: str) -> Path | None:
    """Where the command runner writes a run's logs (runners/dispatcher.py), or None for a run id that could
    not name a folder under ``.taskkernel/runs`` (a separator, a dot name)."""
    name = run_id.replace(":", "_")
    if not name or "/" in name or "\\" in name or "\0" in name or name in (".", ".."):
        return None
    return workspace / ".taskkernel" / "runs" / name


@dataclass(frozen=True)
class Tail:
    lines: list[str]  # the last lines (raw text, undecodable bytes replaced), at most TAIL_LINES
    size: int  # bytes in the whole file
    truncated: bool  # the file holds more than these lines


def tail(path: Path, lines: int = TAIL_LINES, max_bytes: int = TAIL_BYTES) -> Tail | None:
    """The last ``lines`` lines of a log within its last ``max_bytes`` bytes; None when there is no such regular
    file (a symlink is not followed: run logs are the workspace owner's own files)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            return None
        start = max(0, st.st_size - max_bytes)
        fh.seek(start)
        data = fh.read(max_bytes)
    text = data.decode("utf-8", errors="replace")
    split = text.splitlines()
    if start > 0 and split:
        split = split[1:]  # the first line read is most likely cut
    kept = split[-lines:] if lines > 0 else []
    return Tail(kept, st.st_size, start > 0 or len(split) > len(kept))


def _attempt_logs(log_dir: Path | None, n: int) -> dict[str, Any]:
    if log_dir is None:
        return {"logs": None, "stdout_tail": None, "stderr_tail": None}
    folder = log_dir / f"attempt-{n}"
    out: dict[str, Any] = {"logs": None, "stdout_tail": None, "stderr_tail": None}
    if folder.is_dir() and not folder.is_symlink():
        out["logs"] = {"stdout": str(folder / "stdout.log"), "stderr": str(folder / "stderr.log")}
        for stream in ("stdout", "stderr"):
            t = tail(folder / f"{stream}.log")
            out[f"{stream}_tail"] = None if t is None else {"lines": t.lines, "bytes": t.size,
                                                           "truncated": t.truncated}
    return out


def run_detail(db: Database, run_id: str, workspace: Path | None, now: datetime | None = None
               ) -> dict[str, Any] | None:
    """One run: its row as ``run_row`` gives it plus the ledger's lease and agent columns, every attempt (the
    usage ledger's figures, its log files and their tails; an attempt the usage ledger never heard of, because
    its holder crashed, still shows with null figures) and totals. None when the ledger has no such run."""
    with db.read() as conn:
        if not _has_ledger(conn):
            return None
        r = conn.execute(sa.select(runs).where(runs.c.run_id == run_id)).first()
        if r is None:
            return None
        first = max(1, r.attempt - MAX_ATTEMPTS_SHOWN + 1)
        numbers = range(first, max(r.attempt, 0) + 1)
        wanted = [f"run:{run_id}:{n}" for n in numbers]
        used = {u.usage_id: u for u in conn.execute(
            sa.select(usage_table).where(usage_table.c.usage_id.in_(wanted)))} if wanted else {}
    doc = run_row(r, now)
    doc.update(lease_owner=r.lease_owner, lease_until=r.lease_until, heartbeat_at=r.heartbeat_at,
               agent_host=r.agent_host, agent_pgid=r.agent_pgid)
    log_dir = run_log_dir(workspace, run_id) if workspace is not None else None
    attempts = []
    totals: dict[str, Any] = {"attempts": r.attempt, "recorded": 0, "wall_ms": 0, "tokens_in": 0, "tokens_out": 0,
                              "cost_usd": 0.0}
    for n, usage_id in zip(numbers, wanted, strict=True):
        u = used.get(usage_id)
        figures: dict[str, Any] = dict.fromkeys(("exit_code", "wall_ms", "tokens_in", "tokens_out", "cost_usd",
                                                 "recorded_at"))
        if u is not None:
            figures = {"exit_code": u.exit_code, "wall_ms": int(u.wall_ms), "tokens_in": int(u.tokens_in),
                       "tokens_out": int(u.tokens_out), "cost_usd": float(u.cost_usd), "recorded_at": u.recorded_at}
            totals["recorded"] += 1
            for key in ("wall_ms", "tokens_in", "tokens_out", "cost_usd"):
                totals[key] += figures[key]
        attempts.append({"attempt": n, "recorded": u is not None, **figures, **_attempt_logs(log_dir, n)})
    totals["cost_usd"] = round(float(totals["cost_usd"]), 6)
    doc["attempts"] = attempts
    doc["totals"] = totals
    doc["log_dir"] = str(log_dir) if log_dir is not None else None
    return doc
