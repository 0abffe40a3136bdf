"""Append-only event store: optimistic concurrency per stream, commit-ordered global
position, a hash chain for tamper evidence (keyed with HMAC-SHA256 when the Database holds the
workspace's chain key, see chain.py), and upcasting on read."""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from taskkernel.kernel.canonical import canonical_json, utc_now_iso
from taskkernel.kernel.reasons import ConcurrencyError
from taskkernel.kernel.store.chain import (
    GENESIS_HASH,
    Chain,
    ChainKey,
    Link,
    Sealer,
    legacy_head_seal,
    legacy_link,
    read_head,
    read_record,
)
from taskkernel.kernel.store.db import UnitOfWork
from taskkernel.kernel.store.schema import events as events_table

chain_hash = legacy_link  # the legacy (unkeyed) link, for code that writes raw legacy rows

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class NewEvent:
    type: str
    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class RecordedEvent:
    global_pos: int
    stream_id: str
    stream_version: int
    type: str
    schema_version: int
    data: dict[str, Any]
    meta: dict[str, Any]
    recorded_at: str
    hash: str


class Upcasters:
    """Pure functions turning an event's data from schema version v to v+1, applied on read."""

    def __init__(self) -> None:
        self._current: dict[str, int] = {}
        self._steps: dict[tuple[str, int], Upcaster] = {}

    def current_version(self, event_type: str) -> int:
        return self._current.get(event_type, 1)

    def register(self, event_type: str, from_version: int, fn: Upcaster) -> None:
        self._steps[(event_type, from_version)] = fn
        self._current[event_type] = max(self._current.get(event_type, 1), from_version + 1)

    def upcast(self, event_type: str, version: int, data: dict[str, Any]) -> dict[str, Any]:
        target = self.current_version(event_type)
        while version < target:
            data = self._steps[(event_type, version)](data)
            version += 1
        return data


_STREAM_HEAD_SQL = "SELECT max(stream_version) FROM events WHERE stream_id = ?"
_INSERT_SQL = ("INSERT INTO events (global_pos, stream_id, stream_version, event_type, schema_version, data, meta,"
               " recorded_at, hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)")
_COLUMNS = (events_table.c.global_pos, events_table.c.stream_id, events_table.c.stream_version,
            events_table.c.event_type, events_table.c.schema_version, events_table.c.data,
            events_table.c.meta, events_table.c.recorded_at, events_table.c.hash)


