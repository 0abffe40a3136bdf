"""The board's typed read models: what ``/api/…`` returns and its OpenAPI schema describes.

SQLModel classes without ``table=True``: the tables stay the SQLAlchemy Core tables of the write path (one schema,
migrated by Alembic), and each model is filled by the same read the CLI uses (kernel/queries.py, runners/history.py,
scheduler/admin.py, kernel/usage.py, the session log), so a field has the name the CLI's JSON gives it and cannot
drift from it.
"""

from __future__ import annotations

from typing import Any

from sqlmodel import Field, SQLModel


class TaskRow(SQLModel):
    """A task as `task list` prints it (kernel/queries.py TASK_LIST_FIELDS)."""

    task_id: str
    state: str
    revision: int
    round: int
    sender: str
    recipient: str
    subject: str
    priority: str
    risk_level: str
    parent: str | None = None
    root: str
    thread_key: str
    blocked: dict[str, Any] | None = Field(default=None, description="report_id, by, at, reason when blocked")


class HistoryEntry(SQLModel):
    """One event of a task as `task show` lists it."""

    revision: int
    global_pos: int
    type: str
    by: str | None = None
    at: str
    from_: str | None = Field(default=None, alias="from", schema_extra={"serialization_alias": "from"})
    round: int | None = None
    reason: str | None = None
    report_id: str | None = None
    status: str | None = None
    branch: str | None = None  # task_merged / merge_failed (kernel/history.py)
    base: str | None = None
    commit: str | None = None
    how: str | None = None
    error: str | None = None
    note: str | None = None  # what happened, in a line: "merged into main at e68f502abcd1"


class Report(SQLModel):
    """A report as the task document keeps it (the body is in its event: ``/api/tasks/{id}/page`` has it)."""

    report_id: str
    round: int
    status: str = Field(description="done, blocked, in_progress or aborted")
    by: str
    artifacts: list[str] | None = None
    diff: dict[str, Any] | None = Field(default=None, description="range, totals, files' stat and the patch file, "
                                                                  "for a task with its own git worktree")


class TaskDocument(TaskRow):
    """A task as `task show` prints it: the stored document and its history."""

    body: str = ""
    authority: dict[str, str]
    budget: dict[str, Any] | None = None
    cost_tier: str | None = None
    references: list[str] = []
    reports: list[Report] = []
    records: list[dict[str, Any]] | None = None
    assignee: str | None = None
    lease: dict[str, Any] | None = None
    created_at: str
    updated_at: str
    history: list[HistoryEntry]
    aliases: list[str] | None = Field(default=None, description="the other ids the task is known by, if any")
    inputs_pending: int = Field(default=0, description="instructions its agent has not read: it is not submitted "
                                                       "for review until it has")


class CommandOutcome(SQLModel):
    """A command's result as `submit` prints it, with ``hint`` (the command that lifts a ``permission_required``)."""

    status: str = Field(description="accepted, replayed or rejected")
    reason: str | None = Field(default=None, description="the stable reason code of a refusal (docs/reason-codes.md)")
    message: str
    task_id: str | None = None
    revision: int | None = None
    round: int | None = None
    hint: str | None = None


class ActionOutcome(SQLModel):
    """What a board action that is not a task verb answers (a grant, a schedule, a goal): ``status`` ok, or
    rejected with the reason code the CLI gives."""

    status: str
    reason: str | None = None
    message: str
    detail: dict[str, Any] | None = None


class SayBody(SQLModel):
    """The body of ``POST /api/tasks/{id}/say``: `taskkernel task say`'s argument and options (no other field)."""

    text: str = Field(description="what its agent is told, at most 16,384 characters")
    mode: str = Field(default="message", description="message, steer, queue or answer")
    question_id: str | None = Field(default=None, description="the question an answer answers (an answer only)")
    input_id: str | None = Field(default=None, description="an idempotency id, as --input-id")
    anchor: str | None = Field(default=None, description="PATH:LINE, the line of the task's change it is about "
                               "(an inline comment on its diff), as --at")


class InstructionOutcome(SQLModel):
    """`taskkernel task say`'s document: the instruction accepted into the task's run session (or ``replayed``),
    and the run queued to deliver it when nothing runs the task."""

    status: str = Field(description="accepted or replayed (a refusal: status rejected, reason, message)")
    task_id: str
    session: str = Field(description="the task's run session, RUN:<DRIVER>:<agent>@<TASK>")
    input_id: str
    accept_seq: int
    kind: str = Field(description="message, steer, queued or answer")
    queued_run: str | None = None


class InterruptOutcome(SQLModel):
    """`taskkernel task interrupt`'s document: the stop asked of the coordinator holding the running run."""

    status: str = Field(description="requested, or replayed for a stop already asked")
    task_id: str
    run_id: str
    requested_by: str
    message_seq: int | None = Field(default=None, description="the message's sequence, queued for the resumed run")


class RunEvent(SQLModel):
    """One event of an agent's live output, as `taskkernel runs follow --json` prints it (docs/live-output.md)."""

    run_id: str
    n: int = Field(description="1, 2, … per run, in the order the agent printed them")
    task_id: str
    attempt: int
    at: str
    kind: str = Field(description="text, tool_call, tool_result, usage, error or output")
    tool: str | None = None
    text: str = Field(description="redacted and control-escaped when stored")


