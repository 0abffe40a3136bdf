"""The FCoP G2/G3 filename grammar (protocol digest §3), parsed into a small model.

Reading is lenient where field data differs from the library (a sequence wider
than three digits, ISSUE names with ``-to-RECIPIENT`` or a bare summary);
writing always renders the library's canonical form, which ``fcop``'s own
``parse_*_filename`` functions accept (for sequences up to 999). The grammar
is checked here; the ranges (a real date, at most nine digits, see
taskkernel.kernel.model.ids) by the parser, so such a name is ``invalid_task_id``.
"""

from __future__ import annotations

import hashlib
import os
import re
from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from taskkernel.kernel.model.ids import TASK_ID_RE as TASK_ID_RE  # one grammar for ids in files and commands

ROLE = r"[A-Z][A-Z0-9_]*(?:-[A-Z0-9_]+)*"
SLUG = r"[a-z](?:[a-z0-9-]*[a-z0-9])?"
ROLE_RE = re.compile(rf"^{ROLE}$")
SEAT_RE = re.compile(rf"^{ROLE}(?:\.{ROLE})?$")  # ROLE or ROLE.SLOT
SLUG_RE = re.compile(rf"^{SLUG}$")
SUBJECT_SHORT_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")
BROADCAST = "TEAM"
RESERVED_ROLES = frozenset({"ADMIN", "SYSTEM"})
AUTHORITY_WORDS = frozenset({"BOSS", "CEO", "OWNER", "ROOT", "SUPERUSER", "GOD", "MASTER"})

_SEQ = r"(\d{8})-(\d{3,})"
_TASK_RE = re.compile(rf"^TASK-{_SEQ}-({ROLE})-to-({ROLE})(?:\.({ROLE}))?(?:-({SLUG}))?\.md$")
_REPORT_RE = re.compile(rf"^REPORT-{_SEQ}-({ROLE})-to-({ROLE})(?:-({SLUG}))?\.md$")
_ISSUE_RE = re.compile(rf"^ISSUE-{_SEQ}-({ROLE})(?:-to-({ROLE}))?(?:-({SLUG}))?\.md$")
_ISSUE_SUMMARY_RE = re.compile(rf"^ISSUE-{_SEQ}-({SLUG})\.md$")
_REVIEW_RE = re.compile(rf"^REVIEW-{_SEQ}-({ROLE})-on-([a-z0-9][a-z0-9-]*)\.md$")


class EnvelopeKind(StrEnum):
    TASK = "TASK"
    REPORT = "REPORT"
    ISSUE = "ISSUE"
    REVIEW = "REVIEW"


class FcopFilename(BaseModel):
    """One parsed envelope filename. ``sender`` is the reporter (ISSUE) or reviewer (REVIEW)."""

    model_config = ConfigDict(frozen=True)

    kind: EnvelopeKind
    date: str
    sequence: int
    sender: str | None
    recipient: str | None = None
    slot: str | None = None
    slug: str | None = None
    subject_short: str | None = None

    @property
    def id(self) -> str:
        """``TASK-YYYYMMDD-NNN`` (also for REPORT/ISSUE); a REVIEW's id is its whole stem (fcop rule)."""
        if self.kind is EnvelopeKind.REVIEW:
            return self.stem
        return f"{self.kind.value}-{self.date}-{self.sequence:03d}"

    @property
    def stem(self) -> str:
        return self.render()[: -len(".md")]

    @property
    def is_broadcast(self) -> bool:
        """``-to-TEAM``: every role except the sender."""
        return self.recipient == BROADCAST

    def render(self) -> str:
        head = f"{self.kind.value}-{self.date}-{self.sequence:03d}"
        slug = f"-{self.slug}" if self.slug else ""
        if self.kind is EnvelopeKind.TASK:
            seat = f".{self.slot}" if self.slot else ""
            return f"{head}-{self.sender}-to-{self.recipient}{seat}{slug}.md"
        if self.kind is EnvelopeKind.REPORT:
            return f"{head}-{self.sender}-to-{self.recipient}{slug}.md"
        if self.kind is EnvelopeKind.ISSUE:
            who = (self.sender or "") + (f"-to-{self.recipient}" if self.recipient else "")
            return f"{head}-{who}{slug}.md" if who else f"{head}{slug}.md"
        return f"{head}-{self.sender}-on-{self.subject_short}.md"


