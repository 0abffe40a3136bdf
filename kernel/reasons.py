"""Stable reason codes: every rejection the kernel can give is one of these values.

The values are a public contract (CLI JSON, files written beside quarantined input,
logs); see docs/reason-codes.md. Never rename a value; add new ones.
"""

from __future__ import annotations

from enum import StrEnum


class ReasonCode(StrEnum):
    # TaskCommandKernel, in the order the checks run
    INVALID_COMMAND = "invalid_command"
    INVALID_TASK_ID = "invalid_task_id"  # a task id out of the FCoP pattern or range (shape check)
    PAYLOAD_TOO_LARGE = "payload_too_large"  # beyond what the folder projection can write (shape check)
    ACTOR_UNVERIFIED = "actor_unverified"
    STALE_LEASE = "stale_lease"  # a run's credential after its lease was fenced out (revoked by the coordinator)
    IDEMPOTENCY_CONFLICT = "idempotency_conflict"
    TASK_NOT_FOUND = "task_not_found"
    TASK_EXISTS = "task_exists"
    THREAD_MISMATCH = "thread_mismatch"
    TASK_IDENTITY_MISMATCH = "task_identity_mismatch"
    TASK_TERMINAL = "task_terminal"
    STALE_TASK_REVISION = "stale_task_revision"
    STALE_ROUND = "stale_round"
    ROLE_NOT_AUTHORIZED = "role_not_authorized"
    UNKNOWN_ROLE = "unknown_role"  # a new task names a role the team does not have (it would never be run)
    POLICY_ESCALATION = "policy_escalation"
    ILLEGAL_TRANSITION = "illegal_transition"
    CHILD_TASKS_OPEN = "child_tasks_open"
    REPORT_REQUIRED = "report_required"
    PERMISSION_REQUIRED = "permission_required"
    GATE_BLOCKED = "gate_blocked"
    GATE_INSUFFICIENT_EVIDENCE = "gate_insufficient_evidence"
    RETRY_CANNOT_HELP = "retry_cannot_help"  # `task retry`: the role that would run has no usable runner
    # People in the loop of a running agent (kernel/instructions.py, docs/people-in-the-loop.md)
    INPUTS_PENDING = "inputs_pending"  # a submit while the driver has not read what it was told
    MAY_NOT_INSTRUCT = "may_not_instruct"  # `task say`/`interrupt` by someone who may not instruct the task
    TASK_NOT_IN_WORK = "task_not_in_work"  # `task say` to a task no agent is (or will be) at work on
    NO_RUNNING_RUN = "no_running_run"  # `task interrupt` while no run of the task is running
    NO_AGENT_TO_TELL = "no_agent_to_tell"  # `task say` to a task whose driver's agent reads no instructions
    # The database's schema against this code's (kernel/store/version.py, docs/migrations.md)
    SCHEMA_BEHIND = "schema_behind"  # an older revision (or none yet): `taskkernel db upgrade` first
    SCHEMA_AHEAD = "schema_ahead"  # a revision this code does not know: a newer release upgraded the database


class KernelError(Exception):
    """A rejection as a value: a stable code plus a human message."""

    def __init__(self, reason: ReasonCode, message: str) -> None:
        super().__init__(f"{reason.value}: {message}")
        self.reason = reason
        self.message = message


class ConcurrencyError(Exception):
    """A stream's head moved between read and append; the append wrote nothing."""

    def __init__(self, stream_id: str, expected: int, actual: int) -> None:
        super().__init__(f"stream {stream_id}: expected version {expected}, head is {actual}")
        self.stream_id = stream_id
        self.expected = expected
        self.actual = actual
