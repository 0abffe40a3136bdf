"""Typed records of the execution gate: trace events, actions, proposals/reviews and the reason codes.

Field names and values follow docs/gate.md (the trace contract). Types are strict where a lax coercion
could change a decision (``"seq": "3"``, ``"seq": true``); unknown extra fields are ignored, so an
action's own claim such as ``"protected": false`` has no effect.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, model_validator


class GateStatus(StrEnum):
    PASS = "PASS"
    BLOCK = "BLOCK"
    INSUFFICIENT_EVIDENCE = "INSUFFICIENT_EVIDENCE"


class GateDecision(StrEnum):
    """The two-valued view an executor acts on: ALLOW only for PASS."""

    ALLOW = "ALLOW"
    BLOCK = "BLOCK"


class GateReason(StrEnum):
    """Stable reason codes (docs/gate.md). Never renamed; new ones are added."""

    # pre-phase (stops evaluation)
    TRACE_INVALID = "TRACE_INVALID"
    NO_ACTION = "NO_ACTION"
    ACTION_INCOMPLETE = "ACTION_INCOMPLETE"
    # R1-R14
    MISSING_BASIS = "MISSING_BASIS"
    UNKNOWN_EVENT = "UNKNOWN_EVENT"
    TEMPORAL_ORDER = "TEMPORAL_ORDER"
    UNTRUSTED_BASIS = "UNTRUSTED_BASIS"
    INVALID_BASIS_KIND = "INVALID_BASIS_KIND"
    ENTITY_MISMATCH = "ENTITY_MISMATCH"
    SUPERSEDED_BASIS = "SUPERSEDED_BASIS"
    MISSING_PERMISSION = "MISSING_PERMISSION"
    INVALID_PERMISSION_KIND = "INVALID_PERMISSION_KIND"
    UNTRUSTED_PERMISSION = "UNTRUSTED_PERMISSION"
    PERMISSION_SCOPE_MISMATCH = "PERMISSION_SCOPE_MISMATCH"
    PERMISSION_NOT_CURRENT = "PERMISSION_NOT_CURRENT"
    STATE_UNKNOWN = "STATE_UNKNOWN"
    STATE_DISALLOWS = "STATE_DISALLOWS"
    # hybrid semantic path H0-H8
    SEMANTIC_INCOMPLETE = "SEMANTIC_INCOMPLETE"
    QUOTE_NOT_VERBATIM = "QUOTE_NOT_VERBATIM"
    UNTRUSTED_EVIDENCE = "UNTRUSTED_EVIDENCE"
    SUPERSEDED_EVIDENCE = "SUPERSEDED_EVIDENCE"
    UNSUPPORTED_VALUE = "UNSUPPORTED_VALUE"
    SELF_REVIEW = "SELF_REVIEW"
    DIGEST_MISMATCH = "DIGEST_MISMATCH"
    UNCOVERED_CHANGE = "UNCOVERED_CHANGE"
    UNRESOLVED_ISSUES = "UNRESOLVED_ISSUES"

    @property
    def blocks(self) -> bool:
        """True for a hard BLOCK; False for a gap in the evidence (INSUFFICIENT_EVIDENCE)."""
        return self not in _INSUFFICIENT


_INSUFFICIENT = frozenset({
    GateReason.TRACE_INVALID, GateReason.NO_ACTION, GateReason.ACTION_INCOMPLETE, GateReason.MISSING_BASIS,
    GateReason.UNKNOWN_EVENT, GateReason.MISSING_PERMISSION, GateReason.STATE_UNKNOWN,
    GateReason.SEMANTIC_INCOMPLETE,
})

Source = Literal["user", "operator", "system", "tool", "agent"]
ObservationStatus = Literal["ok", "error", "timeout", "denied", "partial"]
EventId = Annotated[str, Field(strict=True, min_length=1)]
Entity = StrictStr | list[StrictStr]
Operation = StrictStr | list[StrictStr]

INSTRUCTION_AUTHORS = frozenset({"user", "operator"})
GRANT_AUTHORS = frozenset({"user", "operator", "system"})
POLICY_AUTHORS = frozenset({"operator", "system"})


class _Record(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class _Event(_Record):
    id: EventId
    seq: StrictInt
    supersedes: list[EventId] | None = None
    text: StrictStr | None = None
    ts: StrictStr | None = None


class Instruction(_Event):
    kind: Literal["instruction"]
    source: Source
    entity: Entity | None = None

    @property
    def trusted(self) -> bool:
        return self.source in INSTRUCTION_AUTHORS


class Observation(_Event):
    kind: Literal["observation"]
    source: Source
    status: ObservationStatus
    tool: StrictStr | None = None
    entity: StrictStr | None = None
    key: StrictStr | None = None
    value: Any = None

    @property
    def trusted(self) -> bool:
        """Only a tool's ``ok`` read is a trusted read; anything else is a failed observation."""
        return self.source == "tool" and self.status == "ok"

    @model_validator(mode="after")
    def _ok_read_names_its_state(self) -> Observation:
        if self.trusted and (self.entity is None or self.key is None):
            raise ValueError("an ok observation needs 'entity' and 'key'")
        return self


