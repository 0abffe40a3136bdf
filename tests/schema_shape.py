"""The shape of a database schema as plain data, to compare two databases (or one with a stored snapshot).

Only SQLAlchemy and the backends' own catalogs are used (never taskkernel), so the snapshots under
tests/fixtures/release-0.1.0/ were made by this same code run against the release that created them.

SQLite: every object in ``sqlite_master`` with its DDL text (whitespace collapsed): columns, types, defaults,
constraints, WITHOUT ROWID and partial-index predicates are all in it. PostgreSQL: every column (type,
nullability, default), constraint (``pg_get_constraintdef``) and index (``pg_get_indexdef``) of the tables in
the connection's current schema, with that schema's name taken out.
"""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy.engine import Connection


def describe(conn: Connection) -> dict[str, Any]:
    return _sqlite(conn) if conn.dialect.name == "sqlite" else _postgresql(conn)


def _squeeze(sql: str | None) -> str | None:
    return None if sql is None else re.sub(r"\s+", " ", sql).strip()


def _sqlite(conn: Connection) -> dict[str, Any]:
    rows = conn.exec_driver_sql("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name").all()
    return {"objects": [[kind, name, table, _squeeze(sql)] for kind, name, table, sql in rows]}


def _postgresql(conn: Connection) -> dict[str, Any]:
    schema = conn.exec_driver_sql("SELECT current_schema()").scalar()

    def local(text: str) -> str:
        return text.replace(f"{schema}.", "")

    columns = conn.exec_driver_sql(
        "SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, "
        "pg_get_expr(d.adbin, d.adrelid) FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid "
        "AND d.adnum = a.attnum WHERE n.nspname = current_schema() AND c.relkind = 'r' AND a.attnum > 0 "
        "AND NOT a.attisdropped ORDER BY c.relname, a.attnum").all()
    constraints = conn.exec_driver_sql(
        "SELECT c.relname, k.conname, k.contype, pg_get_constraintdef(k.oid) FROM pg_constraint k "
        "JOIN pg_class c ON c.oid = k.conrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = current_schema() ORDER BY c.relname, k.conname").all()
    indexes = conn.exec_driver_sql(
        "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema() "
        "ORDER BY tablename, indexname").all()
    return {
        "columns": [[t, name, kind, notnull, default] for t, name, kind, notnull, default in columns],
        "constraints": [[t, name, kind, local(definition)] for t, name, kind, definition in constraints],
        "indexes": [[t, name, local(definition)] for t, name, definition in indexes],
    }
