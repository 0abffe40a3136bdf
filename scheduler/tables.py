"""Scheduler tables (own MetaData, created by ``install``).

Times are fixed-width UTC text (``YYYY-MM-DDTHH:MM:SS.ffffffZ``) on both backends, so they compare
and sort as text and read the same in any SQL shell.
"""

from __future__ import annotations

import sqlalchemy as sa

from taskkernel.kernel.store.db import Database

metadata = sa.MetaData()

schedule = sa.Table(
    "schedule",
    metadata,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("kind", sa.Text, nullable=False),
    sa.Column("spec", sa.Text, nullable=False),
    sa.Column("tz", sa.Text, nullable=False),
    sa.Column("definition", sa.Text, nullable=False),  # canonical JSON of ScheduleSpec
    sa.Column("created_utc", sa.Text, nullable=False),  # also the anchor of interval/calendar triggers
    sa.Column("paused", sa.Integer, nullable=False, server_default="0"),
    sa.Column("pause_reason", sa.Text),
    # Last nominal occurrence handled (claimed or recorded missed); only moves forward.
    sa.Column("watermark_utc", sa.Text, nullable=False),
    # Due time of the first nominal occurrence after the watermark; NULL when the trigger is exhausted.
    sa.Column("next_due_utc", sa.Text),
    sa.Column("revision", sa.Integer, nullable=False, server_default="0"),
    sa.Column("last_digest", sa.Text),  # watched-state digest taken right after the last fire
    sa.Column("no_progress", sa.Integer, nullable=False, server_default="0"),
    sa.Column("removed_utc", sa.Text),
    sa.CheckConstraint("kind IN ('cron','interval','date','calendar')", name="ck_schedule_kind"),
    sa.Index("ix_schedule_due", "next_due_utc"),
    sa.Index(
        "uq_schedule_live_name", "name", unique=True,
        sqlite_where=sa.text("removed_utc IS NULL"), postgresql_where=sa.text("removed_utc IS NULL"),
    ),
    sqlite_with_rowid=False,  # every tick updates due rows by id: one B-tree lookup instead of two
)

occurrence = sa.Table(
    "occurrence",
    metadata,
    sa.Column("schedule_id", sa.Text, sa.ForeignKey("schedule.id"), nullable=False),
    sa.Column("occurrence_key", sa.Text, nullable=False),  # the dedup key
    sa.Column("nominal_utc", sa.Text, nullable=False),
    sa.Column("due_utc", sa.Text, nullable=False),
    sa.Column("state", sa.Text, nullable=False),
    sa.Column("reason", sa.Text),  # MissReason for missed rows
    sa.Column("lease_owner", sa.Text),
    sa.Column("lease_until", sa.Text),
    sa.Column("fencing", sa.Integer, nullable=False, server_default="0"),
    sa.Column("attempt", sa.Integer, nullable=False, server_default="1"),
    sa.Column("claim_token", sa.Text),  # the transaction that inserted the row (conflict detection)
    sa.Column("fired_utc", sa.Text),  # when the first attempt started
    sa.Column("finished_utc", sa.Text),
    sa.Column("run_ref", sa.Text),  # e.g. the task id the action created
    sa.Column("detail", sa.Text),  # error text of failed runs
    sa.Column("recorded_utc", sa.Text, nullable=False),
    sa.PrimaryKeyConstraint("schedule_id", "occurrence_key", name="pk_occurrence"),
    sa.CheckConstraint(
        "state IN ('claimed','running','done','failed','missed','abandoned')", name="ck_occurrence_state"
    ),
    # Partial: only live rows (the few running or waiting ones), so finished rows cost no index upkeep.
    sa.Index("ix_occurrence_live", "state", "lease_until",
             sqlite_where=sa.text("state IN ('running','claimed')"),
             postgresql_where=sa.text("state IN ('running','claimed')")),
    sqlite_with_rowid=False,  # rows live in the primary-key B-tree: one B-tree less per claim
)

# Nominal instants whose dedup key was already taken (the repeated hour of a DST fall-back night,
# or a key a backfill handled first). Kept apart because the key itself is the occurrence's identity.
occurrence_conflict = sa.Table(
    "occurrence_conflict",
    metadata,
    sa.Column("schedule_id", sa.Text, sa.ForeignKey("schedule.id"), nullable=False),
    sa.Column("nominal_utc", sa.Text, nullable=False),
    sa.Column("occurrence_key", sa.Text, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("recorded_utc", sa.Text, nullable=False),
    sa.PrimaryKeyConstraint("schedule_id", "nominal_utc", name="pk_occurrence_conflict"),
)

# Watermarks the runtime moved back because they stood further ahead of the clock than
# [scheduler] max_clock_skew (reason ``clock_jump``). A table of its own, so databases created by an
# earlier release gain it through create-if-missing.
schedule_clamp = sa.Table(
    "schedule_clamp",
    metadata,
    sa.Column("schedule_id", sa.Text, sa.ForeignKey("schedule.id"), nullable=False),
    sa.Column("recorded_utc", sa.Text, nullable=False),  # the clock that found the jump
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("watermark_from", sa.Text, nullable=False),
    sa.Column("watermark_to", sa.Text, nullable=False),
    sa.Column("reopened", sa.Integer, nullable=False),  # missed records after watermark_to, decided again
    sa.Column("by", sa.Text, nullable=False),  # the coordinator that clamped
    sa.PrimaryKeyConstraint("schedule_id", "recorded_utc", name="pk_schedule_clamp"),
)

# Schedules set aside because their stored definition could not be read or computed (reason ``invalid``):
# one row each time a pass met one. A table of its own, so earlier databases gain it through create-if-missing.
schedule_fault = sa.Table(
    "schedule_fault",
    metadata,
    sa.Column("schedule_id", sa.Text, sa.ForeignKey("schedule.id"), nullable=False),
    sa.Column("recorded_utc", sa.Text, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("error", sa.Text, nullable=False),  # the exception's class and message
    sa.Column("by", sa.Text, nullable=False),  # the coordinator (or verb) that met it
    sa.PrimaryKeyConstraint("schedule_id", "recorded_utc", name="pk_schedule_fault"),
)

coordinator = sa.Table(
    "coordinator",
    metadata,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("host", sa.Text, nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("started_utc", sa.Text, nullable=False),
    sa.Column("heartbeat_utc", sa.Text, nullable=False),
)


def install(db: Database) -> None:
    """Create the scheduler tables (idempotent)."""
    db.create_schema(metadata)
