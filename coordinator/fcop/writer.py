"""Strict writing: new envelopes in the canonical G3 form fcop itself writes, and transition appends.

Key order follows fcop's serialisers (known keys in protocol order, then
unknown keys sorted, then ``transitions``), so fcop's v3 reader parses and
round-trips what we write. New TASKs get their creation event
``{from: null, to: inbox}``; later moves append one event each (Rule E/F),
keeping the body bytes and the existing front-matter text; an amendment rewrites the
front matter it changes (and the body) together with its event. Every write goes through
``safeio``: no symlinked folder or file is ever written through.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from taskkernel.coordinator.fcop import frontmatter
from taskkernel.coordinator.fcop.detect import FcopWorkspace
from taskkernel.coordinator.fcop.errors import FcopError, FcopReason
from taskkernel.coordinator.fcop.filenames import (
    EnvelopeKind,
    FcopFilename,
    is_role_code,
    normalize_reference,
    subject_short_for,
)
from taskkernel.coordinator.fcop.models import (
    PRIORITY_ALIASES,
    REPORT_STATUSES,
    REVIEW_DECISIONS,
    SEVERITY_ALIASES,
    Priority,
    Transition,
)
from taskkernel.coordinator.fcop.numbering import Published, allocate_and_publish
from taskkernel.coordinator.fcop.parse import DEFAULT_MAX_BYTES, decode
from taskkernel.coordinator.fcop.safeio import ensure_dir, read_bytes, rewrite, sha256_hex
from taskkernel.kernel.canonical import utc_now_iso

# Called with a new file's path and bytes just before it is published (under the numbering lock), so a
# caller can record it first: whoever finds the file then already knows it (see numbering).
BeforePublish = Callable[[Path, bytes], None]

_TASK_ORDER = ("protocol", "version", "sender", "recipient", "priority", "thread_key", "parent", "subject",
               "references")
_ISSUE_ORDER = ("protocol", "version", "reporter", "severity", "status", "summary", "created_at", "closed_at",
                "closed_by", "resolution")
_REVIEW_ORDER = ("protocol", "version", "type", "sender", "review_id", "subject_type", "subject_ref",
                 "reviewer_role", "reviewer_agent", "decision", "rationale", "required_changes", "decided_at",
                 "session_id")


def _ordered(fields: Mapping[str, Any], order: Iterable[str]) -> dict[str, Any]:
    present = {k: v for k, v in fields.items() if v is not None and v != [] and v != ""}
    out = {k: present.pop(k) for k in order if k in present}
    out.update(sorted(present.items()))
    return out


def _check_role(value: str, what: str) -> str:
    if not is_role_code(value):
        raise FcopError(FcopReason.INVALID_FIELD_VALUE, f"{what} {value!r} is not a role code")
    return value


def _priority(value: str | Priority) -> str:
    p = PRIORITY_ALIASES.get(str(value).lower())
    if p is None:
        raise FcopError(FcopReason.INVALID_FIELD_VALUE, f"priority {value!r} is not P0-P3 or an alias")
    return p.value


def _reserved_keys(extra: Mapping[str, Any], reserved: Iterable[str]) -> None:
    clash = sorted(set(extra) & set(reserved))
    if clash:
        raise FcopError(FcopReason.INVALID_FIELD_VALUE, f"extra keys {clash} would shadow protocol fields")


@dataclass(frozen=True)
class TaskDraft:
    """What a new TASK says. ``by``/``tool`` are recorded in its creation event."""

    sender: str
    recipient: str
    subject: str
    body: str
    priority: str = "P2"
    thread_key: str | None = None
    parent: str | None = None
    references: tuple[str, ...] = ()
    slot: str | None = None
    slug: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    by: str | None = None
    tool: str = "create_task"


def render_task(draft: TaskDraft, at: str | None = None, *, creation: Transition | None = None) -> bytes:
    """A new TASK's bytes; its one event is ``creation``, else ``{from: null, to: inbox}`` by draft.by."""
    _reserved_keys(draft.extra, (*_TASK_ORDER, "transitions"))
    fields = {"protocol": "fcop", "version": 1, "sender": _check_role(draft.sender, "sender"),
              "recipient": _check_role(draft.recipient, "recipient"), "priority": _priority(draft.priority),
              "thread_key": draft.thread_key, "subject": draft.subject,
              "parent": normalize_reference(draft.parent) if draft.parent else None,
              "references": [normalize_reference(r) for r in draft.references], **draft.extra}
    mapping = _ordered(fields, _TASK_ORDER)
    event = creation or Transition(at=at or _event_time(), to="inbox", by=draft.by or draft.sender, tool=draft.tool)
    mapping["transitions"] = [event.to_mapping()]
    return frontmatter.render(mapping, draft.body).encode("utf-8")


