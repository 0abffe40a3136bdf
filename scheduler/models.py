"""Schedule definitions, policies and the stable error codes of the scheduler.

A schedule is stored as one canonical JSON document (``ScheduleSpec``); everything the ledger
needs to decide what is due comes from it plus the durable watermark.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from taskkernel.kernel.canonical import check_json


class ScheduleError(StrEnum):
    """Stable error codes (docs/scheduler.md). Never rename a value; add new ones."""

    INVALID_SPEC = "invalid_spec"
    INVALID_TIMEZONE = "invalid_timezone"
    INVALID_DURATION = "invalid_duration"
    INVALID_ACTION = "invalid_action"
    INVALID_TEMPLATE = "invalid_template"
    INVALID_RANGE = "invalid_range"
    INVALID_SIMULATION = "invalid_simulation"
    SCHEDULE_EXISTS = "schedule_exists"
    SCHEDULE_NOT_FOUND = "schedule_not_found"
    BACKFILL_TOO_LARGE = "backfill_too_large"
    UNKNOWN_CALLABLE = "unknown_callable"
    UNKNOWN_PROBE = "unknown_probe"
    STALE_REVISION = "stale_revision"
    ACTION_REJECTED = "action_rejected"
    ACTION_FAILED = "action_failed"
    LEASE_LOST = "lease_lost"
    ROLE_NOT_AUTHORIZED = "role_not_authorized"  # the caller's credential may not do this (the kernel's code)
    SCHEDULE_INVALID = "schedule_invalid"  # a stored definition cannot be read or computed: set aside, never run
    UNKNOWN_ROLE = "unknown_role"  # the owner or a template role is not a role of the team (the kernel's code)
    INVALID_GRANT = "invalid_grant"  # an allow/revoke payload nothing reads (the session log's code)


CLOCK_JUMP = "clock_jump"  # why a watermark was clamped: it stood further ahead of the clock than allowed
SET_ASIDE = "invalid"  # pause_reason of a schedule whose stored definition cannot be read or computed

# Bounds (docs/scheduler.md, "Bounds"). Every duration and count a schedule holds is bounded, so no value,
# however it was written, can overflow the date arithmetic of a tick or the database's 64-bit integers.
MAX_DURATION_S = 10 * 365 * 86400  # ten years of 365 days: every, grace, catchup_window, jitter, run_for
MAX_CATCHUP = 1000  # catchup_max: occurrences caught up in one pass
MAX_FUSE = 1000  # fuse: consecutive no-progress fires before the schedule pauses
MAX_ATTEMPTS = 100  # max_attempts: runs of one occurrence
MAX_BACKFILL = 10_000  # backfill --max
MIN_INSTANT = datetime(1970, 1, 1, tzinfo=UTC)  # instants given (at, start, backfill and simulation times)
MAX_INSTANT = datetime(9000, 1, 1, tzinfo=UTC)  # ... lie in [MIN_INSTANT, MAX_INSTANT)


class SchedulerException(Exception):
    """An error as a value: a stable code plus a human message."""

    def __init__(self, code: ScheduleError, message: str) -> None:
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message


class Kind(StrEnum):
    CRON = "cron"
    INTERVAL = "interval"
    DATE = "date"
    CALENDAR = "calendar"


class Misfire(StrEnum):
    SKIP = "skip"
    LATEST_ONCE = "latest_once"
    ALL = "all"


class Overlap(StrEnum):
    SKIP = "skip"
    BUFFER_ONE = "buffer_one"
    ALLOW = "allow"


class OccurrenceState(StrEnum):
    CLAIMED = "claimed"  # reserved, waiting to start (buffer_one, backfill); owned by nobody yet
    RUNNING = "running"  # started under a lease held by one coordinator
    DONE = "done"
    FAILED = "failed"
    MISSED = "missed"  # never ran and never will; see MissReason
    ABANDONED = "abandoned"  # its holder died and the action is not idempotent: it may or may not have run


class MissReason(StrEnum):
    MISFIRE = "misfire"  # too late for the misfire policy
    OVERLAP = "overlap"  # an earlier occurrence was still running
    DUPLICATE = "duplicate"  # its dedup key was already taken (e.g. the repeated hour of a DST fall-back)
    PAUSED = "paused"  # the schedule was paused when it came due
    UNCHANGED = "unchanged"  # only_if_changed: the watched state did not change since the last fire
    NO_PROGRESS = "no_progress"  # the no-progress fuse tripped on this occurrence


class ActionType(StrEnum):
    CREATE_TASK = "create_task"
    ACCEPT_INPUT = "accept_input"
    CALL = "call"


FIRED_STATES = (OccurrenceState.RUNNING, OccurrenceState.DONE, OccurrenceState.FAILED, OccurrenceState.ABANDONED)

_DURATION = re.compile(r"(\d+)\s*(w|d|h|m|s)", re.IGNORECASE)
_UNIT_S = {"w": 604800, "d": 86400, "h": 3600, "m": 60, "s": 1}


def shown(value: object, limit: int = 40) -> str:
    """A value for a message: short, and never the (slow, size-limited) decimal form of a huge integer."""
    if isinstance(value, int) and value.bit_length() > 128:
        return f"an integer of {value.bit_length()} bits"
    text = str(value)
    return text if len(text) <= limit else text[:limit] + "…"


def _too_long(value: object) -> SchedulerException:
    return SchedulerException(ScheduleError.INVALID_DURATION, f"{shown(value)} is longer than ten years "
                              f"({MAX_DURATION_S} s), the most a duration may be")


def parse_duration(value: str | int | float) -> int:
    """``"1h30m"``, ``"90s"``, ``"2d"`` or a number of seconds -> whole seconds, at most ``MAX_DURATION_S``."""
    if isinstance(value, bool):
        raise SchedulerException(ScheduleError.INVALID_DURATION, f"not a duration: {value!r}")
    if isinstance(value, int | float):
        if isinstance(value, float) and not math.isfinite(value):
            raise SchedulerException(ScheduleError.INVALID_DURATION, f"not a duration: {value!r}")
        if value < 0:
            raise SchedulerException(ScheduleError.INVALID_DURATION, f"negative duration: {value!r}")
        if value > MAX_DURATION_S:
            raise _too_long(value)
        return int(value)
    text = str(value).strip()
    seconds = re.fullmatch(r"[0-9]+", text) is not None  # str.isdigit() also accepts "²", which int() refuses
    parts = [(text, "s")] if seconds else _DURATION.findall(text)
    if not parts or (not seconds and _DURATION.sub("", text).strip()):
        raise SchedulerException(
            ScheduleError.INVALID_DURATION, f"not a duration: {shown(text)!r} (use e.g. 30s, 15m, 1h30m, 2d)"
        )
    total = 0
    for n, u in parts:
        if len(n.lstrip("0")) > 12:  # longer than any bounded duration; int() of a huge string is costly
            raise _too_long(text)
        total += int(n) * _UNIT_S[u.lower()]
    if total > MAX_DURATION_S:
        raise _too_long(text)
    return total


def parse_instant(value: str | datetime, tz: str = "UTC") -> datetime:
    """ISO 8601 -> aware UTC datetime in [``MIN_INSTANT``, ``MAX_INSTANT``); a naive value is read in ``tz``."""
    if isinstance(value, datetime):
        dt = value
    else:
        try:
            dt = datetime.fromisoformat(str(value).strip().replace("Z", "+00:00"))
        except ValueError as exc:
            raise SchedulerException(ScheduleError.INVALID_SPEC, f"not an ISO 8601 time: {value!r}") from exc
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=zone(tz))
    try:
        dt = dt.astimezone(UTC)
    except (OverflowError, ValueError) as exc:
        raise SchedulerException(ScheduleError.INVALID_SPEC, f"time out of range: {value!r}") from exc
    if not MIN_INSTANT <= dt < MAX_INSTANT:
        raise SchedulerException(ScheduleError.INVALID_SPEC,
                                 f"time out of range: {value!r} (times lie from 1970-01-01 to before 9000-01-01 UTC)")
    return dt


def zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise SchedulerException(ScheduleError.INVALID_TIMEZONE, f"unknown IANA time zone {name!r}") from exc


class ActionSpec(BaseModel):
    """What an occurrence does. create_task and accept_input are idempotent by construction."""

    model_config = ConfigDict(extra="forbid")

    type: ActionType = ActionType.CALL
    template: dict[str, Any] | None = None  # create_task: recipient, subject, body (+ optional payload fields)
    session: str | None = None  # accept_input
    kind: str = "message"  # accept_input
    payload: dict[str, Any] | None = None  # accept_input
    callable: str | None = None  # call: a name registered in the ActionRegistry
    idempotent: bool = False  # call only: safe to re-run after a crash (same dedup key, attempt + 1)
    only_if_changed: bool = False
    watch: str | None = None  # registered probe whose digest is the watched state
    fuse: int = Field(default=3, ge=0, le=MAX_FUSE)  # pause after this many consecutive no-progress fires; 0 = off
    max_attempts: int = Field(default=3, ge=1, le=MAX_ATTEMPTS)

    @model_validator(mode="after")
    def _check(self) -> ActionSpec:
        if self.type is ActionType.CREATE_TASK:
            tpl = self.template or {}
            missing = [k for k in ("recipient", "subject") if not isinstance(tpl.get(k), str) or not tpl[k]]
            if missing:
                raise ValueError(f"create_task template needs string fields {missing}")
        elif self.type is ActionType.ACCEPT_INPUT:
            if not self.session:
                raise ValueError("accept_input needs a session")
        elif self.type is ActionType.CALL and not self.callable:
            raise ValueError("call needs a registered callable name")
        if self.only_if_changed and not self.watch:
            raise ValueError("only_if_changed needs a watch probe")
        # Stored as canonical JSON and rendered into commands: plain JSON only (no NaN, no integer beyond 2**53).
        if self.template is not None:
            check_json(self.template, "template")
        if self.payload is not None:
            check_json(self.payload, "payload")
        return self

    @property
    def is_idempotent(self) -> bool:
        return self.type is not ActionType.CALL or self.idempotent


class Creator(BaseModel):
    """The principal that created a schedule, recorded so the schedule never acts above it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    role: str
    agent: str
    task_id: str | None = None
    round: int | None = None


