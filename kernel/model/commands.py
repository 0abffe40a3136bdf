"""Command wire format (`taskkernel submit`, MCP and file adapters) as pydantic models.

Shape validation is check 1 of the kernel: anything that fails here is ``invalid_command``, except
a task id out of its grammar or range, which is ``invalid_task_id`` (errors of type TASK_ID_ERROR), and
content the folder projection could not write, which is ``payload_too_large`` (taskkernel.kernel.model.limits).
Numbers are strict: an integer field takes only an integer (not ``true``, ``"1"`` or ``1.0``) within
±2**53, a float field only a finite number, and free-form JSON (payload, transport) is checked the
same way, so what is stored reads back exactly (docs/events.md).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from taskkernel.kernel.canonical import JSON_SAFE_INT, check_json
from taskkernel.kernel.model.ids import TASK_ID_RE as TASK_ID_RE  # re-exported: the grammar other modules match
from taskkernel.kernel.model.ids import task_id_problem
from taskkernel.kernel.model.kinds import CommandType as CommandType  # the enums, re-exported (kinds.py)
from taskkernel.kernel.model.kinds import CostTier as CostTier
from taskkernel.kernel.model.kinds import Priority as Priority
from taskkernel.kernel.model.kinds import ReportStatus as ReportStatus
from taskkernel.kernel.model.kinds import RiskLevel as RiskLevel
from taskkernel.kernel.model.limits import Body, Reason, References, ThreadKey

TASK_ID_ERROR = "invalid_task_id"  # the pydantic error type of a bad task id
Count = Annotated[int, Field(strict=True, ge=0, le=JSON_SAFE_INT)]  # no bool, "1" or 1.0; exact in JSON
MAX_STORED_ROUND = 2**31 - 1  # `round` is an INTEGER column of the read model
# Budget bounds (docs/goals.md): tokens up to the exact-JSON limit; a billion dollars; about 31 years;
# a million attempts. Beyond them a figure is a typo or an attack, never a plan.
MAX_BUDGET_COST_USD = 1e9
MAX_BUDGET_WALL_SECONDS = 1e9
MAX_BUDGET_ATTEMPTS = 1_000_000
_THREAD_SUFFIX_RE = re.compile(r"#TASK-(?:\d{8}-\d{3,}|[0-9a-f]{32}).*$", re.IGNORECASE)


# Commands that bring a task into existence (no expected_revision/round; task_id optional).
CREATING = frozenset({CommandType.CREATE_TASK, CommandType.ADOPT_TASK})
# What the coordinator alone records (a merge it did or could not do): never from a credential (kernel/records.py).
COORDINATOR_ONLY = frozenset({CommandType.RECORD_MERGE, CommandType.RECORD_MERGE_FAILURE})


class TaskBudget(BaseModel):
    """Limits of a root task (and of a goal): strict, finite and bounded, so they are stored exactly."""

    model_config = ConfigDict(extra="forbid")

    tokens: int | None = Field(default=None, strict=True, ge=0, le=JSON_SAFE_INT)
    cost_usd: float | None = Field(default=None, strict=True, allow_inf_nan=False, ge=0, le=MAX_BUDGET_COST_USD)
    wall_seconds: float | None = Field(default=None, strict=True, allow_inf_nan=False, ge=0,
                                       le=MAX_BUDGET_WALL_SECONDS)
    attempts: int | None = Field(default=None, strict=True, ge=0, le=MAX_BUDGET_ATTEMPTS)


def canonical_thread_key(value: str | None) -> str:
    """Strip a ledger lineage suffix (`grid#TASK-20260601-002` -> `grid`) so it is not a second identity."""
    return _THREAD_SUFFIX_RE.sub("", (value or "").strip())


_ROLE_RE = re.compile(r"^[A-Z][A-Z0-9_-]{0,31}$")


def _role(value: str) -> str:
    if not _ROLE_RE.match(value):
        raise ValueError(f"role code {value!r} must be upper-case letters, digits, '-' or '_'")
    return value


def _task_id(value: str | None) -> str | None:
    """A task id in its grammar and ranges, else an error of type TASK_ID_ERROR (reason ``invalid_task_id``)."""
    if value is not None and (problem := task_id_problem(value)):
        raise PydanticCustomError(TASK_ID_ERROR, "{problem}", {"problem": problem})
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)


class CreateTaskPayload(_Strict):
    sender: str
    recipient: str
    subject: str = Field(min_length=1, max_length=500)
    body: Body = ""
    priority: Priority = Priority.P2
    parent: str | None = None
    risk_level: RiskLevel = RiskLevel.LOW
    references: References = Field(default_factory=list)
    cost_tier: CostTier | None = None  # default: the root's (a root defaults to standard)
    budget: TaskBudget | None = None
    # Explicit authority fields override the main-line/branch defaults.
    driver: str | None = None
    done_authority: str | None = None
    archive_authority: str | None = None

    _roles = field_validator("sender", "recipient")(_role)

    @field_validator("driver", "done_authority", "archive_authority")
    @classmethod
    def _opt_role(cls, v: str | None) -> str | None:
        return None if v is None else _role(v)

    _parent_id = field_validator("parent")(_task_id)


class AdoptTaskPayload(CreateTaskPayload):
    """Take over a task that already exists on disk (an imported FCoP workspace) in the state found there."""

    state: Literal["inbox", "active", "review", "done", "archive"]
    round: int = Field(strict=True, ge=0, le=MAX_STORED_ROUND)
    source: str = Field(min_length=1, max_length=1000)  # the file it was adopted from

    @model_validator(mode="after")
    def _round_fits_state(self) -> AdoptTaskPayload:
        if (self.state == "inbox") != (self.round == 0):
            raise ValueError("an inbox task has round 0; a task past the inbox has round >= 1")
        return self


class AttachRecordPayload(_Strict):
    """A REPORT, REVIEW or ISSUE file found on disk that concerns a task: history, recorded whatever the task's
    state (an imported workspace). ``author`` is the role the file names (not ``by``: that is an identity claim)."""

    kind: Literal["report", "review", "issue"]
    record_id: str = Field(min_length=1, max_length=200)
    source: str = Field(min_length=1, max_length=1000)  # the file, relative to the FCoP root
    author: str
    status: str | None = Field(default=None, max_length=100)  # report status, review decision, issue status
    body: Body = ""
    references: References = Field(default_factory=list)

    _author = field_validator("author")(_role)


class EmptyPayload(_Strict):
    pass


class ReasonPayload(_Strict):
    reason: Reason


class OptionalReasonPayload(_Strict):
    reason: Reason | None = None  # why a done task goes back to work (reopen), when the caller says


class RetryPayload(_Strict):
    """`task retry`: why the task deserves another run (recorded as ``reason``, null when not given)."""

    reason: Reason | None = None


class ReportPayload(_Strict):
    status: ReportStatus
    body: Body = ""
    references: References = Field(default_factory=list)
    artifacts: References = Field(default_factory=list)  # paths or URLs of what the work produced (evidence)
    report_id: str | None = Field(default=None, min_length=1, max_length=200)


class AmendPayload(_Strict):
    subject: str | None = Field(default=None, min_length=1, max_length=500)
    body: Body | None = None
    priority: Priority | None = None
    risk_level: RiskLevel | None = None
    references: References | None = None

    @model_validator(mode="after")
    def _something(self) -> AmendPayload:
        if not self.model_dump(exclude_none=True):
            raise ValueError("amend needs at least one field to change")
        return self


class MergedPayload(_Strict):
    """A merge the coordinator did on approval (``task_merged``): the task's branch, the base it went into, the
    base's new head and how (``fast-forward``, ``merge commit``, ``already in the base``)."""

    branch: str = Field(min_length=1, max_length=300)
    base: str = Field(min_length=1, max_length=300)
    commit: str = Field(pattern=r"^[0-9a-f]{40,64}$")
    how: str = Field(min_length=1, max_length=100)


