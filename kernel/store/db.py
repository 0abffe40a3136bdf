"""One database handle for both backends, with explicit write transactions.

Writes are serialized on purpose: SQLite takes its single writer lock up front
(``BEGIN IMMEDIATE``), PostgreSQL takes a transaction-level advisory lock first.
Every check a command makes therefore sees the state its append will commit
against, and the global event position is assigned in commit order.
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from functools import lru_cache
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.dialects.sqlite.base import SQLiteCompiler
from sqlalchemy.engine import Connection, Engine

from taskkernel.kernel.private import FILE_MODE, narrow
from taskkernel.kernel.store import version
from taskkernel.kernel.store.chain import POSTGRES_FORMS, Appending, Chain, ChainKeyError, read_record

# Any constant works; it only has to be the same in every process sharing a database.
WRITER_LOCK_KEY = 0x7A5C_4B3E
MAX_IDLE_WRITERS = 4  # write connections kept open between transactions (writes are serialized anyway)


class _Process:
    """This process's id, kept current across ``os.fork``: ``os.getpid`` is a system call, two per write."""

    pid = os.getpid()


os.register_at_fork(after_in_child=lambda: setattr(_Process, "pid", os.getpid()))


class Durability(StrEnum):
    """How much an accepted write survives. Documented in docs/durability.md."""

    FULL = "full"  # fsync at every commit: survives kill -9, OS crash and power loss
    PROCESS = "process"  # survives kill -9 of any process, may lose the last commits on OS crash


@dataclass(slots=True)
class UnitOfWork:
    """One write transaction: a connection plus per-transaction caches.

    ``sql`` runs a prepared statement straight on the driver cursor. It exists for the
    few statements on the command hot path, where SQLAlchemy's per-execute overhead
    (~25 µs) would cost more than the write itself; everything else uses ``conn``.

    ``appending`` is the event chain as this transaction extends it (kernel/store/chain.py); when events were
    appended, ``Database.write`` seals the new chain head just before the commit: one statement per transaction.
    ``head_text`` is the chain head row as a statement of this transaction read it (``head_read``), so the first
    append does not read it again (the command kernel reads it with the command's receipt and task).
    """

    conn: Connection
    dialect: str
    chain: Chain = field(default_factory=lambda: Chain(None))
    cache: dict[str, Any] = field(default_factory=dict)
    appending: Appending | None = None
    head_read: bool = False
    head_text: str | None = None
    _cursor: Any = None
    _driver: Any = None  # the DBAPI connection, when the transaction already holds it

    def sql(self, statement: str, params: Sequence[Any] = ()) -> Any:
        """Execute ``statement`` written with ``?`` placeholders; returns the DBAPI cursor."""
        if self._cursor is None:
            driver = self._driver if self._driver is not None else self.conn.connection.driver_connection
            self._cursor = driver.cursor()  # type: ignore[union-attr]
        self._cursor.execute(statement if self.dialect == "sqlite" else _placeholders(statement, self.dialect), params)
        return self._cursor

    def sql_many(self, statement: str, rows: Sequence[Sequence[Any]]) -> None:
        if self._cursor is None:
            self._cursor = self.conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
        self._cursor.executemany(_placeholders(statement, self.dialect), rows)


@lru_cache(maxsize=512)
def _placeholders(statement: str, dialect: str) -> str:
    """A statement as PostgreSQL runs it: ``%s`` placeholders, and the chain head's writes with the commit's NOTIFY
    (chain.POSTGRES_FORMS: no extra round trip, and no work at all on SQLite)."""
    return POSTGRES_FORMS.get(statement, statement).replace("?", "%s") if dialect == "postgresql" else statement


class DatabaseCorrupt(Exception):
    """The SQLite file is damaged or is not a database at all (``taskkernel verify``: database_corrupt)."""


