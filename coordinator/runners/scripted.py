"""Deterministic built-in agents (no network, no model) used by the demo and the tests (docs/runs.md,
"The built-in scripted agents").

A leader splits work into a build child and, once that is accepted, a check child; it reviews
its branches and submits its own task when every child is done. Workers do their task and
report: DEV writes a real artifact under workspace/, QA checks that artifact.

The leader's review reads no diff, so it never approves a task whose approval would merge a branch into the base
(the driver's runner has ``on_approve = "merge"`` and the task has a worktree): that waits for a person or a
configured reviewer role. The dispatcher does not even start such a review (runners/outcomes.py ``undecidable``).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from taskkernel.coordinator.runners.agent import AgentContext
from taskkernel.coordinator.runners.ledger import Purpose

ScriptedAgent = Callable[[AgentContext], str]
FINISHED = ("done", "archive")


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40] or "artifact"


def leader(ctx: AgentContext) -> str:
    if ctx.purpose is Purpose.REVIEW:
        return _review(ctx)
    kids = ctx.children()
    subject = ctx.task["subject"]
    builders = [k for k in kids if k["subject"].startswith("Build:")]
    checkers = [k for k in kids if k["subject"].startswith("Check:")]
    if not builders:
        ctx.submit("create_task", sender=ctx.principal.role, recipient="DEV",
                   subject=f"Build: {subject}", body=ctx.task["body"], parent=ctx.task["task_id"])
        return "split: build child created"
    if all(b["state"] in FINISHED for b in builders) and not checkers:
        ctx.submit("create_task", sender=ctx.principal.role, recipient="QA",
                   subject=f"Check: {subject}", body=f"Verify the artifact of {builders[0]['task_id']}",
                   parent=ctx.task["task_id"], references=[builders[0]["task_id"]])
        return "build accepted: check child created"
    if kids and all(k["state"] in FINISHED for k in kids) and checkers:
        if ctx.refresh()["state"] == "active":
            ctx.submit("submit_report", status="done", body="all children accepted: " +
                       ", ".join(k["task_id"] for k in kids))
            ctx.submit("submit")
        return "children done: submitted for acceptance"
    return "waiting for children"


def _review(ctx: AgentContext) -> str:
    doc = ctx.refresh()
    if doc["state"] != "review":
        return "nothing to review"
    if ctx.merges_into is not None:  # a judgment on code it cannot read: a person's, or a reviewer role's
        return f"left for a person: approval merges into {ctx.merges_into}"
    done = [r for r in doc["reports"] if r["round"] == doc["round"] and r["status"] == "done"]
    if done:
        ctx.submit("approve")
        return f"approved {doc['task_id']}"
    ctx.submit("reject", reason="no done report for this round")
    return f"rejected {doc['task_id']}"


def developer(ctx: AgentContext) -> str:
    name = slug(ctx.task["subject"].removeprefix("Build:").strip())
    path = ctx.write_artifact(f"{name}/README.md", f"# {ctx.task['subject']}\n\n{ctx.task['body']}\n\n"
                              f"Built for {ctx.task['task_id']} (round {ctx.task['round']}).\n")
    rel = path.relative_to(ctx.workspace).as_posix()
    ctx.submit("submit_report", status="done", body=f"artifact written: {rel}", references=[rel])
    ctx.submit("submit")
    return f"built {rel}"


def checker(ctx: AgentContext) -> str:
    refs = [r for r in ctx.task["references"] if r.startswith("TASK-")]
    target = ctx.kernel.task(refs[0]) if refs else None
    name = slug((target or ctx.task)["subject"].removeprefix("Build:").strip())
    artifact = ctx.workspace / "workspace" / name / "README.md"
    ok = artifact.is_file() and (target is None or target["task_id"] in artifact.read_text(encoding="utf-8"))
    status, body = ("done", f"checked {artifact.relative_to(ctx.workspace).as_posix()}: OK") if ok else \
        ("blocked", f"expected artifact {artifact} is missing or does not name its task")
    ctx.submit("submit_report", status=status, body=body)
    if ok:
        ctx.submit("submit")
    return body


def worker(ctx: AgentContext) -> str:
    ctx.submit("submit_report", status="done", body=f"{ctx.principal.role} finished {ctx.task['subject']}")
    ctx.submit("submit")
    return "done"


def agent_for(role: str, leader_role: str) -> ScriptedAgent:
    if role == leader_role:
        return leader
    return {"DEV": developer, "QA": checker}.get(role, worker)
