"""`taskkernel runs list|show` (docs/runs.md) through the real entry point, each call its own process: runs the
coordinator made (`up --once` with command agents), and states it cannot reach yet written through RunLedger."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from taskkernel.coordinator.runners.ledger import Purpose, RunLedger
from taskkernel.coordinator.tables import runs
from taskkernel.kernel.store.db import Database
from tests.cli_support import append_config, new_workspace, run, run_tty


def write_agent(path: Path, body: str) -> str:
    path.write_text(textwrap.dedent(body), encoding="utf-8")
    return str(path)


def ok(*args: str, cwd: Path) -> Any:
    r = run(*args, cwd=cwd)
    assert r.code == 0, (args, r.out, r.err)
    return r.json


@pytest.fixture(scope="module")
def team(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A workspace where DEV's agent succeeds and QA's fails (exit 3) and waits an hour to retry, after one
    `up --once`."""
    tmp = tmp_path_factory.mktemp("runs")
    ws = new_workspace(tmp)
    good = write_agent(tmp / "good.py", """
        import json, os, subprocess, sys
        subprocess.run([sys.executable, "-m", "taskkernel", "task", "report", os.environ["TASKKERNEL_TASK_ID"],
                        "--status", "done", "--body", "ok"], check=True, capture_output=True)
        print("working on it", flush=True)
        print("colour \\x1b[31mred\\x1b[0m and a bell \\a", flush=True)
        print("to stderr too", file=sys.stderr, flush=True)
        print(json.dumps({"usage": {"tokens_in": 1200, "tokens_out": 300, "cost_usd": 0.0125}}))
    """)
    bad = write_agent(tmp / "bad.py", """
        import sys
        for i in range(30):
            print(f"line {i}", flush=True)
        print("about to crash", flush=True)
        print("boom on stderr", file=sys.stderr, flush=True)
        sys.exit(3)
    """)
    append_config(ws, f"""
[roles.DEV]
runner = "command"
argv = [{json.dumps(sys.executable)}, {json.dumps(good)}]
timeout = 60

[roles.QA]
runner = "command"
argv = [{json.dumps(sys.executable)}, {json.dumps(bad)}]
timeout = 60
max_attempts = 3
backoff = 3600
""")
    dev = ok("task", "create", "--to", "DEV", "--subject", "build it", cwd=ws)["task_id"]
    qa = ok("task", "create", "--to", "QA", "--subject", "check it", cwd=ws)["task_id"]
    up = run("up", str(ws), "--once", cwd=ws)
    assert up.code == 0, (up.out, up.err)
    return {"ws": ws, "dev": dev, "qa": qa}


def test_list_shows_a_done_run_and_a_retrying_one_newest_first(team: dict[str, Any]) -> None:
    ws = team["ws"]
    rows = ok("runs", "list", cwd=ws)
    assert [(r["task_id"], r["state"]) for r in rows] == [(team["qa"], "retrying"), (team["dev"], "done")]
    assert [r["created_at"] for r in rows] == sorted((r["created_at"] for r in rows), reverse=True)
    retrying, done = rows
    assert (retrying["role"], retrying["purpose"], retrying["attempt"], retrying["max_attempts"]) == (
        "QA", "execute", 1, 3)
    assert retrying["exit_code"] == 3 and retrying["last_error"] == "exit code 3: boom on stderr"  # its last words
    assert retrying["retry_at"] > retrying["created_at"] and retrying["ended_at"] is None
    assert (done["exit_code"], done["ended_at"] is not None, done["retry_at"], done["elapsed_s"]) == (
        0, True, None, None)
    assert done["started_at"] is not None and done["error_code"] is None


def test_list_filters_by_state_and_task(team: dict[str, Any]) -> None:
    ws = team["ws"]
    assert [r["task_id"] for r in ok("runs", "list", "--state", "retrying", cwd=ws)] == [team["qa"]]
    assert [r["task_id"] for r in ok("runs", "list", "--state", "done", cwd=ws)] == [team["dev"]]
    assert ok("runs", "list", "--state", "failed", cwd=ws) == []
    assert [r["state"] for r in ok("runs", "list", "--task", team["dev"], cwd=ws)] == ["done"]
    assert ok("runs", "list", "--task", team["dev"], "--state", "retrying", cwd=ws) == []


