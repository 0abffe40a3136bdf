"""Task ids: ``TASK-YYYYMMDD-NNN`` with a real calendar date and a sequence every store can hold, or FCoP 4's
``TASK-<32 lowercase hex>`` (a uuid4 without dashes: the id fcop's Core gives a task in a G4 workspace).

The kernel keeps the highest number per day in an INTEGER counter (32 bits on PostgreSQL), so a
wider sequence would overflow inside the command's transaction. Such an id is refused up front as
``invalid_task_id`` instead: by the wire model for commands, by the FCoP parser for file names.
"""

from __future__ import annotations

import re
from datetime import date
from functools import lru_cache

MAX_SEQUENCE_DIGITS = 9
MAX_SEQUENCE = 10**MAX_SEQUENCE_DIGITS - 1  # below 2**31 - 1, the smallest integer column that stores it
TASK_ID_RE = re.compile(r"^TASK-(?:\d{8}-\d{3,}|[0-9a-f]{32})$")  # the grammar; `task_id_problem` adds the ranges
G4_TASK_ID_RE = re.compile(r"^TASK-[0-9a-f]{32}$")
_PARTS_RE = re.compile(r"^TASK-(\d{8})-(\d{3,})$")


def id_range_problem(day: str, sequence: int) -> str | None:
    """Why an id with this ``YYYYMMDD`` date and sequence number is out of range, or None."""
    if sequence > MAX_SEQUENCE:
        return f"sequence {str(sequence)[:30]} has more than {MAX_SEQUENCE_DIGITS} digits"
    return _day_problem(day)


@lru_cache(maxsize=1024)  # a command names a handful of days: each is checked once per process
def _day_problem(day: str) -> str | None:
    try:
        date(int(day[:4]), int(day[4:6]), int(day[6:8]))
    except ValueError:
        return f"{day} is not a calendar date (YYYYMMDD)"
    return None


def is_dated(task_id: str) -> bool:
    """A ``TASK-YYYYMMDD-NNN`` id (its day's counter numbers it), not an FCoP 4 one."""
    return _PARTS_RE.match(task_id) is not None


def task_id_problem(value: str) -> str | None:
    """Why ``value`` is not a usable task id (grammar, date, sequence), or None if it is one."""
    if G4_TASK_ID_RE.match(value):
        return None
    m = _PARTS_RE.match(value)
    if m is None:
        return f"{value[:80]!r} is not a TASK-YYYYMMDD-NNN (or FCoP 4 TASK-<32 hex>) id"
    if len(m[2]) > MAX_SEQUENCE_DIGITS:  # checked on the text: int() of a huge string is itself an error
        shown = value if len(value) <= 40 else f"{value[:40]}…"
        return f"{shown}: the sequence has more than {MAX_SEQUENCE_DIGITS} digits"
    problem = id_range_problem(m[1], int(m[2]))
    return f"{value}: {problem}" if problem else None
