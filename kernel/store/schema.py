"""Kernel tables (SQLAlchemy Core). JSON is stored as canonical text so hashes stay reproducible."""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()

# INTEGER on SQLite (a rowid alias: fastest), BIGINT on PostgreSQL.
Position = sa.Integer().with_variant(sa.BigInteger(), "postgresql")

events = sa.Table(
    "events",
    metadata,
    sa.Column("global_pos", Position, primary_key=True, autoincrement=False),
    sa.Column("stream_id", sa.Text, nullable=False),
    sa.Column("stream_version", sa.Integer, nullable=False),
    sa.Column("event_type", sa.Text, nullable=False),
    sa.Column("schema_version", sa.Integer, nullable=False),
    sa.Column("data", sa.Text, nullable=False),
    sa.Column("meta", sa.Text, nullable=False),
    sa.Column("recorded_at", sa.Text, nullable=False),
    sa.Column("hash", sa.Text, nullable=False),
    sa.UniqueConstraint("stream_id", "stream_version", name="uq_events_stream_version"),
)

# Idempotency receipts: written in the same transaction as the events they describe.
receipts = sa.Table(
    "receipts",
    metadata,
    sa.Column("idempotency_key", sa.Text, primary_key=True),
    sa.Column("command_type", sa.Text, nullable=False),
    sa.Column("semantic_digest", sa.Text, nullable=False),
    sa.Column("principal", sa.Text, nullable=False),
    sa.Column("task_id", sa.Text),
    sa.Column("result", sa.Text, nullable=False),
    sa.Column("first_pos", Position, nullable=False),
    sa.Column("last_pos", Position, nullable=False),
    sa.Column("created_at", sa.Text, nullable=False),
)

# Task read model, maintained inline with every accepted command and rebuildable from events.
tasks = sa.Table(
    "tasks",
    metadata,
    sa.Column("task_id", sa.Text, primary_key=True),
    sa.Column("state", sa.Text, nullable=False),
    sa.Column("revision", sa.Integer, nullable=False),
    sa.Column("round", sa.Integer, nullable=False),
    sa.Column("parent", sa.Text),
    sa.Column("root", sa.Text, nullable=False),
    sa.Column("recipient", sa.Text, nullable=False),
    sa.Column("doc", sa.Text, nullable=False),
    sa.Column("last_pos", Position, nullable=False),
    sa.Index("ix_tasks_parent", "parent"),
    sa.Index("ix_tasks_state", "state"),
)

# Side effects that leave the database, written with the events and performed afterwards.
outbox = sa.Table(
    "outbox",
    metadata,
    sa.Column("effect_key", sa.Text, primary_key=True),
    sa.Column("effect", sa.Text, nullable=False),
    sa.Column("payload", sa.Text, nullable=False),
    sa.Column("source_pos", Position, nullable=False),
    sa.Column("status", sa.Text, nullable=False, server_default="pending"),
    sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
    sa.Column("claimed_until", sa.Text),
    sa.Column("claim_token", sa.Text),
    sa.Column("last_error", sa.Text),
    sa.Column("done_at", sa.Text),
    sa.Index("ix_outbox_status", "status", "source_pos"),
)

credentials = sa.Table(
    "credentials",
    metadata,
    sa.Column("token_hash", sa.Text, primary_key=True),
    sa.Column("role", sa.Text, nullable=False),
    sa.Column("agent", sa.Text, nullable=False),
    sa.Column("task_id", sa.Text),
    sa.Column("round", sa.Integer),
    sa.Column("issued_at", sa.Text, nullable=False),
    sa.Column("revoked_at", sa.Text),
    # why it was revoked: "stale_lease" when the coordinator fenced out the run that held it
    sa.Column("revoked_reason", sa.Text),
)

# Named gapless counters (task id allocation per day), bumped inside the write transaction.
counters = sa.Table(
    "counters",
    metadata,
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("value", sa.Integer, nullable=False),
)

# Facts about the store itself, such as which hash chain it keeps (kernel/store/chain.py). Never a secret.
store_meta = sa.Table(
    "store_meta",
    metadata,
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
)
