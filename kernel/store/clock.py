"""The time leases are compared with: the store's clock on PostgreSQL, where coordinators on several hosts share
the store and their own clocks may disagree (a host whose clock runs behind would write leases others already
read as expired, and its runs would be taken over while they run); the system clock on SQLite, one machine."""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa


def store_now(conn: sa.Connection) -> datetime:
    """Now, by the clock every process on this store compares leases against (inside the caller's transaction)."""
    if conn.dialect.name == "postgresql":
        value: datetime = conn.exec_driver_sql("SELECT clock_timestamp()").scalar_one()
        return value.astimezone(UTC)
    return datetime.now(UTC)


def iso(moment: datetime) -> str:
    """The stored form of a lease time (sorts as text)."""
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
