"""Durable scheduler for automations (issue 4): never twice per occurrence, never more often than
configured. See docs/scheduler.md.

APScheduler 3.11 computes trigger times and serves as an in-process alarm clock; the source of truth
is the ledger in the kernel's database (schedule watermark, occurrence claims, leases).
"""

from scheduler.actions import ActionContext, ActionRegistry, ActionResult, execute
from scheduler.admin import Schedules
from scheduler.ledger import Claim, Ledger, Outcome, ScheduleRow
from scheduler.models import (
    ActionSpec,
    ActionType,
    Kind,
    Misfire,
    MissReason,
    OccurrenceState,
    Overlap,
    ScheduleError,
    SchedulerException,
    ScheduleSpec,
    parse_duration,
    spec_from_user,
)
from scheduler.runtime import DbClock, SchedulerRuntime, TickReport, system_clock
from scheduler.simulate import simulate
from scheduler.tables import install
from scheduler.triggers import Trigger, build_trigger, translate_day_of_week

__all__ = [
    "ActionContext",
    "ActionRegistry",
    "ActionResult",
    "ActionSpec",
    "ActionType",
    "Claim",
    "DbClock",
    "Kind",
    "Ledger",
    "Misfire",
    "MissReason",
    "OccurrenceState",
    "Outcome",
    "Overlap",
    "ScheduleError",
    "ScheduleRow",
    "ScheduleSpec",
    "SchedulerException",
    "SchedulerRuntime",
    "Schedules",
    "TickReport",
    "Trigger",
    "build_trigger",
    "execute",
    "install",
    "parse_duration",
    "simulate",
    "spec_from_user",
    "system_clock",
    "translate_day_of_week",
]
