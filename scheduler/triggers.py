"""Trigger maths from APScheduler 3.11, plus the two things it does not give: dedup keys and
deterministic jitter.

APScheduler is only a calculator here: ``next_after(w)`` is the first nominal instant strictly after
``w``. The ledger decides what fires.

Dedup keys (docs/scheduler.md, "DST"):
- cron and calendar (``dst="wall"``): the local wall-clock minute of the nominal instant, so the
  repeated hour of a fall-back night maps to a key that is already taken and cannot fire twice;
- interval, date, and cron/calendar with ``dst="elapsed"``: the nominal UTC instant.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.calendarinterval import CalendarIntervalTrigger
from apscheduler.triggers.combining import OrTrigger
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger

from taskkernel.scheduler.models import (
    MAX_DURATION_S,
    Kind,
    ScheduleError,
    SchedulerException,
    ScheduleSpec,
    parse_instant,
    shown,
    zone,
)

_DOW_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_CALENDAR_KEYS = ("years", "months", "weeks", "days", "hour", "minute", "second")
# The most each calendar field may be: the intervals stay within ten years (MAX_DURATION_S), the time of day
# within a day.
CALENDAR_MAX = {"years": 10, "months": 120, "weeks": 521, "days": 3650, "hour": 23, "minute": 59, "second": 59}
_MICRO = timedelta(microseconds=1)
# Occurrences end before this instant (a trigger past it is exhausted): the date arithmetic of a tick (a
# local time, a jitter) stays within datetime's range whatever the schedule.
LAST_NOMINAL = datetime(9999, 1, 1, tzinfo=UTC)
_LATEST = datetime.max.replace(tzinfo=UTC)


def _bad(message: str) -> SchedulerException:
    return SchedulerException(ScheduleError.INVALID_SPEC, message)


def _dow_number(token: str) -> int:
    token = token.strip().lower()
    if token.isdigit():
        n = int(token)
        if not 0 <= n <= 7:
            raise _bad(f"day of week {token} out of range 0-7")
        return n
    if token[:3] in _DOW_NAMES and len(token) == 3:
        return _DOW_NAMES.index(token)
    raise _bad(f"bad day of week {token!r}")


def translate_day_of_week(field: str) -> str:
    """Crontab day-of-week (0 and 7 = Sunday, 1 = Monday) -> APScheduler weekday names.

    APScheduler 3.x numbers weekdays from Monday = 0, so passing crontab numbers through
    (``CronTrigger.from_crontab``) shifts every weekday by one; names are unambiguous."""
    if field == "*":
        return "*"
    days: set[int] = set()
    for part in field.split(","):
        rng, _, step_text = part.partition("/")
        try:
            step = int(step_text) if step_text else 1
        except ValueError as exc:
            raise _bad(f"bad step in day of week {part!r}") from exc
        if step < 1:
            raise _bad(f"bad step in day of week {part!r}")
        if rng == "*":
            lo, hi = 0, 6
        elif "-" in rng:
            a, _, b = rng.partition("-")
            lo, hi = _dow_number(a), _dow_number(b)
        else:
            lo = _dow_number(rng)
            hi = 6 if step_text else lo
        if lo > hi:
            raise _bad(f"day-of-week range {rng!r} runs backwards")
        days.update(d % 7 for d in range(lo, hi + 1, step))
    return ",".join(_DOW_NAMES[d] for d in sorted(days))


def crontab_trigger(expr: str, tz: ZoneInfo) -> BaseTrigger:
    """A 5-field crontab expression with Vixie-cron semantics.

    When both day-of-month and day-of-week are restricted (neither starts with ``*``), cron fires
    when *either* matches; APScheduler ANDs them, so that case becomes an ``OrTrigger``."""
    expr = _MACROS.get(expr.strip().lower(), expr)
    fields = expr.split()
    if len(fields) != 5:
        raise _bad(f"cron expression needs 5 fields (minute hour day month weekday), got {len(fields)}: {expr!r}")
    minute, hour, dom, month, dow = fields
    common: dict[str, Any] = {"second": "0", "minute": minute, "hour": hour, "month": month, "timezone": tz}
    try:
        weekdays = translate_day_of_week(dow)
        if not dom.startswith("*") and not dow.startswith("*"):
            return OrTrigger([CronTrigger(day=dom, **common), CronTrigger(day_of_week=weekdays, **common)])
        return CronTrigger(day=dom, day_of_week=weekdays, **common)
    except ValueError as exc:
        raise _bad(f"bad cron expression {expr!r}: {exc}") from exc


def parse_calendar(text: str) -> dict[str, int]:
    """``"months=1"``, ``"days=1, hour=9, minute=30"`` -> CalendarIntervalTrigger keyword arguments."""
    out: dict[str, int] = {}
    for part in re.split(r"[,\s]+", text.strip()):
        if not part:
            continue
        key, sep, value = part.partition("=")
        key, value = key.strip().lower(), value.strip()
        if not sep or key not in _CALENDAR_KEYS or not re.fullmatch(r"[0-9]+", value):
            raise _bad(f"bad calendar field {shown(part)!r}; use key=N with keys {', '.join(_CALENDAR_KEYS)}")
        if len(value.lstrip("0")) > 6 or int(value) > CALENDAR_MAX[key]:
            raise _bad(f"calendar {key}={shown(value)} is out of range: {key} may be at most {CALENDAR_MAX[key]}")
        out[key] = int(value)
    if not any(out.get(k) for k in ("years", "months", "weeks", "days")):
        raise _bad("calendar interval needs a positive years, months, weeks or days")
    return out


def floor_second(dt: datetime) -> datetime:
    return dt.replace(microsecond=0)


def iso_z(dt: datetime) -> str:
    """UTC ISO with a Z suffix; microseconds only when present (user-facing output)."""
    dt = dt.astimezone(UTC)
    fmt = "%Y-%m-%dT%H:%M:%S.%fZ" if dt.microsecond else "%Y-%m-%dT%H:%M:%SZ"
    return dt.strftime(fmt)


def db_time(dt: datetime) -> str:
    """Fixed-width UTC text: sorts lexicographically in the same order as the instants."""
    if dt.tzinfo is not UTC:
        dt = dt.astimezone(UTC)
    return dt.replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"  # isoformat: far cheaper than strftime


def from_db_time(text: str) -> datetime:
    return datetime.fromisoformat(text)  # Python 3.11 reads the Z suffix as UTC


class Trigger:
    """One schedule's occurrence maths: nominal instants, dedup keys, due times."""

    def __init__(self, spec: ScheduleSpec, anchor: datetime, schedule_id: str = "") -> None:
        self.spec = spec
        self.kind = spec.kind
        self.tz = zone(spec.tz)
        self.schedule_id = schedule_id
        self.anchor = floor_second(anchor.astimezone(UTC))
        self.wall_keys = spec.kind in (Kind.CRON, Kind.CALENDAR) and spec.dst == "wall"
        self._jitter = spec.jitter
        self._first: datetime | None = None
        self._memo: tuple[datetime, datetime | None] | None = None
        self._aps = self._build()

    def _build(self) -> BaseTrigger:
        spec, tz = self.spec, self.tz
        try:
            if spec.kind is Kind.CRON:
                return crontab_trigger(spec.spec, tz)
            if spec.kind is Kind.INTERVAL:
                text = spec.spec.strip()
                if not re.fullmatch(r"[0-9]{1,12}", text) or not 1 <= int(text) <= MAX_DURATION_S:
                    raise _bad(f"interval must be 1 to {MAX_DURATION_S} seconds (ten years), not {shown(text)!r}")
                seconds = int(text)
                # Interval time is elapsed time: computed in UTC, first fire one interval after the anchor.
                start = parse_instant(spec.start, spec.tz) if spec.start else self.anchor + timedelta(seconds=seconds)
                return IntervalTrigger(seconds=seconds, start_date=start, timezone=UTC)
            if spec.kind is Kind.DATE:
                return DateTrigger(run_date=parse_instant(spec.spec, spec.tz), timezone=UTC)
            start_day: date = (
                parse_instant(spec.start, spec.tz).astimezone(tz).date() if spec.start
                else self.anchor.astimezone(tz).date()
            )
            return CalendarIntervalTrigger(**parse_calendar(spec.spec), start_date=start_day, timezone=tz)
        except (ValueError, TypeError, OverflowError) as exc:
            if isinstance(exc, SchedulerException):
                raise
            raise _bad(f"bad {spec.kind.value} spec {shown(spec.spec)!r}: {exc}") from exc

    def next_after(self, w: datetime) -> datetime | None:
        """First nominal instant strictly after ``w`` (UTC), or None when the trigger is exhausted.

        For calendar triggers ``w`` must be the initial watermark or a nominal instant: APScheduler
        advances a calendar interval from the previous fire's date (``preview`` iterates instead)."""
        # A pass ends by computing the occurrence after the new watermark; the next pass starts
        # from that same watermark, so remember the last answer.
        memo = self._memo
        if memo is not None and memo[0] == w:
            return memo[1]
        nxt = self._next_after(w)
        self._memo = (w, nxt)
        return nxt

    def _next_after(self, w: datetime) -> datetime | None:
        if w >= LAST_NOMINAL:
            return None
        try:
            nxt = self._aps_next(w)
        except OverflowError:  # past the end of datetime's range: nothing comes after
            return None
        if nxt is None:
            return None
        nxt = nxt.astimezone(UTC)
        return nxt if w < nxt < LAST_NOMINAL else None

    def _aps_next(self, w: datetime) -> datetime | None:
        aps = self._aps
        if self.kind is Kind.DATE:
            return aps.get_next_fire_time(None, w)
        if self.kind is Kind.CALENDAR:
            if self._first is None:
                self._first = aps.get_next_fire_time(None, w)
            first = self._first
            if first is not None and first.astimezone(UTC) > w:
                return first
            return aps.get_next_fire_time(w.astimezone(self.tz), w)
        # previous_fire_time=None: 3.11.3 can return the previous instant again when handed a UTC
        # previous fire time inside a DST fold; "first fire >= w + 1us" has no such trap.
        return aps.get_next_fire_time(None, w + _MICRO)

    def iter_after(self, w: datetime, until: datetime | None = None) -> Iterator[datetime]:
        n = self.next_after(w)
        while n is not None and (until is None or n <= until):
            yield n
            n = self.next_after(n)

    def preview(self, w: datetime, after: datetime, count: int) -> list[datetime]:
        """The next ``count`` nominal instants later than both ``w`` (the watermark) and ``after``."""
        out: list[datetime] = []
        for n in self.iter_after(w):
            if n > after:
                out.append(n)
                if len(out) >= count:
                    break
        return out

    def key(self, nominal: datetime) -> str:
        if self.wall_keys:
            return nominal.astimezone(self.tz).replace(tzinfo=None).isoformat(timespec="minutes")
        return nominal.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="seconds") + "Z"

    def local(self, nominal: datetime) -> str:
        return nominal.astimezone(self.tz).isoformat()

    def jitter_for(self, key: str) -> timedelta:
        """Deterministic per occurrence: every coordinator computes the same delay."""
        if not self._jitter:
            return timedelta(0)
        h = hashlib.sha256(f"{self.schedule_id}|{key}".encode()).digest()
        return timedelta(seconds=int.from_bytes(h[:8], "big") % (self._jitter + 1))

    def due(self, nominal: datetime, key: str | None = None) -> datetime:
        if not self._jitter:
            return nominal
        delay = self.jitter_for(key if key is not None else self.key(nominal))
        return nominal + delay if nominal < _LATEST - delay else _LATEST


def build_trigger(spec: ScheduleSpec, anchor: datetime, schedule_id: str = "") -> Trigger:
    return Trigger(spec, anchor, schedule_id)
