"""Cost attribution: every unit of work has an owner, rolls up to its root, and policy is the root's."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import sqlalchemy as sa

from taskkernel.kernel.model.principal import Principal
from taskkernel.kernel.usage import Feature, UsageRecord, record_usage, usage_table
from tests.cli_support import run_tty, taskkernel
from tests.coord_support import admin_task, coordinator, make_workspace

SCRIPTED = {"runner": "scripted"}


def usage_cli(ws: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return taskkernel("usage", *args, cwd=ws)


def test_usage_by_root_sums_exactly_to_the_ledger(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "ws", {"PM": SCRIPTED, "DEV": SCRIPTED, "QA": SCRIPTED})
    c = coordinator(ws)
    root = admin_task(c, subject="Feature")
    other = admin_task(c, subject="Heartbeat sink", recipient="OPS")
    c.run_once()
    with c.db.write() as uow:  # an automation firing under its own root, and one background job
        for i in range(5):
            record_usage(uow, UsageRecord(f"auto:{i}", "OPS", "scheduler:heartbeat", Feature.AUTOMATION, other,
                                          other, 0, wall_ms=3, tokens_in=100, cost_usd=0.01))
        record_usage(uow, UsageRecord("bg:summary", "PM", "summarizer", Feature.BACKGROUND, root, root, 1,
                                      tokens_out=40, cost_usd=0.002))
    by_root = json.loads(usage_cli(ws.root, "--by", "root", "--json").stdout)
    with c.db.read() as conn:
        ledger = conn.execute(sa.select(sa.func.count(), sa.func.sum(usage_table.c.tokens_in),
                                        sa.func.sum(usage_table.c.tokens_out), sa.func.sum(usage_table.c.cost_usd))
                              ).one()
    assert by_root["total"]["units"] == ledger[0] == sum(r["units"] for r in by_root["rows"])
    assert by_root["total"]["tokens_in"] == ledger[1] and by_root["total"]["tokens_out"] == ledger[2]
    assert abs(by_root["total"]["cost_usd"] - ledger[3]) < 1e-9
    owners = {r["owner"]: r for r in by_root["rows"]}
    assert set(owners) == {root, other}, "children's runs roll up to their root"
    children = c.kernel.children(root)
    assert len(children) == 2
    by_task = {r["owner"] for r in json.loads(usage_cli(ws.root, "--by", "task", "--json").stdout)["rows"]}
    assert {k["task_id"] for k in children} <= by_task
    by_feature = {r["owner"]: r["units"] for r in json.loads(usage_cli(ws.root, "--by", "feature", "--json")
                                                                  .stdout)["rows"]}
    assert by_feature["automation"] == 5 and by_feature["background"] == 1
    top = json.loads(usage_cli(ws.root, "--top", "--json").stdout)["rows"]
    assert top[0]["owner"] == other, "the costly automation is the first thing you see"
    table = run_tty("usage", "--by", "role", cwd=ws.root)  # a person at a terminal gets the table
    assert table.code == 0 and "TOTAL" in table.out and "OPS" in table.out, table.out
    assert json.loads(usage_cli(ws.root, "--by", "role").stdout)["by"] == "role", "a pipe gets the JSON document"
    assert usage_cli(ws.root, "--by", "planet").returncode == 64
    assert json.loads(usage_cli(ws.root, "--since", "1h", "--json").stdout)["total"]["units"] == ledger[0]
    future = json.loads(usage_cli(ws.root, "--since", "2999-01-01", "--json").stdout)
    assert future["total"]["units"] == 0 and future["rows"] == []
    bad = usage_cli(ws.root, "--since", "yesterday")
    assert bad.returncode == 64 and "neither an ISO date" in bad.stdout + bad.stderr


def test_since_is_compared_by_time_not_by_spelling() -> None:
    """The ledger's timestamps are UTC with microseconds and Z: every accepted spelling of one instant gives that
    form (an offset is converted, a naive time is UTC), ages count back from now; anything else is None."""
    from datetime import UTC, datetime

    from taskkernel.kernel.usage import since_utc

    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    assert since_utc("2026-12-01T14:00+02:00") == since_utc("2026-12-01T12:00") == "2026-12-01T12:00:00.000000Z"
    assert since_utc("2026-12-01T12:00:00Z") == "2026-12-01T12:00:00.000000Z"
    assert since_utc(" 90S ", now) == "2026-12-01T11:58:30.000000Z"
    assert since_utc("2w", now) == "2026-11-17T12:00:00.000000Z"
    assert [since_utc(t, now) for t in ("yesterday", "7 days", "-1h", "1y", "")] == [None] * 5


def test_a_child_cannot_escalate_its_roots_policy(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "ws", {})
    c = coordinator(ws)
    root = admin_task(c, cost_tier="economy", budget={"tokens": 10_000})
    pm = Principal("PM", "pm")
    c.kernel.submit({"type": "claim", "task_id": root, "thread_key": root, "expected_revision": 1, "round": 0,
                     "idempotency_key": "cl"}, pm)

    def child(key: str, **payload: object) -> str | None:
        r = c.kernel.submit({"type": "create_task", "idempotency_key": key, "payload": {
            "sender": "PM", "recipient": "DEV", "subject": "sub", "parent": root, **payload}}, pm)
        return r.reason if r.status == "rejected" else c.kernel.task(r.task_id)["cost_tier"]

    assert child("a", cost_tier="premium") == "policy_escalation"
    assert child("b", cost_tier="standard") == "policy_escalation"
    assert child("c", budget={"tokens": 50_000}) == "policy_escalation"
    assert child("d") == "economy", "a child inherits the root's tier"
    assert child("e", budget={"tokens": 500}) == "economy"


def test_an_automation_fire_is_recorded_as_automation_usage(tmp_path: Path) -> None:
    from datetime import UTC, datetime, timedelta

    from taskkernel.scheduler.admin import Schedules
    from taskkernel.scheduler.models import ActionSpec, ActionType, spec_from_user

    ws = make_workspace(tmp_path / "ws", {})
    c = coordinator(ws)
    start = datetime.now(UTC).replace(microsecond=0)
    spec = spec_from_user({"every": "10m", "start": start.isoformat(), "owner_role": "ADMIN"}, name="patrol")
    action = ActionSpec(type=ActionType.CREATE_TASK, template={"recipient": "OPS", "subject": "patrol {dedup_key}"})
    Schedules(c.automations.runtime.ledger).add(spec.model_copy(update={"action": action}), start)
    for minutes in (11, 21, 31):
        c.automations.tick(start + timedelta(minutes=minutes))
    rows = json.loads(usage_cli(ws.root, "--by", "feature", "--json").stdout)["rows"]
    assert {r["owner"]: r["units"] for r in rows} == {"automation": 3}
    by_agent = json.loads(usage_cli(ws.root, "--by", "agent", "--json").stdout)["rows"]
    assert by_agent[0]["owner"] == "scheduler:patrol"
    roots = {r["owner"] for r in json.loads(usage_cli(ws.root, "--by", "root", "--json").stdout)["rows"]}
    assert len(roots) == 3 and all(r.startswith("TASK-") for r in roots), "each fire is owned by the task it made"