class MergeFailurePayload(_Strict):
    """A merge on approval that waits for a person (``merge_failed``): why, as git or the checkout said."""

    error: Reason


class RequiredState(_Strict):
    entity: str | None = None
    key: str = Field(min_length=1)
    equals: Any = None


class PerformPayload(_Strict):
    """A tool call the driver wants to make for its task, judged by the execution gate at execution time.

    ``based_on_event``/``permission_event`` cite session-log input ids; ``plan_seq`` is the session
    sequence the plan was formed at (default: now)."""

    operation: str = Field(min_length=1, max_length=100)
    entity: str = Field(min_length=1, max_length=500)
    tool: str = Field(min_length=1, max_length=100)
    args: dict[str, Any] = Field(default_factory=dict)
    based_on_event: str | list[str] | None = None
    permission_event: str | None = None
    requires_state: RequiredState | None = None
    plan_seq: Count | None = None


PAYLOAD_MODELS: dict[CommandType, type[BaseModel]] = {
    CommandType.CREATE_TASK: CreateTaskPayload,
    CommandType.CLAIM: EmptyPayload,
    CommandType.SUBMIT: EmptyPayload,
    CommandType.APPROVE: EmptyPayload,
    CommandType.REOPEN: OptionalReasonPayload,
    CommandType.REJECT: ReasonPayload,
    CommandType.ARCHIVE: ReasonPayload,
    CommandType.FORCE_ARCHIVE: ReasonPayload,
    CommandType.SUBMIT_REPORT: ReportPayload,
    CommandType.AMEND: AmendPayload,
    CommandType.PERFORM: PerformPayload,
    CommandType.ADOPT_TASK: AdoptTaskPayload,
    CommandType.ATTACH_RECORD: AttachRecordPayload,
    CommandType.RETRY: RetryPayload,
    CommandType.RECORD_MERGE: MergedPayload,
    CommandType.RECORD_MERGE_FAILURE: MergeFailurePayload,
}

