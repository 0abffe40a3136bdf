"""Outbox relay: performs side effects recorded by accepted commands, at least once, after commit.

Rows are claimed with a lease so several coordinators can relay without running one row
twice at the same time; a crash after the effect but before `done` re-runs it, so handlers
must be idempotent on ``effect_key`` (the file adapter's tmp+rename writes are).

An effect that fails ``max_attempts`` times is given up (``failed``) but never silently: it is a dead letter,
kept with its last error and when it failed, which `up --once`, `effects list` and the board show until a person
fixes the cause and puts it back (`effects retry KEY`, ``retry_dead_letter``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import sqlalchemy as sa

from taskkernel.kernel.canonical import utc_now_iso
from taskkernel.kernel.logging import get_logger
from taskkernel.kernel.store.clock import iso, store_now
from taskkernel.kernel.store.db import Database
from taskkernel.kernel.store.schema import outbox

Handler = Callable[[str, dict[str, Any]], None]
log = get_logger(__name__)

FAILED = "failed"  # the status of a dead letter: attempts exhausted, waiting for a person
EFFECT_NOT_FOUND = "effect_not_found"  # retry_dead_letter: no outbox row has this key
EFFECT_NOT_DEAD = "effect_not_dead"  # retry_dead_letter: the row is pending, claimed or done, not given up


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
        with self.db.write() as uow:
            t = store_now(uow.conn)  # every relay, on any host, compares claims with one clock
            now, until = iso(t), iso(t + self.lease)
            due = sa.or_(outbox.c.status == "pending",
                         sa.and_(outbox.c.status == "claimed", outbox.c.claimed_until < now))
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
                values = {"status": "pending", "last_error": error}
                if (attempts or 0) >= self.max_attempts:
                    values.update(status=FAILED, failed_at=utc_now_iso())
                    log.error("outbox_effect_dead", effect_key=key, attempts=attempts, error=error)
            res = uow.conn.execute(outbox.update().where(outbox.c.effect_key == key, outbox.c.claim_token == token)
                                   .values(**values))
            if not res.rowcount:
                log.warning("outbox_claim_lost", effect_key=key)


def dead_letters(db: Database) -> list[dict[str, Any]]:
    """Every effect the relay gave up on, oldest source first: what a person must fix and retry. ``task_id`` is
    the task whose event wrote the effect (None for an effect without one); ``failed_at`` is None for a row that
    failed before the time was recorded; ``retried_by``/``retried_at`` name the last retry, if any."""
    with db.read() as conn:
        rows = conn.execute(
            sa.select(outbox.c.effect_key, outbox.c.effect, outbox.c.payload, outbox.c.attempts,
                      outbox.c.last_error, outbox.c.failed_at, outbox.c.retried_by, outbox.c.retried_at)
            .where(outbox.c.status == FAILED).order_by(outbox.c.source_pos, outbox.c.effect_key)).all()
    return [{"effect_key": r.effect_key, "effect": r.effect, "task_id": _task_of(r.payload),
             "attempts": r.attempts, "last_error": r.last_error, "failed_at": r.failed_at,
             "retried_by": r.retried_by, "retried_at": r.retried_at} for r in rows]


def _task_of(payload: str) -> str | None:
    try:
        task_id = json.loads(payload).get("task_id")
    except (ValueError, AttributeError):
        return None
    return task_id if isinstance(task_id, str) else None


@dataclass(frozen=True)
class RetryRefused:
    """Why a dead letter was not put back: ``code`` is EFFECT_NOT_FOUND or EFFECT_NOT_DEAD."""

    code: str
    message: str


def retry_dead_letter(db: Database, effect_key: str, by: str) -> RetryRefused | None:
    """Put a dead letter back to pending with its attempts cleared, recording ``by`` (the principal id) and when;
    the next relay pass runs it again. Only a ``failed`` row is touched (the update's own condition, so a
    concurrent retry or relay cannot be undone): a pending, claimed or done effect is refused, as is a key no
    row has. None when it was queued."""
    with db.write() as uow:
        res = uow.conn.execute(outbox.update().where(outbox.c.effect_key == effect_key, outbox.c.status == FAILED)
                               .values(status="pending", attempts=0, claimed_until=None, claim_token=None,
                                       failed_at=None, retried_by=by, retried_at=utc_now_iso()))
        if res.rowcount:
            log.warning("outbox_effect_retried", effect_key=effect_key, by=by)
            return None
        status = uow.conn.execute(sa.select(outbox.c.status).where(outbox.c.effect_key == effect_key)).scalar()
    if status is None:
        return RetryRefused(EFFECT_NOT_FOUND, f"no outbox effect {effect_key!r} (see `taskkernel effects list`)")
    return RetryRefused(EFFECT_NOT_DEAD, f"effect {effect_key!r} is {status}, not a dead letter: only an effect "
                                         "that exhausted its attempts is retried (the relay retries the others)")
