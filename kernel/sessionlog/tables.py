"""The session log's tables, all of them (own MetaData; ``install(db)`` creates them, idempotently).

``session_counter`` is the per-session counter row: ``last_seq`` (acceptance sequence),
``last_record`` (record position of everything received, accepted or not),
``last_consumed_seq`` and ``turns_completed``. Every number a record gets comes from this row,
incremented in the transaction that stores the record, so both are gapless and commit-ordered;
no clock, rowid or database sequence is involved.
"""

from __future__ import annotations

import weakref

import sqlalchemy as sa

from taskkernel.kernel.store.db import Database

metadata = sa.MetaData()

Num = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

session_counter = sa.Table(
    "session_counter",
    metadata,
    sa.Column("session_id", sa.Text, primary_key=True),
    sa.Column("last_seq", Num, nullable=False),
    sa.Column("last_record", Num, nullable=False),
    sa.Column("last_consumed_seq", Num, nullable=False),
    sa.Column("turns_completed", Num, nullable=False),
)

session_input = sa.Table(
    "session_input",
    metadata,
    sa.Column("session_id", sa.Text, primary_key=True),
    sa.Column("record_no", Num, primary_key=True),  # storage (record) order, 1.. per session
    sa.Column("seq", Num, nullable=True),  # acceptance sequence; NULL for refused and legacy records
    sa.Column("input_id", sa.Text, nullable=False),
    sa.Column("kind", sa.Text, nullable=False),
    sa.Column("payload", sa.Text, nullable=False),  # canonical JSON
    sa.Column("content_digest", sa.Text, nullable=False),  # digest of {kind, payload}: idempotency check
    sa.Column("accepted", sa.Boolean, nullable=False),
    sa.Column("legacy", sa.Boolean, nullable=False),
    sa.Column("refusal", sa.Text, nullable=True),
    sa.Column("received_at", sa.Text, nullable=False),  # informational only, never used for order
    sa.Column("accepted_by", sa.Text, nullable=True),  # principal ROLE:agent, from the credential
    sa.UniqueConstraint("session_id", "input_id", name="uq_session_input_id"),
    sa.UniqueConstraint("session_id", "seq", name="uq_session_input_seq"),  # NULLs are distinct
)

# Who owns a session: the principal (ROLE:agent) whose write created it, or ADMIN for the grant sessions.
# Only the owner and an unscoped ADMIN may write to it (docs/security.md).
session_owner = sa.Table(
    "session_owner",
    metadata,
    sa.Column("session_id", sa.Text, primary_key=True),
    sa.Column("owner", sa.Text, nullable=False),
    sa.Column("claimed_at", sa.Text, nullable=False),
)


_installed: weakref.WeakSet[Database] = weakref.WeakSet()


def install(db: Database) -> None:
    """Create the tables if missing (``Database.create_schema``: under the writer lock, so concurrent first users
    do not race, and never in a database whose schema is behind the code)."""
    if db in _installed:
        return
    db.create_schema(metadata)
    _installed.add(db)
