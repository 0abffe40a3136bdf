"""The README's main command: the demo runs end to end and shows each kernel verdict."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_demo_runs_and_shows_rejections_and_replays(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-c", "from kernel.cli.app import main; main()", "demo", "--dir",
                        str(tmp_path / "demo")], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["status"] == "ok" and out["verify"]["status"] == "ok"
    reasons = {s["reason"] for s in out["steps"]}
    assert {"stale_task_revision", "report_required", "role_not_authorized", "illegal_transition",
            "child_tasks_open"} <= reasons
    assert "replayed" in {s["status"] for s in out["steps"]}
    assert out["steps"][-1]["status"] == "accepted" and out["steps"][-1]["command"] == "archive"
