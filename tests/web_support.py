"""Start the real `taskkernel serve` in its own process and talk to it over HTTP, as a browser or a script would."""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest

from taskkernel.coordinator import schema
from taskkernel.coordinator.workspace import Workspace
from taskkernel.coordinator.worktrees.manager import Worktrees
from taskkernel.kernel.store.db import Database
from tests.agents_support import git
from tests.cli_support import CLI, cli_env, run, stop_server


def start(ws: Path, *options: str) -> tuple[subprocess.Popen[str], str]:
    """`taskkernel serve --port 0 OPTIONS` in ``ws``: the process and the board's URL (ending in /)."""
    proc = subprocess.Popen([*CLI, "serve", "--port", "0", "--json", *options], cwd=ws, env=cli_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout or ()], daemon=True).start()
    try:
        listening = json.loads(lines.get(timeout=60))
    except queue.Empty:
        proc.kill()
        raise AssertionError(f"the board did not listen: {proc.stderr.read() if proc.stderr else ''}") from None
    assert listening["status"] == "listening", listening
    return proc, listening["url"]


@contextmanager
def board(ws: Path, *options: str) -> Iterator[str]:
    proc, url = start(ws, *options)
    try:
        yield url
    finally:
        stop_server(proc)


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
NO_CHROMIUM = ("no chromium on this machine (.ci/run installs Debian's; TASKKERNEL_REQUIRE_BROWSER=1 makes this a "
               "failure)")


@contextmanager
def chromium() -> Iterator[Any]:
    """Debian's headless chromium driven by Playwright (no browser is downloaded); the test is skipped without one,
    unless TASKKERNEL_REQUIRE_BROWSER is set."""
    if CHROMIUM is None:
        if os.environ.get("TASKKERNEL_REQUIRE_BROWSER"):
            pytest.fail("TASKKERNEL_REQUIRE_BROWSER is set but chromium is not installed")
        pytest.skip(NO_CHROMIUM)
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        chrome = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            yield chrome
        finally:
            chrome.close()


def policy_violations(page: Any) -> list[str]:
    """What the page's console says its Content-Security-Policy blocked, as it happens: a script, a style or a
    connection the board needs and the policy forbids breaks the board without any other sign."""
    found: list[str] = []
    page.on("console", lambda m: found.append(m.text) if "Content Security Policy" in m.text else None)
    return found


def owner_token(ws: Path) -> str:
    return (ws / ".taskkernel" / "owner.token").read_text().strip()


def issue(ws: Path, role: str, agent: str) -> str:
    done = run("token", "issue", role, "--agent", agent, cwd=ws)
    assert done.code == 0, done.err
    return done.out.strip()


def create(ws: Path, subject: str, *options: str) -> str:
    done = run("task", "create", "--to", "DEV", "--subject", subject, *options, "--json", cwd=ws)
    assert done.code == 0, done.err
    return str(done.json["task_id"])


def report_done(ws: Path, task_id: str, token: str, *then: tuple[str, ...]) -> None:
    """DEV claims the task and reports it done (the CLI as the agent), then acts ``then`` (the task stays active
    until it is submitted)."""
    for args in (("claim", task_id), ("report", task_id, "--status", "done", "--body", "the work is done"), *then):
        done = run("--token", token, "task", *args, "--json", cwd=ws)
        assert done.code == 0, (args, done.out, done.err)


def to_review(ws: Path, task_id: str, token: str) -> None:
    """DEV claims the task, reports done and submits it (the CLI as the agent)."""
    report_done(ws, task_id, token, ("submit", task_id))


def repository_workspace(where: Path, files: dict[str, str]) -> Path:
    """A git repository holding ``files``, with a taskkernel workspace at its root (`taskkernel init`), committed."""
    root = where / "repo"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    for name, text in files.items():
        (root / name).write_text(text)
    assert run("init", str(root), cwd=where).code == 0
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "start")
    return root


def change(ws: Path, task_id: str, files: dict[str, str]) -> None:
    """``files`` written in the task's own worktree: the done report its agent gives next records the diff."""
    db = Database(Workspace.load(ws).database_url, "process")
    schema.ensure(db)
    tree = Worktrees(db, ws).ensure(task_id, None)
    for name, text in files.items():
        (tree.path / name).write_text(text)


def sign_in(url: str, token: str) -> tuple[httpx2.Client, str]:
    """A browser-like client signed in with ``token``: its cookie jar and the CSRF token its pages carry."""
    client = httpx2.Client(base_url=url, timeout=30)
    answer = client.post("/login", data={"token": token, "next": "/"})
    assert answer.status_code == 303, answer.text
    page = client.get("/").text
    marker = '<meta name="csrf-token" content="'
    assert marker in page
    return client, page.split(marker, 1)[1].split('"', 1)[0]


def task_json(ws: Path, task_id: str) -> dict[str, Any]:
    done = run("task", "show", task_id, "--json", cwd=ws)
    assert done.code == 0, done.err
    return dict(done.json)
