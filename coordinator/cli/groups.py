"""Every top-level command, and where it lives. Only the command a call names is imported: `--help` and
completion list the others from this table (their one-line help is kept equal to the real command's by
tests/test_cli_lazy.py), so a call pays only for its own libraries."""

from __future__ import annotations

import copy
import importlib
from dataclasses import dataclass

import typer
from typer.models import CommandInfo


@dataclass(frozen=True)
class Entry:
    name: str
    module: str  # under taskkernel.coordinator.cli
    attr: str  # a command function, or a typer.Typer sub-app
    help: str  # the first line of the real command's help, shown while it is not loaded


ENTRIES: tuple[Entry, ...] = (
    Entry("init", "kernel_cmds", "init", "Create the workspace: .taskkernel/kernel.db, taskkernel.toml and, in a "
          "project without any, the FCoP folders."),
    Entry("submit", "kernel_cmds", "submit", "Submit one command (JSON) to the TaskCommandKernel."),
    Entry("task", "kernel_cmds", "task_app", "Tasks: list and show them, and act on them in one call."),
    Entry("log", "kernel_cmds", "log", "Events in global (commit) order (JSON: one line per event)."),
    Entry("token", "kernel_cmds", "token_app", "Credentials."),
    Entry("up", "up", "up", "Run the coordinator: folders, dispatcher, agents and automations."),
    Entry("hosts", "hosts_cmd", "hosts", "The team's machines on one store: each host's heartbeat, roles, slots and "
          "running runs."),
    Entry("invite", "join", "invite", "Write a join bundle for a new host: this workspace's chain key and owner "
          "credential (unscoped ADMIN)."),
    Entry("join", "join", "join", "Give this host's workspace the shared store's chain key and owner credential from "
          "a join bundle."),
    Entry("demo", "demo", "demo", "Run the coordinator demo on a fresh dev-team workspace (embedded SQLite, scripted "
          "agents, no network)."),
    Entry("verify", "verify", "verify", "Check the database file, the hash chain, every read model and the task "
          "folders against the events; exit 2 at the first break."),
    Entry("usage", "usage", "usage", "Usage per owner: units of work, wall time, tokens and cost."),
    Entry("goal", "goal", "app", "Goals: budgets, circuit breaker, terminal states."),
    Entry("session", "session", "app", "Acceptance-sequenced session log."),
    Entry("gate", "gate", "app", "Execution gate: is this planned action still supported by the trace, now?"),
    Entry("schedule", "schedule", "app", "Durable schedules for automations (docs/scheduler.md)."),
    Entry("fcop", "fcop_cmds", "app", "Whole-workspace FCoP operations (docs/import-and-migrate.md)."),
    Entry("db", "db", "app", "The database schema: its revision, and upgrading it."),
    Entry("doctor", "doctor", "doctor", "Check the workspace: taskkernel.toml, private file modes, the FCoP folder, "
          "the team, each runner, the database and its schema, quarantined files and blocked tasks; exit 0 if "
          "healthy, 2 otherwise."),
    Entry("inbox", "inbox", "inbox", "What waits for your role: reviews to decide, approvals that need a grant, "
          "blocked and stalled tasks, and (every role) effects given up on."),
    Entry("runs", "runs", "app", "Agent runs: what runs, retries, failed or is blocked, and each attempt."),
    Entry("effects", "effects", "app", "Outbox effects that exhausted their attempts (dead letters): list them, "
          "retry one."),
    Entry("mcp", "mcp_cmd", "mcp", "Serve tasks to agent hosts over MCP: task verbs, reads, progress and resume, the "
          "execution gate, usage."),
    Entry("serve", "serve", "serve", "Serve the web board: tasks by stage, each task's story, runs, schedules, usage "
          "and what needs you, live."),
)


def attach(app: typer.Typer, entry: Entry, sub: str | None = None) -> None:
    """Import the entry's module and attach its real command or group: of a group, only its command ``sub`` when
    the call names one it has (the others never run in this process, and click would build each one's
    parameters: the task group's twenty other commands cost `task show` ~37 M instructions)."""
    module = importlib.import_module(f"taskkernel.coordinator.cli.{entry.module}")
    target = getattr(module, entry.attr)
    if isinstance(target, typer.Typer):
        app.add_typer(only(target, sub), name=entry.name)
    else:
        app.command(entry.name)(target)


def only(group: typer.Typer, name: str | None) -> typer.Typer:
    """A copy of ``group`` holding only its command ``name``; the group itself if it has no such command (help,
    a misspelled command: click then lists them all) or has groups of its own."""
    chosen = [c for c in group.registered_commands if _name_of(c) == name]
    if not chosen or group.registered_groups:
        return group
    trimmed = copy.copy(group)
    trimmed.registered_commands = chosen
    return trimmed


def _name_of(command: CommandInfo) -> str | None:
    """The name click knows a command by (typer's rule: the function's, underscores as hyphens)."""
    callback = command.callback
    return command.name or (callback.__name__.replace("_", "-") if callback is not None else None)


def attach_placeholder(app: typer.Typer, entry: Entry) -> None:
    """A stand-in that lists the command in help and completion without importing it. It never runs:
    a call that names the command gets the real one."""

    def placeholder() -> None:  # pragma: no cover - replaced by the real command whenever it is named
        raise RuntimeError(f"{entry.name} was not loaded")

    app.command(entry.name, help=entry.help)(placeholder)


def register(app: typer.Typer, wanted: str | None, sub: str | None = None) -> None:
    """Attach the command ``wanted`` for real (of a group, its command ``sub``: ``attach``), alone: the call runs
    it and lists no other. A call that names none of them (help, completion of the first word, a misspelling
    click answers with the near miss) gets every command as a placeholder instead."""
    named = [entry for entry in ENTRIES if entry.name == wanted]
    for entry in named:
        attach(app, entry, sub)
    if not named:
        for entry in ENTRIES:
            attach_placeholder(app, entry)
