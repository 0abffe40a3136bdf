"""Task verbs through the real entry point, each call its own process, the agent with its own DEV credential
(issue 12): one call per action, submit's output and exit codes, a retry after a crash replays, a stale
--expect-rev is refused, a missing grant says how to grant it."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from tests.cli_support import CLI, Run, cli_env, new_workspace, run


def as_role(token: str, *args: str, cwd: Path, stdin: str | None = None) -> Run:
    proc = subprocess.run([*CLI, *args], cwd=cwd, input=stdin, capture_output=True, text=True,
                          env=cli_env(TASKKERNEL_TOKEN=token), timeout=120)
    return Run(proc.returncode, proc.stdout, proc.stderr)


def events(ws: Path) -> int:
    with sqlite3.connect(ws / ".taskkernel" / "kernel.db") as conn:
        return int(conn.execute("SELECT count(*) FROM events").fetchone()[0])


@pytest.fixture
def team(tmp_path: Path) -> tuple[Path, str]:
    ws = new_workspace(tmp_path)
    dev = run("token", "issue", "DEV", cwd=ws).out.strip()
    return ws, dev


def create(ws: Path, *extra: str) -> str:
    made = run("task", "create", "--to", "dev", "--subject", "fix the [/b] parser", *extra, cwd=ws)
    assert made.code == 0 and made.json["status"] == "accepted", made.out + made.err
    return str(made.json["task_id"])


def test_an_agent_run_is_three_calls_with_no_json_written_by_hand(team: tuple[Path, str]) -> None:
    ws, dev = team
    tid = create(ws, "--body", "the body", "--priority", "P1", "--risk", "medium", "--ref", "docs/x.md")
    claimed = as_role(dev, "task", "claim", tid, cwd=ws)
    assert claimed.code == 0 and (claimed.json["revision"], claimed.json["round"]) == (2, 1), claimed.out
    assert set(claimed.json) == {"status", "reason", "message", "task_id", "revision", "round"}
    (ws / "notes.md").write_text("how it was fixed\n")
    reported = as_role(dev, "task", "report", tid, "--status", "done", "--body-file", "notes.md",
                       "--artifact", "dist/fix.patch", "--submit", cwd=ws)
    assert reported.code == 0, reported.out + reported.err
    first, last = (json.loads(line) for line in reported.out.splitlines())
    assert (first["status"], last["status"], last["message"].split(":")[0]) == ("accepted", "accepted", "submit "
                                                                                "accepted")
    assert run("up", "--once", cwd=ws).code == 0  # the REPORT file a reviewer reads lists the artifacts
    [report_file] = (ws / "fcop" / "reports").glob("REPORT-*.md")
    assert report_file.read_text().endswith("how it was fixed\n\n## Artifacts\n\n- dist/fix.patch\n")
    assert run("task", "approve", tid, cwd=ws).json["status"] == "accepted"
    assert run("task", "archive", tid, "--reason", "shipped", cwd=ws).json["revision"] == 6
    doc = run("task", "show", tid, cwd=ws).json
    assert (doc["state"], doc["subject"], doc["priority"], doc["risk_level"]) == ("archive", "fix the [/b] parser",
                                                                                  "P1", "medium")
    assert doc["reports"][0]["artifacts"] == ["dist/fix.patch"]
    assert doc["references"] == ["docs/x.md"]


def test_reject_reopen_and_amend(team: tuple[Path, str]) -> None:
    ws, dev = team
    tid = create(ws)
    for args in (["claim", tid], ["report", tid, "--status", "done", "--submit"]):
        assert as_role(dev, "task", *args, cwd=ws).code == 0
    rejected = run("task", "reject", tid, "--reason", "no tests", cwd=ws)
    assert (rejected.json["status"], rejected.json["round"]) == ("accepted", 2)
    assert as_role(dev, "task", "report", tid, "--status", "done", "--submit", cwd=ws).code == 0
    assert run("task", "approve", tid, cwd=ws).code == 0
    reopened = run("task", "reopen", tid, "--reason", "regressed", cwd=ws)
    assert (reopened.json["status"], reopened.json["round"]) == ("accepted", 3)
    amended = run("task", "amend", tid, "--subject", "fix the parser again", "--priority", "P0", cwd=ws)
    assert amended.json["status"] == "accepted"
    doc = run("task", "show", tid, cwd=ws).json
    assert (doc["subject"], doc["priority"], doc["state"]) == ("fix the parser again", "P0", "active")
    reasons = [h.get("reason") for h in doc["history"] if h["type"] in ("task_rejected", "task_reopened")]
    assert reasons == ["no tests", "regressed"]


def test_a_retry_after_a_crash_replays_and_records_one_event(team: tuple[Path, str]) -> None:
    """The process is killed as soon as its report is committed (its answer may be lost); the same call again
    is `replayed`, and the log holds the report once."""
    ws, dev = team
    tid = create(ws)
    assert as_role(dev, "task", "claim", tid, cwd=ws).code == 0
    before = events(ws)
    proc = subprocess.Popen([*CLI, "task", "report", tid, "--status", "done", "--body", "all green"], cwd=ws,
                            env=cli_env(TASKKERNEL_TOKEN=dev), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while events(ws) == before and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert events(ws) == before + 1
    again = as_role(dev, "task", "report", tid, "--status", "done", "--body", "all green", cwd=ws)
    assert (again.code, again.json["status"]) == (0, "replayed"), again.out
    assert events(ws) == before + 1
    other = as_role(dev, "task", "report", tid, "--status", "done", "--body", "and the docs", cwd=ws)
    assert other.json["status"] == "accepted" and events(ws) == before + 2  # a different report is a new one


def test_stale_unauthorized_and_missing_are_refusals_with_their_codes(team: tuple[Path, str]) -> None:
    ws, dev = team
    tid = create(ws)
    stale = as_role(dev, "task", "claim", tid, "--expect-rev", "5", cwd=ws)
    assert (stale.code, stale.json["reason"]) == (2, "stale_task_revision")
    assert as_role(dev, "task", "approve", tid, cwd=ws).json["reason"] == "role_not_authorized"  # ADMIN's task
    assert as_role(dev, "task", "submit", tid, cwd=ws).json["reason"] == "illegal_transition"  # not claimed yet
    missing = as_role(dev, "task", "claim", "TASK-20990101-001", cwd=ws)
    assert (missing.code, missing.json["reason"]) == (2, "task_not_found")
    bogus = as_role("tk_" + "x" * 30, "task", "claim", tid, cwd=ws)
    assert (bogus.code, bogus.json["reason"]) == (2, "actor_unverified")


def test_bad_input_is_a_usage_or_input_error(team: tuple[Path, str]) -> None:
    ws, _ = team
    tid = create(ws)
    for args, code in ((["report", tid, "--status", "finished"], 64), (["create", "--to", "DEV"], 64),
                       (["create", "--to", "DEV", "--subject", "s", "--priority", "P9"], 64),
                       (["create", "--to", "DEV", "--subject", "s", "--body", "b", "--body-file", "f"], 64),
                       (["report", tid, "--status", "blocked", "--submit"], 64),
                       (["report", tid, "--status", "done", "--body-file", "nowhere.md"], 65),
                       (["amend", tid], 64)):
        r = run("task", *args, cwd=ws)
        assert r.code == code and "Traceback" not in r.err, (args, r.code, r.out, r.err)


def test_a_missing_grant_prints_the_command_that_grants_it(team: tuple[Path, str]) -> None:
    ws, dev = team
    tid = create(ws, "--risk", "high")
    assert as_role(dev, "task", "claim", tid, cwd=ws).code == 0
    assert as_role(dev, "task", "report", tid, "--status", "done", "--submit", cwd=ws).code == 0
    refused = run("task", "approve", tid, cwd=ws)
    assert (refused.code, refused.json["reason"]) == (2, "permission_required")
    hint = refused.json["hint"]
    assert hint.startswith("taskkernel session accept admin --kind allow") and f"to grant it: {hint}" in refused.err
    granted = subprocess.run(hint.replace("taskkernel", " ".join(CLI), 1), shell=True, cwd=ws, env=cli_env(),
                             capture_output=True, text=True)
    assert granted.returncode == 0, granted.stdout + granted.stderr
    assert run("task", "approve", tid, cwd=ws).json["status"] == "accepted"
