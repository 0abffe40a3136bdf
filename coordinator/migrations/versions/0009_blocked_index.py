"""The blocked tasks found from an index: `ix_tasks_blocked`, and on PostgreSQL `ix_tasks_unblocked`.

Revision ID: 0009_blocked_index
Revises: 0008_people_in_the_loop

The board's active column, `task list --state blocked`, `inbox` and the live view read the blocked tasks by a
partial index whose predicate is the listing's own (kernel/queries.py blocked_now) instead of reading every active
task's document, so the board's front page costs the same at 1,000 tasks and at 10,000 (docs/performance.md).
Indexes only: no row is touched.
"""

from __future__ import annotations

from alembic import op

from taskkernel.kernel.store.schema import BLOCKED_INDEX, UNBLOCKED_INDEX, blocked_predicate

revision = "0009_blocked_index"
down_revision: str | None = "0008_people_in_the_loop"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.create_index(BLOCKED_INDEX, "tasks", ["task_id"], postgresql_where=blocked_predicate("postgresql"))
        op.create_index(UNBLOCKED_INDEX, "tasks", ["task_id"],
                        postgresql_where=blocked_predicate("postgresql", blocked=False))
    else:
        op.create_index(BLOCKED_INDEX, "tasks", ["task_id"], sqlite_where=blocked_predicate("sqlite"))


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.drop_index(UNBLOCKED_INDEX, "tasks")
    op.drop_index(BLOCKED_INDEX, "tasks")
