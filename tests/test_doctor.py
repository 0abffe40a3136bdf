"""`taskkernel doctor` (issue 11, item 2): one run says whether the workspace can work — its configuration, private
file modes, FCoP folder, team, each runner, the database — and what waits for a person; exit 0 healthy, 2 not.
Through the real CLI, in its own process."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.cli_support import CLI, Run, cli_env, new_workspace, run
from tests.cli_support import append_config as append

# Until `doctor` is in the command table (coordinator/cli/groups.py), the same CLI entry point runs it with the
# command attached first; afterwards this is the plain `taskkernel doctor`.
_ATTACH = ("import sys\nfrom taskkernel.coordinator.cli import doctor, root\n"
           "root.app.command('doctor')(doctor.doctor)\nroot.run(sys.argv[1:])")


def _registered() -> bool:
    from taskkernel.coordinator.cli import groups

    return any(getattr(entry, "name", None) == "doctor" for entry in getattr(groups, "ENTRIES", ()))


def doctor(cwd: Path, *args: str) -> Run:
    argv = [*CLI, *args, "doctor"] if _registered() else [sys.executable, "-c", _ATTACH, *args, "doctor"]
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, env=cli_env(), timeout=120)
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr
    return Run(proc.returncode, proc.stdout, proc.stderr)


def checks(r: Run) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in r.json["checks"]}


def statuses(r: Run) -> dict[str, str]:
    return {name: c["status"] for name, c in checks(r).items()}


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    return new_workspace(tmp_path)


def test_a_fresh_workspace_is_healthy(ws: Path) -> None:
    append(ws, f'\n[roles.DEV]\nrunner = "command"\nargv = [{json.dumps(sys.executable)}, "-c", "pass", '
               '"{task_file}"]\n[roles.QA]\nrunner = "scripted"\n')
    r = doctor(ws)
    assert r.code == 0 and r.json["status"] == "ok", r.out
    assert statuses(r) == {"config": "ok", "permissions": "ok", "folders": "ok", "quarantine": "ok", "team": "ok",
                           "runner DEV": "ok", "runner QA": "ok", "database": "ok", "schema": "ok",
                           "blocked_tasks": "ok", "stalled_tasks": "ok", "dead_letters": "ok"}
    found = checks(r)
    assert found["runner DEV"]["program"] == sys.executable
    assert found["team"]["leader"] == "PM" and found["team"]["without_runner"] == ["OPS", "PM"]
    assert found["folders"]["generation"] == "g3"
    assert found["schema"]["version"] == found["schema"]["head"] and not found["schema"]["behind"]
    assert "ok   config" in r.err and "ok   database" in r.err  # one line per check for people


def test_a_broken_workspace_names_each_failing_check(ws: Path) -> None:
    append(ws, '\n[roles.DEV]\nrunner = "command"\nargv = ["no-such-agent-binary", "{task_file}"]\ncwd = "nowhere"\n'
               '\n[roles.DEVV]\nrunner = "scripted"\n\n[gate]\nroles = { OPZ = ["deploy"] }\n')
    (ws / "taskkernel.toml").chmod(0o644)
    (ws / ".taskkernel" / "owner.token").chmod(0o640)
    r = doctor(ws)
    assert r.code == 2 and r.json["status"] == "unhealthy", r.out
    found = checks(r)
    assert {n for n, c in found.items() if c["status"] == "fail"} == {"permissions", "runner DEV", "runner DEVV",
                                                                      "gate"}
    loose = {f["path"]: f["mode"] for f in found["permissions"]["files"]}
    assert loose == {"taskkernel.toml": "0644", ".taskkernel/owner.token": "0640"}
    dev = found["runner DEV"]["message"]
    assert "argv[0] 'no-such-agent-binary' is not on the agent's PATH" in dev and "cwd 'nowhere'" in dev
    assert [p["key"] for p in found["runner DEV"]["problems"]] == ["argv", "cwd"]
    assert "DEVV is not a role of the team" in found["runner DEVV"]["message"]
    assert found["runner DEVV"]["problems"][0]["suggestion"] == "[roles.DEV]"
    assert "roles: OPZ is not a role of the team" in found["gate"]["message"] and "did you mean OPS?" in \
        found["gate"]["message"]
    assert "unhealthy: permissions, runner DEV, runner DEVV, gate" in r.err


def test_an_invalid_config_is_a_failing_check_with_the_near_miss(ws: Path) -> None:
    append(ws, '\n[rols.PM]\nrunner = "scripted"\n')
    r = doctor(ws)
    assert r.code == 2 and statuses(r) == {"config": "fail", "permissions": "ok", "database": "warn"}, r.out
    config = checks(r)["config"]
    assert config["code"] == "config_invalid" and config["file"] == str(ws / "taskkernel.toml")
    assert config["problems"][0]["suggestion"] == "[roles.PM]" and config["line"] is not None
    assert "[rols.PM] is not a table taskkernel knows; did you mean [roles.PM]?" in config["message"]


def test_no_workspace_and_no_database_are_failures_and_doctor_creates_neither(ws: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = doctor(elsewhere)
    assert r.code == 2 and checks(r)["config"]["status"] == "fail" and "run `taskkernel init`" in r.out
    (ws / ".taskkernel" / "kernel.db").unlink()
    r = doctor(ws)
    assert r.code == 2 and checks(r)["database"]["status"] == "fail" and "no database at" in r.out, r.out
    assert not (ws / ".taskkernel" / "kernel.db").exists()


def test_an_unreachable_database_fails_without_its_password(ws: Path) -> None:
    text = (ws / "taskkernel.toml").read_text().replace(
        '# database = "postgresql+psycopg://user@host/db"',
        'database = "postgresql+psycopg://someone:s3cret@127.0.0.1:9/nothing?connect_timeout=2"')
    (ws / "taskkernel.toml").write_text(text)
    r = doctor(ws)
    database = checks(r)["database"]
    assert r.code == 2 and database["status"] == "fail" and database["reason"] == "database_unreachable", r.out
    assert "s3cret" not in r.out and "s3cret" not in r.err


def test_work_waiting_for_a_person_is_a_warning_not_a_failure(tmp_path: Path) -> None:
    project = tmp_path / "project"
    active = project / "fcop" / "_lifecycle" / "active"
    active.mkdir(parents=True)
    (project / "fcop" / "fcop.json").write_text(json.dumps({"team": "t", "leader": "PM", "roles": ["PM", "DEV"]}))
    (active / "TASK-20250101-001-ADMIN-to-GHOST.md").write_text(  # history: imported as it was
        "---\nprotocol: fcop\nversion: 1\nsender: ADMIN\nrecipient: GHOST\npriority: P2\nsubject: old\n---\nbody\n")
    assert run("init", str(project), cwd=tmp_path).code == 0
    append(project, f'\n[roles.DEV]\nrunner = "command"\nargv = [{json.dumps(sys.executable)}, "-c", '
                    '"raise SystemExit(3)"]\nmax_attempts = 1\n')
    assert run("up", "--once", cwd=project).code == 0  # the import
    made = run("submit", cwd=project, stdin=json.dumps({"type": "create_task", "idempotency_key": "k", "payload": {
        "sender": "ADMIN", "recipient": "DEV", "subject": "fails"}}))
    inbox = project / "fcop" / "_lifecycle" / "inbox"
    inbox.mkdir(exist_ok=True)
    (inbox / "TASK-20260101-007-ADMIN-to-DEVV.md").write_text(  # live input for a role the team lacks: refused
        "---\nprotocol: fcop\nversion: 1\nsender: ADMIN\nrecipient: DEVV\npriority: P2\nsubject: typo\n---\nbody\n")
    (inbox / "TASK-20260101-008-ADMIN-to-DEV.md").write_text("no front matter\n")  # unreadable: quarantined
    assert run("up", "--once", cwd=project).code == 0
    r = doctor(project)
    assert r.code == 0 and r.json["status"] == "ok", r.out
    found = checks(r)
    assert {n for n, c in found.items() if c["status"] == "warn"} == {
        "quarantine", "blocked_tasks", "unknown_recipients"}
    waiting = found["quarantine"]
    assert [q["reason"] for q in waiting["quarantined"]] == ["missing_front_matter"], waiting
    assert waiting["refused"] == [{"file": "_lifecycle/inbox/TASK-20260101-007-ADMIN-to-DEVV.md",
                                   "reason": "unknown_role"}]
    [stuck] = found["blocked_tasks"]["tasks"]
    assert stuck["task_id"] == made.json["task_id"] and "exit code 3" in stuck["reason"], stuck
    assert found["unknown_recipients"]["tasks"] == [{"task_id": "TASK-20250101-001", "state": "active",
                                                     "recipient": "GHOST"}]


def test_doctor_reads_modes_before_opening_the_database(ws: Path) -> None:
    db = ws / ".taskkernel" / "kernel.db"
    db.chmod(0o644)
    r = doctor(ws)
    assert r.code == 2 and {f["path"] for f in checks(r)["permissions"]["files"]} == {".taskkernel/kernel.db"}
    assert os.stat(db).st_mode & 0o077 == 0  # opening it narrows it, as every command does


def test_a_database_behind_this_release_fails_and_names_the_upgrade(ws: Path) -> None:
    with sqlite3.connect(ws / ".taskkernel" / "kernel.db") as conn:
        conn.execute("UPDATE alembic_version SET version_num = '0001_baseline'")
    r = doctor(ws)
    schema = checks(r)["schema"]
    assert r.code == 2 and schema["status"] == "fail" and schema["behind"], r.out
    assert "taskkernel db upgrade" in schema["message"] and schema["version"] == "0001_baseline"
