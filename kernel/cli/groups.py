"""Where every command group is attached to the root app (one line per group)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    from kernel.cli import demo, kernel_cmds, up

    kernel_cmds.register(app)
    app.command("demo")(demo.demo)
    app.command("up")(up.up)
