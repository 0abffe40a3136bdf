"""Which revision of the schema a database holds, and which one this code's tables describe (docs/migrations.md).

A database records its revision in Alembic's version table. The migrations that move it from one revision to
the next live with the application (``taskkernel.coordinator.migrations``), the one layer that sees every
component's tables. The core keeps only what ``Database.create_schema`` needs to create tables on open without
ever patching a database another release shaped: the revisions in order (the last is the one the table modules
describe), how to read a database's revision, and how to stamp a database it created.

A database made by release 0.1.0, before revisions were recorded, has the core's tables but no version table: it
is read as the baseline revision, unstamped (``Found.stamped`` is False), until ``taskkernel db upgrade`` (or the
CLI opening it) stamps it.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from taskkernel.kernel.reasons import KernelError, ReasonCode

# Oldest first. A new migration in coordinator/migrations/versions/ is appended here in the same change
# (tests/test_migrations.py checks that both say the same).
REVISIONS: tuple[str, ...] = ("0001_baseline", "0002_tasks_by_state", "0003_run_outcomes", "0004_blocked_documents",
                              "0005_task_worktrees", "0006_outbox_dead_letters",
                              "0007_task_aliases", "0008_people_in_the_loop", "0009_blocked_index",
                              "0010_sign_ins", "0011_hosts")
BASELINE = REVISIONS[0]
HEAD = REVISIONS[-1]

VERSION_TABLE = "alembic_version"
# Alembic's own definition of its version table, so a database this code creates is stamped exactly as
# `alembic stamp` would (tests/test_migrations.py compares the two).
version_table = sa.Table(
    VERSION_TABLE,
    sa.MetaData(),
    sa.Column("version_num", sa.String(32), nullable=False),
    sa.PrimaryKeyConstraint("version_num", name="alembic_version_pkc"),
)

# Every database release 0.1.0 made holds this table: its CLI created the core's tables first, on every open.
RELEASE_0_1_MARK = "events"

UPGRADE_COMMAND = "taskkernel db upgrade"


@dataclass(frozen=True)
class Found:
    """What a database says about its schema. ``revision``: its stamp, BASELINE for an unstamped database made
    by release 0.1.0, None for one with neither (empty, or holding only tables that are not ours).
    ``tables``: the names of the tables it holds."""

    revision: str | None
    stamped: bool
    tables: frozenset[str]

    @property
    def empty(self) -> bool:
        return self.revision is None

    @property
    def known(self) -> bool:
        return self.revision is None or self.revision in REVISIONS

    @property
    def current(self) -> bool:
        """At the revision this code describes, and stamped so."""
        return self.stamped and self.revision == HEAD


def inspect(conn: Connection) -> Found:
    """Read the schema state of the database ``conn`` is connected to (its default schema on PostgreSQL)."""
    tables = frozenset(sa.inspect(conn).get_table_names())
    rows = conn.execute(sa.select(version_table.c.version_num)).scalars().all() if VERSION_TABLE in tables else []
    if len(rows) == 1:
        return Found(rows[0], True, tables)
    if rows:  # Alembic keeps one row on a linear history; several are heads of branches this code never made
        return Found("+".join(sorted(rows)), True, tables)
    # No stamp (an empty version table is what a downgrade to nothing leaves): release 0.1.0's, or empty
    return Found(BASELINE if RELEASE_0_1_MARK in tables else None, False, tables)


def stamp(conn: Connection, revision: str) -> None:
    """Record ``revision`` as the database's (creating the version table if missing), as `alembic stamp` does."""
    version_table.create(conn, checkfirst=True)
    conn.execute(version_table.delete())
    conn.execute(version_table.insert().values(version_num=revision))


def mismatch(found: Found) -> KernelError | None:
    """Why this code must not use the database as it is, or None when it is at this code's revision."""
    if found.current:
        return None
    if not found.known:
        return KernelError(ReasonCode.SCHEMA_AHEAD,
                           f"the database schema is at revision {found.revision}, which this taskkernel does not "
                           f"know (its newest is {HEAD}): a newer release upgraded it; use that release")
    if found.empty:
        return KernelError(ReasonCode.SCHEMA_BEHIND,
                           f"the database holds no taskkernel schema yet; run `{UPGRADE_COMMAND}` (or "
                           "`taskkernel init`) to create it")
    was = found.revision if found.stamped else f"{found.revision} (release 0.1.0, not yet stamped)"
    return KernelError(ReasonCode.SCHEMA_BEHIND,
                       f"the database schema is at revision {was}, behind this taskkernel's {HEAD}; run "
                       f"`{UPGRADE_COMMAND}` (as the workspace owner), then try again; nothing was changed")
