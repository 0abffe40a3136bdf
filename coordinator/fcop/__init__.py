"""The FCoP file layer: detect, parse, write, quarantine and scan G2/G3 workspaces (docs/fcop.md).

Pure file I/O with no kernel semantics; ingest and projection are built on top. Names are imported from their
module on first use (PEP 562), so a command that only locates a workspace does not load the parser, the
writer and the scanner.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
    from taskkernel.coordinator.fcop.quarantining import Quarantined, quarantine
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

_WHERE: dict[str, str] = {
    "DEFAULT_MAX_BYTES": "parse",
    "EntryStatus": "scan",
    "Envelope": "models",
    "EnvelopeKind": "filenames",
    "EnvelopeModel": "models",
    "FcopError": "errors",
    "FcopFilename": "filenames",
    "FcopReason": "errors",
    "FcopWarning": "errors",
    "FcopWorkspace": "detect",
    "Generation": "detect",
    "IssueEnvelope": "models",
    "Priority": "models",
    "Published": "numbering",
    "Quarantined": "quarantining",
    "ReportEnvelope": "models",
    "ReviewEnvelope": "models",
    "ScanBatch": "scan",
    "ScanEntry": "scan",
    "Scanner": "scan",
    "TaskDraft": "writer",
    "TaskEnvelope": "models",
    "Transition": "models",
    "append_transition": "writer",
    "detect_generation": "detect",
    "find_workspace_root": "detect",
    "locked": "safeio",
    "max_sequence": "numbering",
    "move_no_overwrite": "safeio",
    "normalize_reference": "filenames",
    "open_workspace": "detect",
    "parse_envelope": "parse",
    "parse_filename": "filenames",
    "quarantine": "quarantining",
    "read_bytes": "safeio",
    "read_envelope": "parse",
    "rewrite": "safeio",
    "safe_join": "safeio",
    "write_issue": "writer",
    "write_new": "safeio",
    "write_report": "writer",
    "write_review": "writer",
    "write_task": "writer",
}

__all__ = [
    "DEFAULT_MAX_BYTES", "Envelope", "EnvelopeKind", "EnvelopeModel", "EntryStatus", "FcopError", "FcopFilename",
    "FcopReason", "FcopWarning", "FcopWorkspace", "Generation", "IssueEnvelope", "Priority", "Published",
    "Quarantined", "ReportEnvelope", "ReviewEnvelope", "ScanBatch", "ScanEntry", "Scanner", "TaskDraft",
    "TaskEnvelope", "Transition", "append_transition", "detect_generation", "find_workspace_root", "locked",
    "max_sequence", "move_no_overwrite", "normalize_reference", "open_workspace", "parse_envelope",
    "parse_filename", "quarantine", "read_bytes", "read_envelope", "rewrite", "safe_join", "write_issue",
    "write_new", "write_report", "write_review", "write_task",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
