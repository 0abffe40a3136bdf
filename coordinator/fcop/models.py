"""Pydantic models of parsed FCoP envelopes (TASK, REPORT, ISSUE, REVIEW).

Values are normalised (protocol aliases → ``fcop``, priority aliases → P0–P3,
references → ``TASK-YYYYMMDD-NNN``); ``front_matter`` keeps the mapping exactly
as read, in file order, so a rewrite can preserve it, and ``extra`` holds the
keys this layer does not interpret.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from taskkernel.coordinator.fcop.errors import FcopWarning
from taskkernel.coordinator.fcop.filenames import TASK_ID_RE, EnvelopeKind, FcopFilename


class Priority(StrEnum):
    P0 = "P0"
    P1 = "P1"
    P2 = "P2"
    P3 = "P3"


PRIORITY_ALIASES: dict[str, Priority] = {
    "p0": Priority.P0, "p1": Priority.P1, "p2": Priority.P2, "p3": Priority.P3,
    "urgent": Priority.P0, "critical": Priority.P0, "high": Priority.P1,
    "normal": Priority.P2, "medium": Priority.P2, "low": Priority.P3,
}
PROTOCOL_ALIASES = frozenset({"fcop", "agent_bridge", "agent-bridge", "file-coordination", "file_coordination"})
REPORT_STATUSES = frozenset({"done", "blocked", "in_progress", "aborted", "accepted"})
ISSUE_STATUSES = frozenset({"open", "closed", "resolved"})
SEVERITY_ALIASES = {"low": "low", "medium": "medium", "med": "medium", "high": "high",
                    "critical": "critical", "crit": "critical",
                    # field ISSUEs rate severity like priorities
                    "p0": "critical", "p1": "high", "p2": "medium", "p3": "low"}
REVIEW_DECISIONS = frozenset({"approved", "rejected", "needs_changes", "abstained", "needs_human"})
RISK_LEVELS = frozenset({"low", "medium", "high", "irreversible"})


class Transition(BaseModel):
    """One G3 lifecycle event ``{at, from, to, by, tool}`` (+ note, supersedes, unknown keys kept)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, frozen=True)

    at: str
    from_stage: str | None = Field(default=None, alias="from")
    to: str
    by: str
    tool: str
    note: str | None = None
    supersedes: str | None = None

    def to_mapping(self) -> dict[str, Any]:
        """The YAML mapping fcop writes: at, from, to, by, tool, then note/supersedes/extras."""
        out: dict[str, Any] = {"at": self.at, "from": self.from_stage, "to": self.to, "by": self.by,
                               "tool": self.tool}
        if self.note is not None:
            out["note"] = self.note
        if self.supersedes is not None:
            out["supersedes"] = self.supersedes
        for key, value in (self.model_extra or {}).items():
            out.setdefault(key, value)
        return out


class _Envelope(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: FcopFilename
    protocol: str = "fcop"
    version: int = 1
    front_matter: dict[str, Any]
    extra: dict[str, Any] = Field(default_factory=dict)
    body: str
    sha256: str
    size: int
    warnings: tuple[FcopWarning, ...] = ()

    @property
    def id(self) -> str:
        return self.name.id

    @property
    def filename(self) -> str:
        return self.name.render()


class TaskEnvelope(_Envelope):
    kind: Literal[EnvelopeKind.TASK] = EnvelopeKind.TASK
    sender: str
    recipient: str
    priority: Priority = Priority.P2
    subject: str | None = None
    thread_key: str | None = None
    parent: str | None = None
    references: tuple[str, ...] = ()
    supersedes: tuple[str, ...] = ()
    risk_level: str | None = None
    transitions: tuple[Transition, ...] = ()


class ReportEnvelope(_Envelope):
    kind: Literal[EnvelopeKind.REPORT] = EnvelopeKind.REPORT
    sender: str
    recipient: str
    priority: Priority = Priority.P2
    references: tuple[str, ...]
    status: str = "done"
    supersedes: tuple[str, ...] = ()

    @property
    def task_id(self) -> str | None:
        """The TASK this report answers: its first ``TASK-YYYYMMDD-NNN`` reference (fcop's rule)."""
        return next((r for r in self.references if TASK_ID_RE.match(r)), None)


class IssueEnvelope(_Envelope):
    kind: Literal[EnvelopeKind.ISSUE] = EnvelopeKind.ISSUE
    reporter: str
    recipient: str | None = None
    severity: str = "medium"
    status: str = "open"
    summary: str | None = None
    references: tuple[str, ...] = ()


class ReviewEnvelope(_Envelope):
    kind: Literal[EnvelopeKind.REVIEW] = EnvelopeKind.REVIEW
    reviewer: str
    subject_ref: str
    subject_task_id: str | None = None
    subject_type: str | None = None
    decision: str
    rationale: str | None = None
    required_changes: tuple[str, ...] = ()
    decided_at: str | None = None


Envelope = Annotated[TaskEnvelope | ReportEnvelope | IssueEnvelope | ReviewEnvelope, Field(discriminator="kind")]
EnvelopeModel = TaskEnvelope | ReportEnvelope | IssueEnvelope | ReviewEnvelope
