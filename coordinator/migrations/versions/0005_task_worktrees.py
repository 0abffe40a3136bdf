"""Tasks get their own git worktree: the `worktrees` table.

Revision ID: 0005_task_worktrees
Revises: 0004_blocked_documents

A role with ``isolation = "worktree"`` runs each task in ``.taskkernel/worktrees/<TASK-ID>`` on the branch
``task/<TASK-ID>`` (docs/agents.md). The table records each one: its path, branch, git's administrative folder for
it, the base branch and commit it was cut from (the diff of a done report and the merge on approval are against
it), and its state (active, merged, archived). New table only: nothing existing changes.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_task_worktrees"
down_revision: str | None = "0004_blocked_documents"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "worktrees",
        sa.Column("task_id", sa.Text, primary_key=True),
        sa.Column("path", sa.Text, nullable=False),
        sa.Column("branch", sa.Text, nullable=False),
        sa.Column("git_dir", sa.Text, nullable=False),
        sa.Column("base_branch", sa.Text, nullable=False),
        sa.Column("base_commit", sa.Text, nullable=False),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("merged_commit", sa.Text),
        sa.Column("created_at", sa.Text, nullable=False),
        sa.Column("updated_at", sa.Text, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("worktrees")
