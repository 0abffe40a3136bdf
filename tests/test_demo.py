"""The README's main command: the demo runs the coordinator end to end, offline, and exits 0."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli_support import taskkernel


def test_demo_runs_the_whole_story(tmp_path: Path) -> None:
    r = taskkernel("demo", "--dir", str(tmp_path / "demo"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["status"] == "ok" and out["verify"]["status"] == "ok"
    assert out["root_task"]["state"] == "archive"
    assert [(k["recipient"], k["state"]) for k in out["children"]] == [("DEV", "done"), ("QA", "done")]
    artifact = tmp_path / "demo" / out["artifacts"][0]
    assert artifact.is_file() and out["children"][0]["task_id"] in artifact.read_text()
    assert "fcop/_lifecycle/archive/TASK-20261130-001-ADMIN-to-PM.md" in out["task_files"]
    verdicts = [(s["status"], s.get("reason")) for s in out["steps"] if "status" in s]
    assert ("rejected", "permission_required") in verdicts, "approval needs ADMIN's grant from the session log"
    assert ("rejected", "stale_task_revision") in verdicts
    assert ("replayed", None) in verdicts
    [beat] = [s for s in out["steps"] if s["step"] == "heartbeat"]
    assert beat["detail"].startswith("2 fire(s)"), "the 30-minute heartbeat fired twice in one virtual hour"
    again = taskkernel("demo", "--dir", str(tmp_path / "demo"), cwd=tmp_path)
    assert again.returncode == 64 and "Traceback" not in again.stderr, "a second run refuses cleanly"
    assert json.loads(again.stdout)["code"] == "usage"
