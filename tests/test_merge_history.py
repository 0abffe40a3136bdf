"""A merge on approval is in the task's history (`task_merged`), a merge that waits for a person shows on the task
(`merge_failed`), `taskkernel task merge ID` lands it once the cause is fixed, and no credential can forge either
record. Real git, real `taskkernel` processes, the stand-in agent CLIs (tests/agents_support.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from taskkernel.kernel.model.principal import Principal
from taskkernel.kernel.store.db import Database
from tests.agents_support import Team, git, role
from tests.cli_support import taskkernel
from tests.kernel_harness import Harness


def test_a_merge_is_recorded_a_failed_one_shows_on_the_task_and_task_merge_lands_it(tmp_path: Path) -> None:
    team = Team(tmp_path, f"\n[roles.DEV]\n{role('claude-code', concurrency=2, on_approve='merge')}")
    a = team.task("DEV", "Shared from A", "write shared.txt from A")
    b = team.task("DEV", "Notes from B", "write notes.txt from B")
    team.up()
    team.ok("task", "approve", a)
    team.up()
    doc = team.show(a)
    main = git(team.root, "rev-parse", "main")
    assert doc["merge"] == {**doc["merge"], "status": "merged", "base": "main", "commit": main, "round": 1}, doc
    [merged] = [e for e in doc["history"] if e["type"] == "task_merged"]
    assert merged["by"] == "ADMIN:coordinator"

    # a local edit in the base's checkout on the file the task changes: nothing moves, the task says why
    (team.root / "notes.txt").write_text("a local edit\n")
    team.ok("task", "approve", b)
    team.cli("up", "--once", "--once-wait", "5", timeout=300)  # exit 1 (degraded) once dead letters are reported
    doc = team.show(b)
    assert doc["state"] == "done" and doc["merge"]["status"] == "failed", doc
    assert "notes.txt" in doc["merge"]["error"]
    assert [e["type"] for e in doc["history"]].count("merge_failed") == 1, "the same error is recorded once"
    assert git(team.root, "rev-parse", "main") == main
    still = team.cli("task", "merge", b, "--json")
    assert still.returncode == 2 and json.loads(still.stdout)["reason"] == "merge_failed", still

    (team.root / "notes.txt").unlink()  # the person clears the checkout
    landed = team.ok("task", "merge", b)
    main = git(team.root, "rev-parse", "main")
    assert landed["status"] == "merged" and landed["commit"] == main and landed["base"] == "main", landed
    doc = team.show(b)
    assert doc["merge"]["status"] == "merged" and doc["merge"]["commit"] == main
    assert [e["type"] for e in doc["history"]][-2:] == ["merge_failed", "task_merged"]
    assert team.ok("task", "merge", b)["commit"] == main, "a second merge changes nothing"
    assert [e["type"] for e in team.show(b)["history"]].count("task_merged") == 1
    assert doc["history"][-1]["note"] == f"merged into main at {main[:12]}"
    after = team.cli("up", "--once", "--once-wait", "5", "--json", timeout=300)  # the effect that gave up: settled
    assert after.returncode == 0, after.stdout + after.stderr
    assert "merge_record_refused" not in after.stderr, "the re-run found the merge done and recorded nothing"
    assert team.ok("effects", "list")["effects"] == []

    # nobody but the task's done authority (or ADMIN) merges it; and no credential forges a merge record
    dev = team.cli("token", "issue", "DEV").stdout.strip()
    refused = team.cli("task", "merge", b, "--json", env={"TASKKERNEL_TOKEN": dev})
    assert refused.returncode == 2 and json.loads(refused.stdout)["reason"] == "role_not_authorized"
    run_token = team.cli("token", "issue", "ADMIN", "--task", a).stdout.strip()  # ADMIN's role, another task's run
    refused = team.cli("task", "merge", b, "--json", env={"TASKKERNEL_TOKEN": run_token})
    assert refused.returncode == 2 and "not a run's token" in json.loads(refused.stdout)["message"], refused
    revision = team.show(b)["revision"]
    forged = {"type": "record_merge", "task_id": b, "expected_revision": revision, "round": 1,
              "idempotency_key": "forged", "payload": {"branch": f"task/{b}", "base": "main", "commit": "0" * 40,
                                                       "how": "fast-forward"}}
    for tok in (dev, None):
        done = _submit(team, forged, tok)
        assert done["reason"] == "invalid_command" and "recorded by the coordinator alone" in done["message"], done
    assert team.show(b)["revision"] == revision


def _submit(team: Team, command: dict[str, object], tok: str | None) -> dict[str, object]:
    env = team.env(**({"TASKKERNEL_TOKEN": tok} if tok else {}))
    done = taskkernel("submit", cwd=team.root, stdin=json.dumps(command), env=env)
    assert done.returncode == 2, (done.stdout, done.stderr)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.fixture
def h(sqlite_db: Database) -> Harness:
    return Harness(sqlite_db)


def test_a_principal_from_a_credential_cannot_write_a_merge_record_in_process(h: Harness) -> None:
    """Even in-process (a file's, a schedule's, a run's principal), only the coordinator's own records a merge."""
    tid = h.create(recipient="DEV").task_id
    h.drive_to(tid, "done", driver=Principal("DEV", "dev-agent"))
    payload = {"branch": f"task/{tid}", "base": "main", "commit": "a" * 40, "how": "fast-forward"}
    for who in (Principal("ADMIN", "coordinator"), Principal("ADMIN", "owner"), Principal("DEV", "coordinator")):
        refused = h.cmd("record_merge", tid, who, payload=payload)
        assert refused.reason == "role_not_authorized" and "recorded by the coordinator alone" in refused.message
    recorded = h.cmd("record_merge", tid, Principal("ADMIN", "coordinator", internal=True), payload=payload)
    assert recorded.status == "accepted"
    assert h.kernel.task(tid)["merge"]["commit"] == "a" * 40
