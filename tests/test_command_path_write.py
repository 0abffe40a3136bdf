"""The command path's write transaction (``Database.write``, a class rather than generator context managers) and the
payload's identity claims (a payload naming none is the usual case, taken without a walk): what each must keep."""

from __future__ import annotations

from pathlib import Path

import pytest

from taskkernel.kernel.model.commands import Command
from taskkernel.kernel.store.db import Database
from taskkernel.kernel.store.events import EventStore, NewEvent
from taskkernel.kernel.store.schema import metadata


@pytest.fixture
def db(tmp_path: Path) -> Database:
    db = Database(f"sqlite:///{tmp_path / 'write.db'}", chain_key=b"k" * 32)
    db.create_schema(metadata)
    return db


def count(db: Database, sql: str) -> int:
    with db.read() as conn:
        return int(conn.exec_driver_sql(sql).scalar_one())


def test_an_error_in_the_block_rolls_back_and_the_connection_serves_the_next_write(db: Database) -> None:
    with pytest.raises(ValueError, match="refused"), db.write() as uow:
        uow.sql("INSERT INTO counters (name, value) VALUES ('a', 1)")
        raise ValueError("refused")
    assert count(db, "SELECT count(*) FROM counters") == 0
    assert len(db._idle) == 1  # rolled back, out of every transaction: kept for the next write
    kept = db._idle[0]
    with db.write() as uow:
        assert uow.conn is kept
        uow.sql("INSERT INTO counters (name, value) VALUES ('a', 2)")
    assert count(db, "SELECT value FROM counters WHERE name = 'a'") == 2


def test_appended_events_seal_the_head_in_the_same_commit(db: Database) -> None:
    store = EventStore()
    with db.write() as uow:
        store.append(uow, "s", 0, [NewEvent("e", {"n": 1}), NewEvent("e", {"n": 2})], {"actor": "a"})
    with db.read() as conn:
        head = conn.exec_driver_sql("SELECT value FROM store_meta WHERE name = 'head'").scalar_one()
        last = conn.exec_driver_sql("SELECT global_pos, hash FROM events ORDER BY global_pos DESC").first()
    assert last is not None and head.split(" ")[:2] == [str(last[0]), last[1]]
    with pytest.raises(RuntimeError), db.write() as uow:  # an append that rolls back leaves the head as it was
        store.append(uow, "s", 2, [NewEvent("e", {"n": 3})], {"actor": "a"})
        raise RuntimeError
    with db.read() as conn:
        assert conn.exec_driver_sql("SELECT value FROM store_meta WHERE name = 'head'").scalar_one() == head
    assert count(db, "SELECT count(*) FROM events") == 2


def test_identity_claims_are_found_in_their_order_and_never_reach_the_payload_model() -> None:
    plain = Command.model_validate({"type": "submit_report", "task_id": "TASK-20260101-001", "expected_revision": 2,
                                    "round": 1, "idempotency_key": "k", "payload": {"status": "done"}})
    assert plain.identity_claims() == {}
    claiming = Command.model_validate({"type": "submit_report", "task_id": "TASK-20260101-001",
                                       "expected_revision": 2, "round": 1, "idempotency_key": "k",
                                       "payload": {"status": "done", "by": "PM", "actor": "QA"}})
    assert list(claiming.identity_claims().items()) == [("actor", "QA"), ("by", "PM")]
    assert claiming.validated_payload().model_dump()["status"] == "done"  # the claims are no payload fields
