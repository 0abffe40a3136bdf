"""Which hash chain a store keeps, and how its links are computed.

A legacy store links each event to its predecessor with plain SHA-256, so whoever can write the
database can rewrite an event and recompute every later link. A keyed store links with HMAC-SHA256
under a secret kept outside the database (the workspace's chain key): without the key a rewrite breaks
the chain at the first rewritten position. ``store_meta`` records which chain the store keeps: the
algorithm, a key id (an HMAC of a fixed label, never the key), the first keyed position (a store that
held legacy events when it was keyed keeps those links) and a seal over them, so the record cannot be
edited unnoticed either.

Links prove every event up to the last one, but not that the last one is the last: deleting the newest events
leaves a shorter chain that is intact. So ``store_meta`` also keeps the chain head (row ``head``): the last
position and its hash, sealed with the key, rewritten in the same write transaction as every append (once per
transaction, not per event). ``verify`` checks that the log ends exactly there. See docs/events.md and
docs/durability.md.
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

from taskkernel.kernel.store.schema import store_meta

if TYPE_CHECKING:
    from taskkernel.kernel.store.db import UnitOfWork

LEGACY = "sha256"
KEYED = "hmac-sha256"
GENESIS_HASH = "0" * 64
_SEP = "\x1f"
_RECORD = "chain"
_HEAD = "head"
_READ_SQL = "SELECT value FROM store_meta WHERE name = ?"
# The head row, also read as a subquery of the command kernel's first statement (UnitOfWork.head_text).
HEAD_SQL = "SELECT value FROM store_meta WHERE name = 'head'"
_TAIL_SQL = "SELECT global_pos, hash FROM events ORDER BY global_pos DESC LIMIT 1"
_UPDATE_HEAD_SQL = "UPDATE store_meta SET value = ? WHERE name = 'head'"
_INSERT_HEAD_SQL = "INSERT INTO store_meta (name, value) VALUES ('head', ?)"
# The channel a commit that appended events notifies on PostgreSQL (kernel/store/listen.py), with the log's new end
# and the schema it is in as its payload: workspaces in other schemas of the database ignore it.
COMMIT_CHANNEL = "taskkernel_commit"
# PostgreSQL runs the head's two writes in this form (UnitOfWork.sql renders a statement for it once, cached): the
# same row, and that NOTIFY, in one statement, so the wake-up costs no round trip, and SQLite's statements and work
# stay as they were. NOTIFY is transactional: delivered when the transaction commits, never for one rolled back.
POSTGRES_FORMS = {sql: f"WITH h AS ({sql} RETURNING value) SELECT pg_notify('{COMMIT_CHANNEL}', "
                       "split_part(value, ' ', 1) || ' ' || current_schema()) FROM h"
                  for sql in (_INSERT_HEAD_SQL, _UPDATE_HEAD_SQL)}

Link = Callable[[str, int, str, int, str, int, str, str, str], str]
Sealer = Callable[[int, str], str]  # (last position, its hash) -> the head's seal


def _body(prev_hash: str, pos: int, stream_id: str, version: int, event_type: str, schema_version: int,
          data_text: str, meta_text: str, recorded_at: str) -> bytes:
    return _SEP.join((prev_hash, str(pos), stream_id, str(version), event_type, str(schema_version), data_text,
                      meta_text, recorded_at)).encode("utf-8")


def _head_message(pos: int, last_hash: str) -> bytes:
    return _SEP.join(("taskkernel chain head", str(pos), last_hash)).encode("utf-8")


def legacy_head_seal(pos: int, last_hash: str) -> str:
    """The head of a legacy (unkeyed) chain: a plain digest, which anyone who can write the database can recompute.
    It catches a lost tail (a bad restore, a bug), never a deliberate one."""
    return hashlib.sha256(_head_message(pos, last_hash)).hexdigest()


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

    def seal(self, keyed_from: int, sealed_head: bool = True) -> str:
        """The chain record's seal; ``sealed_head`` False is the format written before sealed heads."""
        return self._tag(f"{KEYED}|{self.key_id}|{keyed_from}{'|head' if sealed_head else ''}".encode("ascii"))

    def head_seal(self, pos: int, last_hash: str) -> str:
        return self._tag(_head_message(pos, last_hash))


