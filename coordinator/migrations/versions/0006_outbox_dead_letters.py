"""Dead letters are visible and can be tried again: outbox.failed_at, outbox.retried_by, outbox.retried_at.

Revision ID: 0006_outbox_dead_letters
Revises: 0005_task_worktrees

An outbox effect that exhausted its attempts (``status = 'failed'``) is a dead letter a person must see
(`up --once` degraded, `taskkernel effects list`) and may re-run (`taskkernel effects retry KEY`). ``failed_at`` is
when it gave up (its last error was already kept in ``last_error``); ``retried_by``/``retried_at`` name who last
put a dead letter back to pending, and when. All nullable: existing rows keep their meaning (a row that failed
before this revision shows ``failed_at`` null).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_outbox_dead_letters"
down_revision: str | None = "0005_task_worktrees"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("outbox") as batch:
        batch.add_column(sa.Column("failed_at", sa.Text))
        batch.add_column(sa.Column("retried_by", sa.Text))
        batch.add_column(sa.Column("retried_at", sa.Text))


def downgrade() -> None:
    with op.batch_alter_table("outbox") as batch:
        batch.drop_column("retried_at")
        batch.drop_column("retried_by")
        batch.drop_column("failed_at")
