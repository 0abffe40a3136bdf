"""Alembic's environment: always online, on the connection ``taskkernel.coordinator.schema`` hands over, inside
its write transaction (under the writer lock), so every revision of one upgrade commits together or not at all."""

from __future__ import annotations

from alembic import context

from taskkernel.coordinator.schema import target_metadata
from taskkernel.kernel.store.version import VERSION_TABLE

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("taskkernel migrations run through taskkernel.coordinator.schema (`taskkernel db upgrade`), "
                       "which supplies the connection; there is no offline mode")

context.configure(
    connection=connection,
    target_metadata=target_metadata(connection.dialect.name),
    version_table=VERSION_TABLE,
    render_as_batch=True,  # autogenerate writes SQLite-safe ALTERs (copy-and-move) for the next revision
    compare_server_default=True,
)
with context.begin_transaction():
    context.run_migrations()