class LiveOutput(SQLModel):
    """A task's live output: its runs' events, oldest first, and where the next read goes on from."""

    status: str = "ok"
    task_id: str
    events: list[RunEvent]
    cursor: str | None = Field(description="RUN_ID:N of the last event (or the after given): the next read's after")
    more: bool = Field(description="the read was cut at its limit: read again after cursor")


class EventSummary(SQLModel):
    """One committed event as ``GET /api/events`` sends it (``id:`` is its global position)."""

    global_pos: int | None = Field(description="the event's global position (null for state_changed)")
    stream: str
    type: str = Field(description="the event's type; state_changed: a table outside the event log changed "
                                  "(stream: sessions, schedules, runs or usage); live: the task's agents printed "
                                  "more (a stream opened with live=TASK)")
    task_id: str | None = None
    state: str | None = Field(default=None, description="the task's lifecycle state after a task event")
    by: str | None = None
    at: str | None = None


class HostRun(SQLModel):
    run_id: str
    task_id: str
    role: str
    lease_until: str | None = None


class HostView(SQLModel):
    """A machine of the team on this store, as `taskkernel hosts` prints it (docs/hosts.md)."""

    host: str
    owner: str
    live: bool
    heartbeat_at: str
    heartbeat_age_s: float
    started_at: str
    version: str
    roles: list[str] | None = None  # None: every role (no [hosts] tables)
    slots: dict[str, int]
    max_runs: int
    running: list[HostRun]


class RunRow(SQLModel):
    """A run as `runs list` prints it."""

    run_id: str
    task_id: str
    round: int
    role: str
    purpose: str
    state: str
    attempt: int
    max_attempts: int
    error_code: str | None = None
    last_error: str | None = None
    exit_code: int | None = None
    created_at: str
    started_at: str | None = None
    ended_at: str | None = None
    elapsed_s: float | None = None
    retry_at: str | None = None
    timeout_s: float | None = Field(default=None, description="the role's timeout, from taskkernel.toml")
    log_tail: list[str] | None = Field(default=None, description="the last lines of a failed run's log")


class Occurrence(SQLModel):
    """A decided occurrence of a schedule, as `schedule show` lists its outcomes."""

    dedup_key: str
    nominal: str | None = None
    state: str
    reason: str | None = None
    attempt: int | None = None
    fired_at: str | None = None
    finished_at: str | None = None
    run_ref: str | None = None
    detail: str | None = None


class ScheduleView(SQLModel):
    """A schedule as `schedule show` prints it: its definition, watermark, next fires and recent outcomes."""

    name: str
    id: str
    kind: str
    spec: str
    tz: str | None = None
    paused: bool
    pause_reason: str | None = None
    watermark: str | None = None
    next_due: str | None = None
    revision: int
    no_progress: int
    owner_role: str | None = None
    action: dict[str, Any] | None = None
    error: str | None = None
    next: list[dict[str, Any]] = []
    outcomes: list[Occurrence] = []
    manager_role: str | None = Field(default=None, description="the role besides ADMIN that may pause or resume it")
    misfire: str | None = None
    catchup_window: int | None = Field(default=None, description="seconds")
    catchup_max: int | None = None
    grace: int | None = Field(default=None, description="seconds")
    overlap: str | None = None
    jitter: int | None = Field(default=None, description="seconds")
    dst: str | None = None
    created_by: dict[str, Any] | None = None
    clock_jumps: list[dict[str, Any]] = []
    faults: list[dict[str, Any]] = []


class UsageRow(SQLModel):
    """Usage of one owner, as `usage --by …` prints a row."""

    owner: str | None
    units: int
    wall_ms: int
    tokens_in: int
    tokens_out: int
    cost_usd: float


class UsageDay(SQLModel):
    """Spend of one owner on one UTC day (the usage page's charts)."""

    day: str
    owner: str | None
    tokens: int
    cost_usd: float


class UsageReport(SQLModel):
    by: str
    since: str | None = None
    rows: list[UsageRow]
    total: dict[str, int | float]
    days: list[UsageDay]


class SessionSummary(SQLModel):
    """A session log the reader may read, as `taskkernel session list` prints it."""

    session: str
    owner: str
    last_seq: int | None = None
    last_consumed_seq: int | None = None
    turns_completed: int | None = None


class SessionInput(SQLModel):
    """One input of a session log, as `taskkernel session export` writes it (without its signature)."""

    session: str
    input_id: str
    kind: str
    accepted: bool
    accept_seq: int | None
    payload: dict[str, Any]
    legacy: bool
    log_last_seq: int | None = None
    received_at: str | None = None
    accepted_by: str | None = None
    reason: str | None = Field(default=None, description="why a received input was refused")


class NeedsYou(SQLModel):
    """`taskkernel inbox`'s document: reviews to decide, approvals that need a grant, blocked and stalled tasks,
    effects given up on."""

    status: str = "ok"
    role: str | None
    reviews: list[dict[str, Any]]
    needs_grant: list[dict[str, Any]]
    blocked: list[dict[str, Any]]
    stalled: list[dict[str, Any]] = []
    dead_letters: list[dict[str, Any]] = []
    counts: dict[str, int]
    truncated: bool


class Health(SQLModel):
    status: str
    version: str
    database: str
    log_position: int
