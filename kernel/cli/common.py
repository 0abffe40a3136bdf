"""Shared CLI plumbing: exit codes, output helpers and the lazily opened workspace/database."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, NoReturn

import typer
from rich.console import Console

from kernel.store.db import Database
from kernel.store.schema import metadata as kernel_metadata
from kernel.workspace import Workspace, WorkspaceNotFound

stderr = Console(stderr=True)


class Exit(IntEnum):
    """Process exit codes (docs/cli.md). 64/65 follow sysexits.h."""

    OK = 0
    INTERNAL = 1
    REJECTED = 2  # also: replay unknown, verify found a break, gate BLOCK
    USAGE = 64
    DATAERR = 65


def emit(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, ensure_ascii=False, default=str) + "\n")
    sys.stdout.flush()


def fail(code: Exit, message: str, **extra: Any) -> NoReturn:
    """Print a JSON error on stdout and a readable line on stderr, then exit with ``code``."""
    emit({"status": "error", "code": code.name.lower(), "message": message, **extra})
    stderr.print(f"[red]error:[/red] {message}")
    raise typer.Exit(int(code))


@dataclass
class CliContext:
    """Global options, resolved lazily so commands that need no workspace never look for one."""

    db_url: str | None = None
    workspace_path: str | None = None
    token: str | None = None
    _workspace: Workspace | None = field(default=None, repr=False)
    _db: Database | None = field(default=None, repr=False)

    def workspace(self) -> Workspace:
        if self._workspace is None:
            try:
                self._workspace = Workspace.locate(self.workspace_path)
            except WorkspaceNotFound as exc:
                fail(Exit.USAGE, str(exc))
        return self._workspace

    def database(self) -> Database:
        """The kernel database: --db / TASKKERNEL_DB, else the workspace's configured one."""
        if self._db is None:
            url = self.db_url or os.environ.get("TASKKERNEL_DB")
            durability = "full"
            if not url:
                ws = self.workspace()
                url, durability = ws.database_url, ws.durability
            self._db = Database(url, durability)
            self._db.create_schema(kernel_metadata)
        return self._db

    def optional_workspace(self) -> Workspace | None:
        """The workspace if there is one (commands given only --db may run without)."""
        if self._workspace is None:
            try:
                self._workspace = Workspace.locate(self.workspace_path)
            except WorkspaceNotFound:
                return None
        return self._workspace


def get_ctx(ctx: typer.Context) -> CliContext:
    obj = ctx.find_root().obj
    assert isinstance(obj, CliContext)
    return obj
