"""The core's tables (SQLAlchemy Core), all of them: the event store and its read models, credentials, and the
usage ledger, goals and background jobs. JSON is stored as canonical text so hashes stay reproducible.

Every component keeps its tables in one module like this one (kernel/sessionlog/tables.py, scheduler/tables.py,
coordinator/tables.py); the migrations that change them live in coordinator/migrations/ (docs/migrations.md).
A change to a table here is a new migration there: tests/test_migrations.py fails until both agree."""

from __future__ import annotations

import threading

import sqlalchemy as sa

metadata = sa.MetaData()

# INTEGER on SQLite (a rowid alias: fastest), BIGINT on PostgreSQL.
Position = sa.Integer().with_variant(sa.BigInteger(), "postgresql")
Amount = sa.Integer().with_variant(sa.BigInteger(), "postgresql")  # SQLite's INTEGER is 64-bit already

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
    sa.Index("ix_tasks_state_task_id", "state", "task_id"),  # a state's tasks in id order: `task list` pages
)

# The active tasks that are blocked (on PostgreSQL also those that are not): the board's active column, `task list
# --state blocked`, `inbox` and the live view find them without reading every active task's document. The
# predicates are kernel/queries.py blocked_now's, constants included (a partial index serves only a query that names
# its terms). PostgreSQL keeps no statistics on the JSON expression, so it is given both sides; on SQLite the
# unblocked side would only cost every command on an active task two more JSON reads.
_BLOCKED_MARKER = {"sqlite": "json_extract(doc, '$.blocked.report_id')",
                   "postgresql": "(CAST(doc AS JSON) #>> '{blocked,report_id}')"}
BLOCKED_INDEX = "ix_tasks_blocked"
UNBLOCKED_INDEX = "ix_tasks_unblocked"
ONE_DIALECT_INDEXES = {UNBLOCKED_INDEX: "postgresql"}  # index -> the one backend that builds it


def blocked_predicate(dialect: str, blocked: bool = True) -> sa.TextClause:
    """The partial indexes' WHERE: an active task whose document is (or with ``blocked=False`` is not) blocked."""
    return sa.text(f"state = 'active' AND {_BLOCKED_MARKER[dialect]} IS {'NOT ' if blocked else ''}NULL")


_blocked = sa.Index(BLOCKED_INDEX, tasks.c.task_id, sqlite_where=blocked_predicate("sqlite"))
_postgresql_lock = threading.Lock()


def postgresql_options() -> None:
    """Give the partial indexes their PostgreSQL side before a schema is built or compared on PostgreSQL. Not at
    import: naming a ``postgresql_`` option makes SQLAlchemy load its whole PostgreSQL dialect (~120 M
    instructions), which a command on a SQLite store never needs. Idempotent."""
    with _postgresql_lock:
        if UNBLOCKED_INDEX in {index.name for index in tasks.indexes}:
            return
        _blocked.dialect_kwargs["postgresql_where"] = blocked_predicate("postgresql")
        sa.Index(UNBLOCKED_INDEX, tasks.c.task_id,
                 postgresql_where=blocked_predicate("postgresql", blocked=False)).ddl_if(dialect="postgresql")

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
    # a dead letter (status "failed": attempts exhausted): when it gave up, and who last put it back to pending
    sa.Column("failed_at", sa.Text),
    sa.Column("retried_by", sa.Text),
    sa.Column("retried_at", sa.Text),
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


# Usage ledger (kernel/usage.py): one row per unit of work, inserted once, never updated.
usage = sa.Table(
    "usage",
    metadata,
    sa.Column("usage_id", sa.Text, primary_key=True),  # e.g. run:<run_id>; idempotent re-recording
    sa.Column("root_task", sa.Text),
    sa.Column("task_id", sa.Text),
    sa.Column("round", sa.Integer),
    sa.Column("role", sa.Text, nullable=False),
    sa.Column("agent", sa.Text, nullable=False),
    sa.Column("feature", sa.Text, nullable=False),
    sa.Column("wall_ms", Amount, nullable=False, server_default="0"),
    sa.Column("exit_code", sa.Integer),
    sa.Column("tokens_in", Amount, nullable=False, server_default="0"),
    sa.Column("tokens_out", Amount, nullable=False, server_default="0"),
    sa.Column("cost_usd", sa.Float, nullable=False, server_default="0"),
    sa.Column("recorded_at", sa.Text, nullable=False),
    sa.Index("ix_usage_root", "root_task"),
)

# Goals (kernel/goals.py): a root task run under a budget.
goals = sa.Table(
    "goals",
    metadata,
    sa.Column("goal_id", sa.Text, primary_key=True),
    sa.Column("root_task", sa.Text, nullable=False),
    sa.Column("state", sa.Text, nullable=False),
    sa.Column("reason", sa.Text),
    sa.Column("budget", sa.Text, nullable=False),
    sa.Column("breaker_threshold", sa.Integer, nullable=False),
    sa.Column("consecutive_failures", sa.Integer, nullable=False, server_default="0"),
    sa.Column("started_at", sa.Text, nullable=False),
    sa.Column("ended_at", sa.Text),
    sa.Index("ix_goals_root_state", "root_task", "state"),
)

# Background jobs (kernel/background.py): single-flight, debounced work per subject.
background_jobs = sa.Table(
    "background_jobs",
    metadata,
    sa.Column("subject", sa.Text, primary_key=True),  # e.g. summary:TASK-…
    sa.Column("task_id", sa.Text, nullable=False),
    sa.Column("state", sa.Text, nullable=False),  # idle | scheduled | running
    sa.Column("first_requested", sa.Text),
    sa.Column("not_before", sa.Text),
    sa.Column("rerun", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("fencing", sa.Integer, nullable=False, server_default="0"),
    sa.Column("lease_until", sa.Text),
    sa.Column("based_on_revision", sa.Integer),
    sa.Column("result", sa.Text),
    sa.Column("result_revision", sa.Integer),
    sa.Column("discarded", sa.Integer, nullable=False, server_default="0"),
)
