"""Baseline: the schema release 0.1.0 created, every table, index and constraint, on SQLite and PostgreSQL.

Revision ID: 0001_baseline
Revises: (none)

The definitions below are a frozen copy of that release's table modules, never the current ones: this revision
must build the same schema forever (tests/fixtures/release-0.1.0/schema.*.json is what that release made;
tests/test_migrations.py compares). Later changes are later revisions.

It is also how a database made by release 0.1.0 is adopted: such a database has our tables but no version
table, and the code of that release created each table the first time something needed it. Running this
revision over it creates only the tables still missing (``create_all`` checks first) and gives a run ledger
made before the agent columns those columns, as that release's RunLedger did on open; then it is stamped.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001_baseline"
down_revision: str | None = None
branch_labels = None
depends_on = None

# INTEGER on SQLite (a rowid alias), BIGINT on PostgreSQL; the session log's numbers the other way round.
Position = sa.Integer().with_variant(sa.BigInteger(), "postgresql")
Amount = Position  # the usage ledger's counts: 64-bit on both
Num = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
RUN_AGENT_COLUMNS = ("token_hash", "agent_host", "agent_pgid", "agent_start")


def upgrade() -> None:
    bind = op.get_bind()
    md = release_0_1_metadata()
    md.create_all(bind)  # checkfirst: over a release 0.1.0 database, only the missing tables
    present = {c["name"] for c in sa.inspect(bind).get_columns("runs")}
    for name in RUN_AGENT_COLUMNS:
        if name not in present:
            kind = md.tables["runs"].c[name].type.compile(dialect=bind.dialect)
            op.execute(f"ALTER TABLE runs ADD COLUMN {name} {kind}")


def downgrade() -> None:
    release_0_1_metadata().drop_all(op.get_bind())


def release_0_1_metadata() -> sa.MetaData:
    md = sa.MetaData()
    _core(md)
    _sessionlog(md)
    _scheduler(md)
    _coordinator(md)
    return md


def _core(md: sa.MetaData) -> None:
    sa.Table(
        "events", md,
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
    sa.Table(
        "receipts", md,
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
    sa.Table(
        "tasks", md,
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
    sa.Table(
        "outbox", md,
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
    sa.Table(
        "credentials", md,
        sa.Column("token_hash", sa.Text, primary_key=True),
        sa.Column("role", sa.Text, nullable=False),
        sa.Column("agent", sa.Text, nullable=False),
        sa.Column("task_id", sa.Text),
        sa.Column("round", sa.Integer),
        sa.Column("issued_at", sa.Text, nullable=False),
        sa.Column("revoked_at", sa.Text),
        sa.Column("revoked_reason", sa.Text),
    )
    sa.Table(
        "counters", md,
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("value", sa.Integer, nullable=False),
    )
    sa.Table(
        "store_meta", md,
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
    )
    sa.Table(
        "usage", md,
        sa.Column("usage_id", sa.Text, primary_key=True),
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
    sa.Table(
        "goals", md,
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
    sa.Table(
        "background_jobs", md,
        sa.Column("subject", sa.Text, primary_key=True),
        sa.Column("task_id", sa.Text, nullable=False),
        sa.Column("state", sa.Text, nullable=False),
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


def _sessionlog(md: sa.MetaData) -> None:
    sa.Table(
        "session_counter", md,
        sa.Column("session_id", sa.Text, primary_key=True),
        sa.Column("last_seq", Num, nullable=False),
        sa.Column("last_record", Num, nullable=False),
        sa.Column("last_consumed_seq", Num, nullable=False),
        sa.Column("turns_completed", Num, nullable=False),
    )
    sa.Table(
        "session_input", md,
        sa.Column("session_id", sa.Text, primary_key=True),
        sa.Column("record_no", Num, primary_key=True),
        sa.Column("seq", Num, nullable=True),
        sa.Column("input_id", sa.Text, nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("payload", sa.Text, nullable=False),
        sa.Column("content_digest", sa.Text, nullable=False),
        sa.Column("accepted", sa.Boolean, nullable=False),
        sa.Column("legacy", sa.Boolean, nullable=False),
        sa.Column("refusal", sa.Text, nullable=True),
        sa.Column("received_at", sa.Text, nullable=False),
        sa.Column("accepted_by", sa.Text, nullable=True),
        sa.UniqueConstraint("session_id", "input_id", name="uq_session_input_id"),
        sa.UniqueConstraint("session_id", "seq", name="uq_session_input_seq"),
    )
    sa.Table(
        "session_owner", md,
        sa.Column("session_id", sa.Text, primary_key=True),
        sa.Column("owner", sa.Text, nullable=False),
        sa.Column("claimed_at", sa.Text, nullable=False),
    )


def _scheduler(md: sa.MetaData) -> None:
    live = "state IN ('running','claimed')"
    sa.Table(
        "schedule", md,
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("spec", sa.Text, nullable=False),
        sa.Column("tz", sa.Text, nullable=False),
        sa.Column("definition", sa.Text, nullable=False),
        sa.Column("created_utc", sa.Text, nullable=False),
        sa.Column("paused", sa.Integer, nullable=False, server_default="0"),
        sa.Column("pause_reason", sa.Text),
        sa.Column("watermark_utc", sa.Text, nullable=False),
        sa.Column("next_due_utc", sa.Text),
        sa.Column("revision", sa.Integer, nullable=False, server_default="0"),
        sa.Column("last_digest", sa.Text),
        sa.Column("no_progress", sa.Integer, nullable=False, server_default="0"),
        sa.Column("removed_utc", sa.Text),
        sa.CheckConstraint("kind IN ('cron','interval','date','calendar')", name="ck_schedule_kind"),
        sa.Index("ix_schedule_due", "next_due_utc"),
        sa.Index("uq_schedule_live_name", "name", unique=True, sqlite_where=sa.text("removed_utc IS NULL"),
                 postgresql_where=sa.text("removed_utc IS NULL")),
        sqlite_with_rowid=False,
    )
    sa.Table(
        "occurrence", md,
        sa.Column("schedule_id", sa.Text, sa.ForeignKey("schedule.id"), nullable=False),
        sa.Column("occurrence_key", sa.Text, nullable=False),
        sa.Column("nominal_utc", sa.Text, nullable=False),
        sa.Column("due_utc", sa.Text, nullable=False),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("reason", sa.Text),
        sa.Column("lease_owner", sa.Text),
        sa.Column("lease_until", sa.Text),
        sa.Column("fencing", sa.Integer, nullable=False, server_default="0"),
        sa.Column("attempt", sa.Integer, nullable=False, server_default="1"),
        sa.Column("claim_token", sa.Text),
        sa.Column("fired_utc", sa.Text),
        sa.Column("finished_utc", sa.Text),
        sa.Column("run_ref", sa.Text),
        sa.Column("detail", sa.Text),
        sa.Column("recorded_utc", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("schedule_id", "occurrence_key", name="pk_occurrence"),
        sa.CheckConstraint("state IN ('claimed','running','done','failed','missed','abandoned')",
                           name="ck_occurrence_state"),
        sa.Index("ix_occurrence_live", "state", "lease_until", sqlite_where=sa.text(live),
                 postgresql_where=sa.text(live)),
        sqlite_with_rowid=False,
    )
    sa.Table(
        "occurrence_conflict", md,
        sa.Column("schedule_id", sa.Text, sa.ForeignKey("schedule.id"), nullable=False),
        sa.Column("nominal_utc", sa.Text, nullable=False),
        sa.Column("occurrence_key", sa.Text, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("recorded_utc", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("schedule_id", "nominal_utc", name="pk_occurrence_conflict"),
    )
    sa.Table(
        "schedule_clamp", md,
        sa.Column("schedule_id", sa.Text, sa.ForeignKey("schedule.id"), nullable=False),
        sa.Column("recorded_utc", sa.Text, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("watermark_from", sa.Text, nullable=False),
        sa.Column("watermark_to", sa.Text, nullable=False),
        sa.Column("reopened", sa.Integer, nullable=False),
        sa.Column("by", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("schedule_id", "recorded_utc", name="pk_schedule_clamp"),
    )
    sa.Table(
        "schedule_fault", md,
        sa.Column("schedule_id", sa.Text, sa.ForeignKey("schedule.id"), nullable=False),
        sa.Column("recorded_utc", sa.Text, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("error", sa.Text, nullable=False),
        sa.Column("by", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("schedule_id", "recorded_utc", name="pk_schedule_fault"),
    )
    sa.Table(
        "coordinator", md,
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("host", sa.Text, nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("started_utc", sa.Text, nullable=False),
        sa.Column("heartbeat_utc", sa.Text, nullable=False),
    )


def _coordinator(md: sa.MetaData) -> None:
    sa.Table(
        "runs", md,
        sa.Column("run_id", sa.Text, primary_key=True),
        sa.Column("task_id", sa.Text, nullable=False),
        sa.Column("round", sa.Integer, nullable=False),
        sa.Column("role", sa.Text, nullable=False),
        sa.Column("purpose", sa.Text, nullable=False),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False, server_default="0"),
        sa.Column("max_attempts", sa.Integer, nullable=False),
        sa.Column("fencing", sa.Integer, nullable=False, server_default="0"),
        sa.Column("lease_owner", sa.Text),
        sa.Column("lease_until", sa.Text),
        sa.Column("not_before", sa.Text, nullable=False),
        sa.Column("exit_code", sa.Integer),
        sa.Column("last_error", sa.Text),
        sa.Column("created_at", sa.Text, nullable=False),
        sa.Column("ended_at", sa.Text),
        sa.Column("token_hash", sa.Text),
        sa.Column("agent_host", sa.Text),
        sa.Column("agent_pgid", sa.Integer),
        sa.Column("agent_start", sa.BigInteger),
        sa.Index("ix_runs_due", "state", "not_before"),
    )
    sa.Table(
        "folder_files", md,
        sa.Column("rel", sa.Text, primary_key=True),
        sa.Column("sha256", sa.Text, nullable=False),
        sa.Column("task_id", sa.Text),
        sa.Column("origin", sa.Text, nullable=False),
        sa.Column("note", sa.Text),
        sa.Column("updated_at", sa.Text, nullable=False),
        sa.Index("ix_folder_files_task", "task_id"),
    )
    sa.Table(
        "folder_stats", md,
        sa.Column("rel", sa.Text, primary_key=True),
        sa.Column("stat", sa.Text, nullable=False),
        sa.Column("sha256", sa.Text, nullable=False),
    )
    sa.Table(
        "folder_imports", md,
        sa.Column("root", sa.Text, primary_key=True),
        sa.Column("generation", sa.Text, nullable=False),
        sa.Column("imported_at", sa.Text, nullable=False),
        sa.Column("summary", sa.Text, nullable=False),
    )
