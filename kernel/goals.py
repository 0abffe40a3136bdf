"""Goals: a root task run autonomously under a budget, with terminal states only the kernel sets.

"The agent says it is done" is not a terminal state. A goal ends as `complete` (its root task
reached done/archive), `blocked` (the circuit breaker: N consecutive runs failed to execute
with no success in between → `execution_unavailable`), `budget_exhausted` (tokens, cost, wall
time or attempts, summed over the root and all its descendants) or `cancelled`.

Every verdict names the goal it was computed for and applies only while that goal is still the
root's active one, so a late failure from a replaced goal never blocks its successor. All
updates happen in one serialized write transaction, so concurrent completions never
double-count or lose a run.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import sqlalchemy as sa

from taskkernel.kernel.canonical import canonical_json, utc_now_iso
from taskkernel.kernel.model.commands import TaskBudget
from taskkernel.kernel.model.principal import ADMIN, Principal
from taskkernel.kernel.reasons import KernelError, ReasonCode
from taskkernel.kernel.store.db import Database, UnitOfWork
from taskkernel.kernel.store.events import EventStore, NewEvent
from taskkernel.kernel.store.schema import goals, metadata
from taskkernel.kernel.store.schema import usage as usage_table


def goal_refusal(principal: Principal, root: dict[str, Any], verb: str) -> KernelError | None:
    """Why ``principal`` may not ``verb`` (start, cancel) a goal of the root task ``root`` (its document), or None.
    Starting or cancelling a goal is the root task's authority: ADMIN, or the role its done_authority names, with
    an unscoped credential (an agent's run token would let it reset its own budget by starting a fresh goal)."""
    allowed = {ADMIN, root["authority"]["done_authority"]}
    if principal.task_id is None and principal.role in allowed:
        return None
    scoped = f", scoped to {principal.task_id}" if principal.task_id else ""
    return KernelError(ReasonCode.ROLE_NOT_AUTHORIZED,
                       f"goal {verb} for {root['task_id']} needs an unscoped credential of "
                       f"{' or '.join(sorted(allowed))} (caller: {principal.id}{scoped})")


class GoalState(StrEnum):
    ACTIVE = "active"
    COMPLETE = "complete"
    BLOCKED = "blocked"
    BUDGET_EXHAUSTED = "budget_exhausted"
    CANCELLED = "cancelled"


class GoalReason(StrEnum):
    EXECUTION_UNAVAILABLE = "execution_unavailable"
    TOKENS = "budget_tokens"
    COST = "budget_cost"
    WALL_TIME = "budget_wall_time"
    ATTEMPTS = "budget_attempts"
    ROOT_FINISHED = "root_finished"
    REPLACED = "replaced"
    USER_CANCELLED = "user_cancelled"


Budget = TaskBudget  # a goal's limits have a root task's fields and bounds: strict, finite, stored exactly


TERMINAL = frozenset({GoalState.COMPLETE, GoalState.BLOCKED, GoalState.BUDGET_EXHAUSTED, GoalState.CANCELLED})


@dataclass(frozen=True)
class Spent:
    tokens: int
    cost_usd: float
    wall_ms: int
    attempts: int


class GoalService:
    def __init__(self, db: Database, store: EventStore | None = None) -> None:
        self.db = db
        self.store = store or EventStore()
        db.create_schema(metadata)

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self, root_task: str, budget: Budget, breaker_threshold: int = 3) -> str:
        """Start a goal for a root task; an active goal of the same root is cancelled as replaced."""
        goal_id = f"goal-{uuid.uuid4().hex[:12]}"
        with self.db.write() as uow:
            previous = self._active_row(uow, root_task)
            if previous is not None:
                self._end(uow, previous.goal_id, GoalState.CANCELLED, GoalReason.REPLACED, {"by_goal": goal_id})
            uow.conn.execute(goals.insert().values(
                goal_id=goal_id, root_task=root_task, state=GoalState.ACTIVE.value,
                budget=canonical_json(budget.model_dump()), breaker_threshold=breaker_threshold,
                started_at=utc_now_iso()))
            self._event(uow, goal_id, "goal_started", {"root_task": root_task, "budget": budget.model_dump(),
                                                       "breaker_threshold": breaker_threshold})
        return goal_id

    def cancel(self, goal_id: str) -> bool:
        with self.db.write() as uow:
            return self._end(uow, goal_id, GoalState.CANCELLED, GoalReason.USER_CANCELLED, {})

    def active_goal(self, root_task: str) -> str | None:
        with self.db.read() as conn:
            return conn.execute(sa.select(goals.c.goal_id).where(
                goals.c.root_task == root_task, goals.c.state == GoalState.ACTIVE.value)).scalar()

    def list(self) -> list[dict[str, Any]]:
        """Every goal, newest first (what `show` adds, the spend, costs a read per goal: ask it per goal)."""
        with self.db.read() as conn:
            rows = conn.execute(sa.select(goals.c.goal_id, goals.c.root_task, goals.c.state, goals.c.reason,
                                          goals.c.started_at, goals.c.ended_at).order_by(
                goals.c.started_at.desc(), goals.c.goal_id)).all()
        return [dict(r._mapping) for r in rows]

    def show(self, goal_id: str) -> dict[str, Any] | None:
        with self.db.read() as conn:
            row = conn.execute(sa.select(goals).where(goals.c.goal_id == goal_id)).first()
            if row is None:
                return None
            spent = self._spent(conn, row.root_task, row.started_at)
        return {**{k: v for k, v in row._mapping.items() if k != "budget"}, "budget": json.loads(row.budget),
                "spent": spent.__dict__}

    # -- verdicts from runs and tasks ------------------------------------------------------------
    def record_run(self, goal_id: str, *, executed: bool) -> GoalState | None:
        """Account one run of the goal's tasks. ``executed`` is False when the runner could not execute
        (non-zero exit, unavailable, timeout). Returns the goal's state, or None if the goal is no longer
        the active one (a stale verdict changes nothing)."""
        with self.db.write() as uow:
            row = uow.conn.execute(sa.select(goals).where(goals.c.goal_id == goal_id)).first()
            if row is None or row.state != GoalState.ACTIVE.value:
                return None
            failures = 0 if executed else row.consecutive_failures + 1
            uow.conn.execute(goals.update().where(goals.c.goal_id == goal_id).values(consecutive_failures=failures))
            if failures >= row.breaker_threshold:
                self._end(uow, goal_id, GoalState.BLOCKED, GoalReason.EXECUTION_UNAVAILABLE,
                          {"consecutive_failures": failures})
                return GoalState.BLOCKED
            exhausted = self._exhausted(uow, row)
            if exhausted is not None:
                self._end(uow, goal_id, GoalState.BUDGET_EXHAUSTED, exhausted, {})
                return GoalState.BUDGET_EXHAUSTED
            return GoalState.ACTIVE

    def root_finished(self, root_task: str) -> str | None:
        """The root task reached done/archive: its active goal is complete."""
        with self.db.write() as uow:
            row = self._active_row(uow, root_task)
            if row is None:
                return None
            self._end(uow, row.goal_id, GoalState.COMPLETE, GoalReason.ROOT_FINISHED, {})
            return str(row.goal_id)

    def allows_work(self, root_task: str) -> tuple[bool, str | None]:
        """May more work start under this root? False once its latest goal ended other than complete."""
        with self.db.read() as conn:
            row = conn.execute(sa.select(goals.c.state, goals.c.reason, goals.c.goal_id).where(
                goals.c.root_task == root_task).order_by(goals.c.started_at.desc()).limit(1)).first()
        if row is None or row.state in (GoalState.ACTIVE.value, GoalState.COMPLETE.value):
            return True, None
        return False, f"goal {row.goal_id} is {row.state} ({row.reason})"

    # -- internals -------------------------------------------------------------------------------
    def _active_row(self, uow: UnitOfWork, root_task: str) -> Any:
        return uow.conn.execute(sa.select(goals).where(goals.c.root_task == root_task,
                                                       goals.c.state == GoalState.ACTIVE.value)).first()

    def _end(self, uow: UnitOfWork, goal_id: str, state: GoalState, reason: GoalReason,
             detail: dict[str, Any]) -> bool:
        res = uow.conn.execute(goals.update().where(goals.c.goal_id == goal_id,
                                                    goals.c.state == GoalState.ACTIVE.value).values(
            state=state.value, reason=reason.value, ended_at=utc_now_iso()))
        if res.rowcount:
            self._event(uow, goal_id, f"goal_{state.value}", {"goal_id": goal_id, "reason": reason.value, **detail})
        return bool(res.rowcount)

    def _event(self, uow: UnitOfWork, goal_id: str, event_type: str, data: dict[str, Any]) -> None:
        self.store.append_at_head(uow, f"goal:{goal_id}", [NewEvent(event_type, data)],
                                  {"actor": "kernel", "role": "SYSTEM", "recorded_at": utc_now_iso()})

    @staticmethod
    def _spent(conn: Any, root_task: str, since: str) -> Spent:
        row = conn.execute(sa.select(sa.func.sum(usage_table.c.tokens_in + usage_table.c.tokens_out),
                                     sa.func.sum(usage_table.c.cost_usd), sa.func.sum(usage_table.c.wall_ms),
                                     sa.func.count()).where(usage_table.c.root_task == root_task,
                                                            usage_table.c.recorded_at >= since)).one()
        return Spent(int(row[0] or 0), float(row[1] or 0.0), int(row[2] or 0), int(row[3] or 0))

    def _exhausted(self, uow: UnitOfWork, row: Any) -> GoalReason | None:
        budget = json.loads(row.budget)  # as validated when the goal started (older goals kept their figures)
        spent = self._spent(uow.conn, row.root_task, row.started_at)
        checks = [(budget.get("tokens"), spent.tokens, GoalReason.TOKENS),
                  (budget.get("cost_usd"), spent.cost_usd, GoalReason.COST),
                  (budget.get("wall_seconds"), spent.wall_ms / 1000, GoalReason.WALL_TIME),
                  (budget.get("attempts"), spent.attempts, GoalReason.ATTEMPTS)]
        return next((reason for limit, used, reason in checks if limit is not None and used >= limit), None)
