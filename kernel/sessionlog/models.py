"""Value types of the session log: input kinds, reason codes, per-kind payloads, results.

The replay hot path works on ``Rec`` tuples only; pydantic validates at the edges
(accepting an input, reading an interchange file), never once per record in replay.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError

from taskkernel.kernel.canonical import check_json
from taskkernel.kernel.sessionlog.kinds import INSTRUCTION_KIND_NAMES as INSTRUCTION_KIND_NAMES  # re-exported
from taskkernel.kernel.sessionlog.kinds import INSTRUCTION_KINDS as INSTRUCTION_KINDS
from taskkernel.kernel.sessionlog.kinds import InputKind as InputKind


class SessionReason(StrEnum):
    """Stable codes (docs/sessionlog.md). Never rename a value; add new ones."""

    MISSING_SEQUENCE = "missing_sequence"  # a gap, or an unsequenced record among sequenced ones
    DUPLICATE_SEQUENCE = "duplicate_sequence"  # two accepted records claim one sequence number
    DUPLICATE_INPUT = "duplicate_input"  # one input_id at two different sequence numbers
    IDEMPOTENCY_CONFLICT = "idempotency_conflict"  # known input_id, different content
    SEQUENCE_CONFLICT = "sequence_conflict"  # import: a sequence disagrees with the stored log
    INVALID_INPUT = "invalid_input"  # kind/payload/boundary not valid
    INPUT_REFUSED = "input_refused"  # this input_id was received and refused earlier
    TURN_INCOMPLETE = "turn_incomplete"  # accepted inputs not consumed yet: the turn continues
    NO_SAFE_ANCHOR = "no_safe_anchor"  # resume cannot determine where to continue
    NO_CHECKPOINT = "no_checkpoint"  # resume cause: no progress checkpoint before the compaction
    READ_BOUND_EXCEEDED = "read_bound_exceeded"  # resume cause: the answer lies beyond the read bound
    UNKNOWN_SESSION = "unknown_session"  # no record of this session
    UNREADABLE_FILE = "unreadable_file"  # interchange file missing, not UTF-8 JSON lines, or invalid record
    NOT_AUTHORIZED = "role_not_authorized"  # the caller may not write (or read) this session, or this kind
    INVALID_GRANT = "invalid_grant"  # an allow/revoke whose permission and scope nothing reads (grants.py)


class SessionLogError(Exception):
    """A rejection as a value: a stable code plus a human message."""

    def __init__(self, reason: SessionReason, message: str) -> None:
        super().__init__(f"{reason.value}: {message}")
        self.reason = reason
        self.message = message


# --- payloads, validated per kind (extra fields are kept and digested) ---------------------------


class _Payload(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class TextPayload(_Payload):
    text: str
    entity: str | None = Field(default=None, min_length=1)  # what the instruction is about (for the gate)
    supersedes: list[str] | None = None  # input ids this instruction replaces


class AnswerPayload(TextPayload):
    question_id: str | None = None


class PermissionPayload(_Payload):
    permission: str = Field(min_length=1)
    scope: str = Field(min_length=1)
    # optional, read by the execution gate: checked here so a malformed grant is refused at the door
    principal: str | None = Field(default=None, min_length=1)
    expires_seq: StrictInt | None = Field(default=None, ge=1)
    single_use: StrictBool = False
    revokes: str | None = Field(default=None, min_length=1)
    supersedes: list[str] | None = None


class ProgressPayload(_Payload):
    text: str
    completed_tool_calls: StrictInt = Field(ge=0)
    done: StrictBool = False


class CompactionPayload(_Payload):
    summary: str
    covers_to_seq: StrictInt | None = Field(default=None, ge=0)


class RollbackPayload(_Payload):
    to_seq: StrictInt = Field(ge=0)


class ObservationPayload(_Payload):
    tool: str = Field(min_length=1)
    status: Literal["ok", "error", "timeout", "denied", "partial"]
    entity: str = Field(min_length=1)
    key: str = Field(min_length=1)
    value: Any = None
    supersedes: list[str] | None = None


PAYLOAD_MODELS: dict[InputKind, type[_Payload]] = {
    InputKind.MESSAGE: TextPayload,
    InputKind.STEER: TextPayload,
    InputKind.QUEUED: TextPayload,
    InputKind.ANSWER: AnswerPayload,
    InputKind.ALLOW: PermissionPayload,
    InputKind.REVOKE: PermissionPayload,
    InputKind.PROGRESS: ProgressPayload,
    InputKind.COMPACTION: CompactionPayload,
    InputKind.ROLLBACK: RollbackPayload,
    InputKind.OBSERVATION: ObservationPayload,
}


def validate_payload(kind: InputKind, payload: Any) -> dict[str, Any]:
    """Check a payload against its kind; returns it unchanged (extra keys kept) or raises INVALID_INPUT."""
    if not isinstance(payload, dict):
        raise SessionLogError(SessionReason.INVALID_INPUT, f"{kind.value}: payload must be a JSON object")
    try:
        check_json(payload, "payload")  # stored as canonical JSON: NaN or a 2**64 integer would not read back
    except ValueError as exc:
        raise SessionLogError(SessionReason.INVALID_INPUT, f"{kind.value}: {exc}") from None
    try:
        PAYLOAD_MODELS[kind].model_validate(payload)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "payload"
        raise SessionLogError(SessionReason.INVALID_INPUT, f"{kind.value}: {where}: {first['msg']}") from None
    return payload


def check_boundary(kind: InputKind, payload: dict[str, Any], seq: int) -> None:
    """A rollback/compaction boundary must lie before the record that carries it."""
    field = {InputKind.ROLLBACK: "to_seq", InputKind.COMPACTION: "covers_to_seq"}.get(kind)
    bound = payload.get(field) if field else None
    if bound is not None and bound >= seq:
        raise SessionLogError(
            SessionReason.INVALID_INPUT, f"{kind.value}: {field}={bound} must be below its own sequence {seq}"
        )


class SessionInput(BaseModel):
    """What a host submits to ``SessionLog.accept``."""

    model_config = ConfigDict(frozen=True)

    input_id: str = Field(min_length=1, max_length=256)
    kind: InputKind
    payload: dict[str, Any] = Field(default_factory=dict)


# --- the record tuple used by replay -------------------------------------------------------------


class Rec(NamedTuple):
    """One stored or interchanged record. Field order is the hot-path layout."""

    seq: int | None  # acceptance sequence; None = unsequenced (legacy or refused)
    input_id: str
    kind: str
    payload: dict[str, Any]
    accepted: bool = True
    legacy: bool = False  # explicitly marked legacy by an import or migration
    log_last_seq: int | None = None  # the log's last sequence when this record was written out
    received_at: str | None = None
    refusal: str | None = None  # why a received input was not accepted
    accepted_by: str | None = None  # the principal (ROLE:agent) the host accepted it from; decides trust


# --- results -------------------------------------------------------------------------------------


class AcceptResult(BaseModel):
    session: str
    input_id: str
    accept_seq: int | None
    status: Literal["accepted", "replayed", "refused"]
    reason: str | None = None  # the refusal reason when status == "refused"


class TurnResult(BaseModel):
    session: str
    status: Literal["completed", "continue"]
    reason: SessionReason | None  # TURN_INCOMPLETE when the turn must continue
    last_seq: int
    last_consumed_seq: int
    pending: list[int]  # accepted but not yet consumed sequences
    turns_completed: int


class PermissionDecision(NamedTuple):
    """What the kernel asks before a command that needs a human grant.

    ``seq``/``input_id`` cite the allow or revoke that decided; both are None for the
    initial deny. ``reason`` is set when the log could not be replayed (then: deny).
    """

    decision: Literal["allow", "deny"]
    seq: int | None
    input_id: str | None = None
    reason: SessionReason | None = None
