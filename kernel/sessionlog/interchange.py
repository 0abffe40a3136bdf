"""The JSON Lines interchange format: one input per line, storage (record) order = line order.

Reading is strict: a line that is not a JSON object, or not a valid record, fails the whole file
with its line number (``unreadable_file``) instead of silently dropping history.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError

from kernel.sessionlog.models import (
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


def parse_lines(lines: Iterable[str]) -> dict[str, list[Rec]]:
    """Records per session, each list in file order."""
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
        out.setdefault(rec.session, []).append(
            Rec(rec.accept_seq, rec.input_id, rec.kind.value, rec.payload, rec.accepted, rec.legacy,
                rec.log_last_seq, rec.received_at, rec.reason, rec.accepted_by)
        )
    return out


def read_file(path: str | Path) -> dict[str, list[Rec]]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise LogFileError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise LogFileError(f"{path}: {exc}") from None
    return parse_lines(text.splitlines())


def to_line(session: str, r: Rec) -> str:
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
    return json.dumps(obj, ensure_ascii=False, sort_keys=False)


def dump_lines(session: str, records: Iterable[Rec]) -> Iterator[str]:
    for r in records:
        yield to_line(session, r)
