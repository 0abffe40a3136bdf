"""Runs say why they ended and when their agent last spoke: runs.error_code and runs.heartbeat_at.

Revision ID: 0003_run_outcomes
Revises: 0002_tasks_by_state

``error_code`` is the stable code of a run's last failure (``timeout``, ``heartbeat_timeout``,
``binary_missing``, ``placeholder_unknown``, ``config_invalid``, ``non_retryable_exit``, ``exit_code``,
``attempts_exhausted``, ``interrupted``, …: docs/runs.md), so `runs list --state failed|blocked` tells a run that
gave up after its retries from one stopped at once by an error no retry can fix. ``heartbeat_at`` is the last
time the agent renewed its lease itself (CLI verb, MCP tool or a stdout line), which ``heartbeat_timeout`` is
measured from. Both are nullable: existing rows keep their meaning. Two indexes serve `runs list` (newest first,
keyset pages on (created_at, run_id)) and `--task ID`, which otherwise sort or scan the whole ledger.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_run_outcomes"
down_revision: str | None = "0002_tasks_by_state"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("error_code", sa.Text))
        batch.add_column(sa.Column("heartbeat_at", sa.Text))
    op.create_index("ix_runs_created", "runs", ["created_at", "run_id"])
    op.create_index("ix_runs_task", "runs", ["task_id"])


def downgrade() -> None:
    op.drop_index("ix_runs_task", table_name="runs")
    op.drop_index("ix_runs_created", table_name="runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("heartbeat_at")
        batch.drop_column("error_code")
