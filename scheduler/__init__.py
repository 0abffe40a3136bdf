"""Durable scheduler for automations (issue 4): never twice per occurrence, never more often than
configured. See docs/scheduler.md.

APScheduler 3.11 computes trigger times and serves as an in-process alarm clock; the source of truth
is the ledger in the kernel's database (schedule watermark, occurrence claims, leases).
"""

from taskkernel.scheduler.actions import ActionContext, ActionRegistry, ActionResult, execute
from taskkernel.scheduler.admin import Schedules
from taskkernel.scheduler.ledger import Claim, Ledger, Outcome, ScheduleRow
from taskkernel.scheduler.models import (
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
from taskkernel.scheduler.runtime import DbClock, SchedulerRuntime, TickReport, system_clock
from taskkernel.scheduler.simulate import simulate
from taskkernel.scheduler.tables import install
from taskkernel.scheduler.triggers import Trigger, build_trigger, translate_day_of_week

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
