"""Poison input is a refusal and a failed stage is visible (issue 9, item 5), through the real CLI.

Out-of-range task ids are `invalid_task_id` (a quarantined file, a refused command); numbers on the
wire are strict and bounded, so what is stored reads back exactly; `up --once` exits 1 `degraded`
when a stage failed.
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from taskkernel.coordinator.fcop import FcopError, FcopReason, parse_envelope
from taskkernel.kernel.canonical import check_json
from taskkernel.kernel.model.commands import TASK_ID_ERROR, Command
from taskkernel.kernel.usage import Feature, UsageRecord
from tests.cli_support import CLI, cli_env, run
from tests.coord_support import make_workspace
from tests.test_folders import task_file

POISON = ("TASK-20260101-99999999999999999999999-ADMIN-to-PM.md",  # beyond 64 bits: OverflowError on SQLite
          "TASK-20260101-3000000000-ADMIN-to-PM.md",  # beyond 32 bits: out of range on PostgreSQL
          "TASK-20261301-001-ADMIN-to-PM.md")  # no 13th month
VALID = "TASK-20260102-001-ADMIN-to-PM.md"  # sorts after every poison name


def cli_json(*args: str, cwd: Path, stdin: str | None = None) -> tuple[int, Any]:
    r = run(*args, cwd=cwd, stdin=stdin)
    assert "Traceback" not in r.out, r.out
    return r.code, r.json


def event_count(ws: Path) -> int:
    return len(run("log", cwd=ws).out.splitlines())


def test_poison_task_ids_are_quarantined_and_the_next_file_is_still_ingested(any_url: str, tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "ws", {}, database=any_url).root
    assert cli_json("up", "--once", cwd=ws)[0] == 0  # the import: what is written after it is live input
    for name in (*POISON, VALID):
        task_file(ws, name)
    code, out = cli_json("up", "--once", cwd=ws)
    assert (code, out["status"]) == (0, "ok"), out
    quarantine = ws / "fcop" / "_quarantine"
    for name in POISON:
        assert (quarantine / f"quarantined-{name}").is_file(), name
        assert "reason: invalid_task_id" in (quarantine / f"quarantined-{name}.reason.md").read_text()
    code, task = cli_json("task", "show", "TASK-20260102-001", cwd=ws)
    assert (code, task["state"]) == (0, "inbox")


def test_submit_refuses_an_out_of_range_task_id_as_invalid_task_id(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "ws", {}).root
    for task_id in ("TASK-20260101-99999999999999999999999", "TASK-20260101-3000000000", "TASK-20260230-001"):
        code, out = cli_json("submit", cwd=ws, stdin=json.dumps({
            "type": "create_task", "task_id": task_id, "idempotency_key": f"k-{task_id}",
            "payload": {"sender": "ADMIN", "recipient": "PM", "subject": "poison"}}))
        assert (code, out["reason"]) == (2, "invalid_task_id"), out
    assert event_count(ws) == 0


def test_up_once_is_degraded_with_exit_1_when_a_stage_fails(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "ws", {}).root
    assert run("up", "--once", cwd=ws).code == 0  # every table exists: the read-only store below still opens
    task_file(ws, VALID)
    read_only = f"sqlite:///file:{ws / '.taskkernel' / 'kernel.db'}?mode=ro&uri=true"  # e.g. a read-only mount
    code, out = cli_json("--db", read_only, "up", "--once", cwd=ws)
    assert (code, out["status"]) == (1, "degraded"), out
    assert {"passes", "dispatched", "wakes", "runs"} <= set(out)
    ingest = next(f for f in out["failed_stages"] if f["stage"] == "ingest")
    assert ingest["error"] == "IngestIncomplete" and "readonly database" in ingest["message"], ingest
    code, out = cli_json("up", "--once", cwd=ws)  # writable again: the file was kept and is taken in
    assert (code, out["status"]) == (0, "ok"), out
    assert run("task", "show", "TASK-20260102-001", cwd=ws).code == 0


def test_up_keeps_running_and_logs_a_failing_stage_live(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "ws", {}).root
    assert run("up", "--once", cwd=ws).code == 0
    task_file(ws, VALID)
    read_only = f"sqlite:///file:{ws / '.taskkernel' / 'kernel.db'}?mode=ro&uri=true"
    log = tmp_path / "up.log"
    with log.open("w") as err:
        proc = subprocess.Popen([*CLI, "--db", read_only, "up"], cwd=ws, env=cli_env(), stdout=subprocess.PIPE,
                                stderr=err, text=True)
    try:
        def failing_again() -> bool:  # a second failing pass: the coordinator is still running
            lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
            return any(e["event"] == "coordinator_stage_failed" and e["stage"] == "ingest" and e["repeated"]
                       for e in lines)
        deadline = time.monotonic() + 60
        while not failing_again() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert failing_again(), log.read_text()[-2000:]
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0 and json.loads(out.splitlines()[-1])["status"] == "stopped", out


def test_loose_or_unbounded_numbers_are_invalid_commands_and_write_nothing(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "ws", {}).root
    code, created = cli_json("submit", cwd=ws, stdin=json.dumps({
        "type": "create_task", "idempotency_key": "ok", "payload": {
            "sender": "ADMIN", "recipient": "PM", "subject": "s", "budget": {"tokens": 10}}}))
    assert code == 0, created
    tid = created["task_id"]
    before = event_count(ws)
    claim = (f'{{"type": "claim", "task_id": "{tid}", "thread_key": "{tid}", "round": 0, "idempotency_key": "c", '
             '"expected_revision": ')
    create = ('{"type": "create_task", "idempotency_key": "b", "payload": {"sender": "ADMIN", "recipient": "PM", '
              '"subject": "s", "budget": ')
    bad = [claim + "true}", claim + '"1"}', claim + f"{2**53 + 1}}}",  # JSON text exactly as a client sends it
           create + '{"cost_usd": NaN}}}', create + f'{{"tokens": {10**30}}}}}}}']
    with ThreadPoolExecutor(max_workers=len(bad)) as pool:  # refusals write nothing: safe side by side
        results = list(pool.map(lambda text: run("submit", cwd=ws, stdin=text), bad))
    for text, r in zip(bad, results, strict=True):
        assert (r.code, r.json["status"], r.json["reason"]) == (2, "rejected", "invalid_command"), (text, r.out)
    assert event_count(ws) == before
    assert run("task", "show", tid, cwd=ws).json["revision"] == 1


def test_a_budget_at_2_53_round_trips_exactly_and_verify_holds_after_an_amend(any_url: str, tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "ws", {}, database=any_url).root
    budget = {"tokens": 2**53, "cost_usd": 0.1, "wall_seconds": 3600, "attempts": 5}
    code, created = cli_json("submit", cwd=ws, stdin=json.dumps({
        "type": "create_task", "idempotency_key": "k1", "payload": {
            "sender": "ADMIN", "recipient": "PM", "subject": "big", "budget": budget}}))
    assert code == 0, created
    tid = created["task_id"]
    code, amended = cli_json("submit", cwd=ws, stdin=json.dumps({
        "type": "amend", "task_id": tid, "thread_key": tid, "expected_revision": 1, "round": 0,
        "idempotency_key": "k2", "payload": {"subject": "bigger"}}))
    assert code == 0, amended
    shown = run("task", "show", tid, cwd=ws).json["budget"]
    assert shown == {**budget, "wall_seconds": 3600.0} and type(shown["tokens"]) is int
    code, verified = cli_json("verify", cwd=ws)
    assert (code, verified["status"]) == (0, "ok"), verified


# -- the layers underneath, in process (fast) ----------------------------------------------------
@pytest.mark.parametrize("name", POISON)
def test_the_parser_names_an_out_of_range_id_invalid_task_id(name: str) -> None:
    with pytest.raises(FcopError) as err:
        parse_envelope(name, b"---\nprotocol: fcop\nversion: 1\nsender: ADMIN\nrecipient: PM\n---\nx\n")
    assert err.value.reason is FcopReason.INVALID_TASK_ID


CLAIM = {"type": "claim", "task_id": "TASK-20260101-001", "thread_key": "t", "expected_revision": 1, "round": 0,
         "idempotency_key": "k"}
CREATE = {"type": "create_task", "idempotency_key": "k", "payload": {"sender": "ADMIN", "recipient": "PM",
                                                                     "subject": "s"}}


@pytest.mark.parametrize("command", [
    {**CLAIM, "expected_revision": 1.0}, {**CLAIM, "round": "0"}, {**CLAIM, "round": False},
    {**CLAIM, "based_on_event": True}, {**CLAIM, "permission_as_of": -1},
    {**CREATE, "transport": {"n": 2**64}}, {**CREATE, "payload": {**CREATE["payload"], "body": math.inf}},
    *({**CREATE, "payload": {**CREATE["payload"], "budget": budget}} for budget in (
        {"cost_usd": math.inf}, {"wall_seconds": 1e400}, {"cost_usd": 1e12}, {"attempts": True},
        {"attempts": 1_000_001}, {"tokens": 2**53 + 1}, {"tokens": 5.0})),
    {"type": "perform", **{k: v for k, v in CLAIM.items() if k != "type"}, "payload": {
        "operation": "o", "entity": "e", "tool": "t", "plan_seq": "3"}},
    {"type": "adopt_task", "idempotency_key": "k", "payload": {**CREATE["payload"], "state": "active",
                                                              "round": 2**31, "source": "f"}},
])
def test_the_wire_model_refuses_loose_or_unbounded_numbers(command: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        Command.model_validate(command).validated_payload()


def test_the_wire_model_names_a_bad_task_id_by_its_own_error_type() -> None:
    for bad in ({**CLAIM, "task_id": "TASK-20260101-1000000000"}, {**CLAIM, "root": "TASK-20260229-001"},
                {**CREATE, "payload": {**CREATE["payload"], "parent": "TASK-2026-001"}}):
        with pytest.raises(ValidationError) as err:
            Command.model_validate(bad).validated_payload()
        assert [e["type"] for e in err.value.errors()] == [TASK_ID_ERROR]
    Command.model_validate({**CLAIM, "task_id": "TASK-20280229-999999999"})  # a leap day, nine digits


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 2**53 + 1, -(2**53) - 1, 10**30, b"x", {1: "a"},
                                   {"a": [{"b": math.nan}]}])
def test_check_json_refuses_what_would_not_read_back_exactly(value: Any) -> None:
    with pytest.raises(ValueError):
        check_json(value)


def test_check_json_accepts_the_exact_range_and_refuses_deep_nesting() -> None:
    check_json({"a": [2**53, -(2**53), 0.1, True, None, "s"]})
    deep: Any = 1
    for _ in range(100):
        deep = [deep]
    with pytest.raises(ValueError, match="nested"):
        check_json(deep)


@pytest.mark.parametrize("figures", [{"tokens_in": True}, {"tokens_out": 2**53 + 1}, {"wall_ms": -1},
                                     {"cost_usd": math.inf}, {"cost_usd": math.nan}])
def test_usage_figures_that_would_not_be_stored_exactly_are_refused(figures: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        UsageRecord(usage_id="u", role="DEV", agent="a", feature=Feature.FOREGROUND, **figures)
