"""The typer app: global options and the command groups (coordinator/cli/app.py is the entry point)."""

from __future__ import annotations

import sys

import typer

from taskkernel.coordinator.cli.common import CliContext, Exit, emit, say
from taskkernel.kernel.logging import configure_logging

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="taskkernel: an event-sourced kernel coordinating AI agents and humans.")


def _print_version(value: bool) -> None:
    if value:
        from taskkernel.coordinator.cli.app import version

        sys.stdout.write(f"taskkernel {version()}\n")
        raise typer.Exit(0)


@app.callback()
def _global(
    ctx: typer.Context,
    db: str = typer.Option(None, "--db", help="Database URL (default: the workspace's SQLite file)."),
    workspace: str = typer.Option(None, "--workspace", "-w", help="Workspace root (default: search upwards)."),
    token: str = typer.Option(None, "--token", envvar="TASKKERNEL_TOKEN", help="Credential to act with."),
    _version: bool = typer.Option(False, "--version", "-V", is_eager=True, callback=_print_version,
                                  help="Print the version and exit."),
) -> None:
    ctx.obj = CliContext(db_url=db, workspace_path=workspace, token=token)


def _register_groups() -> None:
    from taskkernel.coordinator.cli import groups

    groups.register(app)


def run(argv: list[str] | None = None) -> None:
    """Run the CLI, mapping usage errors to exit 64 (sysexits EX_USAGE)."""
    from taskkernel.kernel.store.chain import ChainKeyError

    configure_logging()
    _register_groups()
    try:
        rv = app(args=argv, prog_name="taskkernel", standalone_mode=False)
    except ChainKeyError as exc:  # a keyed store opened without (or with another) key: refuse, never write
        emit({"status": "rejected", "reason": exc.reason, "message": str(exc)})
        say(("rejected", "red"), f" {exc}")
        sys.exit(int(Exit.REJECTED))
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        sys.exit(130)
    except typer.TyperException as exc:  # typer's usage errors carry click's exit code 2
        if type(exc).__name__ == "NoArgsIsHelpError":  # no arguments: the help it printed is the answer
            sys.exit(0)
        say(("usage error:", "red"), f" {exc.format_message()}")
        sys.exit(int(Exit.USAGE) if exc.exit_code == 2 else exc.exit_code)
    sys.exit(rv if isinstance(rv, int) else 0)
