"""The task aggregate: FCoP G3 lifecycle rules and the pure fold from events to a task document.

The document (a plain dict, for speed) is both the inline read model and what a rebuild
from events must reproduce byte for byte; ``apply`` is the only place that shapes it.

``blocked`` is derived here too, so the read model, a rebuild and `verify` agree: null, or the latest report of
the current round when its status is ``blocked`` (``{report_id, reason, by, at}``: ``reason`` is the first
non-blank line of the report's body, at most BLOCKED_REASON_MAX characters). A later report of another status
clears it, and so does every event that moves the task or starts a round, and a retry (``task_retried``); an amend
or an authorized action does not. ``state`` stays the lifecycle state. A document stored before the field existed
lacks the key: readers and the projection comparison take a missing ``blocked`` for null.

``merge`` (absent until the coordinator records one) is the last merge of the task on approval: ``{status: merged,
round, branch, base, commit, how, at}`` (``task_merged``) or ``{status: failed, round, error, at}``
(``merge_failed``: the merge waits for a person; `task merge` retries it).
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from taskkernel.kernel.model.kinds import CommandType, ReportStatus
from taskkernel.kernel.model.principal import ADMIN

if TYPE_CHECKING:  # the pydantic wire format is not needed to fold events (nor to import this module)
    from taskkernel.kernel.model.commands import CreateTaskPayload


def task_stream(task_id: str) -> str:
    """The event stream of one task."""
    return f"task:{task_id}"


class TaskState(StrEnum):
    INBOX = "inbox"
    ACTIVE = "active"
    REVIEW = "review"
    DONE = "done"
    ARCHIVE = "archive"


TERMINAL_STATES = frozenset({TaskState.ARCHIVE})
OPEN_STATES = frozenset({TaskState.INBOX, TaskState.ACTIVE, TaskState.REVIEW})

# Lifecycle edges: command -> (allowed source states, target state).
TRANSITIONS: dict[CommandType, tuple[frozenset[str], TaskState]] = {
    CommandType.CLAIM: (frozenset({TaskState.INBOX}), TaskState.ACTIVE),
    CommandType.SUBMIT: (frozenset({TaskState.ACTIVE}), TaskState.REVIEW),
    CommandType.APPROVE: (frozenset({TaskState.REVIEW}), TaskState.DONE),
    CommandType.REJECT: (frozenset({TaskState.REVIEW}), TaskState.ACTIVE),
    CommandType.REOPEN: (frozenset({TaskState.DONE}), TaskState.ACTIVE),
    CommandType.ARCHIVE: (frozenset({TaskState.DONE}), TaskState.ARCHIVE),
    CommandType.FORCE_ARCHIVE: (OPEN_STATES, TaskState.ARCHIVE),
}
# Commands that record without moving the task: where they are legal.
IN_PLACE: dict[CommandType, frozenset[str]] = {
    CommandType.SUBMIT_REPORT: frozenset({TaskState.ACTIVE, TaskState.REVIEW}),
    CommandType.AMEND: frozenset({TaskState.INBOX, TaskState.ACTIVE, TaskState.REVIEW, TaskState.DONE}),
    CommandType.PERFORM: frozenset({TaskState.ACTIVE}),
    CommandType.ATTACH_RECORD: frozenset(TaskState),
    CommandType.RETRY: frozenset({TaskState.ACTIVE, TaskState.REVIEW}),  # a done task is finished (kernel/retry.py)
    CommandType.RECORD_MERGE: frozenset({TaskState.DONE}),  # merges follow an approval
    CommandType.RECORD_MERGE_FAILURE: frozenset({TaskState.DONE}),
}
# The record of what already happened (an imported workspace): ADMIN only, and judged as history, so a
# terminal task (or parent) still takes it; lifecycle and role rules judge new work, not the past.
HISTORY = frozenset({CommandType.ADOPT_TASK, CommandType.ATTACH_RECORD})
# Which authority field of the task a command needs.
AUTHORITY_FOR: dict[CommandType, str] = {
    CommandType.CLAIM: "driver",
    CommandType.SUBMIT: "driver",
    CommandType.SUBMIT_REPORT: "driver",
    CommandType.APPROVE: "done_authority",
    CommandType.REJECT: "done_authority",
    CommandType.REOPEN: "done_authority",
    CommandType.ARCHIVE: "archive_authority",
    CommandType.FORCE_ARCHIVE: "archive_authority",
    CommandType.AMEND: "done_authority",
    CommandType.PERFORM: "driver",
    CommandType.RETRY: "done_authority",  # whoever decides the task decides it is worth another run
}
STARTS_ROUND = frozenset({CommandType.CLAIM, CommandType.REJECT, CommandType.REOPEN})
# Commands whose event records the round it happened in (it starts none).
IN_ROUND = frozenset({CommandType.RETRY, CommandType.RECORD_MERGE, CommandType.RECORD_MERGE_FAILURE})

EVENT_FOR: dict[CommandType, str] = {
    CommandType.CREATE_TASK: "task_created",
    CommandType.CLAIM: "task_claimed",
    CommandType.SUBMIT: "task_submitted",
    CommandType.APPROVE: "task_approved",
    CommandType.REJECT: "task_rejected",
    CommandType.REOPEN: "task_reopened",
    CommandType.ARCHIVE: "task_archived",
    CommandType.FORCE_ARCHIVE: "task_force_archived",
    CommandType.SUBMIT_REPORT: "report_submitted",
    CommandType.AMEND: "task_amended",
    CommandType.PERFORM: "action_authorized",
    CommandType.ADOPT_TASK: "task_adopted",
    CommandType.ATTACH_RECORD: "record_attached",
    CommandType.RETRY: "task_retried",
    CommandType.RECORD_MERGE: "task_merged",
    CommandType.RECORD_MERGE_FAILURE: "merge_failed",
}
REPORT_STATUSES = frozenset(s.value for s in ReportStatus)
BLOCKED_REASON_MAX = 300
TARGET_STATE_OF_EVENT = {EVENT_FOR[c]: target for c, (_src, target) in TRANSITIONS.items()}
_TARGET_STATE_VALUE = {event: target.value for event, target in TARGET_STATE_OF_EVENT.items()}  # for apply


def default_authority(sender: str, recipient: str, explicit: dict[str, str | None]) -> dict[str, str]:
    """Main line (sent by ADMIN): ADMIN accepts and archives. Branch: whoever assigned it does.
    The driver is the recipient. Explicit fields override."""
    owner = ADMIN if sender == ADMIN else sender
    authority = {"driver": recipient, "done_authority": owner, "archive_authority": owner}
    authority.update({k: v for k, v in explicit.items() if v})
    return authority


def authority_of(payload: CreateTaskPayload) -> dict[str, str]:
    """The authority a new task gets: the payload's explicit fields over the defaults (judged by kernel/delegation.py
    for a creator other than ADMIN, then recorded in the creation event)."""
    return default_authority(payload.sender, payload.recipient, {
        "driver": payload.driver, "done_authority": payload.done_authority,
        "archive_authority": payload.archive_authority})


DIFF_FILES_SHOWN = 20  # a report's diffstat in the task document; the report's event and patch file hold all


def diff_summary(diff: dict[str, Any]) -> dict[str, Any]:
    """What the task document keeps of a done report's diff (recorded by the coordinator for a task with its own
    git worktree, docs/agents.md): the range, the totals, the first files' stat and the patch file."""
    shown = {k: v for k, v in diff.items() if k != "files"}
    if "files" in diff:
        shown["files"] = diff["files"][:DIFF_FILES_SHOWN]
    return shown