def is_corruption(exc: BaseException) -> bool:
    """SQLITE_CORRUPT* or SQLITE_NOTADB, raised directly or wrapped by SQLAlchemy."""
    name = getattr(getattr(exc, "orig", exc), "sqlite_errorname", "")
    return isinstance(name, str) and name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB"))


def integrity_summary(problems: Sequence[str], shown: int = 3) -> str:
    """Integrity findings on one line: how many, and the first ``shown`` (SQLite spreads one over several lines)."""
    return f"{len(problems)} finding(s): " + "; ".join(" ".join(p.split()) for p in problems[:shown])


class Database:
    """``chain_key``: the HMAC key of the event hash chain (kernel/store/chain.py), injected by the composition
    root that knows the workspace; None keeps the legacy unkeyed chain (test harnesses, a bare --db)."""

    def __init__(self, url: str, durability: Durability | str = Durability.FULL,
                 chain_key: bytes | None = None) -> None:
        self.url = url
        self.durability = Durability(durability)
        self.chain = Chain(chain_key)
        self.engine: Engine = _make_engine(url, self.durability)
        self.dialect: str = self.engine.dialect.name
        # Idle write connections, kept between transactions: checking one out of the pool and back for every
        # command costs more than the command's own statements. They follow the work, not the thread: a write
        # takes one and puts it back when it ends, so any number of short-lived or pooled threads share the
        # few that are ever in use at once (a connection per thread would pin one for each thread ever seen).
        self._idle: list[Connection] = []
        self._idle_lock = threading.Lock()
        self._idle_pid = _Process.pid
        self._indexes: dict[str, bool] = {}

    @classmethod
    def sqlite_file(cls, path: str | os.PathLike[str],
                    durability: Durability | str = Durability.FULL) -> Database:
        return cls(f"sqlite:///{Path(path).resolve()}", durability)

    @property
    def is_postgres(self) -> bool:
        return self.dialect == "postgresql"

    def write(self) -> _Write:
        """Exclusive write transaction (``with db.write() as uow``); commits on normal exit, rolls back on error. If
        events were appended, the chain head is sealed (under the same writer lock) as the last statement before
        the commit; on PostgreSQL that statement also NOTIFYs the commit (chain.POSTGRES_FORMS)."""
        return _Write(self)

    def _take_writer(self) -> Connection:
        """An idle write connection, or a new one from the pool (none is shared by two writes at once)."""
        with self._idle_lock:
            if self._idle_pid != _Process.pid:  # a forked child never uses its parent's connections
                self._idle, self._idle_pid = [], _Process.pid
            while self._idle:
                conn = self._idle.pop()
                if not (conn.closed or conn.invalidated):
                    return conn
        return self.engine.connect().execution_options(taskkernel_write=True)

    def _put_writer(self, conn: Connection, healthy: bool, driver: Any = None) -> None:
        """Back to the idle list (at most MAX_IDLE_WRITERS kept), or closed: back to the engine's pool. One still
        in a transaction (SQLAlchemy's or the driver's) is never kept: the next write would inherit it."""
        if healthy and not (conn.closed or conn.invalidated or conn.get_transaction() is not None
                            or getattr(conn.connection.driver_connection if driver is None else driver,
                                       "in_transaction", False)):
            with self._idle_lock:
                if self._idle_pid == _Process.pid and len(self._idle) < MAX_IDLE_WRITERS:
                    self._idle.append(conn)
                    return
        with contextlib.suppress(Exception):
            conn.close()

    def sqlite_index_exists(self, name: str) -> bool:
        """Whether this SQLite database holds the index ``name``; read once per handle (an index comes with `db
        upgrade`, and a reader opened before it keeps reading without it)."""
        if name not in self._indexes:
            with self.read() as conn:
                self._indexes[name] = conn.exec_driver_sql(
                    "SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = ?", (name,)).first() is not None
        return self._indexes[name]

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """A read transaction: one consistent snapshot (SQLite deferred BEGIN / PG statement snapshot)."""
        with self.engine.connect() as conn, conn.begin():
            yield conn

    @contextmanager
    def snapshot(self) -> Iterator[Connection]:
        """One read snapshot for several statements: SQLite's read transaction is one; PostgreSQL's default
        (READ COMMITTED) takes a snapshot per statement, so this runs REPEATABLE READ there. For checks that
        compare reads with each other (verify, the folder check): a command committed between two of them must
        not look like a disagreement."""
        if not self.is_postgres:
            with self.read() as conn:
                yield conn
            return
        with self.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="REPEATABLE READ")
            with conn.begin():
                yield conn

    def create_schema(self, *metadatas: sa.MetaData) -> None:
        """Create missing tables under the writer lock, so processes starting together never race on DDL
        (SQLite: ``database is locked`` on the read-to-write upgrade; PostgreSQL: duplicate catalog rows).

        Only where this code's table definitions are the schema (docs/migrations.md): in an empty database,
        which is then stamped at this code's revision (``version.HEAD``), or in one already stamped at it. A
        database at any other revision — older, an unstamped release 0.1.0 one, or one this code does not know —
        is never patched: ``KernelError`` schema_behind / schema_ahead, and ``taskkernel db upgrade`` moves it.
        Raises DatabaseCorrupt when the file is damaged or not a database."""
        wanted = {name for md in metadatas for name in md.tables}
        if self.is_postgres:
            from taskkernel.kernel.store.schema import postgresql_options

            postgresql_options()
        with self._corruption_raised():
            with self.read() as conn:
                if wanted <= set(sa.inspect(conn).get_table_names()):
                    return
            with self.write() as uow:
                found = version.inspect(uow.conn)
                if wanted <= found.tables:
                    return
                if not found.empty and (problem := version.mismatch(found)) is not None:
                    raise problem
                for md in metadatas:
                    md.create_all(uow.conn)
                if found.empty:
                    version.stamp(uow.conn, version.HEAD)

    def schema_version(self) -> version.Found:
        """The schema state of this database: its revision and tables (kernel/store/version.py)."""
        with self._corruption_raised(), self.read() as conn:
            return version.inspect(conn)

    def use_chain_key(self, load_key: Callable[[], bytes | None], create_key: Callable[[], bytes]) -> None:
        """Take the chain key from a workspace (composition roots only). Under the writer lock, so processes
        opening a workspace together agree on one key and one record. A keyed store gets the existing key
        (none: appends and verify say chain_key_missing). An unkeyed store is keyed from its next position
        when it holds no events, or when the workspace has no key yet (it predates keyed chains: the key is
        created now). An unkeyed store with events in a workspace that has a key is left as it is: its chain
        record was removed or the store replaced, and appends and verify say chain_unkeyed. A store keyed before
        sealed chain heads gets its head sealed where its log ends now (docs/events.md)."""
        key = load_key()
        with self._corruption_raised():
            if key is not None:
                self.chain = Chain(key)
                with self.read() as conn:
                    record = read_record(conn)
                    if record.keyed and (record.sealed_head or record.key_id != self.chain.key_id):
                        return
            with self.write() as uow:
                record = read_record(uow.conn)
                if record.keyed:
                    chain = self.chain = Chain(load_key())
                    if chain.key is not None and not record.sealed_head:
                        with contextlib.suppress(ChainKeyError):  # another key or an altered record: verify says so
                            chain.check(record)
                            chain.seal_existing(uow, record)
                    return
                head = uow.conn.exec_driver_sql("SELECT max(global_pos) FROM events").scalar() or 0
                key = load_key()
                if key is None:
                    key = create_key()
                elif head:
                    self.chain = Chain(key)
                    return
                chain = Chain(key)
                chain.bind_legacy(uow)
            self.chain = chain

    def integrity_problems(self, *, quick: bool = False) -> list[str]:
        """SQLite's ``PRAGMA integrity_check`` findings (empty: intact; PostgreSQL: always empty, the server keeps
        its own pages). ``quick``: ``PRAGMA quick_check`` instead, which skips the index-against-table comparison
        and costs a read of the file (the CLI runs it before a command writes: docs/cli.md, "Start-up integrity
        check"); ``verify`` runs the full check. Raises DatabaseCorrupt when the check itself cannot read the file."""
        if self.dialect != "sqlite":
            return []
        pragma = "PRAGMA quick_check" if quick else "PRAGMA integrity_check"
        with self._corruption_raised(), self.read() as conn:
            rows = [str(r[0]) for r in conn.exec_driver_sql(pragma)]
        return [] if rows == ["ok"] else rows

    @contextmanager
    def _corruption_raised(self) -> Iterator[None]:
        try:
            yield
        except sa.exc.DatabaseError as exc:
            if is_corruption(exc):
                raise DatabaseCorrupt(f"{self.url}: {exc.orig}") from exc
            raise

    def dispose(self) -> None:
        with self._idle_lock:
            writers, self._idle = self._idle, []
        for conn in writers:
            with contextlib.suppress(Exception):
                conn.close()
        self.engine.dispose()