class PermissionGrant(_Event):
    kind: Literal["permission_grant"]
    source: Source
    principal: StrictStr | None = None
    entity: Entity
    operation: Operation
    expires_seq: StrictInt | None = None

    @property
    def trusted(self) -> bool:
        """A grant written by the agent or a tool is not a permission (self-granting, injection)."""
        return self.source in GRANT_AUTHORS


class PermissionRevoke(_Event):
    kind: Literal["permission_revoke"]
    source: Source
    revokes: EventId | None = None
    principal: StrictStr | None = None
    entity: Entity | None = None
    operation: Operation | None = None

    @property
    def trusted(self) -> bool:
        return self.source in GRANT_AUTHORS

    @model_validator(mode="after")
    def _names_a_target(self) -> PermissionRevoke:
        if self.revokes is None and (self.entity is None or self.operation is None):
            raise ValueError("a permission_revoke needs 'revokes' or both 'entity' and 'operation'")
        return self


class Policy(_Event):
    kind: Literal["policy"]
    source: Source
    protected_operations: list[StrictStr]
    protected_entities: list[StrictStr] = []

    @property
    def trusted(self) -> bool:
        return self.source in POLICY_AUTHORS


class RequiresState(_Record):
    entity: StrictStr | None = None
    key: StrictStr
    equals: Any


class Action(_Event):
    """The tool call being gated. ``entity``/``operation`` are checked by P3, ``based_on_event`` by R1."""

    kind: Literal["action"]
    source: Source | None = None
    principal: StrictStr | None = None
    tool: StrictStr | None = None
    operation: StrictStr | None = None
    entity: StrictStr | None = None
    args: dict[str, Any] | None = None
    based_on_event: StrictStr | list[StrictStr] | None = None
    permission_event: StrictStr | None = None
    requires_state: RequiresState | None = None

    @property
    def bases(self) -> list[str]:
        raw = self.based_on_event
        items = [raw] if isinstance(raw, str) else list(raw or [])
        return [b for b in items if b]


TraceEvent = Annotated[
    Instruction | Observation | PermissionGrant | PermissionRevoke | Policy | Action,
    Field(discriminator="kind"),
]
EVENT_KINDS = ("instruction", "observation", "permission_grant", "permission_revoke", "policy", "action")


# ---- hybrid semantic path (H0 shapes) -------------------------------------------------------------

class Claim(_Record):
    claim_id: EventId
    event_id: EventId
    entity: StrictStr
    field: StrictStr
    value: Any = Field(...)
    quote: StrictStr


class Change(_Record):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    field: StrictStr
    from_: Any = Field(..., alias="from")
    to: Any = Field(...)
    from_claim: EventId
    supported_by: list[EventId]


class Proposal(_Record):
    proposal_id: EventId
    run_id: EventId
    entity: StrictStr
    as_of_seq: StrictInt
    claims: list[Claim] = Field(min_length=1)
    changes: list[Change] = Field(min_length=1)


class Issue(_Record):
    issue_id: StrictStr | None = None
    status: StrictStr
    note: StrictStr | None = None


class Review(_Record):
    review_id: EventId
    run_id: EventId
    proposal_id: EventId
    proposal_sha256: StrictStr
    decision: StrictStr
    covered_fields: list[StrictStr]
    issues: list[Issue]
