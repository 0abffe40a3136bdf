"""Two coordinators on PostgreSQL sharing one workspace never dispatch or run a task twice."""

from __future__ import annotations

import sys
import textwrap
from collections import Counter
from pathlib import Path

from tests.cli_support import taskkernel_bg
from tests.coord_support import admin_task, coordinator, make_workspace


def test_two_coordinators_share_a_postgres_workspace(pg_url: str, tmp_path: Path) -> None:
    journal = tmp_path / "journal.log"
    agent = tmp_path / "agent.py"
    agent.write_text(textwrap.dedent(f"""
        import os, subprocess, sys, time
        with open({str(journal)!r}, "a") as fh:
            fh.write(os.environ["TASKKERNEL_TASK_ID"] + " " + os.environ["TASKKERNEL_ROUND"] + "\\n")
        time.sleep(0.05)
        subprocess.run([sys.executable, "-m", "taskkernel", "task", "report", os.environ["TASKKERNEL_TASK_ID"],
                        "--status", "done", "--body", "ok"], check=True, capture_output=True)  # else: no_report
    """), encoding="utf-8")
    ws = make_workspace(tmp_path / "ws", {"DEV": {"runner": "command", "argv": [sys.executable, str(agent)]}},
                        database=pg_url)
    c = coordinator(ws)
    tasks = [admin_task(c, subject=f"job {i}", recipient="DEV") for i in range(12)]
    procs = [taskkernel_bg("up", str(ws.root), "--once", cwd=tmp_path) for _ in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
    runs = Counter(journal.read_text().split("\n")[:-1])
    assert sorted(runs) == sorted(f"{t} 1" for t in tasks)
    assert set(runs.values()) == {1}, "no task was executed twice"
    claims = [e for t in tasks for e in c.kernel.history(t) if e.type == "task_claimed"]
    assert len(claims) == 12
