"""Lenient reading: bytes of one envelope file → a typed model, or FcopError with a stable reason.

The kind comes from the filename prefix (real files carry no ``type:``); CRLF
and a UTF-8 BOM are tolerated; aliases are normalised; unknown keys are kept.
Rule 3: a TASK/REPORT without protocol, version, sender or recipient does not exist.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from taskkernel.coordinator.fcop import frontmatter
from taskkernel.coordinator.fcop.errors import FcopError, FcopReason, FcopWarning
from taskkernel.coordinator.fcop.filenames import (
    AUTHORITY_WORDS,
    TASK_ID_RE,
    EnvelopeKind,
    FcopFilename,
    envelope_prefix,
    is_role_code,
    normalize_reference,
    parse_filename,
)
from taskkernel.coordinator.fcop.models import (
    ISSUE_STATUSES,
    PRIORITY_ALIASES,
    PROTOCOL_ALIASES,
    REPORT_STATUSES,
    REVIEW_DECISIONS,
    SEVERITY_ALIASES,
    EnvelopeModel,
    IssueEnvelope,
    Priority,
    ReportEnvelope,
    ReviewEnvelope,
    TaskEnvelope,
    Transition,
)
from taskkernel.coordinator.fcop.safeio import read_bytes
from taskkernel.kernel.model.ids import id_range_problem

DEFAULT_MAX_BYTES = 1024 * 1024
LEGACY_ENCODING = "gb18030"

_COMMON_KEYS = {"protocol", "version", "type"}
_KNOWN_KEYS: dict[EnvelopeKind, set[str]] = {
    EnvelopeKind.TASK: _COMMON_KEYS | {"sender", "recipient", "priority", "subject", "thread_key", "parent",
                                       "references", "supersedes", "risk_level", "transitions"},
    EnvelopeKind.REPORT: _COMMON_KEYS | {"sender", "recipient", "priority", "references", "status", "supersedes"},
    EnvelopeKind.ISSUE: _COMMON_KEYS | {"reporter", "sender", "recipient", "severity", "status", "summary",
                                        "references"},
    EnvelopeKind.REVIEW: _COMMON_KEYS | {"sender", "reviewer_role", "subject_ref", "subject_type", "decision",
                                         "rationale", "required_changes", "decided_at"},
}


def _text(fm: dict[str, Any], key: str, *, required: bool = False) -> str | None:
    value = fm.get(key)
    if value is None or value == "":
        if required:
            raise FcopError(FcopReason.MISSING_REQUIRED_FIELD, f"required front-matter field {key!r} is missing")
        return None
    if not isinstance(value, str | int | float | bool):
        raise FcopError(FcopReason.INVALID_FIELD_TYPE, f"{key!r} must be a scalar, got {type(value).__name__}")
    text = str(value).strip()
    if not text and required:
        raise FcopError(FcopReason.MISSING_REQUIRED_FIELD, f"required front-matter field {key!r} is empty")
    return text or None


def _role(fm: dict[str, Any], key: str, fallback: str | None = None) -> str:
    value = _text(fm, key, required=fallback is None) or fallback
    assert value is not None
    if not is_role_code(value, seat=True):
        raise FcopError(FcopReason.INVALID_FIELD_VALUE,
                        f"{key!r} = {value!r} is not a role code (A-Z, 0-9, _ and inner hyphens)")
    return value


def _text_list(fm: dict[str, Any], key: str) -> tuple[str, ...]:
    value = fm.get(key)
    if value is None:
        return ()
    items = [value] if isinstance(value, str | int | float) and not isinstance(value, bool) else value
    if not isinstance(items, list) or not all(isinstance(i, str | int | float) for i in items):
        raise FcopError(FcopReason.INVALID_FIELD_TYPE, f"{key!r} must be a string or a list of strings")
    return tuple(s for s in (str(i).strip() for i in items) if s)


def _references(fm: dict[str, Any], key: str = "references") -> tuple[str, ...]:
    return tuple(dict.fromkeys(normalize_reference(r) for r in _text_list(fm, key)))


# Fields early agents used instead of `references:` to name the TASK a REPORT answers, in the order we trust them.
REPORT_TASK_FIELDS = ("task_id", "ref_task", "task_ref", "related_task", "in_reply_to", "parent", "related")


def _report_references(fm: dict[str, Any]) -> tuple[tuple[str, ...], bool]:
    """The report's references, and whether its task was named outside `references:` (fcop rejects that; we
    attach it with a warning). A field that is not text is ignored rather than refusing the whole report."""
    references = _references(fm)
    if any(TASK_ID_RE.match(r) for r in references):
        return references, False
    for key in REPORT_TASK_FIELDS:
        value = fm.get(key)
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str) and TASK_ID_RE.match(ref := normalize_reference(item)):
                return (ref, *references), True
    return references, False


def _choice(fm: dict[str, Any], key: str, allowed: dict[str, str] | frozenset[str], default: str) -> str:
    value = _text(fm, key)
    if value is None:
        return default
    norm = value.lower()
    if isinstance(allowed, dict):
        if norm in allowed:
            return allowed[norm]
    elif norm in allowed:
        return norm
    raise FcopError(FcopReason.INVALID_FIELD_VALUE, f"{key!r} = {value!r}; expected one of {sorted(allowed)}")


def _decision(fm: dict[str, Any]) -> str:
    _text(fm, "decision", required=True)
    return _choice(fm, "decision", REVIEW_DECISIONS, "")


def _priority(fm: dict[str, Any]) -> Priority:
    return Priority(_choice(fm, "priority", {k: v.value for k, v in PRIORITY_ALIASES.items()}, "P2"))


def _transitions(fm: dict[str, Any]) -> tuple[Transition, ...]:
    raw = fm.get("transitions")
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise FcopError(FcopReason.INVALID_FIELD_TYPE, "'transitions' must be a list of events")
    out = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise FcopError(FcopReason.INVALID_FIELD_TYPE, f"transitions[{i}] must be a mapping")
        fields = {"from": _text(item, "from")}
        for key in ("at", "to", "by", "tool"):
            fields[key] = _text(item, key, required=True)
        for key in ("note", "supersedes"):
            fields[key] = _text(item, key)
        extras = {k: v for k, v in item.items() if k not in fields}
        out.append(Transition.model_validate({**extras, **fields}))
    return tuple(out)


def _envelope_header(fm: dict[str, Any]) -> None:
    protocol = _text(fm, "protocol", required=True)
    assert protocol is not None
    if protocol.lower() not in PROTOCOL_ALIASES:
        raise FcopError(FcopReason.UNSUPPORTED_PROTOCOL, f"protocol {protocol!r} is not FCoP")
    raw = fm.get("version")
    if raw is None:
        raise FcopError(FcopReason.MISSING_REQUIRED_FIELD, "required front-matter field 'version' is missing")
    version: int | None = None
    if isinstance(raw, int) and not isinstance(raw, bool):
        version = raw
    elif isinstance(raw, float) and raw.is_integer():
        version = int(raw)
    elif isinstance(raw, str) and raw.strip() in ("1", "1.0"):
        version = 1
    if version is None:
        raise FcopError(FcopReason.INVALID_FIELD_TYPE, f"'version' must be the integer 1, got {raw!r}")
    if version != 1:
        raise FcopError(FcopReason.UNSUPPORTED_ENVELOPE_VERSION,
                        f"envelope version {version} is not the G2/G3 version 1 (G4 files are not read)")


def _warnings(name: FcopFilename, fm: dict[str, Any], sender: str, recipient: str | None) -> list[FcopWarning]:
    out = []
    seats = {name.recipient, f"{name.recipient}.{name.slot}"} if name.slot else {name.recipient}
    if name.sender is not None and (sender != name.sender or (recipient is not None and name.recipient is not None
                                                              and recipient not in seats)):
        out.append(FcopWarning.ROUTING_MISMATCH)
    declared = fm.get("type")
    if declared is not None and str(declared).upper() != name.kind.value:
        out.append(FcopWarning.TYPE_MISMATCH)
    if sender in AUTHORITY_WORDS or recipient in AUTHORITY_WORDS:
        out.append(FcopWarning.AUTHORITY_WORD)
    return out


def decode(data: bytes, max_bytes: int = DEFAULT_MAX_BYTES) -> tuple[str, bool]:
    """Bytes → text (BOM removed, flag whether one was there); size, binary and encoding checks."""
    if len(data) > max_bytes:
        raise FcopError(FcopReason.FILE_TOO_LARGE, f"file is {len(data)} bytes; the limit is {max_bytes}")
    if not data:
        raise FcopError(FcopReason.EMPTY_FILE, "file is empty (0 bytes)")
    if b"\x00" in data:
        raise FcopError(FcopReason.BINARY_FILE, "file contains NUL bytes: not a Markdown text file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FcopError(FcopReason.INVALID_ENCODING, f"file is not valid UTF-8 ({exc.reason} at byte "
                                                     f"{exc.start})") from exc
    bom = text.startswith(frontmatter.BOM)
    return (text[1:] if bom else text), bom


def read_envelope(path: Path, *, max_bytes: int = DEFAULT_MAX_BYTES) -> EnvelopeModel:
    """Read (no symlinks, size-capped) and parse one file; FileNotFoundError if it is gone."""
    data, _ = read_bytes(path, max_bytes)
    return parse_envelope(path.name, data, max_bytes=max_bytes)


def _legacy_text(data: bytes) -> str:
    """History only, never live input: GB18030 (a superset of GBK), which early agents wrote, else UTF-8 with
    the damaged sequences replaced by U+FFFD (field files mix both). The file's bytes stay as they are."""
    try:
        return data.decode(LEGACY_ENCODING)
    except UnicodeDecodeError:
        return data.decode("utf-8", errors="replace")


