"""The database schema as one versioned whole: every component's tables, the migrations between revisions, and
what a process does with a database on open (docs/migrations.md).

- ``status(db)``: ``(current, head)``, with ``behind`` / ``ahead``; reads only.
- ``ensure(db)``: what every CLI process does on open. An empty database is created at head (``create_all`` of
  every component's tables, then stamped: the same schema the migrations build, which tests/test_migrations.py
  proves). A database made by release 0.1.0 (our tables, no version table) is adopted as the baseline: the
  baseline migration stamps it and adds what that release created on first use (a table it never needed yet),
  nothing newer. A database behind head is otherwise left as it is: ``up`` and ``submit`` refuse it
  (``require_current``) until ``taskkernel db upgrade``.
- ``upgrade(db)``: run the migrations to head, all in one write transaction under the writer lock, so processes
  doing it together upgrade once and a failed migration leaves the database as it was.

Alembic is imported only to run migrations, and the table modules only to create a database: opening one at
head costs one catalog query and one read of its revision (kernel/store/version.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import sqlalchemy as sa

from taskkernel.kernel.store import version

if TYPE_CHECKING:
    from alembic.config import Config
    from sqlalchemy.engine import Connection

    from taskkernel.kernel.reasons import KernelError
    from taskkernel.kernel.store.db import Database

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
HEAD = version.HEAD


def metadatas() -> tuple[sa.MetaData, ...]:
    """One MetaData per component, each defined in one module. Imported when needed: opening a database at head
    must not load the scheduler or the session log for a command that uses neither."""
    from taskkernel.coordinator import tables as coordinator_tables
    from taskkernel.kernel.sessionlog import tables as sessionlog_tables
    from taskkernel.kernel.store import schema as core_tables
    from taskkernel.scheduler import tables as scheduler_tables

    return (core_tables.metadata, sessionlog_tables.metadata, scheduler_tables.metadata, coordinator_tables.metadata,
            coordinator_tables.worktree_metadata, coordinator_tables.alias_metadata,
            coordinator_tables.loop_metadata, coordinator_tables.sign_in_metadata,
            coordinator_tables.host_metadata)


class Status(NamedTuple):
    """``current``: the database's revision (the baseline for a release 0.1.0 database not stamped yet; None for
    an empty one); ``head``: this code's."""

    current: str | None
    head: str

    @property
    def behind(self) -> bool:
        return self.current in version.REVISIONS and self.current != self.head

    @property
    def ahead(self) -> bool:
        """At a revision this code does not know: a newer release upgraded the database."""
        return self.current is not None and self.current not in version.REVISIONS

    def wire(self) -> dict[str, object]:
        return {"current": self.current, "head": self.head, "behind": self.behind, "ahead": self.ahead}


def _status(found: version.Found) -> Status:
    return Status(found.revision, HEAD)


def status(db: Database) -> Status:
    return _status(db.schema_version())


def ensure(db: Database) -> Status:
    """Make a database usable on open, never moving it past the revision it is at (see the module docstring).
    Serialized under the writer lock: processes opening one database together create or adopt it once."""
    from taskkernel.kernel.store.schema import metadata as core

    found = db.schema_version()
    if found.empty:
        db.create_schema(*metadatas())  # every component's tables, stamped at head
    elif found.current and not set(core.tables) <= found.tables:
        db.create_schema(core)  # a tool made it table by table; the other components make theirs on first use
    elif not found.stamped and found.known:
        upgrade(db, version.BASELINE)  # release 0.1.0: adopted as the baseline, stamped, nothing newer
    return status(db)


def require_current(db: Database) -> None:
    """Refuse (``KernelError`` schema_behind / schema_ahead, naming ``taskkernel db upgrade``) a database that is
    not at this code's revision. For the commands that must not run on an older schema: ``up``, ``submit``."""
    found = db.schema_version()
    if not found.current:
        raise _refusal(found)


def upgrade(db: Database, target: str = HEAD) -> tuple[Status, Status]:
    """Run the migrations from the database's revision to ``target`` (an empty database: from nothing; an
    unstamped release 0.1.0 one: from the baseline, which adopts it); a database already there or past it is
    left as it is. Returns (before, after). A database at a revision this code does not know is refused
    (schema_ahead) and left as it is."""
    if target not in version.REVISIONS:
        raise ValueError(f"no revision {target!r} (known: {', '.join(version.REVISIONS)})")
    with db.write() as uow:
        before = version.inspect(uow.conn)
        if not before.known:
            raise _refusal(before)
        if not (before.stamped and version.REVISIONS.index(str(before.revision)) >= version.REVISIONS.index(target)):
            from alembic import command

            command.upgrade(alembic_config(uow.conn), target)
        after = version.inspect(uow.conn)
    return _status(before), _status(after)


def _refusal(found: version.Found) -> KernelError:
    problem = version.mismatch(found)
    assert problem is not None
    return problem


def alembic_config(connection: Connection | None = None) -> Config:
    """Alembic's configuration, built in code (no alembic.ini): the scripts shipped in this package, and the
    connection to run them on (inside the caller's transaction; coordinator/migrations/env.py uses it)."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("path_separator", "os")
    config.set_main_option("file_template", "%%(rev)s")  # a revision's file is named by its id: 0003_what.py
    config.attributes["connection"] = connection
    return config


def target_metadata(dialect: str | None = None) -> sa.MetaData:
    """Every table of every component in one MetaData: what the migrations must build (autogenerate's target,
    and what tests/test_migrations.py compares a migrated database with). For ``dialect``, without the indexes
    only another backend builds (``ONE_DIALECT_INDEXES``)."""
    from taskkernel.kernel.store.schema import ONE_DIALECT_INDEXES, postgresql_options

    postgresql_options()
    combined = sa.MetaData()
    for md in metadatas():
        for table in md.sorted_tables:
            copy = table.to_metadata(combined)
            for index in list(copy.indexes):
                if dialect is not None and ONE_DIALECT_INDEXES.get(str(index.name), dialect) != dialect:
                    copy.indexes.discard(index)
    return combined
