"""`taskkernel demo`: a walkthrough of the kernel on a fresh embedded-SQLite workspace."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from kernel.cli.common import Exit, emit, get_ctx, stderr
from kernel.cli.wiring import build_kernel
from kernel.commands import TaskCommandKernel
from kernel.credentials import issue_token, resolve_principal
from kernel.model.commands import CommandResult
from kernel.model.principal import LOCAL_OWNER, Principal
from kernel.verify import verify
from kernel.workspace import init_workspace


class _Walkthrough:
    def __init__(self, kernel: TaskCommandKernel) -> None:
        self.kernel = kernel
        self.n = 0
        self.shown: list[dict[str, Any]] = []

    def say(self, who: Principal, kind: str, task_id: str | None = None, *, key: str | None = None,
            expected_revision: int | None = None, **payload: Any) -> CommandResult:
        self.n += 1
        command: dict[str, Any] = {"type": kind, "idempotency_key": key or f"demo-{self.n}", "payload": payload}
        if task_id:
            doc = self.kernel.task(task_id)
            assert doc is not None
            command.update(task_id=task_id, thread_key=doc["thread_key"], round=doc["round"],
                           expected_revision=doc["revision"] if expected_revision is None else expected_revision)
        result = self.kernel.submit(command, who)
        colour = {"accepted": "green", "replayed": "cyan", "rejected": "red"}[result.status]
        stderr.print(f"  {who.role:>5} {kind:<14} [{colour}]{result.status:<8}[/{colour}] "
                     f"{result.reason or ''} {result.message}")
        self.shown.append({"by": who.id, "command": kind, **result.wire()})
        return result


def demo(ctx: typer.Context, keep: Path = typer.Option(None, "--dir", help="Workspace directory to use.")) -> None:
    """Run the kernel walkthrough on a temporary dev-team workspace (embedded SQLite)."""
    root = keep or Path(tempfile.mkdtemp(prefix="taskkernel-demo-"))
    ws = init_workspace(root, "dev-team")
    c = get_ctx(ctx)
    c.workspace_path, c.db_url = str(ws.root), None
    kernel = build_kernel(c)
    db = kernel.db
    pm = resolve_principal(db, issue_token(db, "PM", "pm-agent"))
    dev = resolve_principal(db, issue_token(db, "DEV", "dev-agent"))
    assert pm is not None and dev is not None
    w = _Walkthrough(kernel)

    stderr.rule("ADMIN asks PM for a feature; PM delegates to DEV")
    root_id = w.say(LOCAL_OWNER, "create_task", sender="ADMIN", recipient="PM", subject="Ship the login page",
                    risk_level="medium").task_id
    assert root_id
    w.say(pm, "claim", root_id)
    child = w.say(pm, "create_task", sender="PM", recipient="DEV", subject="Build the form",
                  parent=root_id).task_id
    assert child
    w.say(dev, "claim", child)
    w.say(dev, "submit", child)  # refused: no report yet
    w.say(dev, "submit_report", child, status="done", body="form built, tests green")
    w.say(dev, "submit", child)
    w.say(dev, "approve", child)  # refused: DEV is not the branch's authority

    stderr.rule("Stale and duplicate commands")
    w.say(pm, "submit_report", root_id, expected_revision=1, status="done", body="late")  # stale revision
    w.say(pm, "submit_report", root_id, key="pm-report", status="done", body="feature integrated")
    w.say(pm, "submit_report", root_id, key="pm-report", status="done", body="feature integrated")  # replay
    w.say(LOCAL_OWNER, "archive", root_id, reason="too early")  # refused: illegal edge
    w.say(pm, "submit", root_id)
    w.say(LOCAL_OWNER, "approve", root_id)
    w.say(LOCAL_OWNER, "archive", root_id, reason="shipped")  # refused: the child is still in review
    w.say(pm, "approve", child)
    w.say(LOCAL_OWNER, "archive", root_id, reason="shipped")
    report = verify(db, kernel.store)

    with db.read() as conn:
        events = list(kernel.store.read_all(conn))
    table = Table("pos", "task", "event", "by", "rev", title="Timeline (global commit order)")
    for ev in events:
        table.add_row(str(ev.global_pos), ev.stream_id.removeprefix("task:"), ev.type, str(ev.data.get("by")),
                      str(ev.stream_version))
    stderr.print(table)
    stderr.print(f"verify: {'[green]ok[/green]' if report.ok else '[red]broken[/red]'}; "
                 f"workspace at {ws.root}, database {db.url}")
    emit({"status": "ok" if report.ok else "broken", "workspace": str(ws.root), "steps": w.shown,
          "verify": report.as_json()})
    raise typer.Exit(int(Exit.OK if report.ok else Exit.INTERNAL))