class EventStore:
    def __init__(self, upcasters: Upcasters | None = None) -> None:
        self.upcasters = upcasters or Upcasters()

    # -- writing -----------------------------------------------------------------------------
    def stream_version(self, uow: UnitOfWork, stream_id: str) -> int:
        return uow.sql(_STREAM_HEAD_SQL, (stream_id,)).fetchone()[0] or 0

    def append(self, uow: UnitOfWork, stream_id: str, expected_version: int,
               new_events: Sequence[NewEvent], meta: dict[str, Any],
               *, verified_version: bool = False) -> list[RecordedEvent]:
        """Append after ``expected_version``; raise ConcurrencyError if the head moved.

        ``verified_version`` lets a caller that already read the stream head inside this
        same write transaction skip the re-read (the writer lock keeps it valid).
        """
        if not verified_version:
            actual = self.stream_version(uow, stream_id)
            if actual != expected_version:
                raise ConcurrencyError(stream_id, expected_version, actual)
        chain = uow.appending
        if chain is None:
            chain = uow.appending = uow.chain.begin_append(uow)
        pos, prev, link = chain.pos, chain.prev, chain.link
        meta_text = canonical_json(meta)
        recorded_at = meta.get("recorded_at") or utc_now_iso()
        rows: list[tuple[Any, ...]] = []
        out: list[RecordedEvent] = []
        version = expected_version
        for ev in new_events:
            pos += 1
            version += 1
            schema_version = self.upcasters.current_version(ev.type)
            data_text = canonical_json(ev.data)
            h = link(prev, pos, stream_id, version, ev.type, schema_version, data_text, meta_text, recorded_at)
            rows.append((pos, stream_id, version, ev.type, schema_version, data_text, meta_text, recorded_at, h))
            out.append(RecordedEvent(pos, stream_id, version, ev.type, schema_version, ev.data, meta,
                                     recorded_at, h))
            prev = h
        try:
            if len(rows) == 1:
                uow.sql(_INSERT_SQL, rows[0])
            else:
                uow.sql_many(_INSERT_SQL, rows)
        except Exception as exc:  # a unique violation: the head moved despite the check; never overwrite
            if "unique" in str(exc).lower() or "duplicate" in str(exc).lower():
                raise ConcurrencyError(stream_id, expected_version, -1) from exc
            raise
        chain.pos, chain.prev, chain.moved = pos, prev, True  # sealed once, when the transaction commits
        return out

    def append_at_head(self, uow: UnitOfWork, stream_id: str, new_events: Sequence[NewEvent],
                       meta: dict[str, Any]) -> list[RecordedEvent]:
        """Append after whatever the stream holds now (for streams with a single writer under the lock,
        such as goal and gate records, where no caller-held version needs checking)."""
        head = self.stream_version(uow, stream_id)
        return self.append(uow, stream_id, head, new_events, meta, verified_version=True)

    # -- reading -----------------------------------------------------------------------------
    def read_stream(self, conn: Connection, stream_id: str) -> list[RecordedEvent]:
        q = sa.select(*_COLUMNS).where(events_table.c.stream_id == stream_id).order_by(
            events_table.c.stream_version)
        return [self._decode(r) for r in conn.execute(q)]

    def event_at(self, conn: Connection, global_pos: int) -> RecordedEvent | None:
        row = conn.execute(sa.select(*_COLUMNS).where(events_table.c.global_pos == global_pos)).first()
        return self._decode(row) if row else None

    def read_all(self, conn: Connection, from_pos: int = 1, batch: int = 5000,
                 stream_prefix: str | None = None) -> Iterator[RecordedEvent]:
        """Every event from ``from_pos`` in global order, fetched in bounded batches."""
        pos = from_pos
        while True:
            q = sa.select(*_COLUMNS).where(events_table.c.global_pos >= pos)
            if stream_prefix:
                q = q.where(events_table.c.stream_id.startswith(stream_prefix, autoescape=True))
            rows = conn.execute(q.order_by(events_table.c.global_pos).limit(batch)).all()
            if not rows:
                return
            for r in rows:
                yield self._decode(r)
            pos = rows[-1][0] + 1

    def raw_rows(self, conn: Connection, from_pos: int = 1, batch: int = 5000) -> Iterator[tuple[Any, ...]]:
        """Undecoded rows in global order (for the chain verifier and bulk rebuilds)."""
        pos = from_pos
        while True:
            q = sa.select(*_COLUMNS).where(events_table.c.global_pos >= pos).order_by(
                events_table.c.global_pos).limit(batch)
            rows = conn.execute(q).all()
            if not rows:
                return
            yield from rows
            pos = rows[-1][0] + 1

    def _decode(self, r: Any) -> RecordedEvent:
        data = self.upcasters.upcast(r[3], r[4], json.loads(r[5]))
        return RecordedEvent(r[0], r[1], r[2], r[3], r[4], data, json.loads(r[6]), r[7], r[8])


@dataclass(frozen=True)
class ChainBreak:
    global_pos: int
    detail: str
    reason: str = "hash_chain"  # or chain_key_missing, chain_key_mismatch, chain_unkeyed


def log_end(conn: Connection) -> tuple[int, str]:
    """The last position in the log and its hash ((0, genesis) for an empty log)."""
    row = conn.exec_driver_sql("SELECT global_pos, hash FROM events ORDER BY global_pos DESC LIMIT 1").first()
    return (int(row[0]), str(row[1])) if row else (0, GENESIS_HASH)


