"""A running agent's typed output, what people tell it, and its CLI's conversation: `run_events`,
`input_deliveries`, `run_interrupts`, `agent_sessions`.

Revision ID: 0008_people_in_the_loop
Revises: 0007_task_aliases

`runs follow`, `task watch` and the board read an agent's streamed output as typed events; `task say` instructions
are accepted into the task's run session and this records which run each was delivered to; `task interrupt`
requests are read by the coordinator holding the run; a follow-up run resumes the CLI's own conversation recorded
in `agent_sessions` (docs/people-in-the-loop.md). New tables only.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008_people_in_the_loop"
down_revision: str | None = "0007_task_aliases"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_events",
        sa.Column("run_id", sa.Text, primary_key=True),
        sa.Column("n", sa.Integer, primary_key=True),
        sa.Column("task_id", sa.Text, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("at", sa.Text, nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("tool", sa.Text),
        sa.Column("text", sa.Text, nullable=False),
    )
    op.create_index("ix_run_events_task", "run_events", ["task_id", "at", "run_id", "n"])
    op.create_table(
        "input_deliveries",
        sa.Column("session_id", sa.Text, primary_key=True),
        sa.Column("seq", sa.Integer, primary_key=True),
        sa.Column("task_id", sa.Text, nullable=False),
        sa.Column("run_id", sa.Text, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("via", sa.Text, nullable=False),
        sa.Column("delivered_at", sa.Text, nullable=False),
    )
    op.create_table(
        "run_interrupts",
        sa.Column("task_id", sa.Text, primary_key=True),
        sa.Column("run_id", sa.Text, primary_key=True),
        sa.Column("attempt", sa.Integer, primary_key=True),
        sa.Column("requested_by", sa.Text, nullable=False),
        sa.Column("requested_at", sa.Text, nullable=False),
        sa.Column("message_seq", sa.Integer),
        sa.Column("handled_at", sa.Text),
    )
    op.create_table(
        "agent_sessions",
        sa.Column("task_id", sa.Text, primary_key=True),
        sa.Column("role", sa.Text, primary_key=True),
        sa.Column("runner", sa.Text, nullable=False),
        sa.Column("session_id", sa.Text, nullable=False),
        sa.Column("run_id", sa.Text, nullable=False),
        sa.Column("recorded_at", sa.Text, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("agent_sessions")
    op.drop_table("run_interrupts")
    op.drop_table("input_deliveries")
    op.drop_index("ix_run_events_task", table_name="run_events")
    op.drop_table("run_events")