def _event_time() -> str:
    """UTC with an offset, as fcop writes ``transitions[].at`` (``…+00:00``)."""
    return utc_now_iso().replace("Z", "+00:00")


def _publish(ws: FcopWorkspace, kind: EnvelopeKind, directory: Path, name: Callable[[int, str], FcopFilename],
             render: Callable[[FcopFilename], bytes], date: str | None,
             before_publish: BeforePublish | None = None) -> Published:
    """Number and publish a new file in ``directory``, made first through the safe layer (a symlinked
    folder is refused before numbering touches it)."""
    ensure_dir(directory)

    def rendered(fn: FcopFilename) -> bytes:
        data = render(fn)
        if before_publish is not None:
            before_publish(directory / fn.render(), data)
        return data
    return allocate_and_publish(ws, kind, directory, name, rendered, date=date)


def write_task(ws: FcopWorkspace, draft: TaskDraft, *, date: str | None = None) -> Published:
    """A new TASK in the inbox (``_lifecycle/inbox/``, or ``tasks/`` in a G2 workspace)."""
    def name(seq: int, day: str) -> FcopFilename:
        return FcopFilename(kind=EnvelopeKind.TASK, date=day, sequence=seq, sender=draft.sender,
                            recipient=draft.recipient, slot=draft.slot, slug=draft.slug)
    return _publish(ws, EnvelopeKind.TASK, ws.inbox_dir, name, lambda _: render_task(draft), date)


def write_report(ws: FcopWorkspace, *, sender: str, recipient: str, task_id: str, body: str,
                 status: str = "done", priority: str = "P2", references: Iterable[str] = (),
                 supersedes: str | None = None,
                 slug: str | None = None, extra: Mapping[str, Any] | None = None,
                 date: str | None = None, before_publish: BeforePublish | None = None) -> Published:
    """A REPORT answering ``task_id`` (linked only by ``references``, as fcop's ``write_report`` does: the task
    first, then the report's own references, e.g. artifacts)."""
    extra = dict(extra or {})
    _reserved_keys(extra, (*_TASK_ORDER, "status", "supersedes"))
    if status not in REPORT_STATUSES:
        raise FcopError(FcopReason.INVALID_FIELD_VALUE, f"report status {status!r} not in {sorted(REPORT_STATUSES)}")
    fields = {"protocol": "fcop", "version": 1, "sender": _check_role(sender, "sender"),
              "recipient": _check_role(recipient, "recipient"), "priority": _priority(priority),
              "references": list(dict.fromkeys([normalize_reference(task_id), *references])), "status": status,
              "supersedes": normalize_reference(supersedes) if supersedes else None, **extra}
    data = frontmatter.render(_ordered(fields, _TASK_ORDER), body).encode("utf-8")

    def name(seq: int, day: str) -> FcopFilename:
        return FcopFilename(kind=EnvelopeKind.REPORT, date=day, sequence=seq, sender=sender, recipient=recipient,
                            slug=slug)
    return _publish(ws, EnvelopeKind.REPORT, ws.bucket_dir(EnvelopeKind.REPORT), name, lambda _: data, date,
                    before_publish)


def write_issue(ws: FcopWorkspace, *, reporter: str, summary: str, body: str, severity: str = "medium",
                extra: Mapping[str, Any] | None = None, date: str | None = None) -> Published:
    """An ISSUE in fcop's library form (``ISSUE-…-REPORTER.md``; reporter, severity, status, summary)."""
    extra = dict(extra or {})
    _reserved_keys(extra, _ISSUE_ORDER)
    if severity.lower() not in SEVERITY_ALIASES:
        raise FcopError(FcopReason.INVALID_FIELD_VALUE, f"severity {severity!r} not in {sorted(SEVERITY_ALIASES)}")
    fields = {"protocol": "fcop", "version": 1, "reporter": _check_role(reporter, "reporter"),
              "severity": SEVERITY_ALIASES[severity.lower()], "status": "open", "summary": summary,
              "created_at": utc_now_iso().replace("Z", "+00:00"), **extra}
    data = frontmatter.render(_ordered(fields, _ISSUE_ORDER), body).encode("utf-8")

    def name(seq: int, day: str) -> FcopFilename:
        return FcopFilename(kind=EnvelopeKind.ISSUE, date=day, sequence=seq, sender=reporter)
    return _publish(ws, EnvelopeKind.ISSUE, ws.bucket_dir(EnvelopeKind.ISSUE), name, lambda _: data, date)


