"""Every tool's arguments and results, as pydantic models, and the JSON Schemas the server lists.

Arguments use the CLI's JSON names (``task_id``, ``status``, ``body``, ``artifacts``, ``reason``, ``expect_rev``,
``round``, ``idempotency_key``) and are checked strictly: an unknown argument, a string for an integer or a
missing required argument is a malformed call (a protocol error), never a guess. Results are objects: a command
tool answers `taskkernel submit`'s document (``status`` accepted/replayed/rejected, ``reason``, ``message``,
``task_id``, ``revision``, ``round``) plus the idempotency key used and, for a refusal a person can lift, the
command that lifts it; every other tool answers its own document with ``status: "ok"`` (``resume``: the resume
answer's own status), or the same refusal document (``status: "rejected"``). So each tool's output schema admits
both, and a refusal validates against it too.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

STATES = ("inbox", "active", "review", "done", "archive")
PRIORITIES = ("P0", "P1", "P2", "P3")
RISKS = ("low", "medium", "high", "irreversible")
REPORT_STATUSES = ("done", "blocked", "in_progress", "aborted")
GROUPINGS = ("root", "task", "role", "feature", "agent")

TaskId = Annotated[str, Field(min_length=1, max_length=100, description="A task id, e.g. TASK-20260101-001.")]
Role = Annotated[str, Field(min_length=1, max_length=32, description="A role code, e.g. DEV.")]
Session = Annotated[str, Field(min_length=1, max_length=200)]
Count = Annotated[int, Field(ge=0, le=2**53)]
InputId = Annotated[str, Field(min_length=1, max_length=200)]
MAX_BASED_ON = 32  # input ids one planned action may cite


class Args(BaseModel):
    """Tool arguments: unknown keys and loose types are refused (a malformed call)."""

    model_config = ConfigDict(extra="forbid", strict=True)


class CommandOptions(Args):
    expect_rev: Count | None = Field(None, description="Refuse with stale_task_revision unless the task is at "
                                                       "this revision (--expect-rev). Default: its revision now.")
    round: Count | None = Field(None, description="Refuse with stale_round unless the task is in this round "
                                                  "(--round). Default: its round now.")
    idempotency_key: str | None = Field(None, min_length=1, max_length=300, description=(
        "Idempotency key (--key). Default: derived from you, the verb, the task, its round and the content, so a "
        "retry of the same call replays instead of acting twice."))


class NoArgs(Args):
    pass


class ListTasksArgs(Args):
    state: Literal["inbox", "active", "review", "done", "archive", "blocked"] | None = Field(None, description=(
        "Only tasks in this state. blocked: the active tasks whose latest report of the round is blocked; active: "
        "the active tasks that are not blocked."))
    assigned_to_me: bool = Field(False, description="Only tasks you drive (authority.driver is your role).")
    waiting_for_my_review: bool = Field(False, description="Only tasks in review whose done authority is your "
                                                           "role.")
    root: TaskId | None = Field(None, description="Only the tasks of this tree (the root task's id).")
    parent: TaskId | None = Field(None, description="Only the children of this task.")
    limit: int = Field(50, ge=1, le=1000, description="At most this many tasks (fewer if the output budget "
                                                      "is reached: then truncated is true).")
    cursor: str | None = Field(None, min_length=1, max_length=2000,
                               description="next_cursor of the previous page, with the same filters.")


class GetTaskArgs(Args):
    task_id: TaskId
    history_limit: int = Field(20, ge=0, le=1000, description="The newest history entries to include.")
    report_id: str | None = Field(None, min_length=1, max_length=200,
                                  description="Only this report, its body read from body_offset.")
    body_offset: int = Field(0, ge=0, le=2**31, description="Read the task's body (or report_id's) from this "
                                                            "character: a cut body's body_next says where.")
    live_limit: int = Field(10, ge=0, le=200, description="The newest live events of its agents' runs to include.")


class Budget(Args):
    tokens: Count | None = None
    cost_usd: float | None = Field(None, ge=0)
    wall_seconds: float | None = Field(None, ge=0)
    attempts: Count | None = None


class CreateTaskArgs(Args):
    recipient: Role = Field(description="The role the task is for (the CLI's --to).")
    subject: str = Field(min_length=1, max_length=500)
    body: str = ""
    priority: Literal["P0", "P1", "P2", "P3"] | None = None
    parent: TaskId | None = None
    risk_level: Literal["low", "medium", "high", "irreversible"] | None = None
    references: list[str] = Field(default_factory=list)
    cost_tier: Literal["economy", "standard", "premium"] | None = None
    budget: Budget | None = None
    driver: Role | None = None
    done_authority: Role | None = None
    archive_authority: Role | None = None
    idempotency_key: str | None = Field(None, min_length=1, max_length=300, description=(
        "Idempotency key. Default: derived from you and the content, so an identical create replays (one task); "
        "pass a key to create a twin on purpose."))


class TaskArgs(CommandOptions):
    task_id: TaskId


class ReportArgs(TaskArgs):
    status: Literal["done", "blocked", "in_progress", "aborted"]
    body: str = ""
    artifacts: list[str] = Field(default_factory=list, description="Paths or URLs of what the work produced.")
    references: list[str] = Field(default_factory=list)


class RejectArgs(TaskArgs):
    reason: str = Field(min_length=1, description="Why the work goes back (a new round starts).")


class ArchiveArgs(TaskArgs):
    reason: str | None = Field(None, min_length=1, description="Why it is archived (default: \"archived\").")


class RetryArgs(TaskArgs):
    reason: str | None = Field(None, min_length=1, description="Why another run should do better (recorded).")


class SayArgs(Args):
    task_id: TaskId
    text: str = Field(min_length=1, max_length=16384, description="What to tell the task's agent.")
    mode: Literal["message", "steer", "queue", "answer"] = Field("message", description=(
        "message/steer: delivered at its next tool call; queue: at its next run; answer: answers question_id."))
    question_id: str | None = Field(None, min_length=1, max_length=200, description="With mode answer: the "
                                    "question answered.")
    anchor: str | None = Field(None, min_length=3, max_length=310, description=(
        "PATH:LINE of the task's change the instruction is about (an inline comment on its diff)."))
    input_id: InputId | None = Field(None, description="Idempotency id (default: a new one per call).")


class InterruptArgs(Args):
    task_id: TaskId
    message: str | None = Field(None, min_length=1, max_length=16384, description=(
        "The resumed run's newest instruction (without one, the agent stays stopped until told or retried)."))


class AddProgressArgs(Args):
    text: str = Field(min_length=1, description="Where you are: what is done, what comes next.")
    completed_tool_calls: Count = Field(0, description="Tool calls completed so far.")
    done: bool = Field(False, description="Nothing is left to do (resume then answers complete).")
    session: Session | None = Field(None, description="Default: your own session (whoami says which).")
    input_id: str | None = Field(None, min_length=1, max_length=200, description=(
        "Idempotency id within the session. Default: derived from the content, so a retry replays."))


class ResumeArgs(Args):
    session: Session | None = Field(None, description="Default: your own session (whoami says which).")
    max_inputs: int | None = Field(None, ge=1, le=10**6, description="Read bound: newest inputs.")
    max_bytes: int | None = Field(None, ge=1, le=2**31, description="Read bound: payload bytes.")
    cursor: str | None = Field(None, min_length=1, max_length=2000,
                               description="next_cursor of a cut answer: the instructions after it.")


class RequiredStateArgs(Args):
    entity: str | None = None
    key: str = Field(min_length=1)
    equals: Any = None


class ActionArgs(Args):
    task_id: TaskId
    operation: str = Field(min_length=1, max_length=100, description="e.g. write, deploy, read.")
    entity: str = Field(min_length=1, max_length=500, description="What the action changes, e.g. file:src/a.py.")
    tool: str = Field(min_length=1, max_length=100, description="The tool that would do it, e.g. write_file.")
    args: dict[str, Any] = Field(default_factory=dict)
    based_on_event: InputId | Annotated[list[InputId], Field(max_length=MAX_BASED_ON)] | None = Field(
        None, description="Session input id(s) the plan relies on (at most 32).")
    permission_event: str | None = Field(None, description="The grant (an allow input id) that permits it.")
    requires_state: RequiredStateArgs | None = None
    plan_seq: Count | None = Field(None, description="Session sequence the plan was formed at (default: now).")
    session: Session | None = Field(None, description="Session the trace is read from (default: the gate's, "
                                                      "[gate] session).")


class PerformArgs(ActionArgs, CommandOptions):
    pass


class UsageArgs(Args):
    by: Literal["root", "task", "role", "feature", "agent"] = "root"
    since: str | None = Field(None, min_length=1, max_length=64,
                              description="An ISO time (2026-11-30T23:59Z) or an age (30m, 24h, 7d, 2w).")
    limit: int = Field(100, ge=1, le=1000)
    cursor: str | None = Field(None, min_length=1, max_length=2000)


# -- results ---------------------------------------------------------------------------------------------------

class Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Refusal(Out):
    """Why nothing was done: a stable reason code, a message, and where the task really is."""

    status: Literal["rejected"]
    reason: str
    message: str
    task_id: str | None = None
    revision: int | None = None
    round: int | None = None
    hint: str | None = None


class CommandOut(Out):
    """`taskkernel submit`'s document, with the key the command was submitted under."""

    status: Literal["accepted", "replayed", "rejected"]
    reason: str | None = None
    message: str
    task_id: str | None = None
    revision: int | None = None
    round: int | None = None
    idempotency_key: str | None = None
    hint: str | None = Field(None, description="For a refusal a person can lift: the command that lifts it.")


