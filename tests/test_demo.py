"""The README's main command: the demo runs end to end and shows each kernel verdict."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli_support import taskkernel


def test_demo_runs_and_shows_rejections_and_replays(tmp_path: Path) -> None:
    r = taskkernel("demo", "--dir", str(tmp_path / "demo"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["status"] == "ok" and out["verify"]["status"] == "ok"
    reasons = {s["reason"] for s in out["steps"]}
    assert {"stale_task_revision", "report_required", "role_not_authorized", "illegal_transition",
            "child_tasks_open"} <= reasons
    assert "replayed" in {s["status"] for s in out["steps"]}
    assert out["steps"][-1]["status"] == "accepted" and out["steps"][-1]["command"] == "archive"
