"""Stable reason codes of the FCoP file layer, and the error that carries them.

The values are a public contract: they are written into ``<name>.reason.md``
files in ``fcop/_quarantine/`` and surface in logs and CLI JSON. Never rename a
value; add new ones (see docs/fcop.md).
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path


class FcopReason(StrEnum):
    # workspace detection
    UNSUPPORTED_WORKSPACE_GENERATION = "unsupported_workspace_generation"
    MIXED_WORKSPACE = "mixed_workspace"
    AMBIGUOUS_WORKSPACE_ROOT = "ambiguous_workspace_root"
    MALFORMED_CONFIG = "malformed_config"
    MIGRATION_INCOMPLETE = "migration_incomplete"  # the root is G4 but the kernel imported it as G2/G3
    # the file itself
    BAD_FILENAME = "bad_filename"
    INVALID_TASK_ID = "invalid_task_id"  # a well-formed name whose date is not real or whose sequence is too wide
    MISPLACED_FILE = "misplaced_file"
    PATH_ESCAPE = "path_escape"
    SYMLINK_REFUSED = "symlink_refused"
    NOT_REGULAR_FILE = "not_regular_file"
    FILE_TOO_LARGE = "file_too_large"
    EMPTY_FILE = "empty_file"
    FOLDER_TOO_DEEP = "folder_too_deep"  # more than SCAN_DEPTH folders below an envelope folder: never read
    BINARY_FILE = "binary_file"
    INVALID_ENCODING = "invalid_encoding"
    # its front matter
    MISSING_FRONT_MATTER = "missing_front_matter"
    MALFORMED_FRONT_MATTER = "malformed_front_matter"
    DUPLICATE_KEY = "duplicate_key"
    UNSUPPORTED_PROTOCOL = "unsupported_protocol"
    UNSUPPORTED_ENVELOPE_VERSION = "unsupported_envelope_version"
    MISSING_REQUIRED_FIELD = "missing_required_field"
    INVALID_FIELD_TYPE = "invalid_field_type"
    INVALID_FIELD_VALUE = "invalid_field_value"
    # what a well-formed TASK file claims (ingest refusals, written into the file's reason note)
    DUPLICATE_TASK_ID = "duplicate_task_id"  # another TASK file with the same id became the task
    TASK_ID_TAKEN = "task_id_taken"  # the kernel holds this id with another route or subject
    UNKNOWN_TASK_OUTSIDE_INBOX = "unknown_task_outside_inbox"  # after the import, new tasks start in the inbox
    # writes and moves
    TARGET_EXISTS = "target_exists"
    SOURCE_MISSING = "source_missing"
    CONTENT_CHANGED = "content_changed"
    IO_ERROR = "io_error"


class FcopWarning(StrEnum):
    """Non-fatal observations: the file is usable, but a caller may care."""

    GHOST_FILE = "ghost_file"                  # non-standard name, skipped
    ROUTING_MISMATCH = "routing_mismatch"      # front matter sender/recipient differ from the filename
    TYPE_MISMATCH = "type_mismatch"            # a `type:` key that contradicts the filename prefix
    BOM_STRIPPED = "bom_stripped"
    LEGACY_ENCODING = "legacy_encoding"        # not UTF-8 but GB18030/GBK: read by the import as history
    AUTHORITY_WORD = "authority_word"          # BOSS, CEO, ... legal but suspicious role codes
    TASK_NAMED_OUTSIDE_REFERENCES = "task_named_outside_references"  # a REPORT names its task by ref_task:,
    # in_reply_to: or task_id: (fcop itself rejects it); we attach it to that task


class FcopError(Exception):
    """A refusal as a value: a stable reason, a human message and the path concerned."""

    def __init__(self, reason: FcopReason, message: str, path: Path | str | None = None) -> None:
        super().__init__(f"{reason.value}: {message}")
        self.reason = reason
        self.message = message
        self.path = Path(path) if path is not None else None
