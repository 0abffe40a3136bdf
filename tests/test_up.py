"""`taskkernel up` as a long-running process: watches the folders, stops gracefully, resumes cleanly."""

from __future__ import annotations

import io
import json
import signal
import time
from pathlib import Path

from rich.console import Console

from taskkernel.coordinator.cli.live import live_view
from tests.cli_support import taskkernel, taskkernel_bg
from tests.coord_support import coordinator, make_workspace
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


def test_two_refusals_of_one_operation_both_show_in_up_once_and_in_the_live_view(tmp_path: Path) -> None:
    """A scan that meets a planted link (symlink_refused) and a file where a folder belongs (io_error): two reasons
    of one operation, each its own entry with its count, in `up --once` and among the live view's failing stages."""
    ws = make_workspace(tmp_path / "ws", {})
    fcop = ws.root / "fcop"
    (tmp_path / "elsewhere").mkdir()
    (fcop / "reports").rmdir()
    (fcop / "reports").symlink_to(tmp_path / "elsewhere")
    (fcop / "issues").rmdir()
    (fcop / "issues").write_text("not a folder\n", encoding="utf-8")
    up = taskkernel("up", "--once", cwd=ws.root)
    assert "Traceback" not in up.stderr, up.stderr
    status = json.loads(up.stdout.strip().splitlines()[-1])
    assert (up.returncode, status["status"]) == (1, "degraded"), up.stdout
    scans = [f for f in status["failed_stages"] if f["stage"] == "scan_refused"]
    assert sorted(f["error"] for f in scans) == ["io_error", "symlink_refused"], status["failed_stages"]  # once each
    assert all(f["passes"] >= 1 for f in scans) and any(str(fcop / "issues") in f["message"] for f in scans)

    c = coordinator(ws)
    c.pass_once()
    screen = io.StringIO()
    Console(file=screen, width=200, color_system=None).print(live_view(c, {}))
    c.db.dispose()
    assert "failing scan_refused: symlink_refused" in screen.getvalue()
    assert "failing scan_refused: io_error" in screen.getvalue()
