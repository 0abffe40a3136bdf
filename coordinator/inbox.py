"""What waits for a role: reviews to decide, approvals that need a grant, blocked and stalled tasks, dead letters.

Read without building the command kernel, for `taskkernel inbox` and the web board's "Needs you". Each list in task
id order:

- ``reviews``: tasks in review whose ``done_authority`` is the role (the role decides them); given the workspace,
  each says ``waits_for_person`` when no agent will decide it (the role may not approve, has no runner, or is the
  built-in scripted leader and approving would merge into the base: runners/outcomes.py ``undecidable``);
- ``needs_grant``: those of the reviews the kernel would refuse to approve right now with ``permission_required``
  (judged by the kernel's own guard, kernel/permissions.py ``HumanGrantGuard``, against the session log as it is
  now, each with the exact `taskkernel session accept …` command that grants it, built by kernel/verbs.py
  ``grant_hint`` as the refusal's hint is);
- ``blocked``: active tasks the role drives (``authority.driver``) and tasks in review it decides, whose latest report
  of the round is blocked (kernel/model/task.py), with the cause;
- ``stalled``: active or review tasks of the role (driver, done authority) that nothing moves: a run of the round
  ran and ended, none is queued or running, and no report, decision or open child followed (``stalled``, shared
  with the live view of `up`);
- ``dead_letters``: outbox effects the relay gave up on (kernel/outbox.py ``dead_letters``), for every role only.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing, contextmanager
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from taskkernel.coordinator.runners.history import view_state
from taskkernel.coordinator.runners.outcomes import OPEN, merge_base_of, undecidable, worktree_base
from taskkernel.coordinator.tables import runs
from taskkernel.kernel.model.commands import Command, CommandType
from taskkernel.kernel.model.principal import Principal
from taskkernel.kernel.outbox import dead_letters
from taskkernel.kernel.permissions import HumanGrantGuard
from taskkernel.kernel.queries import doc_text, iter_documents, row_of
from taskkernel.kernel.reasons import KernelError, ReasonCode
from taskkernel.kernel.sessionlog import SessionLog
from taskkernel.kernel.sessionlog.models import Rec
from taskkernel.kernel.store.db import Database, UnitOfWork
from taskkernel.kernel.store.schema import tasks
from taskkernel.kernel.verbs import grant_hint

if TYPE_CHECKING:
    from taskkernel.coordinator.workspace import Workspace

SECTIONS = ("reviews", "needs_grant", "blocked", "stalled", "dead_letters")
STALLED_FIELDS = ("task_id", "state", "round", "subject", "waiting_on", "last_run", "cause")


def waiting(db: Database, grant_sessions: frozenset[str] | None, role: str | None, principal: Principal,
            limit: int, *, workspace: Workspace | None = None) -> dict[str, Any]:
    """The lists for ``role`` (None: every role), each cut at ``limit``, their totals and whether a list was cut.
    ``grant_sessions``: the workspace's (None: the defaults), as coordinator/compose.py gives them to the kernel.
    ``workspace``: its team and runners say which reviews wait for a person (None: not judged)."""
    lists: dict[str, list[dict[str, Any]]] = {name: [] for name in SECTIONS}
    counts = dict.fromkeys(SECTIONS, 0)
    judge = _Deciders(db, workspace) if workspace is not None else None

    def keep(name: str, entry: dict[str, Any]) -> None:
        counts[name] += 1
        if len(lists[name]) < limit:
            lists[name].append(entry)

    blocked_reviews: list[dict[str, Any]] = []
    with closing(iter_documents(db, "review", done_authority=role)) as reviews, \
            approval_refusals(db, grant_sessions) as refusal:
        for doc in reviews:
            entry = {**row_of(doc), "done_authority": doc["authority"]["done_authority"]}
            if judge is not None:
                entry["waits_for_person"] = judge(doc)
            keep("reviews", entry)
            why = refusal(doc, principal)
            if why is not None:
                keep("needs_grant", {**entry, **why})
            if doc.get("blocked"):
                counts["blocked"] += 1
                if len(blocked_reviews) < limit:
                    blocked_reviews.append({**row_of(doc), "driver": doc["authority"]["driver"]})
    with closing(iter_documents(db, "blocked", driver=role)) as blocked:
        for doc in blocked:
            keep("blocked", {**row_of(doc), "driver": doc["authority"]["driver"]})
    lists["blocked"] = sorted([*lists["blocked"], *blocked_reviews], key=lambda r: r["task_id"])[:limit]
    with db.read() as conn:
        lists["stalled"], counts["stalled"] = stalled(conn, db.is_postgres, role, limit)
    if role is None:
        for letter in dead_letters(db):
            keep("dead_letters", letter)
    return {**lists, "counts": counts, "truncated": any(counts[n] > len(lists[n]) for n in SECTIONS)}


def stalled(conn: sa.Connection, postgres: bool, role: str | None, limit: int) -> tuple[list[dict[str, Any]], int]:
    """Tasks nothing moves (the first ``limit`` in task id order, and how many there are): active or in review, not
    blocked, a run of their round for that state ran and ended, none of theirs is queued or running, and an active
    one has no open child it waits for. Typically every attempt of a run failed and its blocked report could not be
    filed, or a run ended before this release judged runs by their outcome. ``role``: the role that should act
    (the driver of an active task, the done authority of one in review); None: every role."""
    if not sa.inspect(conn).has_table(runs.name):
        return [], 0
    child = tasks.alias("child")
    for_state = sa.or_(sa.and_(tasks.c.state == "active", runs.c.purpose.in_(("execute", "children"))),
                       sa.and_(tasks.c.state == "review", runs.c.purpose == "review"))
    ran = sa.exists().where(runs.c.task_id == tasks.c.task_id, runs.c.round == tasks.c.round, for_state)
    busy = sa.exists().where(runs.c.task_id == tasks.c.task_id, runs.c.state.in_(("pending", "running")))
    open_child = sa.exists().where(child.c.parent == tasks.c.task_id, child.c.state.in_(sorted(OPEN)))
    driver, decider = doc_text(("authority", "driver"), postgres), doc_text(("authority", "done_authority"), postgres)
    where = sa.and_(tasks.c.state.in_(("active", "review")), doc_text(("blocked", "report_id"), postgres).is_(None),
                    ran, ~busy, sa.or_(tasks.c.state == "review", ~open_child))
    if role is not None:
        where = sa.and_(where, sa.or_(sa.and_(tasks.c.state == "active", driver == role),
                                      sa.and_(tasks.c.state == "review", decider == role)))
    found = conn.execute(sa.select(tasks.c.task_id, tasks.c.state, tasks.c.round, driver.label("driver"),
                                   decider.label("decider"), doc_text(("subject",), postgres).label("subject"))
                         .where(where).order_by(tasks.c.task_id).limit(limit)).all()
    total = len(found) if len(found) < limit else int(conn.execute(
        sa.select(sa.func.count()).select_from(tasks).where(where)).scalar_one())
    return [_stalled_entry(conn, r) for r in found], total


def _stalled_entry(conn: sa.Connection, r: Any) -> dict[str, Any]:
    """A stalled task with its last run of the round and the cause in one line."""
    last = conn.execute(sa.select(runs).where(runs.c.task_id == r.task_id, runs.c.round == r.round)
                        .order_by(runs.c.created_at.desc(), runs.c.run_id.desc()).limit(1)).first()
    run = None if last is None else {
        "run_id": last.run_id, "role": last.role, "purpose": last.purpose,
        "state": view_state(last.state, last.attempt, last.error_code), "attempt": last.attempt,
        "error_code": last.error_code, "last_error": last.last_error, "ended_at": last.ended_at}
    what = "no report" if r.state == "active" else "no decision"
    cause = (f"its last {run['purpose']} run ({run['role']}) ended {run['state']}"
             + (f" ({run['error_code']})" if run["error_code"] else "") if run else "its runs ended")
    return {"task_id": r.task_id, "state": r.state, "round": r.round, "subject": r.subject,
            "waiting_on": r.driver if r.state == "active" else r.decider, "last_run": run,
            "cause": f"{cause}, {what} followed and nothing is queued: `taskkernel task retry {r.task_id}`"}


class _Deciders:
    """Why no agent will decide a task's review (``waits_for_person``), judged with the workspace's team (who may
    approve) and runners (who has one; a scripted leader never approves a merge into the base)."""

    def __init__(self, db: Database, workspace: Workspace) -> None:
        from taskkernel.coordinator.runners.config import runner_specs
        from taskkernel.roles.registry import RoleRegistry

        team = workspace.team()
        self.db = db
        self.roles = RoleRegistry.for_team(team.leader, team.roles)
        self.specs = runner_specs(workspace.config)

    def __call__(self, doc: dict[str, Any]) -> str | None:
        role = doc["authority"]["done_authority"]
        why = undecidable(role, self.roles.get(role).may_issue(CommandType.APPROVE), self.specs.get(role),
                          merge_base_of(doc, self.specs, self._base))
        if why is None and role not in self.specs and role != "ADMIN":
            why = f"{role} has no runner: waiting for a person, or add [roles.{role}] to taskkernel.toml"
        return why

    def _base(self, task_id: str) -> str | None:
        with self.db.read() as conn:
            return worktree_base(conn, task_id)


class _Refusals:
    """The kernel's human-grant guard, asked about `approve` on one task after another in one read transaction."""

    def __init__(self, guard: HumanGrantGuard, uow: UnitOfWork) -> None:
        self.guard, self.uow = guard, uow

    def __call__(self, doc: dict[str, Any], principal: Principal) -> dict[str, Any] | None:
        """``{permission, why, grant_command}`` when approving the task now would be ``permission_required``."""
        approve = Command(type=CommandType.APPROVE, task_id=doc["task_id"], expected_revision=doc["revision"],
                          round=doc["round"], idempotency_key="inbox")
        try:
            self.guard(self.uow, approve, doc, principal)
        except KernelError as exc:
            if exc.reason is not ReasonCode.PERMISSION_REQUIRED:
                raise
            return {"permission": CommandType.APPROVE.value, "why": exc.message,
                    "grant_command": grant_hint(CommandType.APPROVE, doc["task_id"], self.guard.default_session)}
        return None


class _ReadOnce(SessionLog):
    """The session log as one read transaction sees it: each session's records read once, however many tasks the
    guard is asked about (the board asks about every high-risk review it shows)."""

    def __init__(self, db: Database, grant_sessions: frozenset[str] | None) -> None:
        super().__init__(db, *(() if grant_sessions is None else (grant_sessions,)))
        self._read: dict[str, list[Rec]] = {}

    def records(self, session: str, conn: Connection | None = None) -> list[Rec]:
        if session not in self._read:
            self._read[session] = super().records(session, conn)
        return self._read[session]


@contextmanager
def approval_refusals(db: Database, grant_sessions: frozenset[str] | None) -> Iterator[_Refusals]:
    """The guard exactly as coordinator/compose.py gives it to the kernel (the workspace's grant sessions), over
    a read transaction: the guard only reads the session log, each session once."""
    guard = HumanGrantGuard(_ReadOnce(db, grant_sessions))
    with db.read() as conn:
        yield _Refusals(guard, UnitOfWork(conn, db.dialect))
