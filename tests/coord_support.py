"""Helpers to build a real workspace with runner configuration for coordinator tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from taskkernel.coordinator.cli.common import CliContext
from taskkernel.coordinator.loop import Coordinator
from taskkernel.coordinator.workspace import Workspace, init_workspace
from taskkernel.kernel.model.principal import LOCAL_OWNER
from taskkernel.kernel.store.db import Database


def toml_value(v: Any) -> str:
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + "}"
    return str(v)


def make_workspace(root: Path, roles: dict[str, dict[str, Any]], *, database: str | None = None,
                   durability: str = "process") -> Workspace:
    init_workspace(root, "dev-team")
    lines = ["[kernel]", f'durability = "{durability}"']
    if database:
        lines.append(f"database = {toml_value(database)}")
    for role, table in roles.items():
        lines.append(f"\n[roles.{role}]")
        lines += [f"{k} = {toml_value(v)}" for k, v in table.items()]
    (root / "taskkernel.toml").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return Workspace.load(root)


def workspace_database(ws: Workspace) -> Database:
    """The workspace's database as every CLI process opens it, chain key included: agents that call the CLI
    key the store, and a keyless in-process writer would then be refused."""
    return CliContext(workspace_path=str(ws.root)).database()


def coordinator(ws: Workspace, owner: str = "test-coordinator") -> Coordinator:
    """A coordinator as `up --once` builds it: files are taken as soon as they parse (no settle delay)."""
    return Coordinator(ws, workspace_database(ws), owner=owner, settle_s=0.0, grace_s=0.0)


def admin_task(c: Coordinator, subject: str = "Login page", recipient: str = "PM", key: str | None = None,
               **extra: Any) -> str:
    r = c.kernel.submit({"type": "create_task", "idempotency_key": key or f"admin:{subject}", "payload": {
        "sender": "ADMIN", "recipient": recipient, "subject": subject, "body": "make it work", **extra}}, LOCAL_OWNER)
    assert r.status == "accepted", r
    assert r.task_id is not None
    return r.task_id