@dataclass(frozen=True)
class ChainRecord:
    """What ``store_meta`` says about the chain; a store without a record keeps the legacy chain."""

    algorithm: str = LEGACY
    key_id: str = ""
    keyed_from: int = 0  # first position linked with the key; the ones before it are legacy links
    seal: str = ""
    sealed_head: bool = False  # the store keeps a keyed chain head (False: a record written before sealed heads)

    @property
    def keyed(self) -> bool:
        return self.algorithm == KEYED

    @classmethod
    def decode(cls, text: str | None) -> ChainRecord:
        if text is None:
            return cls()
        raw = json.loads(text)
        return cls(str(raw["algorithm"]), str(raw.get("key_id", "")), int(raw.get("keyed_from", 0)),
                   str(raw.get("seal", "")), raw.get("head") is True)

    def encode(self) -> str:
        return json.dumps({"algorithm": self.algorithm, "key_id": self.key_id, "keyed_from": self.keyed_from,
                           "seal": self.seal, "head": self.sealed_head}, sort_keys=True)


@dataclass(frozen=True)
class ChainHead:
    """Where the log ends (row ``head`` of ``store_meta``, text ``"<pos> <hash> <seal>"``): the last position, its
    hash, and a seal over both (HMAC with the chain key on a keyed store, a plain digest on a legacy one)."""

    pos: int
    hash: str
    seal: str

    @classmethod
    def decode(cls, text: str | None) -> ChainHead | None:
        if text is None:
            return None
        parts = text.split(" ")
        if len(parts) != 3 or not (parts[0].isascii() and parts[0].isdigit()):
            return cls(-1, "", "")  # an edited row that is not even a head: it matches no seal
        return cls(int(parts[0]), parts[1], parts[2])

    def encode(self) -> str:
        return f"{self.pos} {self.hash} {self.seal}"

    def sealed_by(self, sealer: Sealer) -> bool:
        return self.pos >= 0 and hmac.compare_digest(self.seal, sealer(self.pos, self.hash))


@dataclass
class Appending:
    """The chain as one write transaction extends it: the link and head seal to use, and where the log ends
    (read once per transaction, advanced by every append, sealed once at commit)."""

    link: Link
    sealer: Sealer
    pos: int
    prev: str
    stored: bool  # a head row exists (UPDATE) or not yet (INSERT)
    moved: bool = False


def read_record(conn: Connection) -> ChainRecord:
    return ChainRecord.decode(conn.execute(sa.select(store_meta.c.value).where(store_meta.c.name == _RECORD))
                              .scalar())


def read_head(conn: Connection) -> ChainHead | None:
    return ChainHead.decode(conn.execute(sa.select(store_meta.c.value).where(store_meta.c.name == _HEAD)).scalar())


def _read(uow: UnitOfWork, name: str) -> str | None:
    row = uow.sql(_READ_SQL, (name,)).fetchone()
    return row[0] if row else None


def _read_record(uow: UnitOfWork) -> ChainRecord:
    return ChainRecord.decode(_read(uow, _RECORD))


def _tail(uow: UnitOfWork) -> tuple[int, str]:
    row = uow.sql(_TAIL_SQL).fetchone()
    return (int(row[0]), str(row[1])) if row else (0, GENESIS_HASH)


def _legacy_head(uow: UnitOfWork) -> tuple[int, str]:
    """Where an unkeyed store ends: its (legacy) head row when it holds a sound one, else its last event."""
    head = ChainHead.decode(_read(uow, _HEAD))
    if head is not None and head.sealed_by(legacy_head_seal):
        return head.pos, head.hash
    return _tail(uow)


def _head_text(uow: UnitOfWork) -> str | None:
    """The head row as this transaction sees it: the value a statement of it already read, else read now."""
    if uow.head_read:
        return uow.head_text
    return _read(uow, _HEAD)


def _write_head(uow: UnitOfWork, head: ChainHead) -> None:
    uow.sql("DELETE FROM store_meta WHERE name = ?", (_HEAD,))
    uow.sql(_INSERT_HEAD_SQL, (head.encode(),))
    uow.head_read = False  # what was read before is not the row any more


