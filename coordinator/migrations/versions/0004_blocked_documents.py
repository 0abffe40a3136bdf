"""Task documents say when a task is blocked: the `blocked` field, derived for tasks that are blocked now.

Revision ID: 0004_blocked_documents
Revises: 0003_run_outcomes

The fold now derives ``blocked`` (the current round's latest report, when its status is blocked). Documents
stored before it lack the field, which reads as null: right for every task except one blocked at the time of the
upgrade, which `task list --state blocked` would not list and `verify` would report as drifted until it moved.
Those tasks (active or in review, with a blocked report in their stored document) are folded again from their
events, and only their field is set; no event is touched. Rows are read and written in task-id batches.
"""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from alembic import op

from taskkernel.kernel.canonical import canonical_json
from taskkernel.kernel.projections import TASK_PREFIX, fold_streams
from taskkernel.kernel.queries import event_reader

revision = "0004_blocked_documents"
down_revision: str | None = "0003_run_outcomes"
branch_labels = None
depends_on = None

_tasks = sa.table("tasks", sa.column("task_id", sa.Text), sa.column("state", sa.Text), sa.column("doc", sa.Text))
_events = sa.table("events", sa.column("global_pos", sa.Integer), sa.column("stream_id", sa.Text),
                   sa.column("stream_version", sa.Integer), sa.column("event_type", sa.Text),
                   sa.column("schema_version", sa.Integer), sa.column("data", sa.Text),
                   sa.column("recorded_at", sa.Text))


def _candidates(bind: Any) -> list[tuple[str, dict[str, Any]]]:
    rows = bind.execute(sa.select(_tasks.c.task_id, _tasks.c.doc).where(_tasks.c.state.in_(("active", "review")))
                        .order_by(_tasks.c.task_id))
    out = []
    for task_id, text in rows:
        doc = json.loads(text)
        if "blocked" not in doc and any(r.get("status") == "blocked" for r in doc.get("reports", ())):
            out.append((task_id, doc))
    return out


def upgrade() -> None:
    bind = op.get_bind()
    store = event_reader()
    for task_id, doc in _candidates(bind):
        rows = bind.execute(sa.select(_events.c.global_pos, _events.c.stream_id, _events.c.stream_version,
                                      _events.c.event_type, _events.c.schema_version, _events.c.data,
                                      _events.c.recorded_at)
                            .where(_events.c.stream_id == TASK_PREFIX + task_id).order_by(_events.c.stream_version))
        for rebuilt in fold_streams(store, rows):
            if rebuilt.problem is None and rebuilt.doc.get("blocked") is not None:
                bind.execute(_tasks.update().where(_tasks.c.task_id == task_id)
                             .values(doc=canonical_json({**doc, "blocked": rebuilt.doc["blocked"]})))


def downgrade() -> None:
    """Nothing to undo: an older release ignores the field."""
