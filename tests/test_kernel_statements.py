"""What one command costs the database, counted (issue 29): the statements it runs, and that the chain head is
still checked whenever it is not the row this process wrote."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import sqlalchemy as sa

from taskkernel.kernel.model.principal import LOCAL_OWNER
from taskkernel.kernel.store.chain import ChainHead, ChainKey, ChainKeyError, legacy_head_seal
from taskkernel.kernel.store.db import Database
from taskkernel.kernel.store.schema import metadata
from tests.kernel_harness import DEV, Harness


@contextmanager
def traced(db: Database) -> Iterator[list[str]]:
    """Every statement the kernel's write connection runs meanwhile (SQLite)."""
    seen: list[str] = []
    with db.write() as uow:  # the idle writer the next command takes
        driver = uow.conn.connection.driver_connection
    driver.set_trace_callback(seen.append)  # type: ignore[union-attr]
    try:
        yield seen
    finally:
        driver.set_trace_callback(None)  # type: ignore[union-attr]


def keyed(sqlite_url: str) -> Harness:
    h = Harness(Database(sqlite_url, chain_key=os.urandom(32)))
    h.kernel.effect_rules = []  # the outbox row is its own statement; counted where effects are
    return h


def test_a_command_reads_its_receipt_task_and_chain_head_in_one_statement(sqlite_url: str) -> None:
    h = keyed(sqlite_url)
    task_id = h.create(recipient="DEV").task_id  # keys the store; the next write reads the chain record once
    h.create(recipient="DEV")
    assert task_id is not None
    with traced(h.db) as seen:
        assert h.cmd("claim", task_id, DEV).status == "accepted"
    expected = ("BEGIN IMMEDIATE", "SELECT r.semantic_digest", "INSERT INTO events", "UPDATE tasks",
                "INSERT INTO receipts", "UPDATE store_meta", "COMMIT")
    assert len(seen) == len(expected) and all(s.startswith(e) for s, e in zip(seen, expected, strict=True)), seen
    assert "store_meta" in seen[1]  # the chain head, read with the receipt and the task: no statement of its own
    h.db.dispose()


def test_every_command_of_a_lifecycle_stays_within_its_statements(sqlite_url: str) -> None:
    """create: + the day's counter and the allocated id's check; archive: + the open children's check."""
    h = keyed(sqlite_url)
    h.create(recipient="DEV")
    h.create(recipient="DEV")
    with traced(h.db) as seen:
        task_id = h.create(recipient="DEV").task_id
        assert task_id is not None
        counts = [len(seen)]
        for kind, who, payload in (("claim", DEV, None), ("submit_report", DEV, {"status": "done", "body": "x"}),
                                   ("submit", DEV, None), ("approve", LOCAL_OWNER, None),
                                   ("archive", LOCAL_OWNER, {"reason": "finished"})):
            before = len(seen)
            assert h.cmd(kind, task_id, who, payload=payload).status == "accepted"
            counts.append(len(seen) - before)
            # the (state, task_id) index is rewritten only when the state moves (a report leaves it)
            moved = next(s for s in seen[before:] if s.startswith("UPDATE tasks")).startswith("UPDATE tasks SET state")
            assert moved == (kind != "submit_report"), seen[before:]
    assert counts == [9, 7, 7, 7, 7, 8], counts
    h.db.dispose()


def test_a_head_rewritten_after_this_process_sealed_it_is_still_refused(sqlite_url: str) -> None:
    """The head this Database wrote is trusted without a second HMAC; any other text is checked in full."""
    h = keyed(sqlite_url)
    task_id = h.create(recipient="DEV").task_id
    assert task_id is not None
    engine = sa.create_engine(sqlite_url)
    with engine.connect() as conn:
        head = ChainHead.decode(conn.exec_driver_sql("SELECT value FROM store_meta WHERE name = 'head'").scalar())
    assert head is not None
    for seal in (legacy_head_seal, ChainKey(os.urandom(32)).head_seal):  # what an attacker without the key can do
        forged = ChainHead(head.pos, head.hash, seal(head.pos, head.hash)).encode()
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE store_meta SET value = :v WHERE name = 'head'"), {"v": forged})
        with pytest.raises(ChainKeyError) as refused:
            h.cmd("claim", task_id, DEV)
        assert refused.value.reason == "hash_chain"
    with engine.begin() as conn:  # the genuine head back: appends go on
        conn.execute(sa.text("UPDATE store_meta SET value = :v WHERE name = 'head'"), {"v": head.encode()})
    assert h.cmd("claim", task_id, DEV).status == "accepted"
    engine.dispose()
    h.db.dispose()


def test_a_write_on_the_driver_commits_rolls_back_and_lets_core_statements_join(sqlite_url: str) -> None:
    """Database.write begins and ends SQLite's transaction on the driver; a Core statement inside it joins it."""
    db = Database(sqlite_url)
    db.create_schema(metadata)
    insert = "INSERT INTO counters (name, value) VALUES (?, 1)"
    for core in (False, True):
        with pytest.raises(RuntimeError), db.write() as uow:
            uow.sql(insert, (f"lost-{core}",))
            if core:
                uow.conn.execute(sa.text("INSERT INTO counters (name, value) VALUES ('lost-core', 1)"))
            raise RuntimeError
    with db.write() as uow:
        uow.conn.execute(sa.text("INSERT INTO counters (name, value) VALUES ('kept-core', 1)"))
        uow.sql(insert, ("kept-with-core",))
    with db.write() as uow:
        uow.sql(insert, ("kept",))
    with db.read() as conn:
        assert {r[0] for r in conn.exec_driver_sql("SELECT name FROM counters")} == {"kept-core", "kept-with-core",
                                                                                  "kept"}
    db.dispose()


def test_a_busy_database_is_the_error_sqlalchemy_raises(sqlite_url: str) -> None:
    """BEGIN IMMEDIATE on the driver still fails as sqlalchemy's OperationalError (the CLI's fault codes)."""
    db = Database(sqlite_url)
    db.create_schema(metadata)
    with db.write() as uow:  # the idle writer the next write takes, told to give up waiting quickly
        uow.conn.connection.driver_connection.execute("PRAGMA busy_timeout=50")  # type: ignore[union-attr]
    holder = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    with pytest.raises(sa.exc.OperationalError, match="locked"), db.write():
        pass
    holder.execute("ROLLBACK")
    holder.close()
    with db.write() as uow:
        uow.sql("INSERT INTO counters (name, value) VALUES ('after', 1)")
    db.dispose()
