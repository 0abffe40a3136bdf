"""Read models rebuilt from events, and the comparison `taskkernel verify` makes against the stored ones."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from taskkernel.kernel.canonical import canonical_json
from taskkernel.kernel.model.task import apply
from taskkernel.kernel.store.events import EventStore
from taskkernel.kernel.store.schema import tasks

TASK_PREFIX = "task:"


PROJECTION_DRIFT = "projection_drift"
# The stored task is ahead of its events (a higher revision or a later position than the log holds, or no events
# at all): the log may have lost events, so rebuilding from it would launder the loss. --repair refuses.
PROJECTION_AHEAD = "projection_ahead"


@dataclass(frozen=True)
class Drift:
    task_id: str
    position: int  # the task's last event position (where the projection should be; ahead: where it is)
    detail: str
    reason: str = PROJECTION_DRIFT


def rebuild_tasks(store: EventStore, conn: Connection) -> tuple[dict[str, dict[str, Any]], dict[str, int]]:
    """Fold every task stream from scratch; returns docs and each task's last event position."""
    docs: dict[str, dict[str, Any]] = {}
    last_pos: dict[str, int] = {}
    upcast = store.upcasters.upcast
    for pos, stream_id, version, event_type, schema_v, data_text, _meta, _at, _hash in store.raw_rows(conn):
        if not stream_id.startswith(TASK_PREFIX):
            continue
        task_id = stream_id[len(TASK_PREFIX):]
        data = upcast(event_type, schema_v, json.loads(data_text))
        # recorded_at lives in meta; the fold only needs it for timestamps, read from the row.
        docs[task_id] = apply(docs.get(task_id), event_type, data, version, _at)
        last_pos[task_id] = pos
    return docs, last_pos


def _stored_revision(row: Any) -> int:
    """The highest revision the stored task claims, in its column or its document."""
    try:
        claimed = json.loads(row.doc).get("revision")
    except (ValueError, AttributeError):
        claimed = None
    return max(row.revision, claimed) if isinstance(claimed, int) else row.revision


def compare_tasks(conn: Connection, rebuilt: dict[str, dict[str, Any]], last_pos: dict[str, int]) -> list[Drift]:
    drifts: list[Drift] = []
    stored = {r.task_id: r for r in conn.execute(sa.select(tasks))}
    for task_id, doc in rebuilt.items():
        row = stored.pop(task_id, None)
        pos = last_pos[task_id]
        if row is None:
            drifts.append(Drift(task_id, pos, "task has events but no stored projection"))
            continue
        revision = _stored_revision(row)
        if revision > doc["revision"] or row.last_pos > pos:
            drifts.append(Drift(task_id, max(row.last_pos, pos), f"stored task is at revision {revision} "
                                f"(position {row.last_pos}), its events only reach revision {doc['revision']} "
                                f"(position {pos}): events of this task are missing from the log", PROJECTION_AHEAD))
            continue
        if canonical_json(json.loads(row.doc)) != canonical_json(doc):
            drifts.append(Drift(task_id, pos, "stored task document differs from the one rebuilt from events"))
        elif (row.state, row.revision, row.round, row.parent, row.root, row.recipient) != (
                doc["state"], doc["revision"], doc["round"], doc["parent"], doc["root"], doc["recipient"]):
            drifts.append(Drift(task_id, pos, "stored task columns differ from the rebuilt document"))
    for task_id, row in stored.items():
        drifts.append(Drift(task_id, row.last_pos, f"stored task is at revision {_stored_revision(row)} "
                            f"(position {row.last_pos}) but the log holds no event of it", PROJECTION_AHEAD))
    return sorted(drifts, key=lambda d: d.position)


def repair_tasks(conn: Connection, rebuilt: dict[str, dict[str, Any]], last_pos: dict[str, int]) -> int:
    """Replace the task read model by the one rebuilt from events (inside the caller's write transaction)."""
    conn.execute(tasks.delete())
    rows = [{"task_id": t, "state": d["state"], "revision": d["revision"], "round": d["round"],
             "parent": d["parent"], "root": d["root"], "recipient": d["recipient"], "doc": canonical_json(d),
             "last_pos": last_pos[t]} for t, d in rebuilt.items()]
    if rows:
        conn.execute(tasks.insert(), rows)
    return len(rows)
