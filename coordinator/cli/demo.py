"""`taskkernel demo`: the coordinator's main job on a temporary dev-team workspace, in seconds, offline.

ADMIN drops a TASK file for PM; scripted agents split, build (a real artifact under workspace/),
check and submit; ADMIN's approval of the high-risk task arrives through the session log; the
task is archived; a heartbeat automation fires; a stale and a duplicate command are shown being
rejected and replayed; then the timeline (commit order) and where the files are.
"""

from __future__ import annotations

import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import typer
from rich.rule import Rule
from rich.table import Table

from taskkernel.coordinator.cli.common import CliContext, Exit, emit, fail, say, show
from taskkernel.coordinator.loop import Coordinator
from taskkernel.coordinator.workspace import Workspace, init_workspace
from taskkernel.kernel.model.commands import CommandResult
from taskkernel.kernel.model.principal import LOCAL_OWNER, Principal
from taskkernel.kernel.sessionlog import SessionLog
from taskkernel.kernel.verify import verify
from taskkernel.scheduler.admin import Schedules
from taskkernel.scheduler.models import ActionSpec, ActionType, spec_from_user

DEMO_TOML = """\
[kernel]
durability = "full"

[roles.PM]
runner = "scripted"
[roles.DEV]
runner = "scripted"
[roles.QA]
runner = "scripted"
"""
ROOT_TASK = """\
---
protocol: fcop
version: 1
sender: ADMIN
recipient: PM
priority: P1
subject: Ship the login page
risk_level: high
---
Build a login page with a username and password form, and have it checked before release.
"""


class _Demo:
    def __init__(self, coordinator: Coordinator) -> None:
        self.c = coordinator
        self.steps: list[dict[str, Any]] = []

    def say(self, who: Principal, kind: str, task_id: str, *, key: str, expected_revision: int | None = None,
            **extra: Any) -> CommandResult:
        doc = self.c.kernel.task(task_id)
        assert doc is not None
        payload = extra.pop("payload", {})
        command = {"type": kind, "task_id": task_id, "thread_key": doc["thread_key"], "round": doc["round"],
                   "expected_revision": doc["revision"] if expected_revision is None else expected_revision,
                   "idempotency_key": key, "payload": payload, **extra}
        result = self.c.kernel.submit(command, who)
        self.note(f"{who.role} {kind}", result)
        return result

    def note(self, what: str, result: CommandResult | None = None, detail: str = "") -> None:
        if result is not None:
            colour = {"accepted": "green", "replayed": "cyan", "rejected": "red"}[result.status]
            self.steps.append({"step": what, **result.wire()})
            say(f"  {what:<28} ", (result.status, colour), f" {result.reason or ''} {result.message}")
            return
        self.steps.append({"step": what, "detail": detail})
        say(f"  {what:<28} {detail}")


