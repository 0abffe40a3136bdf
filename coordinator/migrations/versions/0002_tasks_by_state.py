"""Tasks by state in task-id order: one index on tasks(state, task_id) in place of the one on tasks(state).

Revision ID: 0002_tasks_by_state
Revises: 0001_baseline

`task list --state S` pages in task-id order (``WHERE state = ? AND task_id > ? ORDER BY task_id LIMIT ?``).
With an index on state alone the database reads every task in that state and sorts them for each page, so a
page costs as much as the whole state; with (state, task_id) a page is one index range read, in order. The
new index also serves everything the old one did (a lookup or count by state uses its first column), so the
old one goes: one index fewer to keep up on every state change. Rows are not touched.
"""

from __future__ import annotations

from alembic import op

revision = "0002_tasks_by_state"
down_revision: str | None = "0001_baseline"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_tasks_state_task_id", "tasks", ["state", "task_id"])
    op.drop_index("ix_tasks_state", table_name="tasks")


def downgrade() -> None:
    op.create_index("ix_tasks_state", "tasks", ["state"])
    op.drop_index("ix_tasks_state_task_id", table_name="tasks")
