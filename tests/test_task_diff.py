"""A reviewer has the change in the CLI (issue 25): `task diff ID [--round N]` prints the patch a done report recorded,
proven against the SHA-256 in its event (like `gh pr diff`): the bytes themselves in a pipe, the document with
`--json`, the terminal rule on a terminal; a changed or missing patch file, or a task without a recorded diff, is
refused with a stable code. Real git, real `taskkernel` processes, the stand-in agent CLI (tests/procs/agent_cli.py)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tests.agents_support import Team, role
from tests.cli_support import run_tty

TITLE = "\x1b]0;pwned\x07"  # an OSC sequence that would retitle the terminal


def refused(team: Team, *args: str) -> tuple[int, str]:
    done = team.cli("task", "diff", *args)
    return done.returncode, json.loads(done.stdout)["reason"]


def test_task_diff_prints_the_recorded_patch_of_a_round_and_refuses_one_changed_since(tmp_path: Path) -> None:
    team = Team(tmp_path, f"\n[roles.DEV]\n{role('claude-code')}")
    task = team.task("DEV", "Versioned", f"stamp version.txt\nwrite title.txt {TITLE}")
    assert refused(team, task) == (2, "no_diff"), "nothing reported yet"
    team.up()
    team.ok("task", "reject", task, "--reason", "once more")
    team.up()  # round 2: the stamp changes
    reports = [r for r in team.show(task)["reports"] if r["status"] == "done"]
    assert [r["round"] for r in reports] == [1, 2]
    assert all(r["body"] == "done by the claude stand-in" for r in reports), reports

    latest = team.cli("task", "diff", task)  # a pipe: the recorded bytes, nothing escaped
    assert latest.returncode == 0, latest.stderr
    patch = (team.root / reports[1]["diff"]["patch"]).read_bytes()
    assert latest.stdout.encode() == patch and "+round 2" in latest.stdout and TITLE in latest.stdout

    first = team.ok("task", "diff", task, "--round", "1", "--json")
    assert set(first) == {"task_id", "round", "report_id", "patch", "patch_sha256", "files"}
    assert (first["task_id"], first["round"], first["report_id"]) == (task, 1, reports[0]["report_id"])
    assert "+round 1" in first["patch"] and "+round 2" not in first["patch"]
    assert first["patch_sha256"] == reports[0]["diff"]["patch_sha256"] == hashlib.sha256(
        first["patch"].encode()).hexdigest()
    assert sorted(f["path"] for f in first["files"]) == ["title.txt", "version.txt"]

    shown = run_tty("task", "diff", task, cwd=team.root)  # a terminal: the patch cannot drive it
    assert shown.code == 0 and "+round 2" in shown.out
    assert "\x1b" not in shown.out and "\x07" not in shown.out and "\\x1b]0;pwned\\x07" in shown.out

    assert refused(team, task, "--round", "7") == (2, "no_diff")
    assert refused(team, "TASK-20990101-001") == (2, "task_not_found")
    path = team.root / reports[0]["diff"]["patch"]
    path.write_bytes(path.read_bytes() + b"+a line nobody reviewed\n")
    assert refused(team, task, "--round", "1") == (2, "patch_mismatch")
    assert team.cli("task", "diff", task).returncode == 0, "round 2's patch is untouched"
    path.unlink()
    assert refused(team, task, "--round", "1") == (2, "patch_missing")
