"""The command path's per-command shortcuts (issue 29 goal 1) decide exactly what the long way did."""

from __future__ import annotations

import dataclasses
import os
import pickle
from pathlib import Path

import pytest
import sqlalchemy as sa

from taskkernel.kernel.commands import TaskCommandKernel
from taskkernel.kernel.model.commands import Command
from taskkernel.kernel.model.ids import task_id_problem
from taskkernel.kernel.model.principal import LOCAL_OWNER, Principal
from taskkernel.kernel.store.chain import ChainKeyError
from taskkernel.kernel.store.db import Database
from taskkernel.kernel.store.events import EventStore, NewEvent
from taskkernel.kernel.store.schema import metadata
from taskkernel.roles.registry import RoleRegistry

DEV = Principal("DEV", "dev-1")


def test_principal_id_is_formed_once_and_stays_out_of_equality() -> None:
    p = Principal("DEV", "d1", "TASK-20260101-001", 2)
    assert p.id == "DEV:d1" and p == Principal("DEV", "d1", "TASK-20260101-001", 2)
    assert hash(p) == hash(Principal("DEV", "d1", "TASK-20260101-001", 2))
    assert dataclasses.replace(p, agent="d2").id == "DEV:d2"
    assert pickle.loads(pickle.dumps(p)).id == "DEV:d1"
    assert ", id=" not in repr(p)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.id = "ADMIN:x"  # type: ignore[misc]


def test_the_payload_is_validated_once_and_kept() -> None:
    cmd = Command.model_validate({"type": "create_task", "idempotency_key": "k",
                                  "payload": {"sender": "ADMIN", "recipient": "DEV", "subject": "s", "body": "b"}})
    assert cmd.validated_payload() is cmd.validated_payload()
    assert "_payload_model" not in cmd.model_dump()
    bad = Command.model_validate({"type": "create_task", "idempotency_key": "k", "payload": {"sender": "ADMIN"}})
    for _ in range(2):  # a refused payload is refused every time, never cached
        with pytest.raises(ValueError):
            bad.validated_payload()


@pytest.mark.parametrize("task_id", ["TASK-20261301-001", "TASK-20260230-001", "TASK-20260229-001"])
def test_a_day_that_is_no_calendar_date_is_refused_every_time(task_id: str) -> None:
    for _ in range(2):  # the second answer comes from the per-day cache
        assert task_id_problem(task_id) is not None and "calendar date" in str(task_id_problem(task_id))
    assert task_id_problem("TASK-20240229-001") is None


def test_a_lifecycle_records_the_same_events_and_results(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'k.db'}", chain_key=os.urandom(32))
    db.create_schema(metadata)
    kernel = TaskCommandKernel(db, RoleRegistry.for_team("PM", ["PM", "DEV"], load_plugins=False))
    r = kernel.submit({"type": "create_task", "idempotency_key": "c", "payload": {
        "sender": "ADMIN", "recipient": "DEV", "subject": "s", "body": "b", "priority": "P1"}}, LOCAL_OWNER)
    assert r.status == "accepted" and r.message.startswith("create_task accepted: ")
    tid = r.task_id
    steps = [("claim", 1, 0, None, DEV), ("submit_report", 2, 1, {"status": "done", "body": "ok"}, DEV),
             ("submit", 3, 1, None, DEV), ("approve", 4, 1, None, LOCAL_OWNER),
             ("archive", 5, 1, {"reason": "finished"}, LOCAL_OWNER)]
    for kind, rev, rnd, payload, who in steps:
        r = kernel.submit({"type": kind, "task_id": tid, "expected_revision": rev, "round": rnd,
                           "idempotency_key": kind, **({"payload": payload} if payload else {})}, who)
        assert r.status == "accepted", r
        assert r.message.startswith(f"{kind} accepted: ")
    events = kernel.history(tid)
    assert type(events[0].data["priority"]) is str and events[0].data["priority"] == "P1"
    claim = events[1]
    assert claim.data == {"round": 1, "from": "inbox", "by": "DEV:dev-1"}  # an empty payload adds nothing
    assert claim.meta["command_type"] == "claim" and type(claim.meta["command_type"]) is str
    assert events[2].data["status"] == "done" and type(events[2].data["status"]) is str
    doc = kernel.task(tid)
    assert doc is not None and doc["state"] == "archive" and type(doc["state"]) is str
    with db.read() as conn:
        kinds = [r[0] for r in conn.execute(sa.text("SELECT command_type FROM receipts ORDER BY first_pos"))]
    assert kinds == ["create_task", "claim", "submit_report", "submit", "approve", "archive"]


def test_a_head_row_rewritten_after_this_process_sealed_it_is_still_refused(tmp_path: Path) -> None:
    """The head this Database sealed is trusted without a second HMAC only while the row is that exact text."""
    db = Database(f"sqlite:///{tmp_path / 'c.db'}", chain_key=os.urandom(32))
    db.create_schema(metadata)
    store = EventStore()
    for i in range(2):
        with db.write() as uow:
            store.append(uow, "s", i, [NewEvent("e", {"i": i})], {})
    with db.write() as uow:
        text = uow.conn.exec_driver_sql("SELECT value FROM store_meta WHERE name = 'head'").scalar()
        pos, last, seal = text.split(" ")
        uow.conn.exec_driver_sql("UPDATE store_meta SET value = ? WHERE name = 'head'",
                                 (f"{int(pos) - 1} {last} {seal}",))
    with pytest.raises(ChainKeyError), db.write() as uow:
        store.append(uow, "s", 2, [NewEvent("e", {"i": 2})], {})
