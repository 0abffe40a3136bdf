"""Which hash chain a store keeps, and how its links are computed.

A legacy store links each event to its predecessor with plain SHA-256, so whoever can write the
database can rewrite an event and recompute every later link. A keyed store links with HMAC-SHA256
under a secret kept outside the database (the workspace's chain key): without the key a rewrite breaks
the chain at the first rewritten position. ``store_meta`` records which chain the store keeps: the
algorithm, a key id (an HMAC of a fixed label, never the key), the first keyed position (a store that
held legacy events when it was keyed keeps those links) and a seal over them, so the record cannot be
edited unnoticed either. See docs/events.md and docs/durability.md.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from kernel.store.schema import store_meta

if TYPE_CHECKING:
    from kernel.store.db import UnitOfWork

LEGACY = "sha256"
KEYED = "hmac-sha256"
GENESIS_HASH = "0" * 64
_SEP = "\x1f"
_RECORD = "chain"
_READ_SQL = "SELECT value FROM store_meta WHERE name = ?"

Link = Callable[[str, int, str, int, str, int, str, str, str], str]


def _body(prev_hash: str, pos: int, stream_id: str, version: int, event_type: str, schema_version: int,
          data_text: str, meta_text: str, recorded_at: str) -> bytes:
    return _SEP.join((prev_hash, str(pos), stream_id, str(version), event_type, str(schema_version), data_text,
                      meta_text, recorded_at)).encode("utf-8")


def legacy_link(prev_hash: str, pos: int, stream_id: str, version: int, event_type: str, schema_version: int,
                data_text: str, meta_text: str, recorded_at: str) -> str:
    """sha256(previous hash ‖ canonical event); fields joined by U+001F, JSON already canonical."""
    return hashlib.sha256(_body(prev_hash, pos, stream_id, version, event_type, schema_version, data_text,
                                meta_text, recorded_at)).hexdigest()


class ChainKeyError(Exception):
    """The store's chain cannot be extended with the key this process holds; nothing was written."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


class ChainKey:
    """An HMAC-SHA256 chain key (RFC 2104). The inner and outer hash states are prepared once and copied for
    every link: 3x cheaper than ``hmac.new(...).copy()``, close to a plain SHA-256 on the command hot path."""

    def __init__(self, key: bytes) -> None:
        if len(key) < 16:
            raise ValueError("a chain key needs at least 16 bytes")
        block = (hashlib.sha256(key).digest() if len(key) > 64 else key).ljust(64, b"\0")
        self._inner = hashlib.sha256(bytes(b ^ 0x36 for b in block))
        self._outer = hashlib.sha256(bytes(b ^ 0x5C for b in block))
        self.key_id = self._tag(b"taskkernel chain key id")[:16]

    def _tag(self, data: bytes) -> str:
        inner, outer = self._inner.copy(), self._outer.copy()
        inner.update(data)
        outer.update(inner.digest())
        return outer.hexdigest()

    def link(self, prev_hash: str, pos: int, stream_id: str, version: int, event_type: str, schema_version: int,
             data_text: str, meta_text: str, recorded_at: str) -> str:
        return self._tag(_body(prev_hash, pos, stream_id, version, event_type, schema_version, data_text,
                               meta_text, recorded_at))

    def seal(self, keyed_from: int) -> str:
        return self._tag(f"{KEYED}|{self.key_id}|{keyed_from}".encode("ascii"))


@dataclass(frozen=True)
class ChainRecord:
    """What ``store_meta`` says about the chain; a store without a record keeps the legacy chain."""

    algorithm: str = LEGACY
    key_id: str = ""
    keyed_from: int = 0  # first position linked with the key; the ones before it are legacy links
    seal: str = ""

    @property
    def keyed(self) -> bool:
        return self.algorithm == KEYED

    @classmethod
    def decode(cls, text: str | None) -> ChainRecord:
        if text is None:
            return cls()
        raw = json.loads(text)
        return cls(str(raw["algorithm"]), str(raw.get("key_id", "")), int(raw.get("keyed_from", 0)),
                   str(raw.get("seal", "")))

    def encode(self) -> str:
        return json.dumps({"algorithm": self.algorithm, "key_id": self.key_id, "keyed_from": self.keyed_from,
                           "seal": self.seal}, sort_keys=True)


def read_record(conn: Connection) -> ChainRecord:
    return ChainRecord.decode(conn.execute(sa.select(store_meta.c.value).where(store_meta.c.name == _RECORD))
                              .scalar())


def _read_record(uow: UnitOfWork) -> ChainRecord:
    row = uow.sql(_READ_SQL, (_RECORD,)).fetchone()
    return ChainRecord.decode(row[0] if row else None)


class Chain:
    """One Database's side of the chain: the key it was given, and the link its appends use.

    The link is cached once the store's record is seen keyed with this key (a committed record never
    legitimately changes). A keyless Database re-reads the record in every write transaction, so it
    stops appending the moment another process keys the store.
    """

    def __init__(self, key: bytes | None) -> None:
        self.key = ChainKey(key) if key else None
        self._link: Link | None = None

    def link_for_append(self, uow: UnitOfWork, head_pos: int) -> Link:
        """The link for events appended in ``uow`` (under the writer lock) after position ``head_pos``.
        A store holding no events yet is keyed here when this Database has a key."""
        if self._link is not None:
            return self._link
        record = _read_record(uow)
        if not record.keyed:
            if self.key is None:
                return legacy_link
            if head_pos:
                raise ChainKeyError("chain_unkeyed", f"the store holds {head_pos} events on an unkeyed chain but "
                                    "this workspace has a chain key: the chain record was removed or the store "
                                    "replaced; run `taskkernel verify` (docs/durability.md)")
            self.bind(uow, 1)
            return self.key.link  # cached only once the record is committed and read back
        self.check(record)
        assert self.key is not None
        self._link = self.key.link
        return self._link

    def bind(self, uow: UnitOfWork, keyed_from: int) -> None:
        """Record that links from ``keyed_from`` on are keyed with this Database's key."""
        assert self.key is not None
        record = ChainRecord(KEYED, self.key.key_id, keyed_from, self.key.seal(keyed_from))
        uow.sql("DELETE FROM store_meta WHERE name = ?", (_RECORD,))
        uow.sql("INSERT INTO store_meta (name, value) VALUES (?, ?)", (_RECORD, record.encode()))

    def check(self, record: ChainRecord) -> None:
        """Refuse to extend a keyed chain without its key, with another key, or under an altered record."""
        if self.key is None:
            raise ChainKeyError("chain_key_missing", f"the store's event chain is keyed (key id {record.key_id}) "
                                "and this process has no chain key; restore the workspace's .taskkernel/chain.key "
                                "from its backup (docs/durability.md)")
        if record.key_id != self.key.key_id:
            raise ChainKeyError("chain_key_mismatch", f"the store's event chain is keyed with key id "
                                f"{record.key_id}, this workspace's chain key has id {self.key.key_id}; "
                                "restore the key that belongs to this database (docs/durability.md)")
        if not hmac.compare_digest(record.seal, self.key.seal(record.keyed_from)):
            raise ChainKeyError("hash_chain", "the store's chain record was altered; run `taskkernel verify`")
