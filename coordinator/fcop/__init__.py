"""The FCoP file layer: detect, parse, write, quarantine and scan G2/G3 workspaces (docs/fcop.md).

Pure file I/O with no kernel semantics; ingest and projection are built on top.
"""

from taskkernel.coordinator.fcop.detect import (
    FcopWorkspace,
    Generation,
    detect_generation,
    find_workspace_root,
    open_workspace,
)
from taskkernel.coordinator.fcop.errors import FcopError, FcopReason, FcopWarning
from taskkernel.coordinator.fcop.filenames import EnvelopeKind, FcopFilename, normalize_reference, parse_filename
from taskkernel.coordinator.fcop.models import (
    Envelope,
    EnvelopeModel,
    IssueEnvelope,
    Priority,
    ReportEnvelope,
    ReviewEnvelope,
    TaskEnvelope,
    Transition,
)
from taskkernel.coordinator.fcop.numbering import Published, max_sequence
from taskkernel.coordinator.fcop.parse import DEFAULT_MAX_BYTES, parse_envelope, read_envelope
from taskkernel.coordinator.fcop.quarantine import Quarantined, quarantine
from taskkernel.coordinator.fcop.safeio import locked, move_no_overwrite, read_bytes, rewrite, safe_join, write_new
from taskkernel.coordinator.fcop.scan import EntryStatus, ScanBatch, ScanEntry, Scanner
from taskkernel.coordinator.fcop.writer import (
    TaskDraft,
    append_transition,
    write_issue,
    write_report,
    write_review,
    write_task,
)

__all__ = [
    "DEFAULT_MAX_BYTES", "Envelope", "EnvelopeKind", "EnvelopeModel", "EntryStatus", "FcopError", "FcopFilename",
    "FcopReason", "FcopWarning", "FcopWorkspace", "Generation", "IssueEnvelope", "Priority", "Published",
    "Quarantined", "ReportEnvelope", "ReviewEnvelope", "ScanBatch", "ScanEntry", "Scanner", "TaskDraft",
    "TaskEnvelope", "Transition", "append_transition", "detect_generation", "find_workspace_root", "locked",
    "max_sequence", "move_no_overwrite", "normalize_reference", "open_workspace", "parse_envelope",
    "parse_filename", "quarantine", "read_bytes", "read_envelope", "rewrite", "safe_join", "write_issue",
    "write_new", "write_report", "write_review", "write_task",
]
