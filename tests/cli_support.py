"""Run the real `taskkernel` CLI in a fresh process, as a user or an acceptance script would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "taskkernel"]


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TASKKERNEL_TOKEN", "TASKKERNEL_DB",
                                                             "TASKKERNEL_WORKSPACE")}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def taskkernel(*args: str, cwd: Path, stdin: str | None = None, env: dict[str, str] | None = None,
               timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], cwd=cwd, input=stdin, capture_output=True, text=True,
                          env=cli_env(**(env or {})), timeout=timeout)


def taskkernel_bg(*args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([*CLI, *args], cwd=cwd, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


@dataclass(frozen=True)
class Run:
    """A finished CLI run; ``json`` is its last stdout line parsed."""

    code: int
    out: str
    err: str

    @property
    def json(self) -> Any:
        return json.loads(self.out.strip().splitlines()[-1])


def stop_server(proc: subprocess.Popen[str]) -> str:
    """SIGTERM to a server the CLI started (`mcp --transport http`, `serve`): a graceful stop exits 0 with no
    traceback; its stderr."""
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    errors = proc.stderr.read() if proc.stderr else ""
    assert "Traceback" not in errors, errors
    assert proc.returncode == 0, (proc.returncode, errors)
    return errors


def run(*args: str, cwd: Path, stdin: str | None = None) -> Run:
    proc = taskkernel(*args, cwd=cwd, stdin=stdin)
    return Run(proc.returncode, proc.stdout, proc.stderr)


def new_workspace(tmp_path: Path) -> Path:
    """``taskkernel init`` of a fresh workspace at ``tmp_path/ws``."""
    root = tmp_path / "ws"
    assert run("init", str(root), cwd=tmp_path).code == 0
    return root


def append_config(ws: Path, text: str) -> None:
    """Add tables or keys at the end of the workspace's taskkernel.toml."""
    with open(ws / "taskkernel.toml", "a", encoding="utf-8") as fh:
        fh.write(text)


def run_tty(*args: str, cwd: Path, timeout: float = 120) -> Run:
    """The CLI as a person at a terminal sees it: stdout is a pseudo-terminal (120 columns, no colours), so
    the human rendering is chosen; stderr stays a pipe."""
    import fcntl
    import pty
    import select
    import struct
    import termios

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 120, 0, 0))
    proc = subprocess.Popen([*CLI, *args], cwd=cwd, stdin=subprocess.DEVNULL, stdout=follower,
                            stderr=subprocess.PIPE, env=cli_env(TERM="dumb", NO_COLOR="1"))
    os.close(follower)
    chunks: list[bytes] = []
    while True:
        ready, _, _ = select.select([leader], [], [], timeout)
        if not ready:
            proc.kill()
            raise TimeoutError(f"taskkernel {' '.join(args)} wrote nothing for {timeout} s")
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the terminal closed with the process
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    err = proc.stderr.read().decode() if proc.stderr else ""
    code = proc.wait(timeout)
    return Run(code, b"".join(chunks).decode().replace("\r\n", "\n"), err)
