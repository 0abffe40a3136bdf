"""Credentials: opaque bearer tokens mapped to a principal. Only a SHA-256 of each token is stored.

A token is checked for shape before it is looked up: an empty or malformed value is an error,
never "no credential" (an agent that blanks its variable must not become the owner).
"""

from __future__ import annotations

import re
import secrets

import sqlalchemy as sa

from taskkernel.kernel.canonical import sha256_hex, utc_now_iso
from taskkernel.kernel.model.principal import Principal
from taskkernel.kernel.reasons import KernelError, ReasonCode
from taskkernel.kernel.store.db import Database
from taskkernel.kernel.store.schema import credentials

TOKEN_PREFIX = "tk_"
_TOKEN_SHAPE = re.compile(r"tk_[A-Za-z0-9_-]{20,128}")
STALE_LEASE = "stale_lease"  # revoked_reason of a run token whose lease was fenced out
REVOKED_BY_OWNER = "revoked"  # revoked_reason of `taskkernel token revoke`
CREDENTIAL_ID_LEN = 16


def issue_token(db: Database, role: str, agent: str | None = None, *, task_id: str | None = None,
                round: int | None = None) -> str:
    """Mint a token for ``role`` (optionally scoped to one task and round); returned once, never stored."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with db.write() as uow:
        uow.conn.execute(credentials.insert().values(
            token_hash=sha256_hex(token), role=role, agent=agent or role.lower(), task_id=task_id,
            round=round, issued_at=utc_now_iso()))
    return token


def token_hash(token: str) -> str:
    return sha256_hex(token)


def revoke_token(db: Database, token: str) -> bool:
    return revoke_hash(db, token_hash(token))


def revoke_hash(db: Database, hashed: str, reason: str | None = None) -> bool:
    """Revoke by stored hash (the run ledger keeps only the hash of a run's token)."""
    with db.write() as uow:
        res = uow.conn.execute(credentials.update().where(
            credentials.c.token_hash == hashed, credentials.c.revoked_at.is_(None)
        ).values(revoked_at=utc_now_iso(), revoked_reason=reason))
        return bool(res.rowcount)


def list_credentials(db: Database) -> list[dict[str, str | int | None]]:
    """Every credential, oldest first, named by ``id`` (the first 16 hex digits of its hash): never the secret."""
    with db.read() as conn:
        rows = conn.execute(sa.select(credentials).order_by(credentials.c.issued_at, credentials.c.token_hash))
        return [{"id": r.token_hash[:CREDENTIAL_ID_LEN], "role": r.role, "agent": r.agent, "task_id": r.task_id,
                 "round": r.round, "issued_at": r.issued_at, "revoked_at": r.revoked_at,
                 "revoked_reason": r.revoked_reason} for r in rows]


def hashes_named(db: Database, ident: str) -> list[str]:
    """The stored hashes a credential id (a prefix of at least 8 hex digits) or a whole token names."""
    hashed = token_hash(ident) if well_formed(ident) else ident.lower()
    if len(hashed) < 8 or not re.fullmatch(r"[0-9a-f]+", hashed):
        return []
    with db.read() as conn:
        return list(conn.execute(sa.select(credentials.c.token_hash).where(
            credentials.c.token_hash.startswith(hashed))).scalars())


def well_formed(token: str) -> bool:
    return bool(_TOKEN_SHAPE.fullmatch(token))


def authenticate(db: Database, token: str) -> Principal:
    """The principal a token stands for, or ``KernelError``: ``actor_unverified`` for an empty, malformed,
    unknown or revoked token, ``stale_lease`` for a run token the coordinator fenced out."""
    return authenticate_hashed(db, checked_hash(token))


def checked_hash(token: str) -> str:
    """The stored hash of a token of the right shape; ``KernelError`` actor_unverified for any other value."""
    if not well_formed(token):
        raise KernelError(ReasonCode.ACTOR_UNVERIFIED,
                          "malformed credential: a token is 'tk_' followed by 20-128 URL-safe characters")
    return token_hash(token)


def authenticate_hashed(db: Database, hashed: str) -> Principal:
    """``authenticate`` for a well-formed token known by its stored hash only (a board's sign-in keeps no token)."""
    with db.read() as conn:
        row = conn.execute(sa.select(credentials.c.role, credentials.c.agent, credentials.c.task_id,
                                     credentials.c.round, credentials.c.revoked_at, credentials.c.revoked_reason)
                           .where(credentials.c.token_hash == hashed)).first()
    if row is None:
        raise KernelError(ReasonCode.ACTOR_UNVERIFIED, "unknown credential")
    if row.revoked_at is not None:
        if row.revoked_reason == STALE_LEASE:
            raise KernelError(ReasonCode.STALE_LEASE,
                              "this run's lease was taken over; its credential no longer acts")
        raise KernelError(ReasonCode.ACTOR_UNVERIFIED, "revoked credential")
    return Principal(row.role, row.agent, row.task_id, row.round)


def resolve_principal(db: Database, token: str) -> Principal | None:
    """Like ``authenticate`` but answering None for any credential that does not stand for a principal."""
    try:
        return authenticate(db, token)
    except KernelError:
        return None
