"""The CLI contract of the kernel commands, run as real processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli_support import run_tty, taskkernel

tk = taskkernel


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    r = tk("init", str(tmp_path / "ws"), "--team", "dev-team", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    return tmp_path / "ws"


def create(ws: Path, key: str = "c1", **extra: object) -> dict:
    cmd = {"type": "create_task", "idempotency_key": key,
           "payload": {"sender": "ADMIN", "recipient": "PM", "subject": "Ship it", **extra}}
    r = tk("submit", "-", cwd=ws, stdin=json.dumps(cmd))
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


def test_init_creates_workspace_layout(ws: Path) -> None:
    assert (ws / ".taskkernel" / "kernel.db").exists()
    assert (ws / "taskkernel.toml").exists()
    for stage in ("inbox", "active", "review", "done", "archive"):
        assert (ws / "fcop" / "_lifecycle" / stage).is_dir()
    assert json.loads((ws / "fcop" / "fcop.json").read_text())["leader"] == "PM"


def test_submit_prints_the_wire_result_and_exit_codes(ws: Path) -> None:
    out = create(ws)
    assert set(out) == {"status", "reason", "message", "task_id", "revision", "round"}
    assert (out["status"], out["reason"], out["revision"], out["round"]) == ("accepted", None, 1, 0)
    again = tk("submit", cwd=ws, stdin=json.dumps({"type": "create_task", "idempotency_key": "c1", "payload": {
        "sender": "ADMIN", "recipient": "PM", "subject": "Ship it"}}))
    assert again.returncode == 0 and json.loads(again.stdout)["status"] == "replayed"
    stale = {"type": "claim", "task_id": out["task_id"], "thread_key": out["task_id"], "expected_revision": 9,
             "round": 0, "idempotency_key": "s1"}
    (ws / "stale.json").write_text(json.dumps(stale))
    r = tk("submit", "stale.json", cwd=ws)
    assert r.returncode == 2 and json.loads(r.stdout)["reason"] == "stale_task_revision"
    bad = tk("submit", cwd=ws, stdin='{"type": "claim"}')
    assert bad.returncode == 2 and json.loads(bad.stdout)["reason"] == "invalid_command"
    assert tk("submit", cwd=ws, stdin="{not json").returncode == 65
    assert tk("submit", "missing.json", cwd=ws).returncode == 65
    assert tk("submit", "--no-such-flag", cwd=ws).returncode == 64


def test_tokens_authenticate_and_bad_tokens_are_unverified(ws: Path) -> None:
    tid = create(ws)["task_id"]
    token = tk("token", "issue", "PM", "--agent", "pm-bot", cwd=ws).stdout.strip()
    assert token.startswith("tk_") and "\n" not in token
    claim = {"type": "claim", "task_id": tid, "thread_key": tid, "expected_revision": 1, "round": 0,
             "idempotency_key": "cl"}
    r = tk("--token", "tk_forged", "submit", cwd=ws, stdin=json.dumps(claim))
    assert r.returncode == 2 and json.loads(r.stdout)["reason"] == "actor_unverified"
    r = tk("submit", cwd=ws, stdin=json.dumps(claim), env={"TASKKERNEL_TOKEN": token})
    assert json.loads(r.stdout)["status"] == "accepted"
    show = json.loads(tk("task", "show", tid, cwd=ws).stdout)
    assert show["history"][-1]["by"] == "PM:pm-bot"


def test_task_show_list_and_log(ws: Path) -> None:
    tid = create(ws)["task_id"]
    show = json.loads(tk("task", "show", tid, cwd=ws).stdout)
    for key in ("task_id", "state", "revision", "round", "thread_key", "parent", "root", "sender", "recipient",
                "subject", "priority", "risk_level", "reports", "history"):
        assert key in show
    assert tk("task", "show", "TASK-20990101-001", cwd=ws).returncode == 2
    listed = json.loads(tk("task", "list", "--state", "inbox", cwd=ws).stdout)
    assert [t["task_id"] for t in listed] == [tid]
    assert json.loads(tk("task", "list", "--state", "done", cwd=ws).stdout) == []
    lines = [json.loads(x) for x in tk("log", cwd=ws).stdout.splitlines()]
    assert [(e["global_pos"], e["type"], e["stream"]) for e in lines] == [(1, "task_created", f"task:{tid}")]
    assert tk("log", "--from", "2", cwd=ws).stdout == ""


def test_verify_exits_2_with_first_broken_position(ws: Path) -> None:
    for i in range(3):
        create(ws, key=f"v{i}")
    assert tk("verify", cwd=ws).returncode == 0
    import sqlite3

    con = sqlite3.connect(ws / ".taskkernel" / "kernel.db")
    con.execute("UPDATE events SET meta = '{}' WHERE global_pos = 2")
    con.commit()
    con.close()
    r = tk("verify", cwd=ws)
    assert r.returncode == 2
    assert json.loads(r.stdout)["first_broken_position"] == 2


def test_db_flag_selects_postgresql(pg_url: str, tmp_path: Path) -> None:
    cmd = {"type": "create_task", "idempotency_key": "pg1",
           "payload": {"sender": "ADMIN", "recipient": "PM", "subject": "on postgres"}}
    r = tk("--db", pg_url, "submit", cwd=tmp_path, stdin=json.dumps(cmd))
    assert r.returncode == 0, r.stdout + r.stderr
    r = tk("verify", cwd=tmp_path, env={"TASKKERNEL_DB": pg_url})
    assert r.returncode == 0 and json.loads(r.stdout)["tasks"] == 1


def test_commands_outside_a_workspace_are_usage_errors(tmp_path: Path) -> None:
    r = tk("task", "list", cwd=tmp_path)
    assert r.returncode == 64 and "taskkernel init" in r.stdout


def test_only_the_owner_or_admin_may_issue_credentials(ws: Path) -> None:
    dev = tk("token", "issue", "DEV", cwd=ws).stdout.strip()
    r = tk("--token", dev, "token", "issue", "ADMIN", cwd=ws)
    assert r.returncode == 2 and json.loads(r.stdout)["reason"] == "role_not_authorized"
    admin = tk("token", "issue", "ADMIN", "--agent", "alice", cwd=ws).stdout.strip()
    assert tk("--token", admin, "token", "issue", "QA", cwd=ws).stdout.strip().startswith("tk_")


def test_task_show_prints_each_reports_body(ws: Path) -> None:
    """A reviewer reads what each report says in `task show`: `body` in every report of the JSON document, and the
    body as a block on a terminal, its lines kept and its control characters escaped."""
    tid = json.loads(tk("task", "create", "--to", "DEV", "--subject", "Fix it", cwd=ws).stdout)["task_id"]
    assert tk("task", "claim", tid, cwd=ws).returncode == 0
    for status, body in (("in_progress", "halfway"), ("blocked", "need the key\nasked \x1b[2Jops")):
        assert tk("task", "report", tid, "--status", status, "--body", body, cwd=ws).returncode == 0
    doc = json.loads(tk("task", "show", tid, "--json", cwd=ws).stdout)
    assert [(r["status"], r["body"]) for r in doc["reports"]] == [
        ("in_progress", "halfway"), ("blocked", "need the key\nasked \x1b[2Jops")]
    shown = run_tty("task", "show", tid, cwd=ws)
    assert shown.code == 0, shown.err
    lines = shown.out.splitlines()
    assert "halfway" in lines and "need the key" in lines and "asked \\x1b[2Jops" in lines, shown.out
    assert "\x1b" not in shown.out
