"""Where every command group is attached to the root app (one line per group)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    from taskkernel.coordinator.cli import (
        demo,
        fcop_cmds,
        gate,
        goal,
        kernel_cmds,
        schedule,
        session,
        up,
        usage,
        verify,
    )

    kernel_cmds.register(app)
    app.command("demo")(demo.demo)
    app.command("up")(up.up)
    app.command("verify")(verify.verify)
    app.command("usage")(usage.usage)
    app.add_typer(goal.app, name="goal")
    app.add_typer(session.app, name="session")
    app.add_typer(gate.app, name="gate")
    app.add_typer(schedule.app, name="schedule")
    app.add_typer(fcop_cmds.app, name="fcop")
