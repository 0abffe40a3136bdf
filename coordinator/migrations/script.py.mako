"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}

Why, and what it does to a database that has rows (docs/migrations.md, "Writing the next migration").
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
${imports if imports else ""}
revision = ${repr(up_revision)}
down_revision: str | None = ${repr(down_revision)}
branch_labels = None
depends_on = None


def upgrade() -> None:
    ${upgrades if upgrades else "pass"}


def downgrade() -> None:
    ${downgrades if downgrades else "pass"}
