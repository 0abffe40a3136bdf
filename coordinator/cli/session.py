"""``taskkernel session ...``: accept, replay, export, import, resume (docs/sessionlog.md).

Exit codes: 0 ok / known, 2 rejected / unknown / no safe anchor, 64 usage, 65 unreadable file.
``replay --file`` and ``resume --file`` work without any workspace or database.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer

from taskkernel.coordinator.cli.common import CliContext, Exit, emit, fail, get_ctx, reject, say
from taskkernel.coordinator.cli.output import json_safe
from taskkernel.kernel.private import read_secret
from taskkernel.kernel.sessionlog import (
    LogFileError,
    Order,
    Rec,
    SessionLog,
    SessionLogError,
    SessionReason,
    parse_lines,
    read_file,
    replay,
    resume_from_records,
)
from taskkernel.kernel.sessionlog.authority import DEFAULT_ADMIN_SESSIONS
from taskkernel.kernel.sessionlog.interchange import signing_key
from taskkernel.kernel.sessionlog.models import InputKind
from taskkernel.kernel.sessionlog.reducers import reducer_names
from taskkernel.kernel.sessionlog.resume import DEFAULT_MAX_BYTES, DEFAULT_MAX_INPUTS

if TYPE_CHECKING:
    from taskkernel.kernel.model.principal import Principal

app = typer.Typer(no_args_is_help=True, help="Acceptance-sequenced session log.")


def _log(ctx: typer.Context) -> SessionLog:
    """The session log with this workspace's grant sessions: `admin` and the gate's configured one."""
    c = get_ctx(ctx)
    ws = c.optional_workspace()
    return SessionLog(c.database(), ws.grant_sessions if ws else DEFAULT_ADMIN_SESSIONS)


def _writer(ctx: typer.Context) -> Principal:
    """The caller of a verb that writes to the log, once the database passed its start-up check."""
    c = get_ctx(ctx)
    c.database(writes=True)
    return c.principal()


def _export_key(c: CliContext) -> bytes | None:
    """The workspace's export signing key (derived from its chain key, which opening the database made sure
    of); without a workspace, or without its key, nothing is signed and no provenance is proven."""
    ws = c.optional_workspace()
    if ws is None:
        return None
    try:
        return signing_key(read_secret(ws.chain_key_path))
    except (OSError, ValueError):
        return None


def _readable(ctx: typer.Context, session: str) -> SessionLog:
    """The log, once the caller is allowed to read ``session`` (its owner or ADMIN)."""
    log = _log(ctx)
    try:
        log.check_read(session, get_ctx(ctx).principal())
    except SessionLogError as exc:
        _reject(exc)
    return log


def _reject(exc: SessionLogError) -> NoReturn:
    """Map a session-log rejection to its exit code: bad input is usage (64), the rest is 2."""
    if exc.reason is SessionReason.INVALID_INPUT:
        fail(Exit.USAGE, exc.message, reason=exc.reason.value)
    if exc.reason is SessionReason.UNREADABLE_FILE:
        fail(Exit.DATAERR, exc.message, reason=exc.reason.value)
    emit({"status": "rejected", "reason": exc.reason.value, "message": exc.message})
    say(("rejected", "red"), f" {exc.reason.value}: {exc.message}")
    raise typer.Exit(int(Exit.REJECTED))


def _file_session(path: Path, session: str | None) -> tuple[str, list[Rec]]:
    """The one session a file holds (or the one named); an unreadable file exits 65."""
    try:
        by_session = read_file(path)
    except LogFileError as exc:
        _reject(exc)
    if session is not None:
        return session, by_session.get(session, [])
    if len(by_session) > 1:
        fail(Exit.DATAERR, f"{path} holds several sessions ({', '.join(sorted(by_session))}); name one",
             reason=SessionReason.UNREADABLE_FILE.value)
    return next(iter(by_session.items()), ("", []))


def _payload(text: str | None) -> dict[str, Any]:
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        fail(Exit.USAGE, f"--payload is not JSON: {exc.msg}", reason=SessionReason.INVALID_INPUT.value)
    if not isinstance(value, dict):
        fail(Exit.USAGE, "--payload must be a JSON object", reason=SessionReason.INVALID_INPUT.value)
    return value


def _session_id(value: str | None) -> str | None:
    if value is not None and not 1 <= len(value) <= 200:
        raise typer.BadParameter("a session id is 1 to 200 characters")
    return value


KIND_HELP = "Input kind: " + ", ".join(k.value for k in InputKind) + "."


@app.command("accept")
def accept(
    ctx: typer.Context,
    session: str = typer.Argument(..., help="Session id.", callback=_session_id),
    kind: InputKind = typer.Option(..., "--kind", help=KIND_HELP),
    input_id: str = typer.Option(..., "--input-id", help="Idempotency id of this input within the session."),
    payload: str = typer.Option(None, "--payload", help="Payload JSON object (fields depend on --kind)."),
) -> None:
    """Accept one input: prints its acceptance sequence once it is committed.

    The input is recorded as accepted from the caller's credential (`--token`, or the owner's): that,
    not the payload, decides whether the gate trusts it. allow/revoke and the grant sessions are ADMIN's;
    any other session is its first writer's (docs/security.md)."""
    principal = _writer(ctx)
    try:
        res = _log(ctx).accept(session, {"input_id": input_id, "kind": kind, "payload": _payload(payload)},
                               writer=principal)
    except SessionLogError as exc:
        _reject(exc)
    if res.status == "refused":
        _reject(SessionLogError(SessionReason.INPUT_REFUSED, f"{input_id!r} was refused earlier: {res.reason}"))
    emit({"session": session, "input_id": input_id, "accept_seq": res.accept_seq, "status": res.status})