def _make_engine(url: str, durability: Durability) -> Engine:
    if url.startswith("sqlite"):
        return _sqlite_engine(url, durability)
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://") :]
    return sa.create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=10)


def _private_sqlite_file(url: str) -> None:
    """Create the database file 0600 before SQLite does (it would use 0644); its -wal and -shm files copy
    the database file's mode. Files left wider by older versions are narrowed."""
    path = sa.engine.make_url(url).database
    if not path or path == ":memory:" or path.startswith("file:"):
        return
    with contextlib.suppress(FileExistsError, FileNotFoundError):  # no directory: SQLite reports it
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE))
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(PermissionError):  # another user's file: leave it to its owner
            narrow(Path(path + suffix))


class _SQLiteCompiler(SQLiteCompiler):
    """SQLite's compiler, rendering a table hint (``Select.with_hint(table, "INDEXED BY ix", "sqlite")``) after the
    table, which SQLAlchemy's leaves out: without statistics SQLite's planner may rank a partial index no better
    than a full one, so a query names the index it is written for (and SQLite refuses it if it cannot serve)."""

    def get_from_hint_text(self, table: Any, text: str | None) -> str | None:
        return text


def _sqlite_engine(url: str, durability: Durability) -> Engine:
    _private_sqlite_file(url)
    engine = sa.create_engine(url, connect_args={"timeout": 60, "check_same_thread": False})
    engine.dialect.statement_compiler = _SQLiteCompiler
    synchronous = "FULL" if durability is Durability.FULL else "NORMAL"

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let us emit BEGIN ourselves: pysqlite's implicit transactions cannot take the write lock up front.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA busy_timeout=60000")
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA synchronous={synchronous}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        driver: Any = conn.connection.driver_connection
        if driver.in_transaction:  # a Database.write transaction, begun on the driver: SQLAlchemy's joins it
            return
        _on_driver(driver.execute, "BEGIN IMMEDIATE" if conn.get_execution_options().get("taskkernel_write")
                   else "BEGIN")

    return engine