class ScheduleSpec(BaseModel):
    """The full, validated definition of a schedule (stored as canonical JSON)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200)
    kind: Kind
    spec: str
    tz: str = "UTC"
    misfire: Misfire = Misfire.LATEST_ONCE
    catchup_window: int = Field(default=3600, ge=0, le=MAX_DURATION_S)  # seconds
    catchup_max: int = Field(default=10, ge=1, le=MAX_CATCHUP)
    grace: int = Field(default=60, ge=0, le=MAX_DURATION_S)  # seconds late that still count as on time
    overlap: Overlap = Overlap.SKIP
    jitter: int = Field(default=0, ge=0, le=MAX_DURATION_S)  # seconds, deterministic per occurrence
    dst: Literal["wall", "elapsed"] = "wall"  # cron/calendar dedup keys: local wall minute or UTC instant
    start: str | None = None  # interval anchor / calendar start date (ISO); default: creation time
    owner_role: str = "ADMIN"
    action: ActionSpec | None = None
    # None: created before creators were recorded (or in-process, e.g. the demo); then the owner role
    # stands for the creator's role.
    created_by: Creator | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._:@-]*", v):
            raise ValueError("name may contain letters, digits and . _ : @ - (starting with a letter or digit)")
        return v

    @field_validator("tz")
    @classmethod
    def _tz(cls, v: str) -> str:
        zone(v)
        return v

    def definition(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


_USER_KINDS = {"cron": Kind.CRON, "every": Kind.INTERVAL, "at": Kind.DATE, "calendar": Kind.CALENDAR}
_DURATION_KEYS = ("catchup_window", "grace", "jitter")


def _label(labels: Mapping[str, str] | None, key: str) -> str:
    return (labels or {}).get(key, key)


def spec_from_user(data: dict[str, Any], *, name: str | None = None,
                   labels: Mapping[str, str] | None = None) -> ScheduleSpec:
    """Build a spec from the user-facing form (CLI flags / simulate JSON): exactly one of
    ``cron``/``every``/``at``/``calendar``, durations as ``"1h"`` strings or seconds. ``labels`` names
    fields in messages as the caller knows them (the CLI: ``--grace``)."""
    if not isinstance(data, dict):
        raise SchedulerException(ScheduleError.INVALID_SPEC, "a schedule must be a JSON object")
    fields = dict(data)
    given = [k for k in _USER_KINDS if fields.get(k) not in (None, "")]
    if "kind" in fields and "spec" in fields and not given:
        pass  # already in stored form
    elif len(given) != 1:
        raise SchedulerException(
            ScheduleError.INVALID_SPEC, "give exactly one of cron, every, at, calendar"
            + (f" (got {', '.join(given)})" if given else "")
        )
    else:
        key = given[0]
        fields["kind"] = _USER_KINDS[key]
        raw = fields.pop(key)
        fields["spec"] = str(_duration(raw, _label(labels, key))) if key == "every" else str(raw)
        for other in _USER_KINDS:
            fields.pop(other, None)
    for key in _DURATION_KEYS:
        if key in fields and fields[key] is not None:
            fields[key] = _duration(fields[key], _label(labels, key))
    if name is not None:
        fields["name"] = name
    fields.setdefault("name", "schedule")
    try:
        spec = ScheduleSpec.model_validate(fields)
    except ValidationError as exc:
        raise SchedulerException(ScheduleError.INVALID_SPEC, first_error(exc, labels)) from exc
    # Importing here keeps models free of the APScheduler dependency for callers that only parse.
    from taskkernel.scheduler.triggers import build_trigger

    try:
        if spec.start is not None:
            parse_instant(spec.start, spec.tz)
    except SchedulerException as exc:
        raise SchedulerException(exc.code, f"{_label(labels, 'start')}: {exc.message}") from None
    try:
        build_trigger(spec, datetime.now(UTC))  # validates the expression itself
    except SchedulerException as exc:
        user_key = next((k for k, v in _USER_KINDS.items() if v is spec.kind), spec.kind.value)
        raise SchedulerException(exc.code, f"{_label(labels, user_key)}: {exc.message}") from None
    return spec


def _duration(value: Any, label: str) -> int:
    try:
        return parse_duration(value)
    except SchedulerException as exc:
        raise SchedulerException(exc.code, f"{label}: {exc.message}") from None


def first_error(exc: ValidationError, labels: Mapping[str, str] | None = None) -> str:
    """The first validation error, readable: the field (as ``labels`` names it), the rule, the value."""
    err = exc.errors(include_url=False)[0]
    loc = ".".join(_label(labels, str(p)) for p in err.get("loc", ()))
    ctx = err.get("ctx") or {}
    kind = err.get("type")
    if kind in ("less_than_equal", "greater_than_equal") and "input" in err:
        bound = "at most" if kind == "less_than_equal" else "at least"
        msg = f"must be {bound} {ctx.get('le', ctx.get('ge'))} (got {shown(err['input'])})"
    else:
        msg = str(err.get("msg"))
        if kind == "value_error":
            msg = msg.removeprefix("Value error, ")
    return f"{loc}: {msg}" if loc else msg
