"""Event store: optimistic concurrency, commit-ordered positions, hash chain, upcasting."""

from __future__ import annotations

import pytest

from kernel.reasons import ConcurrencyError
from kernel.store.db import Database
from kernel.store.events import EventStore, NewEvent, Upcasters, verify_chain
from kernel.store.schema import metadata


@pytest.fixture
def store(any_db: Database) -> EventStore:
    any_db.create_schema(metadata)
    return EventStore()


def test_append_with_stale_expected_version_fails_and_writes_nothing(any_db: Database, store: EventStore) -> None:
    with any_db.write() as uow:
        store.append(uow, "s1", 0, [NewEvent("a", {"n": 1}), NewEvent("b", {"n": 2})], {})
    for expected in (0, 1, 5):
        with pytest.raises(ConcurrencyError), any_db.write() as uow:
            store.append(uow, "s1", expected, [NewEvent("c", {})], {})
    with any_db.read() as conn:
        assert [(e.stream_version, e.type) for e in store.read_stream(conn, "s1")] == [(1, "a"), (2, "b")]


def test_global_positions_are_gapless_in_commit_order_across_streams(any_db: Database, store: EventStore) -> None:
    for i in range(5):
        with any_db.write() as uow:
            store.append(uow, f"s{i % 2}", i // 2, [NewEvent("e", {"i": i})], {})
    with any_db.read() as conn:
        events = list(store.read_all(conn))
    assert [e.global_pos for e in events] == [1, 2, 3, 4, 5]
    assert [e.data["i"] for e in events] == [0, 1, 2, 3, 4]


def test_rolled_back_append_leaves_no_trace(any_db: Database, store: EventStore) -> None:
    with pytest.raises(RuntimeError), any_db.write() as uow:
        store.append(uow, "s", 0, [NewEvent("e", {})], {})
        raise RuntimeError("crash before commit")
    with any_db.write() as uow:
        assert store.append(uow, "s", 0, [NewEvent("e", {})], {})[0].global_pos == 1


def test_hash_chain_detects_any_edit_and_names_the_first_position(any_db: Database, store: EventStore) -> None:
    with any_db.write() as uow:
        for i in range(6):
            store.append(uow, "s", i, [NewEvent("e", {"i": i})], {"actor": "x"})
    with any_db.read() as conn:
        assert verify_chain(store, conn) is None
    with any_db.write() as uow:
        uow.conn.exec_driver_sql("UPDATE events SET data = '{\"i\":99}' WHERE global_pos = 4")
    with any_db.read() as conn:
        brk = verify_chain(store, conn)
    assert brk is not None and brk.global_pos == 4


def test_deleted_event_breaks_the_chain_at_the_gap(any_db: Database, store: EventStore) -> None:
    with any_db.write() as uow:
        for i in range(4):
            store.append(uow, f"s{i}", 0, [NewEvent("e", {})], {})
    with any_db.write() as uow:
        uow.conn.exec_driver_sql("DELETE FROM events WHERE global_pos = 2")
    with any_db.read() as conn:
        brk = verify_chain(store, conn)
    assert brk is not None and brk.global_pos == 2


def test_upcasters_run_on_read_in_version_order(any_db: Database) -> None:
    any_db.create_schema(metadata)
    old = EventStore()
    with any_db.write() as uow:
        old.append(uow, "s", 0, [NewEvent("greeting", {"text": "hi"})], {})
    up = Upcasters()
    up.register("greeting", 1, lambda d: {**d, "lang": "en"})
    up.register("greeting", 2, lambda d: {"message": d["text"], "lang": d["lang"]})
    new = EventStore(up)
    with any_db.read() as conn:
        [ev] = new.read_stream(conn, "s")
    assert ev.schema_version == 1 and ev.data == {"message": "hi", "lang": "en"}
    with any_db.write() as uow:
        assert new.append(uow, "s", 1, [NewEvent("greeting", {"message": "yo", "lang": "de"})], {})[0] \
            .schema_version == 3
