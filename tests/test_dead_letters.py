"""No effect is given up silently (issue 25): an outbox effect that exhausts its attempts is a dead letter that
`up --once` names (exit 1, degraded), `effects list` shows with its last error, and `effects retry KEY` (ADMIN only)
puts back for the next `up` once the cause is fixed. Real git, real `taskkernel` processes, the stand-in agent CLI
(tests/procs/agent_cli.py)."""

from __future__ import annotations

import json
from pathlib import Path

import sqlalchemy as sa

from taskkernel.kernel.outbox import (
    EFFECT_NOT_DEAD,
    EFFECT_NOT_FOUND,
    OutboxRelay,
    RetryRefused,
    dead_letters,
    retry_dead_letter,
)
from taskkernel.kernel.store.db import Database
from taskkernel.kernel.store.schema import outbox
from tests.agents_support import Team, git, role
from tests.cli_support import run_tty
from tests.kernel_harness import Harness


def key_and_error(table: str) -> tuple[str, str]:
    """The effect key and the first words of the error in the dead-letter table's one row."""
    [row] = [line for line in table.splitlines() if "worktree:" in line]
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    return cells[0], " ".join(cells[-1].split()[:2])


def test_a_merge_blocked_by_a_local_edit_is_a_dead_letter_until_a_person_fixes_it_and_retries(
        tmp_path: Path) -> None:
    team = Team(tmp_path, f"\n[roles.DEV]\n{role('claude-code', on_approve='merge')}")
    task = team.task("DEV", "Shared", "write shared.txt from the task")
    team.up()
    team.ok("task", "approve", task)
    (team.root / "shared.txt").write_text("the user's own unfinished edit\n")  # the base checkout cannot move

    for _ in range(6):  # the relay tries the merge once per pass that has nothing else to do: up to 5 attempts
        up = team.cli("up", "--once", "--once-wait", "0", "--json", timeout=300)
        if up.returncode != 0:
            break
        assert json.loads(up.stdout)["status"] == "ok", up.stdout
    assert up.returncode == 1, (up.stdout, up.stderr)
    degraded = json.loads(up.stdout)
    assert degraded["status"] == "degraded" and degraded["failed_stages"] == [], degraded
    [dead] = degraded["dead_letters"]
    assert (dead["effect"], dead["task_id"], dead["attempts"]) == ("worktree", task, 5), dead
    assert f"merge of task/{task} into main waits" in dead["last_error"] and dead["failed_at"], dead
    assert f"dead letter {dead['effect_key']}" in up.stderr and "effects retry" in up.stderr
    assert (team.root / "shared.txt").read_text() == "the user's own unfinished edit\n", "nothing merged"

    listed = team.ok("effects", "list")
    assert listed == {"effects": [dead]}, listed
    checks = {c["name"]: c for c in json.loads(team.cli("doctor", "--json").stdout)["checks"]}
    assert checks["dead_letters"]["status"] == "warn" and dead["effect_key"] in checks["dead_letters"]["message"]
    table = run_tty("effects", "list", cwd=team.root)
    assert table.code == 0 and key_and_error(table.out) == (dead["effect_key"], "merge of"), table.out

    key = dead["effect_key"]
    run_token = team.cli("token", "issue", "ADMIN", "--task", task).stdout.strip()
    for token in (run_token, team.cli("token", "issue", "DEV").stdout.strip()):
        refused = team.cli("effects", "retry", key, env={"TASKKERNEL_TOKEN": token})
        assert (refused.returncode, json.loads(refused.stdout)["reason"]) == (2, "role_not_authorized"), refused
    unknown = team.cli("effects", "retry", "worktree:999999")
    assert (unknown.returncode, json.loads(unknown.stdout)["reason"]) == (2, "effect_not_found"), unknown.stdout
    assert team.ok("effects", "list") == listed, "a refused retry changes nothing"

    git(team.root, "checkout", "--", "shared.txt")  # the person clears the checkout
    assert team.ok("effects", "retry", key) == {"status": "queued", "effect_key": key}
    again = team.cli("effects", "retry", key)
    assert (again.returncode, json.loads(again.stdout)["reason"]) == (2, "effect_not_dead"), again.stdout
    assert "pending" in json.loads(again.stdout)["message"]
    assert team.ok("effects", "list") == {"effects": []}
    with sa.create_engine(f"sqlite:///{team.root / '.taskkernel' / 'kernel.db'}").connect() as conn:
        retried = conn.execute(sa.text("SELECT status, attempts, retried_by, retried_at FROM outbox "
                                       "WHERE effect_key = :k"), {"k": key}).one()
    assert retried[:3] == ("pending", 0, "ADMIN:local-owner") and retried[3], retried

    team.up()  # exit 0, status ok: the retried merge lands
    assert (team.root / "shared.txt").read_text() == "from the task\n"
    assert git(team.root, "rev-parse", "main") == git(team.root, "rev-parse", f"task/{task}")
    assert team.ok("effects", "list") == {"effects": []}


def test_the_relay_keeps_an_effect_it_gave_up_on_and_only_a_dead_letter_is_put_back(any_db: Database) -> None:
    """The relay's side (kernel/outbox.py), on every backend: a failing effect is pending again after each of its
    attempts, a dead letter after the last, with its last error and when; `retry_dead_letter` refuses a key no row
    has and an effect that is not dead, and puts a dead one back with its attempts cleared, recording who."""
    h = Harness(any_db)
    task_id = h.create().task_id
    broken = {"yes": True}

    def notify(key: str, payload: dict[str, object]) -> None:
        if broken["yes"]:
            raise OSError(f"disk says no ({broken})")

    relay = OutboxRelay(any_db, {"notify": notify}, max_attempts=3)
    [key] = _keys(any_db)  # the task_created event's effect
    for attempt in range(1, 4):
        assert dead_letters(any_db) == [], f"pending again after attempt {attempt - 1}"
        assert retry_dead_letter(any_db, key, "ADMIN:x") == RetryRefused(
            EFFECT_NOT_DEAD, f"effect {key!r} is pending, not a dead letter: only an effect that exhausted its "
                             "attempts is retried (the relay retries the others)")
        assert relay.run_pending() == 0
    [dead] = dead_letters(any_db)
    assert {k: dead[k] for k in ("effect_key", "effect", "task_id", "attempts", "last_error", "retried_by")} == {
        "effect_key": key, "effect": "notify", "task_id": task_id, "attempts": 3,
        "last_error": "disk says no ({'yes': True})", "retried_by": None}
    assert dead["failed_at"] and relay.run_pending() == 0, "a dead letter is not claimed again"
    assert code_of(retry_dead_letter(any_db, "notify:999999", "ADMIN:x")) == EFFECT_NOT_FOUND

    broken["yes"] = False
    assert retry_dead_letter(any_db, key, "ADMIN:local-owner") is None
    assert dead_letters(any_db) == [] and relay.run_pending() == 1
    assert code_of(retry_dead_letter(any_db, key, "ADMIN:x")) == EFFECT_NOT_DEAD, "done: nothing to put back"


def code_of(refused: RetryRefused | None) -> str | None:
    return None if refused is None else refused.code


def _keys(db: Database) -> list[str]:
    with db.read() as conn:
        return list(conn.execute(sa.select(outbox.c.effect_key)).scalars())
