"""Sequence numbers for files the kernel writes: max+1 over every folder the kind can live in.

FCoP's own allocator fills gaps and looks only at the inbox, so it reuses
numbers once a TASK moves on (digest §7). Here the number is one more than the
highest ``KIND-YYYYMMDD-NNN`` seen anywhere that kind may live (all lifecycle
stages, G2 ``tasks/`` and ``log/``, ``history/``, the quarantine, and temp files
reserved by writers still in flight), never a gap. Allocation runs under a
per-kind ``flock`` and is reserved by creating the temp file with ``O_EXCL``,
so concurrent writers in any process get distinct numbers. Dates are UTC.
Beyond 999 the field simply grows (``1000``): our reader accepts it, fcop's does not. Numbers
beyond nine digits are ``invalid_task_id`` (quarantined when read), so they never count here.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from taskkernel.coordinator.fcop.detect import SCAN_DEPTH, FcopWorkspace
from taskkernel.coordinator.fcop.errors import FcopError, FcopReason
from taskkernel.coordinator.fcop.filenames import EnvelopeKind, FcopFilename, parse_filename
from taskkernel.coordinator.fcop.quarantining import QUARANTINE_PREFIX
from taskkernel.coordinator.fcop.safeio import list_names, locked, open_tmp, publish_reserved
from taskkernel.kernel.model.ids import MAX_SEQUENCE

_ATTEMPTS = 5


@dataclass(frozen=True)
class Published:
    path: Path
    name: FcopFilename
    sha256: str


def utc_date() -> str:
    return datetime.now(UTC).strftime("%Y%m%d")


def _names(directory: Path, depth: int = 0) -> list[str]:
    """Names below ``directory``, read through the safe layer: a symlinked folder is not looked into. Names
    come without a stat: a reservation's temp file unlinked right after its number was published must
    still count if the listing missed the published name (else another writer takes the same number)."""
    try:
        entries = list_names(directory)
    except (FcopError, OSError):  # missing, not a folder, or a refused link
        return []
    names = []
    for name, is_dir in entries:
        names.append(name)
        if depth < SCAN_DEPTH and is_dir:
            names.extend(_names(directory / name, depth + 1))
    return names


def sequences_in_use(ws: FcopWorkspace, kind: EnvelopeKind, date: str) -> set[int]:
    """Every NNN of ``kind`` on ``date`` present as a file anywhere the kind may live (quarantine included)."""
    pattern = re.compile(rf"^(?:\.|{QUARANTINE_PREFIX})?{kind.value}-{date}-(\d{{3,}})(?:-|\.|$)")
    found = set()
    for directory in [*ws.envelope_dirs(kind), ws.quarantine_dir]:
        for name in _names(directory):
            if (m := pattern.match(name)) and (n := int(m[1])) <= MAX_SEQUENCE:
                found.add(n)
    return found


def max_sequence(ws: FcopWorkspace, kind: EnvelopeKind, date: str) -> int:
    """Highest NNN of ``kind`` on ``date`` anywhere in the workspace (0 if none)."""
    return max(sequences_in_use(ws, kind, date), default=0)


def allocate_and_publish(ws: FcopWorkspace, kind: EnvelopeKind, directory: Path,
                         make_name: Callable[[int, str], FcopFilename],
                         render: Callable[[FcopFilename], bytes], *, date: str | None = None) -> Published:
    """Pick the next number, reserve it, write ``render(name)`` and publish it in ``directory``.

    ``make_name(sequence, date)`` builds the filename; ``render`` gets it so the
    content may quote its own id (a REVIEW's ``review_id``).
    """
    date = date or utc_date()  # open_tmp creates missing folders through the safe layer
    for _ in range(_ATTEMPTS):
        with locked(ws.lock_dir / f"seq-{kind.value}.lock"):
            seq = max_sequence(ws, kind, date) + 1
            if seq > MAX_SEQUENCE:
                raise FcopError(FcopReason.INVALID_TASK_ID, f"no {kind.value} number left for {date}", directory)
            name = make_name(seq, date)
            if parse_filename(name.render()) != name:
                raise FcopError(FcopReason.INVALID_FIELD_VALUE,
                                f"{name.render()!r} would not be a well-formed {kind.value} name")
            path = directory / name.render()
            if os.path.lexists(path):
                continue
            data = render(name)  # before the reservation: a refusal leaves nothing behind
            # Published under the lock: a directory listing may miss both a temp file unlinked and the name
            # linked while it runs (POSIX leaves readdir unspecified there), so a reservation must never be
            # half-way from one name to the other while another writer counts.
            try:
                return Published(path=path, name=name, sha256=publish_reserved(open_tmp(path), path, data))
            except FcopError as exc:
                if exc.reason is not FcopReason.TARGET_EXISTS:
                    raise
    raise FcopError(FcopReason.TARGET_EXISTS, f"could not allocate a {kind.value} number in {directory}", directory)
