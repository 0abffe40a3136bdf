"""Credentials: opaque bearer tokens mapped to a principal. Only a SHA-256 of each token is stored."""

from __future__ import annotations

import secrets

import sqlalchemy as sa

from kernel.canonical import sha256_hex, utc_now_iso
from kernel.model.principal import LOCAL_OWNER, Principal
from kernel.store.db import Database
from kernel.store.schema import credentials

TOKEN_PREFIX = "tk_"


def issue_token(db: Database, role: str, agent: str | None = None, *, task_id: str | None = None,
                round: int | None = None) -> str:
    """Mint a token for ``role`` (optionally scoped to one task and round); returned once, never stored."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with db.write() as uow:
        uow.conn.execute(credentials.insert().values(
            token_hash=sha256_hex(token), role=role, agent=agent or role.lower(), task_id=task_id,
            round=round, issued_at=utc_now_iso()))
    return token


def revoke_token(db: Database, token: str) -> bool:
    with db.write() as uow:
        res = uow.conn.execute(credentials.update().where(
            credentials.c.token_hash == sha256_hex(token), credentials.c.revoked_at.is_(None)
        ).values(revoked_at=utc_now_iso()))
        return bool(res.rowcount)


def resolve_principal(db: Database, token: str | None) -> Principal | None:
    """No token: the workspace's local owner (ADMIN). Unknown or revoked token: None (unverified)."""
    if not token:
        return LOCAL_OWNER
    with db.read() as conn:
        row = conn.execute(sa.select(credentials.c.role, credentials.c.agent, credentials.c.task_id,
                                     credentials.c.round, credentials.c.revoked_at)
                           .where(credentials.c.token_hash == sha256_hex(token))).first()
    if row is None or row.revoked_at is not None:
        return None
    return Principal(row.role, row.agent, row.task_id, row.round)
