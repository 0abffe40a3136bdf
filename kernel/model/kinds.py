"""The command vocabulary as plain enums: command types, priorities, risk levels, cost tiers, report statuses.

No pydantic here: a read (``task show``, the fold in task.py) names a command or a status without loading the
wire format's models. kernel/model/commands.py re-exports every name, so ``from ...model.commands import
CommandType`` keeps working.
"""

from __future__ import annotations

from enum import StrEnum


class CommandType(StrEnum):
    CREATE_TASK = "create_task"
    CLAIM = "claim"
    SUBMIT = "submit"
    APPROVE = "approve"
    REJECT = "reject"
    REOPEN = "reopen"
    ARCHIVE = "archive"
    FORCE_ARCHIVE = "force_archive"
    SUBMIT_REPORT = "submit_report"
    AMEND = "amend"
    PERFORM = "perform"
    ADOPT_TASK = "adopt_task"
    ATTACH_RECORD = "attach_record"
    RETRY = "retry"
    RECORD_MERGE = "record_merge"
    RECORD_MERGE_FAILURE = "record_merge_failure"


class Priority(StrEnum):
    P0 = "P0"
    P1 = "P1"
    P2 = "P2"
    P3 = "P3"


class RiskLevel(StrEnum):
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    IRREVERSIBLE = "irreversible"


class CostTier(StrEnum):
    """Model class / service tier, owned by the root task and inherited by every descendant."""

    ECONOMY = "economy"
    STANDARD = "standard"
    PREMIUM = "premium"

    @property
    def rank(self) -> int:
        return list(CostTier).index(self)


class ReportStatus(StrEnum):
    DONE = "done"
    BLOCKED = "blocked"
    IN_PROGRESS = "in_progress"
    ABORTED = "aborted"
