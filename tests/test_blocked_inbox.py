"""Blocked is a visible state, and `taskkernel inbox` (issue 13, items 5 and 6), through the real entry point, each
call its own process: a task whose latest report of the round is blocked shows as blocked in `task list --state
blocked`, `task show`, `inbox` and MCP list_tasks until it moves; inbox lists a role's reviews, the approvals that
need a grant (with the command that grants it, which then works) and the blocked tasks it drives."""

from __future__ import annotations

import json
import shlex
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest

from taskkernel.kernel.queries import count_tasks, iter_tasks, page_tasks
from taskkernel.kernel.store.db import Database
from taskkernel.kernel.verify import verify
from tests.cli_support import CLI, Run, cli_env, new_workspace, run, run_tty
from tests.kernel_harness import DEV, Harness
from tests.test_mcp import stdio_session


def as_role(token: str, *args: str, cwd: Path) -> Run:
    proc = subprocess.run([*CLI, *args], cwd=cwd, capture_output=True, text=True,
                          env=cli_env(TASKKERNEL_TOKEN=token), timeout=120)
    return Run(proc.returncode, proc.stdout, proc.stderr)


def ok(done: Run) -> Any:
    assert done.code == 0, done.out + done.err
    return done.json


@pytest.fixture
def team(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    ws = new_workspace(tmp_path)
    return ws, {role: run("token", "issue", role, cwd=ws).out.strip() for role in ("DEV", "PM")}


def listed(ws: Path, state: str) -> list[str]:
    return [r["task_id"] for r in ok(run("task", "list", "--state", state, cwd=ws))]


def mcp_blocked(ws: Path, token: str) -> list[dict[str, Any]]:
    async def go() -> list[dict[str, Any]]:
        async with stdio_session(ws, token) as client:
            page = await client.ok("list_tasks", state="blocked", assigned_to_me=True)
            return list(page["tasks"])
    return anyio.run(go)


def test_a_blocked_report_shows_everywhere_until_the_task_moves(team: tuple[Path, dict[str, str]]) -> None:
    ws, tokens = team
    dev = tokens["DEV"]
    tid = ok(run("task", "create", "--to", "dev", "--subject", "wire the [/b] API", cwd=ws))["task_id"]
    other = ok(run("task", "create", "--to", "dev", "--subject", "another", cwd=ws))["task_id"]
    for t in (tid, other):
        ok(as_role(dev, "task", "claim", t, cwd=ws))
    assert listed(ws, "blocked") == [] and listed(ws, "active") == [tid, other]
    why = "  waiting for the API key " + "x" * 400
    ok(as_role(dev, "task", "report", tid, "--status", "blocked", "--body", f"\n{why}\nsecond line", cwd=ws))

    # task list: blocked and active part the active tasks; rows carry the blocked report
    assert listed(ws, "blocked") == [tid] and listed(ws, "active") == [other]
    [row] = ok(run("task", "list", "--state", "blocked", cwd=ws))
    assert row["state"] == "active" and row["blocked"]["reason"] == why.strip()[:300]
    assert len(row["blocked"]["reason"]) == 300 and row["blocked"]["by"] == "DEV:dev"
    assert row["blocked"]["report_id"] == f"{tid}/r1/1" and row["blocked"]["at"].endswith("Z")
    assert [r["blocked"] for r in ok(run("task", "list", cwd=ws)) if r["task_id"] == other] == [None]
    # task show: the document's field, and people read "blocked" with the reason
    shown = ok(run("task", "show", tid, cwd=ws))
    assert (shown["state"], shown["blocked"]) == ("active", row["blocked"])
    tty = run_tty("task", "show", tid, cwd=ws)
    assert tty.code == 0 and f"{tid} blocked rev 3" in tty.out and "waiting for the API key" in tty.out, tty.out
    table = run_tty("task", "list", cwd=ws).out
    cells = [[c.strip() for c in line.split("│")] for line in table.splitlines() if tid in line or other in line]
    assert [c[2] for c in cells] == ["blocked", "active"], table
    # inbox and MCP list_tasks
    inbox = ok(as_role(dev, "inbox", cwd=ws))
    assert [(b["task_id"], b["driver"], b["blocked"]["report_id"]) for b in inbox["blocked"]] == [
        (tid, "DEV", f"{tid}/r1/1")]
    assert [(t["task_id"], t["blocked"]["reason"]) for t in mcp_blocked(ws, dev)] == [(tid, why.strip()[:300])]

    # a later report of another status clears it
    ok(as_role(dev, "task", "report", tid, "--status", "in_progress", "--body", "key found", cwd=ws))
    assert listed(ws, "blocked") == [] and ok(run("task", "show", tid, cwd=ws))["blocked"] is None
    assert ok(as_role(dev, "inbox", cwd=ws))["blocked"] == [] and mcp_blocked(ws, dev) == []

    # blocked in review, then a move (reject: a new round) clears it without any report
    ok(as_role(dev, "task", "report", tid, "--status", "done", "--submit", cwd=ws))
    ok(as_role(dev, "task", "report", tid, "--status", "blocked", "--body", "reviewer unreachable", cwd=ws))
    in_review = ok(run("task", "show", tid, cwd=ws))
    assert (in_review["state"], in_review["blocked"]["reason"]) == ("review", "reviewer unreachable")
    assert f"{tid} review (blocked)" in run_tty("task", "show", tid, cwd=ws).out
    assert listed(ws, "blocked") == []  # the listing state is active and blocked
    ok(run("task", "reject", tid, "--reason", "tests missing", cwd=ws))
    moved = ok(run("task", "show", tid, cwd=ws))
    assert (moved["state"], moved["round"], moved["blocked"]) == ("active", 2, None)
    assert listed(ws, "active") == [tid, other]
    assert ok(run("verify", cwd=ws))["status"] == "ok"  # the read model agrees with a rebuild from events


def test_a_document_stored_before_the_field_existed_still_verifies(team: tuple[Path, dict[str, str]]) -> None:
    ws, tokens = team
    calm, stuck = (ok(run("task", "create", "--to", "dev", "--subject", s, cwd=ws))["task_id"] for s in "ab")
    for t in (calm, stuck):
        ok(as_role(tokens["DEV"], "task", "claim", t, cwd=ws))
    ok(as_role(tokens["DEV"], "task", "report", stuck, "--status", "blocked", "--body", "no key", cwd=ws))

    def drop_field(task_id: str) -> None:  # the document as the release before this one stored it
        with sqlite3.connect(ws / ".taskkernel" / "kernel.db") as conn:
            doc = json.loads(conn.execute("SELECT doc FROM tasks WHERE task_id = ?", (task_id,)).fetchone()[0])
            del doc["blocked"]
            conn.execute("UPDATE tasks SET doc = ? WHERE task_id = ?", (json.dumps(doc), task_id))

    drop_field(calm)
    assert ok(run("verify", cwd=ws))["status"] == "ok"
    assert ok(run("task", "show", calm, cwd=ws))["blocked"] is None and listed(ws, "active") == [calm]
    drop_field(stuck)  # blocked by its events, not shown by the stored document: that is drift, and repairable
    broken = run("verify", cwd=ws)
    assert (broken.code, broken.json["reason"]) == (2, "projection_drift"), broken.out
    assert listed(ws, "blocked") == []
    assert ok(run("verify", "--repair", cwd=ws))["repaired"] == 2
    assert listed(ws, "blocked") == [stuck] and ok(run("verify", cwd=ws))["status"] == "ok"


def test_state_is_validated_and_names_blocked(team: tuple[Path, dict[str, str]]) -> None:
    ws, _ = team
    bogus = run("task", "list", "--state", "bogus", cwd=ws)
    assert bogus.code == 64 and bogus.json["code"] == "usage", bogus.out
    assert bogus.json["message"].endswith("choose one of inbox, active, review, done, archive, blocked")
    assert "blocked" in run("task", "list", "--help", cwd=ws).out


def test_inbox_lists_reviews_grants_and_blocked_tasks_per_role(team: tuple[Path, dict[str, str]]) -> None:
    ws, tokens = team
    dev, pm = tokens["DEV"], tokens["PM"]

    def made(subject: str, *extra: str) -> str:  # PM assigns it, so PM decides it (a branch task)
        return str(ok(as_role(pm, "task", "create", "--to", "dev", "--subject", subject, *extra, cwd=ws))["task_id"])

    plain, risky, stuck = made("plain"), made("risky", "--risk", "high"), made("stuck")
    owners = ok(run("task", "create", "--to", "dev", "--subject", "the owner's", cwd=ws))
    assert len({plain, risky, stuck, owners["task_id"]}) == 4
    for t in (plain, risky, stuck, owners["task_id"]):
        ok(as_role(dev, "task", "claim", t, cwd=ws))
    for t in (plain, risky, owners["task_id"]):
        ok(as_role(dev, "task", "report", t, "--status", "done", "--submit", cwd=ws))
    ok(as_role(dev, "task", "report", stuck, "--status", "blocked", "--body", "needs a decision", cwd=ws))

    mine = ok(as_role(pm, "inbox", cwd=ws))
    assert mine["role"] == "PM" and [r["task_id"] for r in mine["reviews"]] == [plain, risky]
    assert {r["done_authority"] for r in mine["reviews"]} == {"PM"} and mine["blocked"] == []
    [grant] = mine["needs_grant"]
    assert (grant["task_id"], grant["permission"], grant["risk_level"]) == (risky, "approve", "high")
    assert grant["grant_command"].startswith("taskkernel session accept admin --kind allow ")
    assert mine["counts"] == {"reviews": 2, "needs_grant": 1, "blocked": 0, "stalled": 0, "dead_letters": 0}
    assert mine["truncated"] is False
    assert {r["waits_for_person"] for r in mine["reviews"]} == {
        "PM has no runner: waiting for a person, or add [roles.PM] to taskkernel.toml"}
    refused = as_role(pm, "task", "approve", risky, cwd=ws)  # the kernel agrees: and its hint is the same command
    assert (refused.code, refused.json["reason"], refused.json["hint"]) == (2, "permission_required",
                                                                            grant["grant_command"])
    devs = ok(as_role(dev, "inbox", cwd=ws))
    assert (devs["reviews"], [b["task_id"] for b in devs["blocked"]]) == ([], [stuck])
    assert as_role(dev, "inbox", "--role", "pm", cwd=ws).json["reason"] == "role_not_authorized"
    everyone = ok(run("inbox", cwd=ws))  # the owner: every role
    assert everyone["role"] is None and [r["task_id"] for r in everyone["reviews"]] == [plain, risky,
                                                                                       owners["task_id"]]
    assert ok(run("inbox", "--role", "pm", cwd=ws))["reviews"] == mine["reviews"]
    assert ok(run("inbox", "--limit", "1", cwd=ws))["truncated"] is True
    tty = run_tty("inbox", "--role", "pm", cwd=ws)
    assert tty.code == 0 and "PM: 2 review(s) to decide, 1 need a grant, 0 blocked" in tty.out, tty.out
    assert "taskkernel session accept admin" in tty.out and risky in tty.out

    argv = shlex.split(grant["grant_command"])
    assert argv[0] == "taskkernel"
    ok(run(*argv[1:], cwd=ws))  # the owner grants it with the printed command
    after = ok(as_role(pm, "inbox", cwd=ws))
    assert after["needs_grant"] == [] and len(after["reviews"]) == 2
    ok(as_role(pm, "task", "approve", risky, cwd=ws))
    assert [r["task_id"] for r in ok(as_role(pm, "inbox", cwd=ws))["reviews"]] == [plain]


def test_blocked_and_active_listings_on_both_backends(any_db: Database) -> None:
    """The JSON-in-SQL filter on SQLite and PostgreSQL alike: pages, cursors, streams and counts; verify agrees."""
    h = Harness(any_db)
    ids = [str(h.create(recipient="DEV", subject=f"t{i}").task_id) for i in range(5)]
    for tid in ids:
        h.drive_to(tid, "active", driver=DEV)
    for tid in ids[1::2]:
        assert h.cmd("submit_report", tid, DEV, payload={"status": "blocked", "body": "stuck"}).status == "accepted"
    assert h.cmd("submit_report", ids[3], DEV, payload={"status": "aborted", "body": "gave up"}).status == "accepted"
    blocked, active = [ids[1]], [ids[0], ids[2], ids[3], ids[4]]
    first = page_tasks(h.db, state="blocked", limit=1)
    assert [r["task_id"] for r in first.rows] == blocked and first.next_cursor is None
    assert [r["task_id"] for r in page_tasks(h.db, state="active", limit=2).rows] == active[:2]
    cursor = page_tasks(h.db, state="active", limit=2).next_cursor
    assert [r["task_id"] for r in page_tasks(h.db, state="active", limit=2, after=cursor).rows] == active[2:]
    assert [r["task_id"] for r in iter_tasks(h.db, "blocked", driver="DEV")] == blocked
    assert (count_tasks(h.db, state="blocked"), count_tasks(h.db, state="active")) == (1, 4)
    assert verify(h.db, h.kernel.store).ok
