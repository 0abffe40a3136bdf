"""``taskkernel schedule ...``: add, list, show, pause, resume, remove, backfill, next, simulate.

Every command prints one JSON document on stdout (docs/scheduler.md, "CLI"). Exit codes: 0 ok,
2 rejected (a credential that stands for nobody, a caller not authorized, unknown schedule, name taken,
backfill too large, a stored definition that cannot be computed), 64 usage (bad flags or values, values out
of bounds), 65 unreadable or invalid input file. No value, however large, ends in a traceback.

Every verb that touches the store first resolves the caller's credential, so a bogus or empty token is
refused before anything is read or written; changes are authorized by role in ``Schedules``
(``taskkernel.scheduler.authority``). ``simulate`` needs no workspace, database or credential: it writes nothing.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn

import typer
import yaml
from pydantic import ValidationError

from taskkernel.coordinator.cli.common import Exit, emit, fail, get_ctx, reject
from taskkernel.kernel.model.principal import Principal
from taskkernel.scheduler.admin import Schedules
from taskkernel.scheduler.clockjump import recent_clamps
from taskkernel.scheduler.ledger import Ledger
from taskkernel.scheduler.models import (
    ActionSpec,
    ActionType,
    ScheduleError,
    SchedulerException,
    first_error,
    parse_instant,
    spec_from_user,
)
from taskkernel.scheduler.simulate import simulate as run_simulation
from taskkernel.scheduler.tables import install

app = typer.Typer(no_args_is_help=True, help="Durable schedules for automations (docs/scheduler.md).")

_REJECTED = {ScheduleError.SCHEDULE_NOT_FOUND, ScheduleError.SCHEDULE_EXISTS, ScheduleError.BACKFILL_TOO_LARGE,
             ScheduleError.SCHEDULE_INVALID, ScheduleError.UNKNOWN_ROLE, ScheduleError.INVALID_GRANT}
# How `add` names a field in messages: the flag that sets it.
FLAGS = {"cron": "--cron", "every": "--every", "at": "--at", "calendar": "--calendar", "tz": "--tz",
         "misfire": "--misfire", "catchup_window": "--catchup-window", "catchup_max": "--catchup-max",
         "grace": "--grace", "overlap": "--overlap", "jitter": "--jitter", "dst": "--dst", "start": "--start",
         "owner_role": "--owner", "name": "NAME", "type": "--action", "template": "--template",
         "session": "--session", "kind": "--kind", "payload": "--payload", "callable": "--callable",
         "watch": "--watch", "fuse": "--fuse", "max_attempts": "--max-attempts"}


def _fail(exc: SchedulerException, *, data_error: bool = False) -> NoReturn:
    if exc.code is ScheduleError.ROLE_NOT_AUTHORIZED:
        reject(exc.code.value, exc.message)  # the same refusal shape as an unverified credential
    if exc.code in _REJECTED:
        code = Exit.REJECTED
    else:
        code = Exit.DATAERR if data_error or exc.code is ScheduleError.INVALID_TEMPLATE else Exit.USAGE
    fail(code, exc.message, reason=exc.code.value)


def _open(ctx: typer.Context, *, writes: bool = False) -> tuple[Schedules, Principal]:
    """The schedules and the caller; a credential that stands for nobody ends the command (exit 2). ``writes``: a
    verb that changes a schedule, run on a database that passed its start-up check."""
    c = get_ctx(ctx)
    if writes:
        c.database(writes=True)
    principal = c.principal()
    db = c.database()
    install(db)
    return Schedules(Ledger(db)), principal


def _now() -> datetime:
    return datetime.now(UTC)


def _flag(flag: str, parse: Any, *args: Any) -> Any:
    """``parse(*args)``, its error naming ``flag``."""
    try:
        return parse(*args)
    except SchedulerException as exc:
        raise SchedulerException(exc.code, f"{flag}: {exc.message}") from None


def _read_template(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))  # YAML is a superset of JSON
    except (OSError, yaml.YAMLError, ValueError, RecursionError) as exc:  # ValueError: UnicodeDecodeError too
        raise SchedulerException(ScheduleError.INVALID_TEMPLATE, f"cannot read template {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise SchedulerException(ScheduleError.INVALID_TEMPLATE, f"template {path} must be a mapping")
    return data


def _action(
    action: str | None, template: Path | None, session: str | None, kind: str, payload: str | None,
    callable_name: str | None, idempotent: bool, only_if_changed: bool, watch: str | None, fuse: int,
    max_attempts: int,
) -> ActionSpec:
    if action is None:
        raise SchedulerException(ScheduleError.INVALID_ACTION, "--action is required (create_task, accept_input, call)")
    try:
        kind_of = ActionType(action)
    except ValueError:
        raise SchedulerException(ScheduleError.INVALID_ACTION, f"unknown action {action!r}") from None
    fields: dict[str, Any] = {"type": kind_of, "only_if_changed": only_if_changed, "watch": watch, "fuse": fuse,
                              "max_attempts": max_attempts}
    if kind_of is ActionType.CREATE_TASK:
        if template is None:
            raise SchedulerException(ScheduleError.INVALID_ACTION, "create_task needs --template FILE")
        fields["template"] = _read_template(template)
    elif kind_of is ActionType.ACCEPT_INPUT:
        fields.update(session=session, kind=kind)
        if payload:
            try:
                fields["payload"] = json.loads(payload)
            except (ValueError, RecursionError) as exc:  # JSONDecodeError, or an integer too long to read
                raise SchedulerException(ScheduleError.INVALID_ACTION, f"--payload is not JSON: {exc}") from exc
    else:
        fields.update(callable=callable_name, idempotent=idempotent)
    try:
        return ActionSpec.model_validate(fields)
    except ValidationError as exc:
        raise SchedulerException(ScheduleError.INVALID_ACTION, first_error(exc, FLAGS)) from None


@app.command("add")
def add(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Unique schedule name."),
    cron: str = typer.Option(None, "--cron", help='Crontab expression, e.g. "30 1 * * *" (0 or 7 = Sunday).'),
    every: str = typer.Option(None, "--every", help="Interval, e.g. 30m, 1h30m (elapsed time, UTC)."),
    at: str = typer.Option(None, "--at", help="One-off ISO time (naive = in --tz)."),
    calendar: str = typer.Option(None, "--calendar", help='Calendar interval, e.g. "months=1, hour=9".'),
    tz: str = typer.Option("UTC", "--tz", help="IANA time zone."),
    misfire: str = typer.Option("latest_once", "--misfire", help="skip | latest_once | all"),
    catchup_window: str = typer.Option("1h", "--catchup-window", help="How late a missed occurrence may still run."),
    catchup_max: int = typer.Option(10, "--catchup-max", help="misfire=all: most occurrences caught up at once."),
    grace: str = typer.Option("60s", "--grace", help="Lateness still counted as on time."),
    overlap: str = typer.Option("skip", "--overlap", help="skip | buffer_one | allow"),
    jitter: str = typer.Option("0", "--jitter", help="Deterministic delay per occurrence, up to this long."),
    dst: str = typer.Option("wall", "--dst", help="Cron/calendar dedup keys: wall (local minute) | elapsed (UTC)."),
    start: str = typer.Option(None, "--start", help="Interval anchor / calendar start (ISO)."),
    owner: str = typer.Option(None, "--owner", help="Role the automation acts as (default: the caller's; "
                              "only ADMIN may name another)."),
    action: str = typer.Option(None, "--action", help="create_task | accept_input | call"),
    template: Path = typer.Option(None, "--template", help="create_task: JSON/YAML with recipient, subject, body."),
    session: str = typer.Option(None, "--session", help="accept_input: session id."),
    kind: str = typer.Option("message", "--kind", help="accept_input: input kind."),
    payload: str = typer.Option(None, "--payload", help="accept_input: payload JSON."),
    callable_name: str = typer.Option(None, "--callable", help="call: registered callable name."),
    idempotent: bool = typer.Option(False, "--idempotent", help="call: safe to re-run after a crash."),
    only_if_changed: bool = typer.Option(False, "--only-if-changed", help="Fire only if the --watch digest changed."),
    watch: str = typer.Option(None, "--watch", help="Registered probe whose digest is the watched state."),
    fuse: int = typer.Option(3, "--fuse", help="Pause after N fires that changed nothing (0 = off)."),
    max_attempts: int = typer.Option(3, "--max-attempts", help="Most runs of one occurrence (idempotent actions)."),
) -> None:
    """Add a schedule (exactly one of --cron, --every, --at, --calendar); it acts as the caller's role."""
    schedules, principal = _open(ctx, writes=True)
    schedules.roles = get_ctx(ctx).kernel().roles  # the owner and the template's roles must be the team's
    try:
        act = _action(action, template, session, kind, payload, callable_name, idempotent, only_if_changed,
                      watch, fuse, max_attempts)
        spec = spec_from_user({
            "cron": cron, "every": every, "at": at, "calendar": calendar, "tz": tz, "misfire": misfire,
            "catchup_window": catchup_window, "catchup_max": catchup_max, "grace": grace, "overlap": overlap,
            "jitter": jitter, "dst": dst, "start": start, "owner_role": owner or principal.role,
        }, name=name, labels=FLAGS)
        spec = spec.model_copy(update={"action": act})
        now = _now()
        row = schedules.add(spec, now, by=principal)
    except SchedulerException as exc:
        _fail(exc)
    emit({"status": "added", "schedule": schedules.view(row), "next": schedules.upcoming(row, now, 5)})


