"""`task show`'s document, one definition for the CLI and the board: the kernel's task document with what the
coordinator adds to it — the other ids the task answers to (``aliases``, when it has some: a migrated task's FCoP 4
file id) and ``inputs_pending``, the instructions its agent has not read (it is not submitted for review until it
has: docs/people-in-the-loop.md)."""

from __future__ import annotations

from typing import Any

from taskkernel.coordinator.fcop4.aliases import aliases_of
from taskkernel.kernel.instructions import pending_for_task
from taskkernel.kernel.queries import task_show_document
from taskkernel.kernel.store.db import Database


def task_show(db: Database, task_id: str) -> dict[str, Any] | None:
    """The document of ``task_id`` (the kernel's id), or None: no such task."""
    doc = task_show_document(db, task_id)
    if doc is None:
        return None
    if aliases := aliases_of(db, task_id):
        doc["aliases"] = aliases
    doc["inputs_pending"] = pending_for_task(db, doc)
    return doc