class Next(Out):
    """The call that reads on: a tool and its arguments."""

    tool: str
    arguments: dict[str, Any]


class PrincipalOut(Out):
    id: str
    role: str
    agent: str
    task_id: str | None
    round: int | None
    provenance: str
    admin: bool


class WhoamiOut(Out):
    status: Literal["ok"]
    principal: PrincipalOut
    session: str = Field(description="Your own session: where add_progress writes and resume reads by default.")
    transport: Literal["stdio", "http"]
    workspace: str | None
    output_budget: int


class BlockedOut(Out):
    report_id: str
    reason: str = Field(description="The blocked report's first non-blank line, at most 300 characters.")
    by: str | None
    at: str


class TaskRow(Out):
    task_id: str
    state: str
    revision: int
    round: int
    sender: str | None
    recipient: str | None
    subject: str | None
    priority: str | None
    risk_level: str | None
    parent: str | None
    root: str | None
    thread_key: str | None
    blocked: BlockedOut | None = Field(description="null, or the blocked report the task waits on: its latest "
                                                   "report of the round said blocked.")


class ListTasksOut(Out):
    status: Literal["ok"]
    tasks: list[TaskRow]
    count: int
    truncated: bool = Field(description="Fewer tasks than asked, to stay within the output budget.")
    next_cursor: str | None = Field(description="Pass as cursor (same filters) for the next page; null: no more.")


