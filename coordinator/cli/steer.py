"""`taskkernel task say|interrupt|inputs`: people in the loop of a running agent (docs/people-in-the-loop.md).

`say` accepts an instruction into the task's run session, `interrupt` stops its running agent (and resumes it with a
message), `inputs` lists what the task's agent was told with each instruction's delivery state (`--consume`: a run
reads what waits for it, as MCP ``read_inputs`` does). Output follows the CLI's rules: one JSON document piped or
with --json; a refusal is ``{"status": "rejected", "reason", "message"}``, exit 2; bad usage exit 64.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

import typer

from taskkernel.coordinator.cli.common import Exit, emit, fail, get_ctx, reject, say

if TYPE_CHECKING:
    from taskkernel.coordinator.runners.inputs import RunInputs
    from taskkernel.kernel.model.principal import Principal


def attach(app: typer.Typer) -> None:
    for name, command in (("say", say_cmd), ("interrupt", interrupt), ("inputs", inputs)):
        app.command(name)(command)


def _inputs(ctx: typer.Context) -> tuple[RunInputs, Principal]:
    from taskkernel.coordinator.runners.inputs import RunInputs, role_specs
    from taskkernel.kernel.sessionlog import SessionLog

    c = get_ctx(ctx)
    db = c.current_database()
    principal = c.principal()
    workspace = c.optional_workspace()
    log = SessionLog(db, workspace.grant_sessions) if workspace else SessionLog(db)
    return RunInputs(db, log, role_specs(workspace.config) if workspace else {}), principal


def _resolved(ctx: typer.Context, task_id: str) -> str:
    from taskkernel.coordinator.fcop4.aliases import resolve_task_id

    return resolve_task_id(get_ctx(ctx).database(), task_id)


def _refused(exc: Exception) -> NoReturn:
    """A KernelError or SessionLogError as the CLI's refusal (an unusable instruction is a usage error)."""
    from taskkernel.kernel.reasons import KernelError
    from taskkernel.kernel.sessionlog import SessionLogError
    from taskkernel.kernel.sessionlog.models import SessionReason

    if isinstance(exc, SessionLogError) and exc.reason is SessionReason.INVALID_INPUT:
        fail(Exit.USAGE, exc.message, error=exc.reason.value)
    if isinstance(exc, KernelError | SessionLogError):
        reject(exc.reason.value, exc.message)
    raise exc


def say_cmd(ctx: typer.Context, task_id: str, text: str = typer.Argument(..., help="What to tell the agent."),
            steer: bool = typer.Option(False, "--steer", help="Deliver at its next tool call (the default does "
                                       "too; recorded as a steer)."),
            queue: bool = typer.Option(False, "--queue", help="Hold it for the agent's next run."),
            answer: str | None = typer.Option(None, "--answer", metavar="Q", help="Answer the agent's question Q."),
            input_id: str | None = typer.Option(None, "--input-id", help="Idempotency id: the same id and text "
                                                "replay (default: a new one per call)."),
            at: str | None = typer.Option(None, "--at", metavar="PATH:LINE", help="The line of the task's change "
                                          "it is about (an inline comment on its diff).")) -> None:
    """Tell a task's agent something: accepted into the task's run session in acceptance order, delivered at its
    next tool call (or its next run), listed by `task inputs` (ADMIN, the task's done authority or sender)."""
    chosen = [name for name, on in (("--steer", steer), ("--queue", queue), ("--answer", answer is not None)) if on]
    if len(chosen) > 1:
        fail(Exit.USAGE, f"give at most one of --steer, --queue, --answer (not {' and '.join(chosen)})")
    mode = "steer" if steer else "queue" if queue else "answer" if answer is not None else "message"
    service, principal = _inputs(ctx)
    try:
        out = service.say(principal, _resolved(ctx, task_id), text, mode, question_id=answer, input_id=input_id,
                          anchor=at)
    except Exception as exc:  # noqa: BLE001 - _refused re-raises what is no refusal
        _refused(exc)
    emit(out, generic=False)
    woke = f"; run {out['queued_run']} queued to deliver it" if out["queued_run"] else ""
    say((out["status"], "green"), f" #{out['accept_seq']} for {out['task_id']}{woke}")


def interrupt(ctx: typer.Context, task_id: str,
              message: str | None = typer.Option(None, "--message", "-m", help="The resumed run's newest "
                                                 "instruction (without one the agent stays stopped until you "
                                                 "`task say` or `task retry`).")) -> None:
    """Stop the task's running agent (SIGTERM to its process group, its role's kill_grace, then SIGKILL; the
    worktree kept) and, with --message, resume it with that message."""
    service, principal = _inputs(ctx)
    try:
        out = service.interrupt(principal, _resolved(ctx, task_id), message)
    except Exception as exc:  # noqa: BLE001
        _refused(exc)
    emit(out, generic=False)
    say((out["status"], "green"), f" stop of {out['run_id']} (the coordinator holding it stops it within a second)")


def inputs(ctx: typer.Context, task_id: str,
           consume: bool = typer.Option(False, "--consume", help="As the task's run (its token): return the "
                                        "instructions waiting for you and mark them consumed.")) -> None:
    """What the task's agent was told, in acceptance order, each with its delivery state (accepted, delivered to a
    run, consumed)."""
    service, principal = _inputs(ctx)
    task_id = _resolved(ctx, task_id)
    try:
        if consume:
            out: dict[str, Any] = _consume(service, principal, task_id)
        else:
            from taskkernel.kernel.instructions import check_reader

            doc = service.task(task_id)
            check_reader(principal, doc)
            out = {"status": "ok", "task_id": task_id, "session": service.session_of(doc),
                   "inputs": service.timeline(task_id)}
    except Exception as exc:  # noqa: BLE001
        _refused(exc)
    emit(out, generic=False)
    for item in out["inputs"]:
        state = item.get("state", "consumed")
        say(f"#{item['accept_seq']} {item['kind']} [{state}] ", item.get("text") or "")


def _consume(service: RunInputs, principal: Principal, task_id: str) -> dict[str, Any]:
    from taskkernel.kernel.reasons import KernelError, ReasonCode

    if principal.task_id != task_id:
        raise KernelError(ReasonCode.ROLE_NOT_AUTHORIZED, f"--consume reads {task_id}'s instructions as its run: "
                          f"it needs the run's token (caller: {principal.provenance})")
    from taskkernel.coordinator.runners.inputs import NO_RUN

    running = service.running_run(task_id)
    taken = service.deliver(principal.provenance, *(running or (NO_RUN, 0)), "cli")
    return {"status": "ok", "task_id": task_id, "session": principal.provenance,
            "inputs": [{"accept_seq": t.seq, "kind": t.kind, "text": t.text, "question_id": t.question_id,
                        "anchor": t.anchor,
                        "by": t.by} for t in taken]}
