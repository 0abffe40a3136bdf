"""Other ids a task is known by (``task_aliases``): a migrated task's FCoP 4 file id and the kernel's own id."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa

from taskkernel.coordinator.tables import alias_metadata, task_aliases
from taskkernel.kernel.canonical import utc_now_iso
from taskkernel.kernel.store.db import Database

MIGRATED = "fcop4-migrate"


class Aliases:
    """Both directions, read once per process and after each change (a migration runs with `up` stopped)."""

    def __init__(self, db: Database) -> None:
        db.create_schema(alias_metadata)
        with db.read() as conn:
            rows = conn.execute(sa.select(task_aliases.c.alias, task_aliases.c.task_id)).all()
        self.to_kernel = {alias: task_id for alias, task_id in rows}
        self.to_file = {task_id: alias for alias, task_id in rows}

    def kernel_id(self, file_id: str) -> str:
        return self.to_kernel.get(file_id, file_id)

    def file_id(self, task_id: str) -> str:
        return self.to_file.get(task_id, task_id)


def add_aliases(conn: sa.Connection, pairs: Iterable[tuple[str, str]], source: str = MIGRATED) -> None:
    """(alias, task id) rows, inside the caller's transaction."""
    now = utc_now_iso()
    rows = [{"alias": a, "task_id": t, "source": source, "created_at": now} for a, t in pairs]
    if rows:
        conn.execute(task_aliases.insert(), rows)


def _read(db: Database, query: sa.Select[Any]) -> list[Any]:
    """Rows of a read that also works on a database from before the table (a read never patches a schema)."""
    try:
        with db.read() as conn:
            return list(conn.execute(query).scalars())
    except (sa.exc.OperationalError, sa.exc.ProgrammingError):
        with db.read() as conn:
            if sa.inspect(conn).has_table(task_aliases.name):
                raise
        return []


def resolve_task_id(db: Database, task_id: str) -> str:
    """The kernel's id for ``task_id`` (itself unless it is an alias)."""
    found = _read(db, sa.select(task_aliases.c.task_id).where(task_aliases.c.alias == task_id))
    return str(found[0]) if found else task_id


def aliases_of(db: Database, task_id: str) -> list[str]:
    """Every other id ``task_id`` is known by (oldest first)."""
    return [str(a) for a in _read(db, sa.select(task_aliases.c.alias).where(task_aliases.c.task_id == task_id)
                                  .order_by(task_aliases.c.created_at, task_aliases.c.alias))]