def parse_envelope(filename: str, data: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES,
                   legacy_encoding: bool = False, sha256: str | None = None) -> EnvelopeModel:
    """Parse one file's bytes, named ``filename`` (a basename), into its envelope model. ``legacy_encoding``
    (the import): a file that is not UTF-8 but is GB18030 is read, with the warning ``legacy_encoding``.
    ``sha256``: the digest of ``data`` when the caller has it already."""
    name = parse_filename(filename)
    if name is None:
        claimed = envelope_prefix(filename)
        what = f"a {claimed.value} name" if claimed else "an envelope name"
        raise FcopError(FcopReason.BAD_FILENAME, f"{filename!r} is not {what} of the FCoP grammar (§3)")
    if problem := id_range_problem(name.date, name.sequence):  # it would overflow the kernel's id counter
        raise FcopError(FcopReason.INVALID_TASK_ID, f"{filename[:120]!r}: {problem}")
    legacy = False
    try:
        text, bom = decode(data, max_bytes)
    except FcopError as exc:
        if not legacy_encoding or exc.reason is not FcopReason.INVALID_ENCODING:
            raise
        text, bom, legacy = _legacy_text(data), False, True
    parts = frontmatter.split(text)
    if parts is None:
        raise FcopError(FcopReason.MISSING_FRONT_MATTER, "file does not start with a '---' fenced YAML block")
    fm = frontmatter.load_mapping(parts.yaml)
    _envelope_header(fm)
    body = parts.body[len(parts.newline):] if parts.body.startswith(parts.newline) else parts.body
    if parts.newline == "\r\n":
        body = body.replace("\r\n", "\n")
    common: dict[str, Any] = {
        "name": name, "front_matter": fm, "body": body, "sha256": sha256 or hashlib.sha256(data).hexdigest(),
        "size": len(data), "extra": {k: v for k, v in fm.items() if k not in _KNOWN_KEYS[name.kind]},
    }
    warnings = [FcopWarning.BOM_STRIPPED] if bom else []
    if legacy:
        warnings.append(FcopWarning.LEGACY_ENCODING)
    model: EnvelopeModel
    if name.kind is EnvelopeKind.TASK:
        sender, recipient = _role(fm, "sender"), _role(fm, "recipient")
        parent = _text(fm, "parent")
        model = TaskEnvelope(
            **common, sender=sender, recipient=recipient, priority=_priority(fm), subject=_text(fm, "subject"),
            thread_key=_text(fm, "thread_key"), parent=normalize_reference(parent) if parent else None,
            references=_references(fm), supersedes=_references(fm, "supersedes"),
            risk_level=_text(fm, "risk_level"), transitions=_transitions(fm),
            warnings=(*warnings, *_warnings(name, fm, sender, recipient)))
    elif name.kind is EnvelopeKind.REPORT:
        sender, recipient = _role(fm, "sender"), _role(fm, "recipient")
        references, named_elsewhere = _report_references(fm)
        if not references:
            raise FcopError(FcopReason.MISSING_REQUIRED_FIELD,
                            "a REPORT needs 'references' naming its TASK (TASK-YYYYMMDD-NNN)")
        if named_elsewhere:
            warnings.append(FcopWarning.TASK_NAMED_OUTSIDE_REFERENCES)
        model = ReportEnvelope(
            **common, sender=sender, recipient=recipient, priority=_priority(fm), references=references,
            status=_choice(fm, "status", REPORT_STATUSES, "done"), supersedes=_references(fm, "supersedes"),
            warnings=(*warnings, *_warnings(name, fm, sender, recipient)))
    elif name.kind is EnvelopeKind.ISSUE:
        reporter = _role(fm, "reporter", _text(fm, "sender") or name.sender)
        model = IssueEnvelope(
            **common, reporter=reporter, recipient=_text(fm, "recipient") or name.recipient,
            severity=_choice(fm, "severity", SEVERITY_ALIASES, "medium"),
            status=_choice(fm, "status", ISSUE_STATUSES, "open"), summary=_text(fm, "summary"),
            references=_references(fm), warnings=(*warnings, *_warnings(name, fm, reporter, None)))
    else:
        reviewer = _role(fm, "reviewer_role", _text(fm, "sender") or name.sender)
        subject_ref = _text(fm, "subject_ref", required=True)
        assert subject_ref is not None
        ref = normalize_reference(subject_ref)
        model = ReviewEnvelope(
            **common, reviewer=reviewer, subject_ref=subject_ref,
            subject_task_id=ref if TASK_ID_RE.match(ref) else None,
            subject_type=_text(fm, "subject_type"), decision=_decision(fm),
            rationale=_text(fm, "rationale"), required_changes=_text_list(fm, "required_changes"),
            decided_at=_text(fm, "decided_at"), warnings=(*warnings, *_warnings(name, fm, reviewer, None)))
    return model
