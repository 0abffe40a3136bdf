"""The JSON Lines interchange format: one input per line, storage (record) order = line order.

Reading is strict: a line that is not a JSON object, or not a valid record, fails the whole file
with its line number (``unreadable_file``) instead of silently dropping history.

Provenance: an export made with the workspace's key carries ``sig`` (HMAC-SHA256 over the line's other
fields) on each line. An importer that checks provenance keeps ``accepted_by`` only on lines whose
``sig`` its own key reproduces; any other line's claim is kept visible as ``IMPORTED:<claim>``, which
no grant, instruction or permission trusts.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError

from taskkernel.kernel.canonical import canonical_json
from taskkernel.kernel.sessionlog.authority import IMPORTED_PREFIX
from taskkernel.kernel.sessionlog.models import (
    InputKind,
    Rec,
    SessionLogError,
    SessionReason,
    check_boundary,
    validate_payload,
)


class LogFileError(SessionLogError):
    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(SessionReason.UNREADABLE_FILE, f"line {line}: {message}" if line else message)
        self.line = line


class InterchangeRecord(BaseModel):
    """One line of the file. Unknown top-level fields are ignored (forward compatibility)."""

    model_config = ConfigDict(extra="ignore")

    session: str = Field(min_length=1)
    input_id: str = Field(min_length=1)
    kind: InputKind
    accepted: StrictBool = True
    accept_seq: StrictInt | None = Field(default=None, ge=1)
    payload: dict[str, Any] = Field(default_factory=dict)
    legacy: StrictBool = False
    log_last_seq: StrictInt | None = Field(default=None, ge=0)
    received_at: str | None = None
    reason: str | None = None  # why an accepted:false record was refused
    accepted_by: str | None = None  # principal the host accepted it from (ROLE:agent)


_SIGNING_CONTEXT = b"taskkernel session export v1"


def signing_key(secret: bytes) -> bytes:
    """The export signing key, derived from the workspace secret (never the secret itself)."""
    return hmac.new(secret, _SIGNING_CONTEXT, hashlib.sha256).digest()


def _signature(key: bytes, obj: dict[str, Any]) -> str:
    body = canonical_json({k: v for k, v in obj.items() if k != "sig"})
    return hmac.new(key, body.encode("utf-8"), hashlib.sha256).hexdigest()


def _proven(key: bytes | None, raw: dict[str, Any]) -> bool:
    sig = raw.get("sig")
    return key is not None and isinstance(sig, str) and hmac.compare_digest(sig, _signature(key, raw))


def parse_lines(lines: Iterable[str], *, provenance_key: bytes | None = None,
                check_provenance: bool = False) -> dict[str, list[Rec]]:
    """Records per session, each list in file order. With ``check_provenance``, an ``accepted_by``
    that ``provenance_key`` cannot prove (no key, no or wrong ``sig``) becomes ``IMPORTED:<claim>``."""
    out: dict[str, list[Rec]] = {}
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
            rec = InterchangeRecord.model_validate(raw)
        except json.JSONDecodeError as exc:
            raise LogFileError(f"not JSON: {exc.msg}", no) from None
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "record"
            raise LogFileError(f"{where}: {first['msg']}", no) from None
        if rec.legacy and rec.accept_seq is not None:
            raise LogFileError("a record marked legacy cannot carry an accept_seq", no)
        if rec.accepted:
            try:
                validate_payload(rec.kind, rec.payload)
                if rec.accept_seq is not None:
                    check_boundary(rec.kind, rec.payload, rec.accept_seq)
            except SessionLogError as exc:
                raise LogFileError(exc.message, no) from None
        accepted_by = rec.accepted_by
        if check_provenance and accepted_by is not None and not _proven(provenance_key, raw):
            accepted_by = accepted_by if accepted_by.startswith(IMPORTED_PREFIX) else IMPORTED_PREFIX + accepted_by
        out.setdefault(rec.session, []).append(
            Rec(rec.accept_seq, rec.input_id, rec.kind.value, rec.payload, rec.accepted, rec.legacy,
                rec.log_last_seq, rec.received_at, rec.reason, accepted_by)
        )
    return out


def read_file(path: str | Path, *, provenance_key: bytes | None = None,
              check_provenance: bool = False) -> dict[str, list[Rec]]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise LogFileError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise LogFileError(f"{path}: {exc}") from None
    return parse_lines(text.splitlines(), provenance_key=provenance_key, check_provenance=check_provenance)


def record_json(session: str, r: Rec) -> dict[str, Any]:
    """One record as `session export` writes it (before its signature): the interchange fields."""
    obj: dict[str, Any] = {
        "session": session,
        "input_id": r.input_id,
        "kind": r.kind,
        "accepted": r.accepted,
        "accept_seq": r.seq,
        "payload": r.payload,
        "legacy": r.legacy,
        "log_last_seq": r.log_last_seq,
        "received_at": r.received_at,
    }
    if r.accepted_by is not None:
        obj["accepted_by"] = r.accepted_by
    if not r.accepted:
        obj["reason"] = r.refusal
    return obj


def to_line(session: str, r: Rec, key: bytes | None = None) -> str:
    obj = record_json(session, r)
    if key is not None:
        obj["sig"] = _signature(key, obj)
    return json.dumps(obj, ensure_ascii=False, sort_keys=False)


def dump_lines(session: str, records: Iterable[Rec], key: bytes | None = None) -> Iterator[str]:
    for r in records:
        yield to_line(session, r, key)