def verify_chain(store: EventStore, conn: Connection, chain: Chain | None = None) -> ChainBreak | None:
    """Walk the hash chain with the links the store's record names, and check that the log ends exactly at its
    sealed head; return the first break, or None. ``chain`` holds the key (None: a keyed chain cannot be proven
    past its legacy part)."""
    record, key = read_record(conn), chain.key if chain else None
    end, end_hash = log_end(conn)
    if not record.keyed:
        brk = _walk(store, conn, None, end + 1)
        if brk is None and key is not None and end:
            return ChainBreak(1, "the store's chain is unkeyed but this workspace has a chain key: the chain "
                                 "record was removed or the store replaced, so no link can be proven",
                              "chain_unkeyed")
        return _first(brk, _check_head(conn, legacy_head_seal, False, end, end_hash))
    if key is None or key.key_id != record.key_id:
        brk = _walk(store, conn, None, record.keyed_from)  # the legacy part can still be checked
        if brk is not None:
            return brk
        if key is None:
            return ChainBreak(record.keyed_from, f"the chain is keyed (key id {record.key_id}) and no chain key "
                                                 "was given: it cannot be proven", "chain_key_missing")
        return ChainBreak(record.keyed_from, f"the chain is keyed with key id {record.key_id}, the workspace's "
                                             f"key has id {key.key_id}: it cannot be proven", "chain_key_mismatch")
    keyed_from, sealed_head = record.keyed_from, record.sealed_head
    if not hmac.compare_digest(record.seal, key.seal(keyed_from, sealed_head)):
        # an edited record: the seal still names the true first keyed position and format (position 1 and a
        # sealed head if the seal was edited too)
        keyed_from, sealed_head = next(((p, h) for p in range(1, end + 2) for h in (True, False)
                                        if hmac.compare_digest(record.seal, key.seal(p, h))), (1, True))
    brk = _first(_walk(store, conn, key, keyed_from), _check_head(conn, key.head_seal, sealed_head, end, end_hash))
    if brk is None and (keyed_from, sealed_head) != (record.keyed_from, record.sealed_head):
        return ChainBreak(min(keyed_from, record.keyed_from), f"the chain record was altered: it says keyed from "
                                                              f"{record.keyed_from}, its seal {keyed_from}"
                                                              + ("" if sealed_head == record.sealed_head else
                                                                 ", and it hides the sealed head"))
    return brk


def _first(*breaks: ChainBreak | None) -> ChainBreak | None:
    return min((b for b in breaks if b is not None), key=lambda b: b.global_pos, default=None)


def _check_head(conn: Connection, sealer: Sealer, required: bool, end: int, end_hash: str) -> ChainBreak | None:
    """The log must end exactly at the sealed head: a missing or unsealed head, or a log that ends before it
    (its newest events deleted), is a break where the log now ends plus one. ``required``: a keyed store that
    seals its head (a legacy store, or one keyed before sealed heads, may have no head row)."""
    head = read_head(conn)
    if head is None:
        return ChainBreak(end + 1, "the chain head record is missing: where the log ends cannot be proven "
                                   "(the newest events may have been deleted)") if required else None
    if not head.sealed_by(sealer):
        return ChainBreak(end + 1, "the chain head record does not match its seal: it was rewritten without the "
                                   "chain key, so where the log ends cannot be proven")
    if head.pos > end:
        return ChainBreak(end + 1, f"the log ends at position {end} but its sealed head is at {head.pos}: "
                                   f"the newest {head.pos - end} event(s) were deleted")
    if head.pos < end:
        return ChainBreak(head.pos + 1, f"the sealed head is at position {head.pos} but the log goes on to {end}: "
                                        "events were added without the chain head")
    if not hmac.compare_digest(head.hash, end_hash):
        return ChainBreak(end, "the last event is not the one the chain head sealed")
    return None


def _walk(store: EventStore, conn: Connection, key: ChainKey | None, keyed_from: int) -> ChainBreak | None:
    """Check every link: legacy before ``keyed_from``, keyed from there (a keyless walk stops there)."""
    prev = GENESIS_HASH
    expected_pos = 1
    for r in store.raw_rows(conn):
        pos = r[0]
        if pos != expected_pos:
            return ChainBreak(expected_pos, f"position {expected_pos} is missing (next is {pos})")
        if pos >= keyed_from and key is None:
            return None
        link: Link = key.link if pos >= keyed_from and key is not None else legacy_link
        h = link(prev, pos, r[1], r[2], r[3], r[4], r[5], r[6], r[7])
        if not hmac.compare_digest(h, r[8]):
            return ChainBreak(pos, "hash does not match the event and its predecessor")
        prev = h
        expected_pos = pos + 1
    return None
