"""An agent's own fcop tool moves the task's file and appends its entry; a file the projection wrote before
entries carried kernel_event is continued, never rewritten from the start (issue 10 review findings)."""

from __future__ import annotations

import re
from pathlib import Path

from fcop.lifecycle.events import read_events

from tests.coord_support import coordinator, make_workspace
from tests.test_fcop_projection_fidelity import DEV, PM, chain, pm_task, say

CLAIM_ENTRY = ("- at: '2026-11-30T10:00:00+00:00'\n  from: inbox\n  to: active\n  by: DEV\n  tool: claim_task\n")


def test_a_claim_made_with_fcops_tool_is_the_drivers_claim(tmp_path: Path) -> None:
    c = coordinator(make_workspace(tmp_path / "ws", {}))
    c.run_once()
    task_id = pm_task(c)
    c.run_once()
    lifecycle = c.workspace.root / "fcop" / "_lifecycle"
    [inbox] = list((lifecycle / "inbox").glob(f"{task_id}-*.md"))
    text = inbox.read_text(encoding="utf-8")
    head, _, body = text[4:].partition("\n---\n")
    moved = lifecycle / "active" / inbox.name  # what fcop's claim_task does: move, then append its entry
    moved.write_text(f"---\n{head}\n{CLAIM_ENTRY.rstrip()}\n---\n{body}", encoding="utf-8")
    inbox.unlink()
    c.run_once()
    assert c.kernel.task(task_id)["state"] == "active"
    assert not list((c.workspace.root / "fcop" / "_quarantine").glob("TASK-*")), "the task's own file stays"
    assert [e[:2] for e in chain(moved)] == [(None, "inbox"), ("inbox", "active")], "the agent's entry, once"


def test_a_file_written_before_kernel_event_is_continued_not_replayed(tmp_path: Path) -> None:
    c = coordinator(make_workspace(tmp_path / "ws", {}))
    c.run_once()
    task_id = pm_task(c)
    c.run_once()
    say(c, PM, "amend", task_id, priority="P1")  # two events carried so far: created, amended
    c.run_once()
    [path] = list((c.workspace.root / "fcop" / "_lifecycle" / "inbox").glob(f"{task_id}-*.md"))
    # as the old projection wrote it: our event names as tools, no kernel_event
    legacy = re.sub(r"\n  kernel_event: \d+", "", path.read_text(encoding="utf-8"))
    legacy = legacy.replace("tool: amend_task", "tool: task_amended")
    path.write_text(legacy, encoding="utf-8")
    say(c, DEV, "claim", task_id)
    c.run_once()
    [now] = list((c.workspace.root / "fcop" / "_lifecycle" / "active").glob(f"{task_id}-*.md"))
    entries = [(e.from_stage.value if e.from_stage else None, e.to_stage.value, e.tool)
               for e in read_events(now.read_text(encoding="utf-8"))]
    assert entries == [(None, "inbox", "create_task"), ("inbox", "inbox", "task_amended"),
                       ("inbox", "active", "claim_task")], "one new entry, nothing replayed"
