"""The team's machines on one store: `hosts`.

Revision ID: 0011_hosts
Revises: 0010_sign_ins

Coordinators on several machines share one PostgreSQL store (`taskkernel up --host NAME`, `[hosts.NAME]`,
docs/hosts.md); each keeps its heartbeat, its roles and its slots in this table, which `taskkernel hosts` lists.
New table only.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011_hosts"
down_revision: str | None = "0010_sign_ins"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "hosts",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("owner", sa.Text, nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("roles", sa.Text, nullable=False),
        sa.Column("slots", sa.Text, nullable=False),
        sa.Column("max_runs", sa.Integer, nullable=False),
        sa.Column("version", sa.Text, nullable=False),
        sa.Column("started_at", sa.Text, nullable=False),
        sa.Column("heartbeat_at", sa.Text, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("hosts")