def test_show_a_failed_attempt_with_its_exit_code_and_log_tails(team: dict[str, Any]) -> None:
    ws = team["ws"]
    [row] = ok("runs", "list", "--task", team["qa"], cwd=ws)
    doc = ok("runs", "show", row["run_id"], cwd=ws)
    assert (doc["run_id"], doc["state"], doc["attempt"]) == (row["run_id"], "retrying", 1)
    [attempt] = doc["attempts"]
    assert (attempt["attempt"], attempt["recorded"], attempt["exit_code"]) == (1, True, 3)
    assert attempt["wall_ms"] >= 0 and attempt["tokens_in"] == 0
    out = attempt["stdout_tail"]
    assert out["lines"] == [f"line {i}" for i in range(11, 30)] + ["about to crash"]
    assert out["truncated"] is True and out["bytes"] > 0
    assert attempt["stderr_tail"]["lines"] == ["boom on stderr"]
    for stream in ("stdout", "stderr"):
        path = Path(attempt["logs"][stream])
        assert path.is_file() and oct(path.stat().st_mode & 0o777) == "0o600"
        assert path.parent.name == "attempt-1" and path.parent.parent.name == row["run_id"].replace(":", "_")
    assert doc["totals"]["attempts"] == 1 and doc["totals"]["recorded"] == 1


def test_show_a_succeeded_run_with_usage_and_escaped_log_lines(team: dict[str, Any]) -> None:
    ws = team["ws"]
    [row] = ok("runs", "list", "--task", team["dev"], cwd=ws)
    doc = ok("runs", "show", row["run_id"], cwd=ws)
    [attempt] = doc["attempts"]
    assert (attempt["exit_code"], attempt["tokens_in"], attempt["tokens_out"], attempt["cost_usd"]) == (
        0, 1200, 300, 0.0125)
    lines = attempt["stdout_tail"]["lines"]
    assert lines[:2] == ["working on it", "colour \\x1b[31mred\\x1b[0m and a bell \\x07"]
    assert attempt["stdout_tail"]["truncated"] is False
    assert attempt["stderr_tail"]["lines"] == ["to stderr too"]
    assert doc["totals"] | {"wall_ms": 0} == {"attempts": 1, "recorded": 1, "wall_ms": 0, "tokens_in": 1200,
                                              "tokens_out": 300, "cost_usd": 0.0125}


def test_a_person_gets_tables(team: dict[str, Any]) -> None:
    ws = team["ws"]
    listed = run_tty("runs", "list", cwd=ws)
    assert listed.code == 0 and not listed.out.lstrip().startswith("[")
    assert "retrying" in listed.out and "2 run(s)" in listed.out and team["qa"] in listed.out
    [row] = ok("runs", "list", "--task", team["qa"], cwd=ws)
    shown = run_tty("runs", "show", row["run_id"], cwd=ws)
    assert shown.code == 0 and "about to crash" in shown.out and "TOTAL" in shown.out
    assert "\x1b[31m" not in shown.out


def test_unknown_run_and_bad_options(team: dict[str, Any]) -> None:
    ws = team["ws"]
    missing = run("runs", "show", "TASK-20990101-001:r1:execute:1", cwd=ws)
    assert missing.code == 2 and missing.json["status"] == "rejected"
    assert missing.json["reason"] == "run_not_found"
    bogus = run("runs", "list", "--state", "bogus", cwd=ws)
    assert bogus.code == 64 and bogus.json["code"] == "usage"
    assert "queued, running, retrying, done, failed, blocked" in bogus.json["message"]
    assert run("runs", "list", "--limit", "0", cwd=ws).code == 64
    assert run("runs", "list", "--cursor", "not-a-cursor", cwd=ws).code == 64


