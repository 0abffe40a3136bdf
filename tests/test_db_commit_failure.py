"""A write whose COMMIT fails is rolled back, raised, and leaves no connection that breaks the next write.

SQLite's deferred foreign keys make COMMIT itself fail (what a full disk or an I/O error does at the same point).
Before the fix, a write that had run a Core statement left SQLAlchemy's failed transaction on its connection, and
every later Core write on it failed with PendingRollbackError until the process restarted."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import sqlalchemy as sa

from taskkernel.kernel.store.db import Database


@pytest.fixture
def db(tmp_path: Path) -> Database:
    db = Database(f"sqlite:///{tmp_path / 'commit.db'}")
    with db.engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE p (id INTEGER PRIMARY KEY)")
        conn.exec_driver_sql("CREATE TABLE ch (id INTEGER PRIMARY KEY, "
                             "pid INTEGER REFERENCES p(id) DEFERRABLE INITIALLY DEFERRED)")
    return db


def rows(db: Database) -> int:
    with db.read() as conn:
        return int(conn.exec_driver_sql("SELECT count(*) FROM ch").scalar_one())


@pytest.mark.parametrize("core", [False, True], ids=["driver", "core"])
def test_a_failed_commit_is_raised_rolled_back_and_the_next_writes_succeed(db: Database, core: bool) -> None:
    with pytest.raises(sa.exc.IntegrityError), db.write() as uow:
        if core:
            uow.conn.exec_driver_sql("INSERT INTO ch (id, pid) VALUES (1, 99)")
        else:
            uow.sql("INSERT INTO ch (id, pid) VALUES (1, 99)")
    assert rows(db) == 0
    for n in (1, 2, 3):  # the idle list hands back the same connection first: each of these would have failed
        with db.write() as uow:
            uow.conn.exec_driver_sql(f"INSERT INTO p (id) VALUES ({n})")
            uow.sql("INSERT INTO ch (id, pid) VALUES (?, ?)", (10 + n, n))
    assert rows(db) == 3


def test_an_interrupted_write_releases_the_write_lock(db: Database) -> None:
    with pytest.raises(KeyboardInterrupt), db.write() as uow:
        uow.conn.exec_driver_sql("INSERT INTO p (id) VALUES (50)")
        raise KeyboardInterrupt
    other = Database(db.engine.url.render_as_string(hide_password=False))
    with other.write() as uow:  # would wait out the busy timeout if the lock were still held
        uow.sql("INSERT INTO p (id) VALUES (51)")
    with db.read() as conn:
        assert conn.exec_driver_sql("SELECT id FROM p").scalars().all() == [51]


def test_an_interrupt_once_begin_took_the_lock_releases_it(db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ctrl-C landing after BEGIN IMMEDIATE but before the block runs (the write's UnitOfWork being made) rolls
    back at once: no `__exit__` will, and a lock kept until the garbage collector ran would stall every writer."""
    from taskkernel.kernel.store import db as db_module

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    with db.write() as earlier:  # its connection goes back idle and serves the next write; `earlier` keeps it alive
        earlier.sql("INSERT INTO p (id) VALUES (1)")
    monkeypatch.setattr(db_module, "UnitOfWork", interrupted)
    with pytest.raises(KeyboardInterrupt), db.write():
        pass
    monkeypatch.undo()
    other = sqlite3.connect(str(db.engine.url.database), isolation_level=None, timeout=0)  # fails at once if held
    try:
        other.execute("BEGIN IMMEDIATE")
        other.execute("ROLLBACK")
    finally:
        other.close()