def current_done_report(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The latest `done` report of the current round, which `submit` requires."""
    for report in reversed(doc["reports"]):
        if report["round"] == doc["round"] and report["status"] == "done":
            return report
    return None


def blocked_reason(body: str | None) -> str:
    """What a blocked report says, in one line: the first non-blank line of its body, at most
    BLOCKED_REASON_MAX characters ("" for an empty body)."""
    for line in (body or "").splitlines():
        if line.strip():
            return line.strip()[:BLOCKED_REASON_MAX]
    return ""


def _blocked_by(report_id: str, status: str | None, body: str | None, by: str | None,
                at: str) -> dict[str, Any] | None:
    if status != ReportStatus.BLOCKED.value:
        return None
    return {"report_id": report_id, "reason": blocked_reason(body), "by": by, "at": at}


def apply(doc: dict[str, Any] | None, event_type: str, data: dict[str, Any], revision: int,
          recorded_at: str) -> dict[str, Any]:
    """Fold one event into the task document (pure; returns a new dict for creation)."""
    if event_type in ("task_created", "task_adopted"):
        return {
            "task_id": data["task_id"], "thread_key": data["thread_key"], "parent": data["parent"],
            "root": data["root"], "sender": data["sender"], "recipient": data["recipient"],
            "subject": data["subject"], "body": data["body"], "priority": data["priority"],
            "risk_level": data["risk_level"], "references": list(data["references"]),
            "cost_tier": data["cost_tier"], "budget": data["budget"],
            "authority": dict(data["authority"]), "state": data.get("state", TaskState.INBOX.value),
            "revision": revision, "round": data.get("round", 0), "reports": [], "blocked": None,
            "created_at": recorded_at,
            "updated_at": recorded_at,
        }
    assert doc is not None, f"{event_type} before task_created"
    target = _TARGET_STATE_VALUE.get(event_type)
    if target is not None:
        doc["state"] = target
        doc["blocked"] = None  # the task moved
        if "round" in data:
            doc["round"] = data["round"]
    elif event_type == "report_submitted":
        doc["reports"].append({"report_id": data["report_id"], "round": data["round"],
                               "status": data["status"], "by": data["by"],
                               **({"artifacts": data["artifacts"]} if data.get("artifacts") else {}),
                               **({"diff": diff_summary(data["diff"])} if data.get("diff") else {})})
        doc["blocked"] = _blocked_by(data["report_id"], data["status"], data.get("body"), data["by"], recorded_at)
    elif event_type == "task_amended":
        doc.update(data["changes"])
    elif event_type == "record_attached":
        doc.setdefault("records", []).append({k: data[k] for k in ("kind", "record_id", "source", "author", "status")})
        if data["kind"] == "report" and data["status"] in REPORT_STATUSES:  # counts like a report of this round
            doc["reports"].append({"report_id": data["record_id"], "round": doc["round"], "status": data["status"],
                                   "by": data["author"], "imported": True})
            doc["blocked"] = _blocked_by(data["record_id"], data["status"], data.get("body"), data["author"],
                                         recorded_at)
    elif event_type == "task_retried":
        doc["blocked"] = None  # a new run is due: the round's block is lifted
    elif event_type == "task_merged":
        doc["merge"] = {"status": "merged", "round": data["round"], "branch": data["branch"], "base": data["base"],
                        "commit": data["commit"], "how": data["how"], "at": recorded_at}
    elif event_type == "merge_failed":
        doc["merge"] = {"status": "failed", "round": data["round"], "error": data["error"], "at": recorded_at}
    elif event_type == "action_authorized":
        doc.setdefault("actions", []).append({"action_id": data["action_id"], "operation": data["operation"],
                                              "entity": data["entity"], "round": data["round"]})
    else:
        raise ValueError(f"unknown task event type {event_type!r}")
    doc["revision"] = revision
    doc["updated_at"] = recorded_at
    return doc


def fold(events: Iterable[tuple[str, dict[str, Any], int, str]]) -> dict[str, Any] | None:
    doc: dict[str, Any] | None = None
    for event_type, data, revision, recorded_at in events:
        doc = apply(doc, event_type, data, revision, recorded_at)
    return doc