class Chain:
    """One Database's side of the chain: the key it was given, and the link and head seal its appends use.

    Both are cached once the store's record is seen keyed with this key and a sealed head (a committed record
    never legitimately changes). A keyless Database re-reads the record in every write transaction, so it stops
    appending the moment another process keys the store.
    """

    def __init__(self, key: bytes | None) -> None:
        self.key = ChainKey(key) if key else None
        self._keyed: tuple[Link, Sealer] | None = None
        # The head row this Database last wrote: a row equal to it carries a seal made here with this key, so it
        # needs no second HMAC (any other text, a rewritten row included, is checked in full).
        self._sealed_here: tuple[str, int, str] | None = None  # (row text, position, last hash)

    @property
    def key_id(self) -> str | None:
        return self.key.key_id if self.key else None

    def begin_append(self, uow: UnitOfWork) -> Appending:
        """The chain as ``uow`` (under the writer lock) will extend it. A store holding no events yet is keyed
        here when this Database has a key; a keyed store whose head is missing or altered refuses (hash_chain)."""
        link, sealer, must_have_head = self._links(uow)
        text = _head_text(uow)
        sealed_here = self._sealed_here
        if sealed_here is not None and text == sealed_here[0]:  # the row this Database wrote, read back unchanged
            return Appending(link, sealer, sealed_here[1], sealed_here[2], stored=True)
        head = ChainHead.decode(text)
        if head is None:
            if must_have_head:
                raise ChainKeyError("hash_chain", "the store's chain head record is missing, so where the log ends "
                                    "cannot be proven; nothing was written. Run `taskkernel verify`")
            pos, prev = _tail(uow)
            return Appending(link, sealer, pos, prev, stored=False)
        if not head.sealed_by(sealer):
            raise ChainKeyError("hash_chain", "the store's chain head record was altered (its seal does not match); "
                                "nothing was written. Run `taskkernel verify`")
        return Appending(link, sealer, head.pos, head.hash, stored=True)

    def seal_head(self, uow: UnitOfWork, appending: Appending) -> None:
        """Record where the log now ends: once per write transaction, just before it commits (on PostgreSQL the
        same statement notifies the commit: POSTGRES_FORMS)."""
        pos, last = appending.pos, appending.prev
        value = f"{pos} {last} {appending.sealer(pos, last)}"  # ChainHead.encode, inlined on the hot path
        if appending.stored:
            uow.sql(_UPDATE_HEAD_SQL, (value,))
        else:
            uow.sql(_INSERT_HEAD_SQL, (value,))
        self._sealed_here = (value, pos, last)

    def _links(self, uow: UnitOfWork) -> tuple[Link, Sealer, bool]:
        """The link, the head seal, and whether the store must hold a head row already."""
        if self._keyed is not None:
            return (*self._keyed, True)
        record = _read_record(uow)
        if not record.keyed:
            if self.key is None:
                return legacy_link, legacy_head_seal, False
            pos, _ = _tail(uow)
            if pos:
                raise ChainKeyError("chain_unkeyed", f"the store holds {pos} events on an unkeyed chain but "
                                    "this workspace has a chain key: the chain record was removed or the store "
                                    "replaced; run `taskkernel verify` (docs/durability.md)")
            self.bind(uow, 0, GENESIS_HASH)
            return self.key.link, self.key.head_seal, True  # cached only once the record is committed and read back
        self.check(record)
        assert self.key is not None
        if not record.sealed_head:  # keyed before sealed heads: seal the log where it ends now
            self.seal_existing(uow, record)
            return self.key.link, self.key.head_seal, True
        self._keyed = (self.key.link, self.key.head_seal)
        return (*self._keyed, True)

    def bind(self, uow: UnitOfWork, head_pos: int, head_hash: str) -> None:
        """Record that links after ``head_pos`` are keyed with this Database's key, and seal the head there."""
        assert self.key is not None
        keyed_from = head_pos + 1
        record = ChainRecord(KEYED, self.key.key_id, keyed_from, self.key.seal(keyed_from), sealed_head=True)
        uow.sql("DELETE FROM store_meta WHERE name = ?", (_RECORD,))
        uow.sql("INSERT INTO store_meta (name, value) VALUES (?, ?)", (_RECORD, record.encode()))
        _write_head(uow, ChainHead(head_pos, head_hash, self.key.head_seal(head_pos, head_hash)))

    def bind_legacy(self, uow: UnitOfWork) -> None:
        """Key an unkeyed store from its next position (under the writer lock)."""
        self.bind(uow, *_legacy_head(uow))

    def seal_existing(self, uow: UnitOfWork, record: ChainRecord) -> None:
        """A store keyed before sealed heads: seal the head where the log ends now, and say so in the record."""
        assert self.key is not None
        pos, last = _tail(uow)
        upgraded = ChainRecord(KEYED, record.key_id, record.keyed_from, self.key.seal(record.keyed_from),
                               sealed_head=True)
        uow.sql("UPDATE store_meta SET value = ? WHERE name = ?", (upgraded.encode(), _RECORD))
        _write_head(uow, ChainHead(pos, last, self.key.head_seal(pos, last)))

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
        if not hmac.compare_digest(record.seal, self.key.seal(record.keyed_from, record.sealed_head)):
            raise ChainKeyError("hash_chain", "the store's chain record was altered; run `taskkernel verify`")
