"""The typer app: global options, the one command a call names (coordinator/cli/groups.py), `--json` on every
command, shell completion, and the last line of defence: no traceback ever reaches a user (faults.py).
coordinator/cli/app.py is the entry point."""

from __future__ import annotations

import functools
import inspect
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
import typer.main

from taskkernel.coordinator.cli.common import CliContext
from taskkernel.coordinator.cli.output import Exit, fail, force_json, warn

PROG = "taskkernel"
COMPLETE_VAR = "_TASKKERNEL_COMPLETE"
VALUED_GLOBALS = {"--db", "--workspace", "-w", "--token", "--token-file"}  # global options that take a value

app = typer.Typer(no_args_is_help=True, add_completion=True, pretty_exceptions_enable=False,
                  help="taskkernel: an event-sourced kernel coordinating AI agents and humans.")


def _print_version(value: bool) -> None:
    if value:
        from taskkernel import __version__

        sys.stdout.write(f"taskkernel {__version__}\n")
        raise typer.Exit(0)


@app.callback()
def _global(
    ctx: typer.Context,
    db: str = typer.Option(None, "--db", help="Database URL (default: the workspace's SQLite file)."),
    workspace: str = typer.Option(None, "--workspace", "-w", help="Workspace root (default: search upwards)."),
    token: str = typer.Option(None, "--token", envvar="TASKKERNEL_TOKEN", help="Credential to act with."),
    token_file: Path = typer.Option(None, "--token-file", help="Read the credential from this file (a run's MCP "
                                    "configuration names one, so the token is in no command line)."),
    _json: bool = typer.Option(False, "--json", help="JSON on stdout even on a terminal (any command).",
                               callback=lambda v: force_json(v)),
    _version: bool = typer.Option(False, "--version", "-V", is_eager=True, callback=_print_version,
                                  help="Print the version and exit."),
) -> None:
    if token is None and token_file is not None:
        token = _read_token_file(token_file)
    ctx.obj = _called.context = CliContext(db_url=db, workspace_path=workspace, token=token)


def _read_token_file(path: Path) -> str:
    from taskkernel.kernel.private import read_private

    try:
        return read_private(path).decode("ascii").strip()
    except (OSError, UnicodeDecodeError) as exc:
        fail(Exit.USAGE, f"--token-file {path}: cannot read a token there ({exc})")


class _called:
    """The call's global options, for the fault handler after click's context is gone."""

    context: CliContext | None = None


def commands_named(args: list[str]) -> tuple[str | None, str | None]:
    """The top-level command a command line names (its first word that is not a global option or a value) and,
    when the word right after it is not an option, the command of that group it names (``task show`` -> ("task",
    "show"))."""
    words = iter(args)
    for word in words:
        if word == "--":
            return next(words, None), None
        if word in VALUED_GLOBALS:
            next(words, None)
        elif not word.startswith("-"):
            sub = next(words, None)
            return word, sub if sub is not None and not sub.startswith("-") else None
    return None, None


def _completion_words() -> list[str]:
    """During shell completion the line being completed is in the environment, not argv: COMP_WORDS and
    COMP_CWORD (bash), _TYPER_COMPLETE_ARGS (zsh, fish, PowerShell). The complete words, without the program."""
    import shlex  # only completion splits a line

    try:
        if "_TYPER_COMPLETE_ARGS" in os.environ:
            line = os.environ["_TYPER_COMPLETE_ARGS"]
            words = shlex.split(line)
            return words[1:] if line.endswith(" ") else words[1:-1]
        words = shlex.split(os.environ.get("COMP_WORDS", ""))
        return words[1:int(os.environ.get("COMP_CWORD") or len(words))]
    except ValueError:  # an unfinished quote: complete the command names
        return []


def _with_json_flag(command: Callable[..., Any]) -> Callable[..., Any]:
    """The command with a `--json` option of its own (same meaning as the global one), so it works wherever
    the user puts it. Declared through the signature typer reads, like any other option."""
    signature = inspect.signature(command)
    if "json_output" in signature.parameters:
        return command
    flag = inspect.Parameter("json_output", inspect.Parameter.KEYWORD_ONLY, annotation=bool, default=typer.Option(
        False, "--json", help="JSON on stdout even on a terminal."))

    @functools.wraps(command)
    def with_flag(*args: Any, json_output: bool = False, **kwargs: Any) -> Any:
        force_json(json_output)
        return command(*args, **kwargs)

    with_flag.__signature__ = signature.replace(parameters=[*signature.parameters.values(), flag])  # type: ignore[attr-defined]
    with_flag.__annotations__ = {**command.__annotations__, "json_output": bool}
    return with_flag


def _add_json_flags(typer_app: typer.Typer) -> None:
    for info in typer_app.registered_commands:
        if info.callback is not None:
            info.callback = _with_json_flag(info.callback)
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            _add_json_flags(group.typer_instance)


def build(args: list[str]) -> Any:
    """The click command for this call: the named command alone, for real (of a group, the command it names);
    when it names none, every command as a placeholder."""
    from taskkernel.coordinator.cli import groups, params

    wanted, sub = commands_named(_completion_words() if COMPLETE_VAR in os.environ else args)
    groups.register(app, wanted, sub)
    if wanted is not None:
        from taskkernel.kernel.logging import configure_logging

        configure_logging()  # before anything logs: structlog's default would write to stdout
    _add_json_flags(app)
    command = typer.main.get_command(app)
    params.install(command)  # plain values converted without typer's pydantic adapters (params.py)
    return command


def run(argv: list[str] | None = None) -> None:
    """Run one command and exit with its documented code (docs/cli.md): usage errors 64, Ctrl-C 130, an
    infrastructure fault one line + the error envelope (faults.py), never a traceback."""
    args = sys.argv[1:] if argv is None else argv
    try:
        command = build(args)
        rv = command.main(args=args, prog_name=PROG, complete_var=COMPLETE_VAR, standalone_mode=False)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        sys.exit(130)
    except KeyboardInterrupt:
        sys.exit(130)
    except typer.TyperException as exc:  # usage errors (click's exit code 2 becomes sysexits' 64)
        if type(exc).__name__ == "NoArgsIsHelpError":  # no arguments: the help it printed is the answer
            sys.exit(0)
        warn(("usage error:", "red"), f" {exc.format_message()}")
        sys.exit(int(Exit.USAGE) if exc.exit_code == 2 else exc.exit_code)
    except Exception as exc:  # noqa: BLE001 - the one place every other failure becomes a value
        from taskkernel.coordinator.cli.faults import report_fault

        context = _called.context
        sys.exit(report_fault(exc, context.workspace_path if context else None))
    sys.exit(rv if isinstance(rv, int) else 0)
