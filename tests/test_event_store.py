"""Event store: optimistic concurrency, commit-ordered positions, hash chain and its sealed head, upcasting."""

from __future__ import annotations

import os

import pytest
import sqlalchemy as sa

from taskkernel.kernel.reasons import ConcurrencyError
from taskkernel.kernel.store.chain import KEYED, ChainKey, ChainRecord, read_head, read_record
from taskkernel.kernel.store.db import Database
from taskkernel.kernel.store.events import EventStore, NewEvent, Upcasters, log_end, verify_chain
from taskkernel.kernel.store.schema import metadata


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


def test_the_head_is_sealed_once_per_transaction_where_the_log_ends(sqlite_url: str) -> None:
    """Many appends in one write transaction (a group commit) read the head once and write it once."""
    db = Database(sqlite_url, chain_key=os.urandom(32))
    db.create_schema(metadata)
    store = EventStore()
    for version in range(2):  # keys the store, then reads the record back once (cached from then on)
        with db.write() as uow:
            store.append(uow, "s0", version, [NewEvent("e", {})], {})
    seen: list[str] = []
    with db.write() as uow:
        uow.conn.connection.driver_connection.set_trace_callback(seen.append)  # type: ignore[union-attr]
        for i in range(1, 4):
            store.append(uow, f"s{i}", 0, [NewEvent("e", {}), NewEvent("f", {})], {})
    head_statements = [s for s in seen if "store_meta" in s]
    assert len(head_statements) == 2, head_statements  # one read, one UPDATE before the commit
    assert head_statements[1].startswith("UPDATE store_meta")
    with db.read() as conn:
        head = read_head(conn)
        assert head is not None and head.pos == 8 and head.hash == log_end(conn)[1]
        assert verify_chain(store, conn, db.chain) is None
    db.dispose()


def test_a_lost_tail_breaks_the_chain_where_the_log_now_ends(any_db: Database, store: EventStore) -> None:
    """Also on a legacy (unkeyed) store: its head is a plain digest, so only an accident is caught there."""
    for i in range(4):
        with any_db.write() as uow:
            store.append(uow, "s", i, [NewEvent("e", {"i": i})], {})
    with any_db.write() as uow:
        uow.conn.exec_driver_sql("DELETE FROM events WHERE global_pos >= 3")
    with any_db.read() as conn:
        brk = verify_chain(store, conn)
    assert brk is not None and (brk.global_pos, brk.reason) == (3, "hash_chain")
    # the next append continues after the sealed head, so the loss stays visible as a gap
    with any_db.write() as uow:
        assert store.append_at_head(uow, "t", [NewEvent("e", {})], {})[0].global_pos == 5
    with any_db.read() as conn:
        brk = verify_chain(store, conn)
    assert brk is not None and brk.global_pos == 3


def test_a_rolled_back_append_leaves_the_head_alone(any_db: Database, store: EventStore) -> None:
    with any_db.write() as uow:
        store.append(uow, "s", 0, [NewEvent("e", {})], {})
    with pytest.raises(RuntimeError), any_db.write() as uow:
        store.append(uow, "s", 1, [NewEvent("e", {})], {})
        raise RuntimeError("crash before commit")
    with any_db.read() as conn:
        head = read_head(conn)
        assert head is not None and head.pos == 1 and verify_chain(store, conn) is None


def test_a_store_keyed_before_sealed_heads_is_sealed_where_it_ends(any_url: str) -> None:
    """A chain record of the previous format (no sealed head) is upgraded by the next write: the head is sealed
    at the log's current end, and from then on a missing head is a break."""
    key = os.urandom(32)
    db = Database(any_url, chain_key=key)
    db.create_schema(metadata)
    store = EventStore()
    for i in range(3):
        with db.write() as uow:
            store.append(uow, "s", i, [NewEvent("e", {"i": i})], {})
    old = ChainRecord(KEYED, ChainKey(key).key_id, 1, ChainKey(key).seal(1, sealed_head=False))
    with db.write() as uow:  # what the previous version left behind
        uow.conn.exec_driver_sql("DELETE FROM store_meta WHERE name = 'head'")
        uow.conn.execute(sa.text("UPDATE store_meta SET value = :v WHERE name = 'chain'"), {"v": old.encode()})
    fresh = Database(any_url, chain_key=key)
    with fresh.read() as conn:
        assert verify_chain(store, conn, fresh.chain) is None  # nothing sealed yet: nothing to check
    with fresh.write() as uow:
        store.append(uow, "s", 3, [NewEvent("e", {"i": 3})], {})
    with fresh.read() as conn:
        assert read_record(conn).sealed_head and verify_chain(store, conn, fresh.chain) is None
    with fresh.write() as uow:
        uow.conn.exec_driver_sql("DELETE FROM store_meta WHERE name = 'head'")
    with fresh.read() as conn:
        brk = verify_chain(store, conn, fresh.chain)
    assert brk is not None and (brk.global_pos, brk.reason) == (5, "hash_chain")
    # nor can the record be put back to the old format to hide the head: its seal says otherwise
    with fresh.write() as uow:
        uow.conn.execute(sa.text("UPDATE store_meta SET value = :v WHERE name = 'chain'"),
                         {"v": ChainRecord(KEYED, old.key_id, 1, read_seal(uow.conn)).encode()})
    with fresh.read() as conn:
        brk = verify_chain(store, conn, fresh.chain)
    assert brk is not None and brk.reason == "hash_chain"
    fresh.dispose()
    db.dispose()


def read_seal(conn: sa.engine.Connection) -> str:
    return read_record(conn).seal