def envelope_prefix(name: str) -> EnvelopeKind | None:
    """The kind a name *claims* to be (``TASK-…``), whether or not the rest is well formed."""
    head = name.split("-", 1)[0]
    try:
        return EnvelopeKind(head)
    except ValueError:
        return None


# A reason note ("Not applied", "Moved back") sits beside its file under a name no envelope rule matches:
# no envelope prefix (ours or fcop's ``^TASK-`` style patterns) and no ``.md``/``.fcop`` suffix, so neither
# our scan nor fcop's readers (``TASK-*.md`` globs, ``*.md`` counts) take it for an envelope.
REASON_NOTE_PREFIX = "_reason."
REASON_NOTE_SUFFIX = ".txt"
_NAME_MAX = 255


def reason_note_name(name: str) -> str:
    """The one note name for the file ``name``: ``_reason.<name>.txt`` (shortened with a digest if too long)."""
    note = f"{REASON_NOTE_PREFIX}{name}{REASON_NOTE_SUFFIX}"
    if len(os.fsencode(note)) <= _NAME_MAX and name.isprintable():
        return note
    digest = hashlib.sha256(os.fsencode(name)).hexdigest()[:12]
    keep = "".join(c if c.isascii() and c.isprintable() and c not in "/\\" else "_" for c in name)
    return f"{REASON_NOTE_PREFIX}{keep[:80]}-{digest}{REASON_NOTE_SUFFIX}"


def is_reason_note(name: str) -> bool:
    """A reason note's name (never an envelope: see :func:`reason_note_name`)."""
    return name.startswith(REASON_NOTE_PREFIX) and name.endswith(REASON_NOTE_SUFFIX)


def parse_filename(name: str) -> FcopFilename | None:
    """Parse a basename; ``None`` for anything that is not a well-formed envelope name."""
    kind = envelope_prefix(name)
    if kind is EnvelopeKind.TASK and (m := _TASK_RE.match(name)):
        return FcopFilename(kind=kind, date=m[1], sequence=int(m[2]), sender=m[3], recipient=m[4],
                            slot=m[5], slug=m[6])
    if kind is EnvelopeKind.REPORT and (m := _REPORT_RE.match(name)):
        return FcopFilename(kind=kind, date=m[1], sequence=int(m[2]), sender=m[3], recipient=m[4], slug=m[5])
    if kind is EnvelopeKind.ISSUE:
        if m := _ISSUE_RE.match(name):
            return FcopFilename(kind=kind, date=m[1], sequence=int(m[2]), sender=m[3], recipient=m[4], slug=m[5])
        if m := _ISSUE_SUMMARY_RE.match(name):
            return FcopFilename(kind=kind, date=m[1], sequence=int(m[2]), sender=None, slug=m[3])
    if kind is EnvelopeKind.REVIEW and (m := _REVIEW_RE.match(name)):
        return FcopFilename(kind=kind, date=m[1], sequence=int(m[2]), sender=m[3], subject_short=m[4])
    return None


def normalize_reference(ref: str) -> str:
    """``TASK-…-001``, ``TASK-…-001-A-to-B``, ``…md`` or a path → ``TASK-YYYYMMDD-NNN``; others stripped."""
    text = ref.strip().replace("\\", "/").rsplit("/", 1)[-1]
    if text.endswith(".md"):
        text = text[:-3]
    m = re.match(r"^((?:TASK|REPORT|ISSUE)-\d{8}-\d{3,})(?:-|\.|$)", text)
    return m[1] if m else text


def subject_short_for(subject_ref: str) -> str:
    """The ``-on-<short>`` part of a REVIEW name, derived exactly as fcop's ``write_review`` does."""
    raw = subject_ref.strip().replace("\\", "/").rsplit("/", 1)[-1]
    if raw.lower().endswith(".md"):
        raw = raw[:-3]
    raw = re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]+", "-", raw.lower())).strip("-")
    raw = raw[:64].rstrip("-")
    return raw or "subject"


def is_role_code(value: str, *, seat: bool = False) -> bool:
    """A role code; with ``seat``, also ``ROLE.SLOT`` and cross-scope ``fcop://`` URIs (front matter may use them)."""
    if seat:
        return bool(SEAT_RE.match(value)) or value.startswith("fcop://")
    return bool(ROLE_RE.match(value))
