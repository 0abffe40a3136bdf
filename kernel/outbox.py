"""Outbox relay: performs side effects recorded by accepted commands, at least once, after commit.

Rows are claimed with a lease so several coordinators can relay without running one row
twice at the same time; a crash after the effect but before `done` re-runs it, so handlers
must be idempotent on ``effect_key`` (the file adapter's tmp+rename writes are).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from taskkernel.kernel.canonical import utc_now_iso
from taskkernel.kernel.logging import get_logger
from taskkernel.kernel.store.db import Database
from taskkernel.kernel.store.schema import outbox

Handler = Callable[[str, dict[str, Any]], None]
log = get_logger(__name__)


class OutboxRelay:
    def __init__(self, db: Database, handlers: Mapping[str, Handler], lease_seconds: float = 60.0,
                 max_attempts: int = 5) -> None:
        self.db = db
        self.handlers = dict(handlers)
        self.lease = timedelta(seconds=lease_seconds)
        self.max_attempts = max_attempts

    def run_pending(self, limit: int = 100, claim_size: int = 10) -> int:
        """Perform up to ``limit`` due effects in source order, claiming a few at a time so each lease
        covers little work; returns how many completed."""
        done = 0
        while done < limit:
            claimed = self._claim(min(claim_size, limit - done))
            if not claimed:
                break
            token = claimed[0][3]
            for key, effect, payload, _ in claimed:
                handler = self.handlers.get(effect)
                try:
                    if handler is None:
                        raise LookupError(f"no handler registered for effect {effect!r}")
                    handler(key, json.loads(payload))
                except Exception as exc:  # noqa: BLE001 - an effect failure must not stop the relay
                    log.warning("outbox_effect_failed", effect_key=key, error=str(exc))
                    self._finish(key, token, error=str(exc))
                    continue
                self._finish(key, token, error=None)
                done += 1
            if len(claimed) < claim_size:
                break
        return done

    def _claim(self, limit: int) -> list[tuple[str, str, str, str]]:
        now = utc_now_iso()
        until = (datetime.now(UTC) + self.lease).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        due = sa.or_(outbox.c.status == "pending",
                     sa.and_(outbox.c.status == "claimed", outbox.c.claimed_until < now))
        with self.db.write() as uow:
            rows = uow.conn.execute(
                sa.select(outbox.c.effect_key, outbox.c.effect, outbox.c.payload)
                .where(due, outbox.c.effect.in_(list(self.handlers)))
                .order_by(outbox.c.source_pos).limit(limit)).all()
            token = uuid.uuid4().hex
            if rows:
                uow.conn.execute(outbox.update().where(outbox.c.effect_key.in_([r[0] for r in rows]))
                                 .values(status="claimed", claimed_until=until, claim_token=token,
                                         attempts=outbox.c.attempts + 1))
        return [(r[0], r[1], r[2], token) for r in rows]

    def _finish(self, key: str, token: str, error: str | None) -> None:
        """Record the outcome only if this relay still holds the claim (its token is the fence)."""
        with self.db.write() as uow:
            if error is None:
                values: dict[str, Any] = {"status": "done", "done_at": utc_now_iso(), "last_error": None}
            else:
                attempts = uow.conn.execute(sa.select(outbox.c.attempts).where(outbox.c.effect_key == key)).scalar()
                values = {"status": "failed" if (attempts or 0) >= self.max_attempts else "pending",
                          "last_error": error}
            res = uow.conn.execute(outbox.update().where(outbox.c.effect_key == key, outbox.c.claim_token == token)
                                   .values(**values))
            if not res.rowcount:
                log.warning("outbox_claim_lost", effect_key=key)