@app.command("list")
def list_(ctx: typer.Context) -> None:
    """All schedules (not removed)."""
    schedules, _ = _open(ctx)
    emit({"schedules": [schedules.view(s) for s in schedules.all()]})


@app.command("show")
def show(ctx: typer.Context, name: str) -> None:
    """A schedule with its watermark, next 5 occurrences, last 10 outcomes and last 10 clock-jump clamps."""
    schedules, _ = _open(ctx)
    try:
        s = schedules.get(name)
    except SchedulerException as exc:
        _fail(exc)
    try:
        upcoming = schedules.upcoming(s, _now(), 5)
    except SchedulerException:  # a definition that cannot be computed is shown with its error and faults
        upcoming = []
    emit({**schedules.view(s), "next": upcoming, "outcomes": schedules.outcomes(s, 10),
          "clock_jumps": recent_clamps(schedules.ledger, s.id, 10), "faults": schedules.faults(s, 10)})


def _change(ctx: typer.Context, name: str, verb: str) -> None:
    schedules, principal = _open(ctx, writes=True)
    try:
        s = getattr(schedules, verb)(name, _now(), by=principal)
    except SchedulerException as exc:
        _fail(exc)
    status = {"pause": "paused", "resume": "resumed", "remove": "removed"}[verb]
    emit({"status": status, "schedule": schedules.view(s)})