class _Write:
    """One ``Database.write``, as a class: two generator context managers cost more than a command's statements.

    SQLite: BEGIN IMMEDIATE ... COMMIT on the driver connection, since SQLAlchemy's transaction machinery (~10 µs)
    costs more than a command's statements too. A Core statement run meanwhile makes SQLAlchemy open its
    transaction object over this one (the begin hook issues no second BEGIN); the end then goes through SQLAlchemy.
    PostgreSQL: the writer lock is a transaction-level advisory lock, taken first. Any error rolls back, and the
    connection goes back to the idle list only if it is healthy and out of every transaction."""

    __slots__ = ("db", "conn", "driver", "pg", "uow")

    def __init__(self, db: Database) -> None:
        self.db = db
        self.driver: Any = None  # SQLite's DBAPI connection
        self.pg: Any = None  # PostgreSQL's SQLAlchemy transaction, until it ends

    def __enter__(self) -> UnitOfWork:
        db = self.db
        conn = self.conn = db._take_writer()  # never the one of a write in progress: a nested write gets another
        try:
            if db.is_postgres:
                pg = conn.begin()
                pg.__enter__()
                self.pg = pg
                conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({WRITER_LOCK_KEY})")
                if db.durability is Durability.PROCESS:
                    conn.exec_driver_sql("SET LOCAL synchronous_commit = off")
            else:
                driver: Any = conn.connection.driver_connection
                self.driver = driver
                _on_driver(driver.execute, "BEGIN IMMEDIATE")
            # the UnitOfWork opens its cursor on the driver (PostgreSQL: it finds the driver connection itself)
            uow = self.uow = UnitOfWork(conn, db.dialect, db.chain, _driver=self.driver)
            return uow
        except BaseException as exc:  # an interrupt while BEGIN waits for the lock may arrive once it is taken
            self._abandon(exc)
            raise

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if exc is None:
            try:
                uow = self.uow
                if uow.appending is not None and uow.appending.moved:
                    uow.chain.seal_head(uow, uow.appending)
                self._commit()
            except BaseException as failed:
                self._abandon(failed)
                raise
            self.db._put_writer(self.conn, True, self.driver)
        else:
            self._abandon(exc)  # and the block's exception propagates

    def _commit(self) -> None:
        conn, pg, self.pg = self.conn, self.pg, None  # a PostgreSQL commit that fails has rolled back already
        if pg is not None:
            pg.__exit__(None, None, None)
        elif conn.in_transaction():
            conn.commit()
        else:
            driver = self.driver
            _on_driver(lambda _: driver.commit(), "COMMIT")

    def _abandon(self, exc: BaseException) -> None:
        """Roll back, then give the connection back (closed when the error, or the rollback's own, invalidated
        it)."""
        try:
            self._rollback(exc)
        except BaseException as other:
            self._release(other)
            raise
        self._release(exc)

    def _rollback(self, exc: BaseException) -> None:
        conn, pg, self.pg = self.conn, self.pg, None
        if pg is not None:
            try:
                pg.__exit__(type(exc), exc, exc.__traceback__)  # as ``with conn.begin()`` ends on an error
            except Exception:
                conn.invalidate()  # one that cannot roll back is never handed to another write
            return
        driver = self.driver
        if driver is None:  # PostgreSQL, whose transaction has ended (or never began)
            return
        try:
            # SQLAlchemy keeps a transaction whose COMMIT failed (inactive, not "in transaction"): roll it back, or
            # every later Core statement on this connection fails with PendingRollbackError
            if conn.get_transaction() is not None:
                conn.rollback()
            if driver.in_transaction:  # a failed COMMIT may leave SQLite's open
                _on_driver(lambda _: driver.rollback(), "ROLLBACK")
        except Exception:
            conn.invalidate()  # one that cannot roll back is never handed to another write

    def _release(self, exc: BaseException) -> None:
        conn = self.conn
        healthy = not (isinstance(exc, sa.exc.DBAPIError) and (exc.connection_invalidated or conn.invalidated))
        self.db._put_writer(conn, healthy, self.driver)


def _on_driver(call: Callable[[str], Any], statement: str) -> None:
    """``call(statement)`` on the driver, its errors raised as SQLAlchemy raises them (e.g. OperationalError:
    database is locked), so callers and the CLI's fault codes see one kind of database error."""
    try:
        call(statement)
    except sqlite3.Error as exc:
        raise sa.exc.DBAPIError.instance(statement, (), exc, sqlite3.Error) from exc


_SAFE_SCHEMA = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def with_pg_schema(url: str, schema: str) -> str:
    """Point a PostgreSQL URL at one schema (used to isolate tests and workspaces)."""
    if not _SAFE_SCHEMA.match(schema):
        raise ValueError(f"unsafe schema name {schema!r}")
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options=-csearch_path%3D{schema}"
