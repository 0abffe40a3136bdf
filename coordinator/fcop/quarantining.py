"""Quarantine: move a file the kernel will not ingest into ``_quarantine/``, bytes untouched, reason beside it.

The file is moved with link + unlink (same inode: bytes, mode and mtime are
unchanged; a symlink is moved as the link itself, never followed), and
``<name>.reason.md`` records the reason code, a human explanation, where it
came from, its size and sha256. Nothing is deleted or overwritten: a name
already taken in the quarantine gets a ``.2``, ``.3``… before its suffix.
Both carry the ``quarantined-`` prefix: fcop's validator reads every ``TASK-*.md`` (and REPORT/ISSUE/REVIEW)
anywhere below the root, so a quarantined envelope under its own name would make the workspace invalid to
fcop; older quarantines are renamed so by :func:`sweep_notes`.
Every step goes through ``safeio``: a symlinked ``_quarantine/`` (or any folder on the way) is
refused and reported, and the file stays where it is.

``_quarantine/`` is never scanned, so a note there is never taken for an envelope. A note whose file
has left the quarantine (moved back to be retried, or never arrived after a crash) describes nothing
any more: :func:`sweep_notes` removes it, so each quarantined file has exactly one note and a fixed
file none.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import yaml

from taskkernel.coordinator.fcop import safeio
from taskkernel.coordinator.fcop.detect import FcopWorkspace
from taskkernel.coordinator.fcop.errors import FcopError, FcopReason
from taskkernel.kernel.canonical import utc_now_iso

REASON_SUFFIX = ".reason.md"
QUARANTINE_PREFIX = "quarantined-"  # no envelope prefix: fcop's readers and validator pass it by
_ENVELOPE_PREFIXES = ("TASK-", "REPORT-", "ISSUE-", "REVIEW-")
_MAX_NAME_BYTES = 200     # leaves room for ".NNN" and ".reason.md" under NAME_MAX (255)
_HASH_LIMIT = 64 * 1024 * 1024


@dataclass(frozen=True)
class Quarantined:
    path: Path
    reason_path: Path
    reason: FcopReason


def _safe_base(name: str) -> str:
    """The quarantine name: the original one, unless too long or unprintable to keep as is."""
    raw = os.fsencode(name)
    printable = name.isprintable() and not name.startswith(".")
    if len(raw) <= _MAX_NAME_BYTES and printable:
        return name
    digest = hashlib.sha256(raw).hexdigest()[:12]
    keep = "".join(c if c.isascii() and c.isprintable() and c not in "/\\" else "_" for c in name.lstrip("."))
    return f"{keep[:80]}-{digest}"


def printable_path(rel: str) -> str:
    """``rel`` as it is recorded in a reason file: undecodable bytes as ``\\xNN``, control characters escaped."""
    text = os.fsencode(rel).decode("utf-8", "backslashreplace")
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def _candidates(base: str) -> list[str]:
    base = QUARANTINE_PREFIX + base
    stem, dot, suffix = base.rpartition(".")
    if not dot or not stem:
        stem, suffix = base, ""
    return [base] + [f"{stem}.{n}.{suffix}" if suffix else f"{base}.{n}" for n in range(2, 1000)]


def _describe(path: Path) -> tuple[int | None, str | None, str | None]:
    """(size, sha256, symlink target) of what is being quarantined, without following links."""
    with safeio.parent_fd(path) as (dir_fd, name):
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            return st.st_size, None, os.readlink(name, dir_fd=dir_fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size > _HASH_LIMIT:
        return st.st_size, None, None
    h = hashlib.sha256()
    fd = safeio.open_read(path)
    try:
        while chunk := os.read(fd, 1 << 20):
            h.update(chunk)
    finally:
        os.close(fd)
    return st.st_size, h.hexdigest(), None


def _rename_legacy(qdir: Path, entries: list[tuple[str, os.stat_result]]) -> list[tuple[str, os.stat_result]]:
    """Quarantined files (and notes) an older version kept under an envelope name get the prefix, so fcop's
    validator stops reading them; a name already taken keeps the old one."""
    renamed = []
    for name, st in entries:
        if name.startswith(_ENVELOPE_PREFIXES) and not stat.S_ISDIR(st.st_mode):
            try:
                safeio.move_no_overwrite(qdir / name, qdir / (QUARANTINE_PREFIX + name))
                name = QUARANTINE_PREFIX + name
            except (FileNotFoundError, FcopError):
                pass
        renamed.append((name, st))
    return renamed


def sweep_notes(ws: FcopWorkspace) -> list[Path]:
    """Remove every ``<name>.reason.md`` in ``_quarantine/`` whose ``<name>`` is not beside it; returns them.
    Older envelope-named entries are renamed with the prefix first."""
    qdir = ws.quarantine_dir
    try:
        entries = safeio.list_dir(qdir)
    except (FileNotFoundError, FcopError):  # no quarantine yet, or a linked one (quarantine() reports it)
        return []
    if any(name.startswith(_ENVELOPE_PREFIXES) for name, _ in entries):
        entries = _rename_legacy(qdir, entries)
    names = {name for name, _ in entries}
    removed: list[Path] = []
    for name, st in entries:
        if (not name.endswith(REASON_SUFFIX) or not stat.S_ISREG(st.st_mode)
                or name[: -len(REASON_SUFFIX)] in names
                or f"{name}{REASON_SUFFIX}" in names):  # a quarantined file named like a note has its own note
            continue
        try:
            safeio.unlink(qdir / name)
        except FileNotFoundError:
            continue
        removed.append(qdir / name)
    return removed


def quarantine(ws: FcopWorkspace, path: Path, reason: FcopReason, message: str) -> Quarantined:
    """Move ``path`` (inside the workspace) to ``_quarantine/`` and write its ``.reason.md``.

    A refusal (e.g. ``symlink_refused`` for a linked ``_quarantine/``) is logged with its path and raised.
    """
    try:
        return _quarantine(ws, Path(path), reason, message)
    except FcopError as exc:
        if exc.reason is not FcopReason.SOURCE_MISSING:  # gone meanwhile (moved on by an agent or another
            safeio.report(exc, "quarantine", file=str(path))  # coordinator): nothing was refused
        raise


def _quarantine(ws: FcopWorkspace, path: Path, reason: FcopReason, message: str) -> Quarantined:
    try:
        source = ws.relative(path)
    except ValueError:
        raise FcopError(FcopReason.PATH_ESCAPE, f"{path} is not inside the workspace {ws.root}", path) from None
    try:
        size, digest, link_target = _describe(path)
    except FileNotFoundError:
        raise FcopError(FcopReason.SOURCE_MISSING, f"{path} no longer exists", path) from None
    qdir = ws.quarantine_dir
    for candidate in _candidates(_safe_base(path.name)):
        dest = qdir / candidate
        reason_path = qdir / f"{candidate}{REASON_SUFFIX}"
        if safeio.lexists(dest) or safeio.lexists(reason_path):
            continue
        record = {"reason": reason.value, "source": printable_path(source),
                  "quarantined_at": utc_now_iso(), "size": size, "sha256": digest, "symlink_target": link_target}
        header = yaml.safe_dump({k: v for k, v in record.items() if v is not None}, sort_keys=False,
                                allow_unicode=True)
        text = (f"---\n{header}---\n\n# Quarantined: {reason.value}\n\n{message}\n\n"
                f"The file's bytes are unchanged. Fix it and move it back to `{record['source']}` to retry.\n")
        # The reason goes first: a crash in between leaves a reason without a file, never the reverse.
        try:
            safeio.write_new(reason_path, text.encode("utf-8", "backslashreplace"))
        except FcopError as exc:
            if exc.reason is FcopReason.TARGET_EXISTS:
                continue
            raise
        try:
            safeio.move_no_overwrite(path, dest)
        except FcopError as exc:
            safeio.unlink(reason_path)  # our own note about a move that did not happen
            if exc.reason is FcopReason.TARGET_EXISTS:
                continue
            raise
        return Quarantined(path=dest, reason_path=reason_path, reason=reason)
    raise FcopError(FcopReason.TARGET_EXISTS, f"no free name in {qdir} for {path.name}", path)