@app.command("pause")
def pause(ctx: typer.Context, name: str) -> None:
    """Pause: occurrences that come due are recorded missed ("paused"), never caught up later."""
    _change(ctx, name, "pause")


@app.command("resume")
def resume(ctx: typer.Context, name: str) -> None:
    """Resume a paused schedule (also one paused by the no-progress fuse)."""
    _change(ctx, name, "resume")


@app.command("remove")
def remove(ctx: typer.Context, name: str) -> None:
    """Remove a schedule; its ledger stays for audit and the name can be reused."""
    _change(ctx, name, "remove")


@app.command("backfill")
def backfill(
    ctx: typer.Context,
    name: str,
    from_: str = typer.Option(..., "--from", help="Start of the range (ISO, inclusive)."),
    to: str = typer.Option(..., "--to", help="End of the range (ISO, inclusive, not in the future)."),
    max_count: int = typer.Option(100, "--max", help="Refuse ranges with more occurrences than this."),
) -> None:
    """Queue the past occurrences in a range that never fired (deduplicated, bounded)."""
    schedules, principal = _open(ctx, writes=True)
    try:
        s = schedules.get(name)
        tz = s.spec.tz if s.error is None else "UTC"
        result = schedules.backfill(name, _flag("--from", parse_instant, from_, tz),
                                    _flag("--to", parse_instant, to, tz), _now(), max_count, by=principal)
    except SchedulerException as exc:
        _fail(exc)
    emit(result)


@app.command("next")
def next_(ctx: typer.Context, name: str, count: int = typer.Option(5, "--count", min=1, max=1000)) -> None:
    """The next N occurrences: dedup key, nominal UTC, local time, due time (with jitter)."""
    schedules, _ = _open(ctx)
    try:
        s = schedules.get(name)
        upcoming = schedules.upcoming(s, _now(), count)
    except SchedulerException as exc:
        _fail(exc)
    emit({"name": name, "next": upcoming})


@app.command("simulate")
def simulate(spec_file: Path = typer.Argument(..., help="Simulation input JSON ('-' for stdin).")) -> None:
    """Run the real scheduler against a virtual clock; print what fires and what is missed."""
    try:
        text = typer.get_text_stream("stdin").read() if str(spec_file) == "-" else spec_file.read_text("utf-8")
        doc = json.loads(text)
    except (OSError, ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, huge integers
        fail(Exit.DATAERR, f"cannot read {spec_file}: {exc}", reason=ScheduleError.INVALID_SIMULATION.value)
    try:
        emit(run_simulation(doc))
    except SchedulerException as exc:
        _fail(exc, data_error=True)
