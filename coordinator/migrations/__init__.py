"""Alembic migration scripts for the whole schema (docs/migrations.md): ``env.py`` and ``versions/``.

Run only through ``taskkernel.coordinator.schema`` (``taskkernel db upgrade``), which hands env.py the
connection of its write transaction: there is no alembic.ini and no offline (``--sql``) mode.
"""