def ledger_states(db: Database) -> dict[str, str]:
    """Runs in every state, written as the dispatcher writes them; the ids name the state they must show."""
    ledger = RunLedger(db, "test-owner", lease_seconds=3600)
    names = ("queued", "running", "failed-old", "failed", "blocked", "blocked-2")
    with db.write() as uow:
        for name in names:
            ledger.enqueue(uow, f"X:{name}", "TASK-20990101-009", 1, "DEV", Purpose.EXECUTE, 3)
    claimed = {c.run_id: c for c in ledger.claim_due(limit=len(names))}
    # the queued one back as the dispatcher leaves a new run: pending, never attempted
    with db.write() as uow:
        uow.conn.execute(runs.update().where(runs.c.run_id == "X:queued").values(state="pending", attempt=0))
    for name, code in (("failed-old", None), ("failed", "attempts_exhausted"), ("blocked", "binary_missing"),
                       ("blocked-2", "config_invalid")):
        assert ledger.block(claimed[f"X:{name}"], f"gave up: {name}\nsecond line")
        with db.write() as uow:
            uow.conn.execute(runs.update().where(runs.c.run_id == f"X:{name}").values(error_code=code))
    return {"X:queued": "queued", "X:running": "running", "X:failed-old": "failed", "X:failed": "failed",
            "X:blocked": "blocked", "X:blocked-2": "blocked"}


def test_every_state_and_the_pages(any_url: str, tmp_path: Path) -> None:
    """On both backends, with only --db (no workspace: no log folder to read)."""
    db_args = ("--db", any_url)
    ws = tmp_path  # no taskkernel.toml here

    def ok(*args: str, cwd: Path) -> Any:
        r = run(*db_args, *args, cwd=cwd)
        assert r.code == 0, (args, r.out, r.err)
        return r.json

    assert ok("runs", "list", cwd=ws) == [], "a new database: no runs yet (and its schema made, at head)"
    db = Database(any_url)
    try:
        expected = ledger_states(db)
    finally:
        db.engine.dispose()
    rows = ok("runs", "list", cwd=ws)
    assert {r["run_id"]: r["state"] for r in rows} == expected
    for state in ("queued", "running", "failed", "blocked"):
        got = {r["run_id"] for r in ok("runs", "list", "--state", state, cwd=ws)}
        assert got == {k for k, v in expected.items() if v == state}, state
    by_id = {r["run_id"]: r for r in rows}
    assert by_id["X:running"]["elapsed_s"] is not None and by_id["X:running"]["elapsed_s"] >= 0
    assert by_id["X:queued"]["started_at"] is None and by_id["X:queued"]["attempt"] == 0
    assert by_id["X:blocked"]["error_code"] == "binary_missing"
    assert by_id["X:blocked"]["last_error"] == "gave up: blocked\\nsecond line", "one line"
    # pages of two: every run once, in the same order as one listing, then no cursor
    seen: list[str] = []
    cursor: list[str] = []
    for _ in range(5):
        r = run(*db_args, "runs", "list", "--limit", "2", *cursor, cwd=ws)
        assert r.code == 0, r.err
        seen += [x["run_id"] for x in json.loads(r.out)]
        more = [line for line in r.err.splitlines() if line.startswith("next page: --cursor ")]
        if not more:
            break
        cursor = ["--cursor", more[0].split()[-1]]
        other = run(*db_args, "runs", "list", "--limit", "2", "--state", "failed", *cursor, cwd=ws)
        assert other.code == 64 and "repeat those filters" in other.json["message"], "a cursor keeps its filters"
    assert seen == [r["run_id"] for r in rows] and len(seen) == 6
    shown = ok("runs", "show", "X:running", cwd=ws)
    assert shown["lease_owner"] == "test-owner" and shown["attempts"][0]["recorded"] is False
    assert shown["attempts"][0]["logs"] is None and shown["totals"]["recorded"] == 0
    assert shown["log_dir"] is None


def test_the_cli_choices_are_the_histories(tmp_path: Path) -> None:
    from taskkernel.coordinator.cli import runs as cli
    from taskkernel.coordinator.runners import history

    assert cli.VIEW_STATES == history.VIEW_STATES
    assert history.view_state("pending", 0, None) == "queued"
    assert history.view_state("blocked", 2, "lease_lost") == "blocked"
