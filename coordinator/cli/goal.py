"""`taskkernel goal`: run a root task as a goal with a budget; terminal states are the kernel's.

Starting or cancelling a goal is the root task's authority (kernel/goals.py ``goal_refusal``)."""

from __future__ import annotations

from typing import Any

import typer
from pydantic import ValidationError

from taskkernel.coordinator.cli.common import CliContext, Exit, emit, fail, get_ctx, reject, say
from taskkernel.kernel.goals import Budget, GoalService, goal_refusal
from taskkernel.kernel.reasons import ReasonCode

app = typer.Typer(no_args_is_help=True, help="Goals: budgets, circuit breaker, terminal states.")


def _authorize(c: CliContext, root: dict[str, Any], verb: str) -> None:
    refusal = goal_refusal(c.principal(), root, verb)
    if refusal is not None:
        reject(refusal.reason.value, refusal.message)


def _service(ctx: typer.Context) -> GoalService:
    kernel = get_ctx(ctx).kernel()
    return GoalService(kernel.db, kernel.store)


@app.command("start")
def start(ctx: typer.Context, root_task: str,
          tokens: int = typer.Option(None, "--tokens", min=0), cost: float = typer.Option(None, "--cost", min=0),
          wall_seconds: float = typer.Option(None, "--wall-seconds", min=0),
          attempts: int = typer.Option(None, "--attempts", min=0),
          breaker: int = typer.Option(3, "--breaker", min=1, max=1000,
                                      help="Consecutive failed runs that block the goal.")
          ) -> None:
    """Start a goal for ROOT_TASK (an active goal of the same root is replaced)."""
    c = get_ctx(ctx)
    c.database(writes=True)
    kernel = c.kernel()
    doc = kernel.task(root_task)
    if doc is None:
        reject(ReasonCode.TASK_NOT_FOUND.value, f"{root_task} does not exist")
    if doc["root"] != root_task:
        reject(ReasonCode.TASK_IDENTITY_MISMATCH.value, f"{root_task} is not a root task (its root is {doc['root']})")
    _authorize(c, doc, "start")
    try:
        budget = Budget(tokens=tokens, cost_usd=cost, wall_seconds=wall_seconds, attempts=attempts)
    except ValidationError as exc:
        first = exc.errors()[0]
        flag = {"cost_usd": "cost", "wall_seconds": "wall-seconds"}.get(str(first["loc"][0]), str(first["loc"][0]))
        fail(Exit.USAGE, f"--{flag}: {first['msg']}", reason=ReasonCode.INVALID_COMMAND.value)
    goal_id = GoalService(kernel.db, kernel.store).start(root_task, budget, breaker)
    emit({"status": "ok", "goal_id": goal_id, "root_task": root_task}, generic=False)
    say(f"goal {goal_id} started for {root_task}")


@app.command("list")
def list_goals(ctx: typer.Context) -> None:
    """Every goal, newest first: id, root task, state, reason, started and ended."""
    rows = _service(ctx).list()
    emit(rows)
    say(f"{len(rows)} goal(s), {sum(1 for g in rows if g['state'] == 'active')} active")


@app.command("show")
def show(ctx: typer.Context, goal_id: str) -> None:
    """State, reason, budget and what the root and its descendants spent."""
    goal = _service(ctx).show(goal_id)
    if goal is None:
        reject("unknown_goal", f"no goal {goal_id} (see `taskkernel goal list`)")
    emit(goal)


@app.command("cancel")
def cancel(ctx: typer.Context, goal_id: str) -> None:
    """Cancel an active goal (the root task's authority)."""
    c = get_ctx(ctx)
    c.database(writes=True)
    kernel = c.kernel()
    service = GoalService(kernel.db, kernel.store)
    goal = service.show(goal_id)
    root = kernel.task(goal["root_task"]) if goal else None
    if goal is None or root is None:
        reject("unknown_goal", f"no goal {goal_id}")
    _authorize(c, root, "cancel")
    if not service.cancel(goal_id):
        reject("goal_not_active", f"goal {goal_id} is not active")
    emit({"status": "ok", "goal_id": goal_id, "state": "cancelled"}, generic=False)
    say(("cancelled", "yellow"), f" goal {goal_id}")
