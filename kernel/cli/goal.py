"""`taskkernel goal`: run a root task as a goal with a budget; terminal states are the kernel's."""

from __future__ import annotations

import typer

from kernel.cli.common import Exit, emit, fail, get_ctx, stderr
from kernel.cli.wiring import build_kernel
from kernel.goals import Budget, GoalService

app = typer.Typer(no_args_is_help=True, help="Goals: budgets, circuit breaker, terminal states.")


def _service(ctx: typer.Context) -> GoalService:
    kernel = build_kernel(get_ctx(ctx))
    return GoalService(kernel.db, kernel.store)


@app.command("start")
def start(ctx: typer.Context, root_task: str,
          tokens: int = typer.Option(None, "--tokens", min=0), cost: float = typer.Option(None, "--cost", min=0),
          wall_seconds: float = typer.Option(None, "--wall-seconds", min=0),
          attempts: int = typer.Option(None, "--attempts", min=0),
          breaker: int = typer.Option(3, "--breaker", min=1, help="Consecutive failed runs that block the goal.")
          ) -> None:
    """Start a goal for ROOT_TASK (an active goal of the same root is replaced)."""
    kernel = build_kernel(get_ctx(ctx))
    doc = kernel.task(root_task)
    if doc is None:
        fail(Exit.REJECTED, f"{root_task} does not exist")
    if doc["root"] != root_task:
        fail(Exit.REJECTED, f"{root_task} is not a root task (its root is {doc['root']})")
    goal_id = GoalService(kernel.db, kernel.store).start(
        root_task, Budget(tokens=tokens, cost_usd=cost, wall_seconds=wall_seconds, attempts=attempts), breaker)
    emit({"status": "ok", "goal_id": goal_id, "root_task": root_task})
    stderr.print(f"goal {goal_id} started for {root_task}")


@app.command("show")
def show(ctx: typer.Context, goal_id: str) -> None:
    """State, reason, budget and what the root and its descendants spent."""
    goal = _service(ctx).show(goal_id)
    if goal is None:
        fail(Exit.REJECTED, f"no goal {goal_id}")
    emit(goal)


@app.command("cancel")
def cancel(ctx: typer.Context, goal_id: str) -> None:
    if not _service(ctx).cancel(goal_id):
        fail(Exit.REJECTED, f"goal {goal_id} is not active")
    emit({"status": "ok", "goal_id": goal_id, "state": "cancelled"})