def write_review(ws: FcopWorkspace, *, reviewer: str, subject_ref: str, decision: str, body: str = "",
                 subject_type: str = "task", rationale: str | None = None,
                 required_changes: Iterable[str] = (), extra: Mapping[str, Any] | None = None,
                 date: str | None = None, decided_at: str | None = None,
                 before_publish: BeforePublish | None = None) -> Published:
    """A REVIEW verdict in ``reviews/`` named ``REVIEW-…-REVIEWER-on-<subject>.md`` (its stem is its id);
    ``decided_at`` defaults to now."""
    extra = dict(extra or {})
    _reserved_keys(extra, _REVIEW_ORDER)
    if decision not in REVIEW_DECISIONS:
        raise FcopError(FcopReason.INVALID_FIELD_VALUE, f"decision {decision!r} not in {sorted(REVIEW_DECISIONS)}")
    changes = [c for c in required_changes if c]
    if (decision == "needs_changes") != bool(changes):
        raise FcopError(FcopReason.INVALID_FIELD_VALUE, "required_changes must be non-empty iff needs_changes")
    _check_role(reviewer, "reviewer")

    def name(seq: int, day: str) -> FcopFilename:
        return FcopFilename(kind=EnvelopeKind.REVIEW, date=day, sequence=seq, sender=reviewer,
                            subject_short=subject_short_for(subject_ref))

    def render(fn: FcopFilename) -> bytes:
        fields = {"protocol": "fcop", "version": 1, "type": "REVIEW", "sender": reviewer, "review_id": fn.stem,
                  "subject_type": subject_type, "subject_ref": subject_ref, "reviewer_role": reviewer,
                  "decision": decision, "rationale": rationale, "required_changes": changes,
                  "decided_at": decided_at or _event_time(), **extra}
        return frontmatter.render(_ordered(fields, _REVIEW_ORDER), body).encode("utf-8")
    return _publish(ws, EnvelopeKind.REVIEW, ws.bucket_dir(EnvelopeKind.REVIEW), name, render, date, before_publish)


def append_transition(path: Path, event: Transition, *, expect_sha256: str | None = None) -> str:
    """Append one event to a TASK's ``transitions:`` in place; returns the new sha256.

    Body bytes and the existing front-matter text are kept; a BOM is dropped
    (fcop cannot read one). With ``expect_sha256`` the file must still be the
    version the caller read. Run it under the task's lock (see ``locked``).
    """
    data, _ = read_bytes(path, DEFAULT_MAX_BYTES)
    if expect_sha256 is not None and sha256_hex(data) != expect_sha256:
        raise FcopError(FcopReason.CONTENT_CHANGED, "the file changed since it was read", path)
    text, _bom = decode(data)
    new = frontmatter.append_list_item(text, "transitions", event.to_mapping()).encode("utf-8")
    return rewrite(path, new, expect_sha256=sha256_hex(data))


def amend_task(path: Path, changes: Mapping[str, Any], event: Transition, *, expect_sha256: str | None = None) -> str:
    """Bring a TASK's front matter in line with an amendment (subject, priority, risk_level, references and,
    when given, the body) and append its event, in one rewrite; returns the new sha256.

    Other keys keep their values and order (a key new to the file goes before ``transitions``); the YAML
    block is re-dumped, so comments in it are not kept. Run it under the task's lock.
    """
    data, _ = read_bytes(path, DEFAULT_MAX_BYTES)
    if expect_sha256 is not None and sha256_hex(data) != expect_sha256:
        raise FcopError(FcopReason.CONTENT_CHANGED, "the file changed since it was read", path)
    text, _bom = decode(data)
    parts = frontmatter.split(text)
    if parts is None:
        raise FcopError(FcopReason.MISSING_FRONT_MATTER, "file has no front matter to amend", path)
    mapping = frontmatter.load_mapping(parts.yaml)
    transitions = mapping.pop("transitions", None) or []
    if not isinstance(transitions, list):
        raise FcopError(FcopReason.INVALID_FIELD_TYPE, "'transitions' is not a list", path)
    values = {"subject": changes.get("subject"), "risk_level": changes.get("risk_level"),
              "priority": _priority(changes["priority"]) if "priority" in changes else None,
              "references": [normalize_reference(r) for r in changes.get("references") or ()] or None}
    for key, value in values.items():
        if key in changes:
            if value is None:  # emptied (references: [])
                mapping.pop(key, None)
            else:
                mapping[key] = value
    mapping["transitions"] = [*transitions, event.to_mapping()]
    rest = parts.rest
    if "body" in changes:
        fence = rest[: len(rest) - len(parts.body)]
        fence += "" if fence.endswith("\n") else parts.newline
        body = str(changes["body"]).replace("\r\n", "\n").replace("\n", parts.newline)
        rest = fence + parts.newline + body + ("" if body.endswith(parts.newline) else parts.newline)
    new = parts.head + frontmatter.dump_mapping(mapping).replace("\n", parts.newline) + rest
    return rewrite(path, new.encode("utf-8"), expect_sha256=sha256_hex(data))
