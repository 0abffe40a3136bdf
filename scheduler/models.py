"""Schedule definitions, policies and the stable error codes of the scheduler.

A schedule is stored as one canonical JSON document (``ScheduleSpec``); everything the ledger
needs to decide what is due comes from it plus the durable watermark.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


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


CLOCK_JUMP = "clock_jump"  # why a watermark was clamped: it stood further ahead of the clock than allowed


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


def parse_duration(value: str | int | float) -> int:
    """``"1h30m"``, ``"90s"``, ``"2d"`` or a number of seconds -> whole seconds."""
    if isinstance(value, bool):
        raise SchedulerException(ScheduleError.INVALID_DURATION, f"not a duration: {value!r}")
    if isinstance(value, int | float):
        if value < 0:
            raise SchedulerException(ScheduleError.INVALID_DURATION, f"negative duration: {value!r}")
        return int(value)
    text = str(value).strip()
    if text.isdigit():
        return int(text)
    parts = _DURATION.findall(text)
    if not parts or _DURATION.sub("", text).strip():
        raise SchedulerException(
            ScheduleError.INVALID_DURATION, f"not a duration: {value!r} (use e.g. 30s, 15m, 1h30m, 2d)"
        )
    return sum(int(n) * _UNIT_S[u.lower()] for n, u in parts)


def parse_instant(value: str | datetime, tz: str = "UTC") -> datetime:
    """ISO 8601 -> aware UTC datetime; a naive value is read in ``tz``."""
    if isinstance(value, datetime):
        dt = value
    else:
        try:
            dt = datetime.fromisoformat(str(value).strip().replace("Z", "+00:00"))
        except ValueError as exc:
            raise SchedulerException(ScheduleError.INVALID_SPEC, f"not an ISO 8601 time: {value!r}") from exc
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=zone(tz))
    return dt.astimezone(UTC)


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
    fuse: int = Field(default=3, ge=0)  # pause after this many consecutive no-progress fires; 0 = off
    max_attempts: int = Field(default=3, ge=1)

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
    catchup_window: int = Field(default=3600, ge=0)  # seconds
    catchup_max: int = Field(default=10, ge=1)
    grace: int = Field(default=60, ge=0)  # seconds late that still count as on time
    overlap: Overlap = Overlap.SKIP
    jitter: int = Field(default=0, ge=0)  # seconds, deterministic per occurrence
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


def spec_from_user(data: dict[str, Any], *, name: str | None = None) -> ScheduleSpec:
    """Build a spec from the user-facing form (CLI flags / simulate JSON): exactly one of
    ``cron``/``every``/``at``/``calendar``, durations as ``"1h"`` strings or seconds."""
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
        fields["spec"] = str(parse_duration(raw)) if key == "every" else str(raw)
        for other in _USER_KINDS:
            fields.pop(other, None)
    for key in _DURATION_KEYS:
        if key in fields and fields[key] is not None:
            fields[key] = parse_duration(fields[key])
    if name is not None:
        fields["name"] = name
    fields.setdefault("name", "schedule")
    try:
        spec = ScheduleSpec.model_validate(fields)
    except ValidationError as exc:
        raise SchedulerException(ScheduleError.INVALID_SPEC, _first_error(exc)) from exc
    # Importing here keeps models free of the APScheduler dependency for callers that only parse.
    from scheduler.triggers import build_trigger

    build_trigger(spec, datetime.now(UTC))  # validates the expression itself
    return spec


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err.get("loc", ()))
    return f"{loc}: {err.get('msg')}" if loc else str(err.get("msg"))