@app.command("refuse")
def refuse(
    ctx: typer.Context,
    session: str = typer.Argument(..., help="Session id.", callback=_session_id),
    kind: InputKind = typer.Option(..., "--kind", help=KIND_HELP),
    input_id: str = typer.Option(..., "--input-id", help="Id of the refused input."),
    reason: str = typer.Option(..., "--reason", help="Why it was refused (free text, e.g. a policy name)."),
    payload: str = typer.Option(None, "--payload", help="Payload JSON object."),
) -> None:
    """Record an input as received but not accepted (it never takes part in replay)."""
    principal = _writer(ctx)
    try:
        res = _log(ctx).refuse(session, {"input_id": input_id, "kind": kind, "payload": _payload(payload)}, reason,
                               writer=principal)
    except SessionLogError as exc:
        _reject(exc)
    emit(res.model_dump(mode="json"))


def _check_reducer(value: str) -> str:
    if value not in reducer_names():
        raise typer.BadParameter(f"choose one of {', '.join(reducer_names())}")
    return value


@app.command("list")
def list_cmd(ctx: typer.Context) -> None:
    """The sessions you may read (all of them for ADMIN): id, owner, last sequence, consumed, turns (JSON)."""
    rows = _log(ctx).sessions(get_ctx(ctx).principal())
    emit(rows)
    say(f"{len(rows)} session(s)")


@app.command("replay")
def replay_cmd(
    ctx: typer.Context,
    session: str = typer.Argument(None, help="Session id (from the database, or selects one session of --file)."),
    file: Path = typer.Option(None, "--file", help="Replay a JSONL interchange file; needs no workspace."),
    order: Order = typer.Option(Order.ACCEPTANCE, "--order", help="acceptance (the truth) or record (naive)."),
    as_of: int = typer.Option(None, "--as-of", min=0, help="Use only inputs accepted at sequence <= N."),
    reducer: str = typer.Option("inputs", "--reducer", callback=_check_reducer,
                                help="inputs (the ordered context) or permission (allow/revoke)."),
) -> None:
    """Replay a session: exit 0 known, 2 unknown, 65 unreadable file."""
    if file is None and session is None:
        raise typer.BadParameter("give a SESSION or --file LOG.jsonl")
    if file is not None:
        _, records = _file_session(file, session)
    else:
        log = _readable(ctx, session)
        if not log.exists(session):  # nothing to replay is not an empty, "known" history
            reject("not_found", f"no session {session!r} in this workspace's log")
        records = log.records(session)
    result = replay(records, order=order, as_of=as_of, reducer=reducer)
    emit(result.to_json())
    if not result.known:
        say(("unknown", "yellow"), f" {result.reason}: {result.detail}")
        raise typer.Exit(int(Exit.REJECTED))


