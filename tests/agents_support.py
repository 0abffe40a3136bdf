"""A git repository with a taskkernel workspace and stand-ins for the agent CLIs first on PATH
(tests/procs/agent_cli.py): what the worktree, merge and agent-security tests drive through the real CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from taskkernel.coordinator import schema
from taskkernel.coordinator.workspace import Workspace, init_workspace
from taskkernel.coordinator.worktrees.manager import Worktrees
from taskkernel.kernel.store.db import Database
from tests.cli_support import taskkernel

STANDIN = Path(__file__).parent / "procs" / "agent_cli.py"
GIT_ID = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t",
          "GIT_COMMITTER_EMAIL": "t@example.invalid"}


def git(where: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True,
                          env={**os.environ, **GIT_ID}, check=False)
    assert done.returncode == 0, (args, done.stderr)
    return done.stdout.strip()


class Team:
    """A git repository with a taskkernel workspace at its root, and the stand-in CLIs first on PATH."""

    def __init__(self, tmp: Path, roles: str) -> None:
        self.tmp, self.root, self.records = tmp, tmp / "repo", tmp / "records"
        self.bin = tmp / "bin"
        for d in (self.root, self.records, self.bin):
            d.mkdir()
        for cli in ("claude", "codex", "gemini"):
            wrapper = self.bin / cli
            wrapper.write_text(f"#!/bin/sh\nSTANDIN_RECORDS={self.records} exec {sys.executable} {STANDIN} {cli} "
                               '"$@"\n')
            wrapper.chmod(0o755)
        git(self.root, "init", "-q", "-b", "main")
        (self.root / "README.md").write_text("project\n")
        (self.root / "shared.txt").write_text("base\n")
        init = self.cli("init", ".")
        assert init.returncode == 0, init.stderr
        with open(self.root / "taskkernel.toml", "a", encoding="utf-8") as fh:
            fh.write(roles)
        git(self.root, "add", "-A")
        git(self.root, "commit", "-q", "-m", "start")

    def env(self, **extra: str) -> dict[str, str]:
        return {"PATH": f"{self.bin}{os.pathsep}{os.environ['PATH']}", **extra}

    def cli(self, *args: str, env: dict[str, str] | None = None, timeout: float = 180
            ) -> subprocess.CompletedProcess[str]:
        return taskkernel(*args, cwd=self.root, env=self.env(**(env or {})), timeout=timeout)

    def ok(self, *args: str, env: dict[str, str] | None = None) -> Any:
        done = self.cli(*args, "--json", env=env) if "--json" not in args else self.cli(*args, env=env)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return json.loads(done.stdout)

    def task(self, recipient: str, subject: str, body: str) -> str:
        made = self.ok("task", "create", "--to", recipient, "--subject", subject, "--body", body)
        return str(made["task_id"])

    def up(self, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        done = self.cli("up", "--once", "--once-wait", "20", env=env, timeout=300)
        assert done.returncode == 0, (done.stdout, done.stderr)
        return done

    def show(self, task_id: str) -> dict[str, Any]:
        return dict(self.ok("task", "show", task_id))

    def runs_of(self, task_id: str) -> list[dict[str, Any]]:
        """The stand-in's starts for the task, in start order, each with its end time (None: it crashed)."""
        found = []
        for path in self.records.glob(f"{task_id}-*.json"):
            end = path.with_suffix(".end")
            found.append({**json.loads(path.read_text()),
                          "ended": float(end.read_text()) if end.exists() else None})
        return sorted(found, key=lambda r: r["started"])

    def worktree(self, task_id: str) -> Path:
        return self.root / ".taskkernel" / "worktrees" / task_id


def role(runner: str, **keys: Any) -> str:
    table = {"max_attempts": 2, "backoff": 0, "timeout": 120, **keys}
    lines = "".join(f"{k} = {json.dumps(v)}\n" for k, v in table.items())
    return f'runner = "{runner}"\n{lines}'


def worktrees_in_repository(tmp_path: Path) -> tuple[Worktrees, Path]:
    """The worktree manager over a fresh repository (README.md and shared.txt committed on main) whose root is a
    workspace: for what a process test cannot stop at the right moment."""
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    (root / "README.md").write_text("project\n")
    (root / "shared.txt").write_text("base\n")
    init_workspace(root)
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "start")
    db = Database(Workspace.load(root).database_url, "process")
    schema.ensure(db)
    return Worktrees(db, root), root
