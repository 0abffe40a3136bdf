"""Data is printed as data (issue 11, item 1 — first step): a subject or message with rich markup in it, such as
`[/b]` or `[roles.DEV]`, crashes no command and prints as itself."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli_support import run, run_tty

SUBJECT = "Fix [/b] then [red]x[/red] in [roles.DEV]"


def workspace_with_task(tmp_path: Path, subject: str = "s") -> tuple[Path, str]:
    """A fresh workspace and one task ADMIN created in it through `taskkernel submit`."""
    ws = tmp_path / "ws"
    assert run("init", str(ws), cwd=tmp_path).code == 0
    made = run("submit", cwd=ws, stdin=json.dumps({"type": "create_task", "idempotency_key": "k", "payload": {
        "sender": "ADMIN", "recipient": "PM", "subject": subject}}))
    assert made.code == 0, made.err
    return ws, made.json["task_id"]


def test_markup_in_a_subject_prints_as_itself_in_every_command(tmp_path: Path) -> None:
    ws, task_id = workspace_with_task(tmp_path, SUBJECT)
    show = run("task", "show", task_id, cwd=ws)
    assert show.code == 0 and show.json["subject"] == SUBJECT, show.err
    assert run("task", "list", cwd=ws).json[0]["subject"] == SUBJECT
    for args in (("task", "show", task_id), ("task", "list"), ("log",), ("log", "--stream", task_id)):
        human = run_tty(*args, cwd=ws)  # on a terminal: the human rendering, with the subject as itself
        assert human.code == 0 and "Traceback" not in human.err, human.err
        assert "[/b]" in human.out and "[red]x[/red]" in human.out or args[0] == "log", human.out
    again = run("submit", cwd=ws, stdin=json.dumps({"type": "create_task", "idempotency_key": "k", "payload": {
        "sender": "ADMIN", "recipient": "PM", "subject": "[bold]other[/bold]"}}))
    assert again.code == 2 and "idempotency_conflict" in again.err, again.err
    up = run("up", "--once", cwd=ws)
    assert up.code == 0 and "Traceback" not in up.err
    assert run("verify", cwd=ws).code == 0


def test_a_message_with_brackets_keeps_them(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    assert run("init", str(ws), cwd=tmp_path).code == 0
    (ws / "fcop" / "fcop.json").unlink()
    with open(ws / "taskkernel.toml", "a", encoding="utf-8") as fh:
        fh.write('\n[team]\nleader = "lower"\nroles = ["lower"]\n')
    r = run("task", "show", "TASK-20260101-001", cwd=ws)
    assert r.code == 64 and "[team] in taskkernel.toml" in r.err, r.err


def test_version_and_no_arguments(tmp_path: Path) -> None:
    from importlib.metadata import version

    for flag in ("--version", "-V"):
        r = run(flag, cwd=tmp_path)
        assert (r.code, r.out.strip()) == (0, f"taskkernel {version('taskkernel')}"), r.err
    bare = run(cwd=tmp_path)
    assert bare.code == 0 and "Usage: taskkernel" in bare.out and "usage error" not in bare.err, bare.err


def test_inputs_are_checked_at_the_door(tmp_path: Path) -> None:
    ws, task_id = workspace_with_task(tmp_path)
    bogus = run("task", "list", "--state", "bogus", cwd=ws)
    assert bogus.code == 64 and bogus.json["code"] == "usage" and "inbox" in bogus.json["message"], bogus.out
    assert [t["task_id"] for t in run("task", "list", "--state", "inbox", cwd=ws).json] == [task_id]
    bare = run("log", "--stream", task_id, cwd=ws)
    assert bare.code == 0 and [json.loads(x)["type"] for x in bare.out.splitlines()] == ["task_created"]
    nosuch = run("session", "replay", "nosuch", cwd=ws)
    assert (nosuch.code, nosuch.json["reason"]) == (2, "not_found"), nosuch.out


def test_token_list_and_revoke(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    assert run("init", str(ws), cwd=tmp_path).code == 0
    dev = run("token", "issue", "DEV", cwd=ws).out.strip()
    listed = run("token", "list", cwd=ws)
    assert listed.code == 0 and dev not in listed.out, "no secret is shown"
    rows = {r["role"]: r for r in listed.json}
    assert set(rows) == {"ADMIN", "DEV"} and rows["DEV"]["revoked_at"] is None
    assert run("--token", dev, "token", "list", cwd=ws).json["reason"] == "role_not_authorized"
    assert run("--token", dev, "token", "revoke", rows["DEV"]["id"], cwd=ws).json["reason"] == "role_not_authorized"
    own = run("token", "revoke", rows["ADMIN"]["id"], cwd=ws)
    assert (own.code, own.json["reason"]) == (2, "own_credential"), "the owner cannot lock itself out"
    assert run("token", "revoke", "deadbeef00", cwd=ws).json["reason"] == "not_found"
    revoked = run("token", "revoke", rows["DEV"]["id"][:8], cwd=ws)
    assert revoked.code == 0 and revoked.json["revoked"] is True, revoked.out
    refused = run("--token", dev, "task", "list", cwd=ws)
    assert (refused.code, refused.json["reason"]) == (2, "actor_unverified")
    after = {r["role"]: r for r in run("token", "list", cwd=ws).json}
    assert after["DEV"]["revoked_reason"] == "revoked" and after["ADMIN"]["revoked_at"] is None


def test_goal_list_and_session_list(tmp_path: Path) -> None:
    ws, root = workspace_with_task(tmp_path)
    goal = run("goal", "start", root, "--tokens", "1000", cwd=ws)
    assert goal.code == 0, goal.out
    goals = run("goal", "list", cwd=ws)
    assert goals.code == 0 and [(g["goal_id"], g["root_task"], g["state"]) for g in goals.json] == [
        (goal.json["goal_id"], root, "active")]
    dev = run("token", "issue", "DEV", cwd=ws).out.strip()
    for who, session in ((None, "admin"), (dev, "dev-notes")):
        args = ("--token", who) if who else ()
        accepted = run(*args, "session", "accept", session, "--kind", "message", "--input-id", "i1",
                       "--payload", json.dumps({"text": "hello"}), cwd=ws)
        assert accepted.code == 0, accepted.out
    everything = run("session", "list", cwd=ws)
    assert [(s["session"], s["last_seq"]) for s in everything.json] == [("admin", 1), ("dev-notes", 1)]
    mine = run("--token", dev, "session", "list", cwd=ws)
    assert [s["session"] for s in mine.json] == ["dev-notes"], "a session is listed only to who may read it"
