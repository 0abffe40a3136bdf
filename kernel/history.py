"""One task event as people read it in a history (`task show`, MCP `get_task`, the board's timeline): the fields a
reader needs, and a line saying what happened where the type alone does not (``note``): ``merged into main at
e68f502abcd1`` for ``task_merged``, ``merge failed: …`` for ``merge_failed``, ``retried: …`` for ``task_retried``.
"""

from __future__ import annotations

from typing import Any

from taskkernel.kernel.store.events import RecordedEvent

# What a history keeps of an event's data (the whole event is in `taskkernel log`).
HISTORY_FIELDS = ("from", "round", "reason", "report_id", "status", "branch", "base", "commit", "how", "error")
COMMIT_SHOWN = 12  # characters of a commit in a note, as `git log --oneline` would show a few more


def history_note(event_type: str, data: dict[str, Any]) -> str | None:
    """What the event did, in one line, when its fields alone do not say it; None otherwise."""
    if event_type == "task_merged":
        return f"merged into {data.get('base')} at {str(data.get('commit') or '')[:COMMIT_SHOWN]}"
    if event_type == "merge_failed":
        return f"merge failed: {data.get('error')}"
    if event_type == "task_retried":
        return "retried" + (f": {data['reason']}" if data.get("reason") else "")
    return None


def history_entry(ev: RecordedEvent) -> dict[str, Any]:
    """One event of a task as a history lists it: revision, position, type, actor, time, the fields above and its
    ``note`` when it has one."""
    note = history_note(ev.type, ev.data)
    return {"revision": ev.stream_version, "global_pos": ev.global_pos, "type": ev.type, "by": ev.data.get("by"),
            "at": ev.recorded_at, **{k: v for k, v in ev.data.items() if k in HISTORY_FIELDS},
            **({"note": note} if note else {})}