# Payload keys through which a caller might try to speak for someone else (check 2).
IDENTITY_CLAIM_KEYS = ("actor", "role", "by", "principal", "agent", "as_role")
_CLAIM_KEYS = frozenset(IDENTITY_CLAIM_KEYS)  # for the usual case, a payload naming none of them (one C call)


class Command(BaseModel):
    """One task command. ``payload`` is validated per type into ``body``."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    type: CommandType
    task_id: str | None = None
    thread_key: ThreadKey | None = None
    root: str | None = None
    expected_revision: Count | None = None
    round: Count | None = None
    idempotency_key: str = Field(min_length=1, max_length=300)
    payload: dict[str, Any] = Field(default_factory=dict)
    # Protected actions cite the evidence they are based on (see docs/reason-codes.md).
    based_on_event: int | None = Field(default=None, strict=True, ge=1, le=JSON_SAFE_INT)
    permission_session: str | None = Field(default=None, min_length=1, max_length=200)
    permission_as_of: Count | None = None  # session-log cutoff the command was formed at
    transport: dict[str, Any] | None = None  # free-form metadata, excluded from the semantic digest

    _task_ids = field_validator("task_id", "root")(_task_id)

    @field_validator("payload", "transport")
    @classmethod
    def _exact_json(cls, v: dict[str, Any] | None, info: ValidationInfo) -> dict[str, Any] | None:
        if v is not None:
            check_json(v, info.field_name or "value")
        return v

    @model_validator(mode="after")
    def _targeting(self) -> Command:
        if self.type in CREATING:
            if self.expected_revision is not None or self.round is not None:
                raise ValueError(f"{self.type.value} takes no expected_revision or round")
        else:
            # thread_key may be omitted: the kernel reads it from the task (a supplied one is checked)
            missing = [name for name in ("task_id", "expected_revision", "round") if getattr(self, name) is None]
            if missing:
                raise ValueError(f"{self.type.value} requires {', '.join(missing)}")
        return self

    def identity_claims(self) -> dict[str, Any]:
        if _CLAIM_KEYS.isdisjoint(self.payload):
            return {}
        return {k: self.payload[k] for k in IDENTITY_CLAIM_KEYS if k in self.payload}

    def validated_payload(self) -> BaseModel:
        """The payload checked against its type's model (validated once, then cached in the instance's
        ``__dict__`` as ``functools.cached_property`` did, without its per-call descriptor and lock)."""
        cached = self.__dict__.get("_payload_model")
        if cached is None:
            body = self.payload if _CLAIM_KEYS.isdisjoint(self.payload) else {
                k: v for k, v in self.payload.items() if k not in _CLAIM_KEYS}
            cached = self.__dict__["_payload_model"] = PAYLOAD_MODELS[self.type].model_validate(body)
        return cached

    def semantic_view(self, principal_id: str) -> dict[str, Any]:
        """What makes two submissions 'the same command' (excludes revision, round, transport)."""
        return {"type": str(self.type), "task_id": self.task_id,  # str(): the StrEnum's value, without a frame
                "thread_key": canonical_thread_key(self.thread_key) if self.thread_key else None,
                "principal": principal_id, "payload": self.payload,
                "based_on_event": self.based_on_event, "permission_session": self.permission_session,
                "permission_as_of": self.permission_as_of}


CommandStatus = Literal["accepted", "replayed", "rejected"]


class CommandResult(BaseModel):
    status: CommandStatus
    reason: str | None = None
    message: str = ""
    task_id: str | None = None
    revision: int | None = None
    round: int | None = None
    events: list[int] = Field(default_factory=list)  # global positions appended (empty unless accepted)

    @property
    def ok(self) -> bool:
        return self.status != "rejected"

    def wire(self) -> dict[str, Any]:
        """The exact JSON `taskkernel submit` prints."""
        return {"status": self.status, "reason": self.reason, "message": self.message,
                "task_id": self.task_id, "revision": self.revision, "round": self.round}