@app.command("export")
def export(
    ctx: typer.Context,
    session: str = typer.Argument(..., help="Session id."),
    output: Path = typer.Option(None, "--output", "-o", help="Write here instead of stdout (fsynced)."),
) -> None:
    """Write the session as JSON Lines, in storage order, each line signed with the workspace's key."""
    log = _readable(ctx, session)
    if not log.exists(session):
        _reject(SessionLogError(SessionReason.UNKNOWN_SESSION, f"no session {session!r}"))
    lines = [line + "\n" for line in log.export(session, _export_key(get_ctx(ctx)))]
    if output is None:  # the same lines (the signature covers the values), inert on a terminal
        sys.stdout.writelines(json_safe(line) for line in lines)
        sys.stdout.flush()
        return
    try:  # never through a link someone planted where the export goes
        fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        fail(Exit.DATAERR, f"cannot write {output}: {exc.strerror}", reason=SessionReason.UNREADABLE_FILE.value)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.writelines(lines)
        fh.flush()
        os.fsync(fh.fileno())
    say(f"exported {len(lines)} record(s) of {session} to {output}")


@app.command("import")
def import_cmd(
    ctx: typer.Context,
    source: str = typer.Argument(..., metavar="FILE|-", help="JSONL interchange file, or - for stdin."),
) -> None:
    """Import interchange records, keeping and verifying their sequences (all or nothing). ADMIN only.
    A line keeps its `accepted_by` only if this workspace's key signed it; any other claim is stored as
    `IMPORTED:<claim>`, from which no grant, instruction or permission derives."""
    c = get_ctx(ctx)
    c.database(writes=True)
    c.require_admin("session import")
    key = _export_key(c)
    try:
        by_session = (parse_lines(sys.stdin.read().splitlines(), provenance_key=key, check_provenance=True)
                      if source == "-" else read_file(source, provenance_key=key, check_provenance=True))
        summary = _log(ctx).import_records(by_session)
    except SessionLogError as exc:
        _reject(exc)
    emit({"status": "imported", "sessions": summary})


@app.command("resume")
def resume(
    ctx: typer.Context,
    session: str = typer.Argument(None, help="Session id."),
    file: Path = typer.Option(None, "--file", help="Read a JSONL interchange file instead of the database."),
    max_inputs: int = typer.Option(DEFAULT_MAX_INPUTS, "--max-inputs", min=1, max=10**6,
                                   help="Read bound: newest inputs."),
    max_bytes: int = typer.Option(DEFAULT_MAX_BYTES, "--max-bytes", min=1, max=2**31,
                                  help="Read bound: payload bytes."),
) -> None:
    """Where to continue after a compaction: exit 0 with an anchor, 2 with anchor null (no_safe_anchor)."""
    if file is None and session is None:
        raise typer.BadParameter("give a SESSION or --file LOG.jsonl")
    try:
        if file is not None:
            name, records = _file_session(file, session)
            answer = resume_from_records(name, records, max_inputs=max_inputs, max_bytes=max_bytes)
        else:
            answer = _readable(ctx, session).resume(session, max_inputs=max_inputs, max_bytes=max_bytes)
    except SessionLogError as exc:
        _reject(exc)
    emit(answer.model_dump(mode="json"))
    if answer.anchor is None:
        say(("no safe anchor", "yellow"), f" ({answer.cause}): nothing is resumed automatically")
        raise typer.Exit(int(Exit.REJECTED))


@app.command("consume")
def consume(
    ctx: typer.Context,
    session: str = typer.Argument(..., help="Session id."),
    through: int = typer.Option(..., "--through", min=0, help="Last acceptance sequence now consumed."),
) -> None:
    """Mark accepted inputs consumed by the running turn (the session's owner or ADMIN)."""
    principal = _writer(ctx)
    try:
        consumed = _log(ctx).consume(session, through, writer=principal)
    except SessionLogError as exc:
        _reject(exc)
    emit({"session": session, "last_consumed_seq": consumed})


@app.command("complete-turn")
def complete_turn(ctx: typer.Context, session: str = typer.Argument(..., help="Session id.")) -> None:
    """Complete the turn if every accepted input was consumed; else exit 2 (turn_incomplete)."""
    principal = _writer(ctx)
    try:
        res = _log(ctx).complete_turn(session, writer=principal)
    except SessionLogError as exc:
        _reject(exc)
    emit(res.model_dump(mode="json"))
    if res.status != "completed":
        raise typer.Exit(int(Exit.REJECTED))