def demo(directory: Path = typer.Option(None, "--dir", help="Workspace directory to use.")
         ) -> None:
    """Run the coordinator demo on a fresh dev-team workspace (embedded SQLite, scripted agents, no network)."""
    root = directory or Path(tempfile.mkdtemp(prefix="taskkernel-demo-"))
    if root.exists() and any(root.iterdir()):  # the story starts from nothing: never on top of another one
        fail(Exit.USAGE, f"{root} is not empty; give --dir a new or empty directory (or omit it for a temporary one)")
    init_workspace(root, "dev-team")
    (root / "taskkernel.toml").write_text(DEMO_TOML, encoding="utf-8")
    ws = Workspace.load(root)
    c = Coordinator(ws, CliContext(workspace_path=str(ws.root)).database(), owner="demo", settle_s=0, grace_s=0)
    d = _Demo(c)
    c.run_once()  # the import of the (empty) workspace: the TASK file below is live input, not history

    show(Rule("1. ADMIN drops a task for PM (a TASK file)"), story=True)
    inbox = ws.root / "fcop" / "_lifecycle" / "inbox" / "TASK-20261130-001-ADMIN-to-PM.md"
    inbox.write_text(ROOT_TASK, encoding="utf-8")
    c.run_once()
    root_id = "TASK-20261130-001"
    for kid in c.kernel.children(root_id):
        d.note(f"child {kid['recipient']}", detail=f"{kid['task_id']} {kid['state']}: {kid['subject']}")
    artifacts = sorted(str(p.relative_to(ws.root)) for p in (ws.root / "workspace").rglob("*") if p.is_file())
    d.note("artifact", detail=", ".join(artifacts))
    doc = c.kernel.task(root_id)
    assert doc is not None
    d.note("root task", detail=f"{root_id} is {doc['state']} (round {doc['round']}), waiting for ADMIN")

    show(Rule("2. ADMIN approves through the session log"), story=True)
    d.say(LOCAL_OWNER, "approve", root_id, key="admin-approve-early")  # high risk: no grant yet
    SessionLog(c.db).accept("admin", {"input_id": "admin-grant-1", "kind": "allow", "payload": {
        "permission": "approve", "scope": f"task:{root_id}", "text": "Looks good, ship it."}},
        accepted_by=LOCAL_OWNER.id)
    d.note("session admin", detail="accepted allow approve task:" + root_id)
    d.say(LOCAL_OWNER, "approve", root_id, key="admin-approve")

    show(Rule("3. Stale and duplicate commands"), story=True)
    stale_rev = c.kernel.task(root_id)["revision"] - 1  # type: ignore[index]
    d.say(LOCAL_OWNER, "archive", root_id, key="admin-archive-stale", expected_revision=stale_rev,
          payload={"reason": "shipped"})
    d.say(LOCAL_OWNER, "archive", root_id, key="admin-archive", payload={"reason": "shipped"})
    d.say(LOCAL_OWNER, "archive", root_id, key="admin-archive", expected_revision=stale_rev,
          payload={"reason": "shipped"})  # the retry of an accepted command: replayed, nothing runs twice
    c.run_once()

    show(Rule("4. A heartbeat automation fires"), story=True)
    _heartbeat(c, d)

    report = verify(c.db, c.kernel.store)
    _timeline(c)
    files = sorted(str(p.relative_to(ws.root)) for p in (ws.root / "fcop" / "_lifecycle").rglob("*.md"))
    say(("Where things are", "bold"))
    for line in [f"workspace   {ws.root}", f"database    {ws.database_url}", *[f"task file   {f}" for f in files],
                 *[f"artifact    {a}" for a in artifacts], f"ledger      {ws.root / 'fcop' / 'ledger'}"]:
        say(f"  {line}")
    say("verify: ", ("ok", "green") if report.ok else ("broken", "red"))
    final = c.kernel.task(root_id)
    emit({"status": "ok" if report.ok and final and final["state"] == "archive" else "failed",
          "workspace": str(ws.root), "root_task": final, "children": c.kernel.children(root_id),
          "artifacts": artifacts, "task_files": files, "steps": d.steps, "verify": report.as_json()},
         generic=False)  # on a terminal the story above is the answer; the document is for --json and scripts
    raise typer.Exit(int(Exit.OK if report.ok else Exit.INTERNAL))


def _heartbeat(c: Coordinator, d: _Demo) -> None:
    """A real durable schedule, fired by the real scheduler code on a virtual clock (no sleeping)."""
    start = datetime.now(UTC).replace(microsecond=0)
    spec = spec_from_user({"every": "30m", "start": start.isoformat(), "owner_role": "ADMIN"}, name="heartbeat")
    action = ActionSpec(type=ActionType.ACCEPT_INPUT, session="heartbeat", kind="progress",
                        payload={"text": "heartbeat {dedup_key}", "completed_tool_calls": 0})
    Schedules(c.automations.runtime.ledger).add(spec.model_copy(update={"action": action}), start)
    for minutes in (31, 33, 61):  # two occurrences due over the hour; the 33-minute tick finds nothing new
        claimed = c.automations.tick(start + timedelta(minutes=minutes))
        d.note(f"tick at +{minutes} min", detail=f"{claimed} occurrence(s) claimed and run")
    records = SessionLog(c.db).records("heartbeat")
    d.note("heartbeat", detail=f"{len(records)} fire(s) in session 'heartbeat', "
                               f"accepted by {records[0].accepted_by if records else '-'}")


def _timeline(c: Coordinator) -> None:
    with c.db.read() as conn:
        events = list(c.kernel.store.read_all(conn))
    table = Table(title="Timeline (acceptance = commit order)")
    for name in ("pos", "task", "event", "by"):  # ids in full, whatever the terminal's width: detail wraps
        table.add_column(name, no_wrap=True)
    table.add_column("detail")
    for ev in events:
        detail = ev.data.get("subject") or ev.data.get("status") or ev.data.get("reason") or \
            ev.data.get("decision") or ""
        by = str(ev.data.get("by", ev.meta.get("actor", "")))
        table.add_row(str(ev.global_pos), ev.stream_id.split(":", 1)[-1], ev.type, by, str(detail)[:40])
    show(table, story=True)
