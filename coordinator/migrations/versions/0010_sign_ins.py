"""The board's sign-ins in the store: `sign_ins`.

Revision ID: 0010_sign_ins
Revises: 0009_blocked_index

A sign-in was held in one `serve` process's memory: another server on the same store did not know it, and a restart
signed everyone out. Now every server reads and writes this table (docs/web.md, "Signing in"); it holds the
SHA-256 of each cookie and of the credential it stands for, never either value. New table only: sign-ins made
before the upgrade lived in a process's memory and end with it, as they always did.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010_sign_ins"
down_revision: str | None = "0009_blocked_index"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sign_ins",
        sa.Column("sid_hash", sa.Text, primary_key=True),
        sa.Column("token_hash", sa.Text, nullable=False),
        sa.Column("principal", sa.Text, nullable=False),
        sa.Column("created_at", sa.Text, nullable=False),
        sa.Column("expires_at", sa.Text, nullable=False),
    )
    op.create_index("ix_sign_ins_principal", "sign_ins", ["principal", "created_at"])
    op.create_index("ix_sign_ins_expires", "sign_ins", ["expires_at"])


def downgrade() -> None:
    op.drop_table("sign_ins")
