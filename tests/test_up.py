"""`taskkernel up` as a long-running process: watches the folders, stops gracefully, resumes cleanly."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from tests.cli_support import taskkernel, taskkernel_bg
from tests.coord_support import make_workspace
from tests.test_folders import task_file


def wait_for(predicate, timeout: float = 30.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def state_of(ws: Path, task_id: str) -> str | None:
    r = taskkernel("task", "show", task_id, cwd=ws)
    return json.loads(r.stdout)["state"] if r.returncode == 0 else None


def test_up_picks_up_new_files_and_stops_on_sigterm(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "ws", {"PM": {"runner": "scripted"}, "DEV": {"runner": "scripted"},
                                          "QA": {"runner": "scripted"}})
    proc = taskkernel_bg("up", str(ws.root), cwd=tmp_path)
    try:
        time.sleep(1.0)
        task_file(ws.root, "TASK-20261130-001-ADMIN-to-PM.md", subject="Watch me")
        assert wait_for(lambda: state_of(ws.root, "TASK-20261130-001") == "review"), proc.stderr
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1])["status"] == "stopped"
    events = len(taskkernel("log", cwd=ws.root).stdout.splitlines())
    again = taskkernel("up", str(ws.root), "--once", cwd=tmp_path)
    assert again.returncode == 0
    assert len(taskkernel("log", cwd=ws.root).stdout.splitlines()) == events, "a restart duplicates nothing"
