"""Other ids a task is known by: the `task_aliases` table.

Revision ID: 0007_task_aliases
Revises: 0006_outbox_dead_letters

`taskkernel fcop migrate --to g4` writes every task into an FCoP 4 workspace, where fcop's Core names each one
``TASK-<32 hex>``; the kernel keeps its own id and history, and this table maps the file's id to it, so both
names answer (docs/fcop4.md). New table only: nothing existing changes.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_task_aliases"
down_revision: str | None = "0006_outbox_dead_letters"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "task_aliases",
        sa.Column("alias", sa.Text, primary_key=True),
        sa.Column("task_id", sa.Text, nullable=False),
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("created_at", sa.Text, nullable=False),
    )
    op.create_index("ix_task_aliases_task", "task_aliases", ["task_id"])


def downgrade() -> None:
    op.drop_index("ix_task_aliases_task", table_name="task_aliases")
    op.drop_table("task_aliases")