class ReportOut(Out):
    report_id: str | None
    round: int | None
    status: str | None
    by: str | None
    at: str | None
    body: str
    body_chars: int
    body_truncated: bool
    body_next: Next | None
    artifacts: list[str]
    references: list[str]
    diff: dict[str, Any] | None = Field(default=None, description="A done report's change in the task's git "
                                        "worktree, recorded by the coordinator: range, commits, files_changed, "
                                        "insertions, deletions, files (the first 50), patch (a file path).")


class HistoryOut(Out):
    model_config = ConfigDict(extra="allow")

    revision: int
    global_pos: int
    type: str
    by: str | None
    at: str


class LiveEventOut(Out):
    run_id: str
    n: int
    attempt: int
    at: str
    kind: str
    tool: str | None
    text: str


class GetTaskOut(Out):
    status: Literal["ok"]
    task: dict[str, Any] = Field(description="The task's document without its reports (they are `reports`); its "
                                             "body possibly cut: see body_next.")
    body_chars: int
    body_truncated: bool
    body_next: Next | None
    reports: list[ReportOut]
    reports_total: int
    children: list[TaskRow]
    children_total: int
    children_next: Next | None
    history: list[HistoryOut] = Field(description="The newest entries, oldest first.")
    history_total: int
    live: list[LiveEventOut] = Field(description="What its agents did last (typed run events), oldest first.")
    truncated: bool


class SayOut(Out):
    status: Literal["accepted", "replayed"]
    task_id: str
    session: str
    input_id: str
    accept_seq: int | None
    kind: str
    queued_run: str | None


class InterruptOut(Out):
    status: Literal["requested", "replayed"]
    task_id: str
    run_id: str
    requested_by: str
    message_seq: int | None


class InputOut(Out):
    accept_seq: int
    kind: str
    text: str
    text_truncated: bool
    question_id: str | None
    anchor: str | None = Field(description="PATH:LINE of the change it is about, or null.")
    by: str | None


class ReadInputsOut(Out):
    status: Literal["ok"]
    session: str
    inputs: list[InputOut] = Field(description="In acceptance order; each now consumed.")
    remaining: int = Field(description="Still pending after these (call read_inputs again).")


class PendingNotice(Out):
    """On every result of a run's call while instructions wait for it."""

    count: int
    tool: Literal["read_inputs"]
    message: str


