"""The REAL agent CLIs (installed from npm, pinned in tests/clis/package.json) driven through `taskkernel up
--once`, each pointed at a scripted stand-in for its provider's API (tests/model_servers.py).

``RealTeam`` is tests/agents_support.py's Team without the stand-in CLIs: a git repository with a taskkernel
workspace at its root, the real binaries of tests/clis/node_modules/.bin first on PATH, a fresh HOME, and an
environment cleaned of the developer's own provider settings (nothing of theirs reaches the CLIs or a real API).
``require_cli`` skips when a binary is missing (fails under TASKKERNEL_REQUIRE_AGENT_CLIS=1, as a missing chromium
fails under TASKKERNEL_REQUIRE_BROWSER=1).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.agents_support import git
from tests.cli_support import CLI, ROOT

CLIS_DIR = Path(__file__).parent / "clis"
BIN = CLIS_DIR / "node_modules" / ".bin"
# Droid's package is its platform binary alone (no wrapper, so no .bin link): its own folder goes on PATH too
DROID_BIN = CLIS_DIR / "node_modules" / "@factory" / "cli-linux-x64" / "bin"
BIN_DIRS = (BIN, DROID_BIN)
INSTALL = "make agent-clis"
REQUIRE = "TASKKERNEL_REQUIRE_AGENT_CLIS"
NODE_CLIS = {"codex", "gemini", "qwen", "copilot"}  # started through node (a `#!/usr/bin/env node` script)

# Nothing of the developer's own agent or provider configuration may reach a CLI under test (or make it call a
# real API): these are dropped from the environment the coordinator is started with.
_DROPPED_PREFIXES = ("ANTHROPIC_", "CLAUDE_", "CODEX_", "OPENAI_", "GEMINI_", "GOOGLE_", "AWS_", "AZURE_",
                     "VERTEX", "CLOUD_ML_", "XDG_", "TASKKERNEL_", "NODE_OPTIONS", "NPM_", "COPILOT_", "GH_",
                     "GITHUB_", "OPENCODE_", "FACTORY_", "AMP_", "QWEN_", "DASHSCOPE_")
_DROPPED = {"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy", "no_proxy",
            "NO_PROXY", "PYTHONPATH", "VIRTUAL_ENV"}


def binary(name: str) -> Path:
    return (DROID_BIN if name == "droid" else BIN) / name


def cli_missing(name: str) -> str | None:
    """Why the real CLI ``name`` cannot run here, or None."""
    path = binary(name)
    if not (path.exists() and os.access(path, os.X_OK)):
        return (f"the agent CLI `{name}` is not installed at {path.relative_to(ROOT)}: run `{INSTALL}` "
                "(the pinned releases of tests/clis/package.json)")
    if name in NODE_CLIS and shutil.which("node") is None:
        return f"the agent CLI `{name}` needs Node.js (`node` on PATH): install it (Debian: apt-get install nodejs)"
    return None


def require_cli(name: str) -> None:
    """Skip when the real CLI is missing; fail instead under TASKKERNEL_REQUIRE_AGENT_CLIS=1 (CI)."""
    reason = cli_missing(name)
    if reason:
        if os.environ.get(REQUIRE) == "1":
            pytest.fail(f"{REQUIRE}=1 but {reason}", pytrace=False)
        pytest.skip(reason)


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if k not in _DROPPED and not k.startswith(_DROPPED_PREFIXES)}


class RealTeam:
    """A git repository with a taskkernel workspace at its root; the real CLIs first on PATH; HOME a fresh folder
    (the CLIs write their state there: ~/.claude.json, ~/.codex, ~/.gemini, ~/.qwen, ~/.copilot, ~/.factory, …;
    a test may put the user's own CLI configuration there first); ``provider`` the variables the coordinator is
    started with (base URL, key)."""

    def __init__(self, tmp: Path, roles: str, provider: dict[str, str] | None = None) -> None:
        self.tmp, self.root, self.home = tmp, tmp / "repo", tmp / "home"
        self.provider = dict(provider or {})
        self.tmpdir = tmp / "tmpdir"  # the CLIs' temporary files (Gemini CLI writes error reports there)
        for d in (self.root, self.home, self.tmpdir):
            d.mkdir(mode=0o700, exist_ok=d == self.home)  # HOME may hold the user's own CLI configuration
        git(self.root, "init", "-q", "-b", "main")
        (self.root / "README.md").write_text("project\n")
        init = self.cli("init", ".")
        assert init.returncode == 0, init.stderr
        with open(self.root / "taskkernel.toml", "a", encoding="utf-8") as fh:
            fh.write(roles)
        git(self.root, "add", "-A")
        git(self.root, "commit", "-q", "-m", "start")

    def env(self, **extra: str) -> dict[str, str]:
        base = clean_env()
        path = os.pathsep.join([*map(str, BIN_DIRS), base.get("PATH", "/usr/bin:/bin")])
        return {**base, "PATH": path, "HOME": str(self.home),
                "TMPDIR": str(self.tmpdir), "PYTHONPATH": str(ROOT), "NO_PROXY": "127.0.0.1,localhost",
                **self.provider, **extra}

    def cli(self, *args: str, env: dict[str, str] | None = None, timeout: float = 180
            ) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CLI, *args], cwd=self.root, capture_output=True, text=True,
                              env=self.env(**(env or {})), timeout=timeout, check=False)

    def ok(self, *args: str, env: dict[str, str] | None = None) -> Any:
        done = self.cli(*args, "--json", env=env)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return json.loads(done.stdout)

    def task(self, recipient: str, subject: str, body: str) -> str:
        made = self.ok("task", "create", "--to", recipient, "--subject", subject, "--body", body)
        return str(made["task_id"])

    def up(self, env: dict[str, str] | None = None, wait: float = 5, timeout: float = 240
           ) -> subprocess.CompletedProcess[str]:
        done = self.cli("up", "--once", "--once-wait", str(wait), env=env, timeout=timeout)
        assert done.returncode == 0, (done.stdout[-4000:], done.stderr[-4000:])
        return done

    def show(self, task_id: str) -> dict[str, Any]:
        return dict(self.ok("task", "show", task_id))

    def runs(self, task_id: str) -> list[dict[str, Any]]:
        """Every run of the task (``runs show``: attempts, logs), oldest first."""
        listed = self.ok("runs", "list", "--task", task_id)
        return [self.ok("runs", "show", r["run_id"]) for r in reversed(listed)]

    def usage(self, task_id: str) -> dict[str, Any]:
        rows = {r["owner"]: r for r in self.ok("usage", "--by", "task")["rows"]}
        return dict(rows.get(task_id) or {})

    def worktree(self, task_id: str) -> Path:
        return self.root / ".taskkernel" / "worktrees" / task_id


def logs(attempt: dict[str, Any]) -> tuple[str, str]:
    """An attempt's whole stdout and stderr."""
    paths = attempt.get("logs") or {}
    return tuple(Path(paths[k]).read_text(errors="replace") if paths.get(k) and Path(paths[k]).exists() else ""
                 for k in ("stdout", "stderr"))  # type: ignore[return-value]


def role(runner: str, **keys: Any) -> str:
    """A [roles.X] table body: the preset, one attempt unless said, no backoff, a timeout that fits a test."""
    table = {"max_attempts": 1, "backoff": 0, "timeout": 90, **keys}
    lines = []
    for key, value in table.items():
        if isinstance(value, dict):
            inner = ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in value.items())
            lines.append(f"{key} = {{ {inner} }}\n")
        else:
            lines.append(f"{key} = {json.dumps(value)}\n")
    return f'runner = "{runner}"\n' + "".join(lines)


def json_lines(text: str) -> list[dict[str, Any]]:
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                found.append(obj)
    return found
