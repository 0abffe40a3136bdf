"""Persistence: one Database wrapper for SQLite and PostgreSQL, the tables, the event store."""