class ProgressOut(Out):
    status: Literal["accepted", "replayed"]
    session: str
    input_id: str
    accept_seq: int


class AnchorOut(Out):
    seq: int | None
    input_id: str
    text: str
    text_truncated: bool
    completed_tool_calls: int
    done: bool


class CompactionOut(Out):
    seq: int | None
    input_id: str
    covers_to_seq: int | None


class InstructionOut(Out):
    seq: int | None
    input_id: str
    kind: str
    text: str
    text_truncated: bool = False


class ReadOut(Out):
    max_inputs: int
    max_bytes: int
    inputs_read: int
    bytes_read: int
    from_seq: int | None
    to_seq: int | None
    complete: bool


class ResumeOut(Out):
    status: Literal["resume", "complete", "no_safe_anchor"]
    session: str
    reason: str | None
    cause: str | None
    anchor: AnchorOut | None
    compaction: CompactionOut | None
    instructions: list[InstructionOut]
    read: ReadOut
    truncated: bool
    next_cursor: str | None


class GateReasonOut(Out):
    model_config = ConfigDict(extra="allow")

    code: str
    rule: str | None = None
    detail: str | None = None


class VerdictOut(Out):
    model_config = ConfigDict(extra="allow")

    status: Literal["PASS", "BLOCK", "INSUFFICIENT_EVIDENCE"]
    decision: Literal["ALLOW", "BLOCK"]
    action_id: str | None
    trace_sha256: str | None
    trace_head_seq: int | None
    protected: bool | None
    policy_event: str | None
    reasons: list[GateReasonOut]
    checks: list[dict[str, Any]] | None = Field(None, description="Every rule application (dropped first when "
                                                                  "the output budget is short: truncated).")
    cited_events: list[str]


class CheckActionOut(Out):
    status: Literal["ok"]
    allowed: bool = Field(description="true only for PASS: perform would pass the gate now.")
    task_id: str
    state: str
    revision: int
    round: int
    session: str
    session_head_seq: int
    plan_seq: int
    verdict: VerdictOut
    truncated: bool


class UsageRow(Out):
    owner: str | None
    units: int
    wall_ms: int
    tokens_in: int
    tokens_out: int
    cost_usd: float


class UsageTotal(Out):
    units: int
    wall_ms: int
    tokens_in: int
    tokens_out: int
    cost_usd: float


class UsageOut(Out):
    status: Literal["ok"]
    by: str
    since: str | None
    rows: list[UsageRow]
    total: UsageTotal
    truncated: bool
    next_cursor: str | None


# -- JSON Schemas ------------------------------------------------------------------------------------------------

def _inline(node: Any, defs: dict[str, Any]) -> Any:
    """``node`` with every ``#/$defs/X`` reference replaced by X itself (the models are not recursive), so each
    schema stands alone: hosts that do not resolve references read it as well."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            rest = {k: v for k, v in node.items() if k != "$ref"}
            return _inline({**defs[ref.removeprefix("#/$defs/")], **rest}, defs)
        return {k: _inline(v, defs) for k, v in node.items() if k != "$defs"}
    if isinstance(node, list):
        return [_inline(v, defs) for v in node]
    return node


def _standalone(schema: dict[str, Any]) -> dict[str, Any]:
    return dict(_inline(schema, schema.get("$defs", {})))


LAST = ("expect_rev", "round", "idempotency_key")  # the options every command takes, listed after its own


def input_schema(model: type[Args]) -> dict[str, Any]:
    schema = _standalone(model.model_json_schema(mode="validation"))
    props = schema.get("properties", {})
    schema["properties"] = {**{k: v for k, v in props.items() if k not in LAST},
                            **{k: props[k] for k in LAST if k in props}}
    return schema


def output_schema(model: type[Out]) -> dict[str, Any]:
    """A command's document (which admits a refusal), or the tool's own document or a refusal; either may carry
    the pending-inputs notice (``pending_inputs``)."""
    if model is CommandOut:
        return _with_notice(_standalone(model.model_json_schema(mode="serialization")))
    either = TypeAdapter(model | Refusal).json_schema(mode="serialization")  # type: ignore[arg-type]
    return _with_notice({"type": "object", **_standalone(either)})


def _with_notice(schema: dict[str, Any]) -> dict[str, Any]:
    notice = _standalone(PendingNotice.model_json_schema(mode="serialization"))
    for variant in schema.get("anyOf") or schema.get("oneOf") or [schema]:
        if "properties" in variant:
            variant["properties"]["pending_inputs"] = notice
    return schema
