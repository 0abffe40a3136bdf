"""Incremental listing of a workspace's envelopes, with a "settled" check against half-written files.

Each scan lists every folder an envelope can live in and parses only files
whose (size, mtime_ns, inode) changed since the previous scan. A file is
handed out once it has *settled*:

* it looks the same (same key and same bytes) on two looks at least
  ``settle_s`` apart (``grace_s`` for a file that does not parse, since a
  writer may still be busy with it), or
* its mtime is already that old when first seen: it was written earlier and
  arrived by rename (our own moves and ``mv`` keep the mtime).

Which folders are walked is defined once, by :func:`list_envelope_dirs`: every folder a file of a kind
can live in (``FcopWorkspace.envelope_dirs``), ``SCAN_DEPTH`` folders deep. The scan (and so the import
and the live ingest), the drift check of ``taskkernel verify`` and the projection's search for a task's
file all list through it (:func:`task_files`), so a file the import takes is a file verify sees.

Dotfiles and ``*.tmp`` are ignored (writers in flight); files that vanish
between listing and reading are simply gone; a name without an envelope
prefix is a "ghost": reported once with a warning and left alone. The kernel's own reason notes
(``_reason.<name>.txt``, see :func:`taskkernel.coordinator.fcop.filenames.reason_note_name`) are not envelopes and are
skipped silently; a note whose file is no longer beside it is listed in ``ScanBatch.stale_notes`` for
ingest to remove. Symlinks
are never followed: folders are listed through ``safeio``'s checked descriptors, a symlinked
folder (or a link that is not an envelope name) is reported once (``symlink_refused``) and
skipped, and an envelope-named link is refused like a bad file. A folder that cannot be listed
(``io_error``) or lies deeper than ``SCAN_DEPTH`` (``folder_too_deep``) is skipped the same way; every
such folder or link is in ``ScanBatch.refused`` while it stays, so the import can list it. ``settle_s=0,
grace_s=0`` hands out everything at once (for ``--once`` runs over a quiescent folder).
"""

from __future__ import annotations

import os
import stat
import struct
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from taskkernel.coordinator.fcop.detect import LIFECYCLE_DIR, SCAN_DEPTH, FcopWorkspace
from taskkernel.coordinator.fcop.errors import FcopError, FcopReason, FcopWarning
from taskkernel.coordinator.fcop.filenames import (
    EnvelopeKind,
    FcopFilename,
    envelope_prefix,
    is_reason_note,
    parse_filename,
    reason_note_name,
)
from taskkernel.coordinator.fcop.models import EnvelopeModel
from taskkernel.coordinator.fcop.parse import DEFAULT_MAX_BYTES, parse_envelope
from taskkernel.coordinator.fcop.safeio import folder_fd, list_fd, read_at, report, sha256_hex
from taskkernel.kernel.logging import get_logger

log = get_logger("taskkernel.coordinator.fcop.scan")
_AREA_KINDS: dict[str, frozenset[EnvelopeKind]] = {
    LIFECYCLE_DIR: frozenset({EnvelopeKind.TASK}),
    "tasks": frozenset({EnvelopeKind.TASK}),
    "reports": frozenset({EnvelopeKind.REPORT}),
    "issues": frozenset({EnvelopeKind.ISSUE}),
    "reviews": frozenset({EnvelopeKind.REVIEW}),
    "history": frozenset({EnvelopeKind.TASK, EnvelopeKind.REPORT}),
    "log/tasks": frozenset({EnvelopeKind.TASK}),
    "log/reports": frozenset({EnvelopeKind.REPORT}),
    "log/issues": frozenset({EnvelopeKind.ISSUE}),
    "log/reviews": frozenset({EnvelopeKind.REVIEW}),
}

_ARCHIVE_EXTRA = frozenset({EnvelopeKind.REPORT})  # see FcopWorkspace.envelope_dirs
ARCHIVE_AREAS = ("log/tasks", "history")  # G2 history


class EntryStatus(StrEnum):
    READY = "ready"       # settled and parsed
    INVALID = "invalid"   # settled and refused (quarantine it if it sits where agents write)
    PENDING = "pending"   # not settled yet
    GHOST = "ghost"       # not an envelope name: skipped


@dataclass(frozen=True)
class ScanEntry:
    path: Path
    rel: str              # POSIX path relative to the workspace root
    area: str             # "_lifecycle", "tasks", "reports", "issues", "reviews", "history", "log/<kind>s"
    stage: str | None     # the lifecycle stage for files under _lifecycle/ (Rule A: the path is the state)
    size: int
    mtime_ns: int
    status: EntryStatus
    envelope: EnvelopeModel | None = None
    error: FcopError | None = None
    sha256: str | None = None  # of the bytes read (None when nothing could be read)


@dataclass
class ScanBatch:
    ready: list[ScanEntry] = field(default_factory=list)
    invalid: list[ScanEntry] = field(default_factory=list)
    pending: list[ScanEntry] = field(default_factory=list)
    ghosts: list[ScanEntry] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    stale_notes: list[Path] = field(default_factory=list)  # reason notes whose file is gone from beside them
    refused: dict[str, FcopError] = field(default_factory=dict)  # folders and links not looked into (rel -> why)


StatKey = tuple[int, int, int, int]  # size, mtime_ns, inode, ctime_ns
_PACKED = struct.Struct("<qqqq?d??B32s")  # key, done, first_seen, has sha256, ok, row, sha256 (raw)
_HANDED_OUT = struct.Struct("<qqqq?")  # its head: an unchanged file handed out is told without unpacking


def _word(value: int) -> int:
    """A stat field as a signed 64-bit word, which the packed record holds: an agent may date its file in 2286 (past
    2**63 ns); the identity for every value a real clock and file system give, a pre-1970 mtime included."""
    return (value + (1 << 63)) % (1 << 64) - (1 << 63)
NO_ROW, OLD_ROW, SAVED = 0, 1, 2  # what folder_stats holds for a file: nothing, another version, this one


@dataclass(slots=True)
class _Seen:
    """What the scanner knows of one file. Kept packed (``pack``: about 110 bytes, against some 450 as objects):
    a workspace's every file stays known between scans, so this is what a scanner holds per file."""

    key: StatKey
    first_seen: float
    sha256: str | None
    ok: bool
    done: bool
    row: int = NO_ROW  # folder_stats' row for the file (NO_ROW, OLD_ROW, SAVED)

    def pack(self) -> bytes:
        sha = bytes.fromhex(self.sha256) if self.sha256 else b""
        return _PACKED.pack(*self.key, self.done, self.first_seen, bool(self.sha256), self.ok, self.row, sha)

    @classmethod
    def unpack(cls, data: bytes) -> _Seen:
        size, mtime, ino, ctime, done, first, has_sha, ok, row, sha = _PACKED.unpack(data)
        return cls((size, mtime, ino, ctime), first, sha.hex() if has_sha else None, ok, done, row)


def shown_state(area: str, stage: str | None) -> str | None:
    """The lifecycle state a TASK file's place shows (Rule A): its stage folder (a batch folder below it too);
    G2 `tasks/` the inbox, `log/tasks/` and `history/` the archive. Import, ingest, verify and the projection
    all read a place so."""
    return stage or ("inbox" if area == "tasks" else "archive" if area in ARCHIVE_AREAS else None)


def place_of(rel: str) -> tuple[str, str | None]:
    """(area, lifecycle stage) of a file by its path below the root: a file in a batch folder below a stage
    is in that stage (Rule A: the path is the state)."""
    parts = rel.split("/")
    head = parts[0]
    if head == LIFECYCLE_DIR:
        return head, parts[1] if len(parts) > 2 else None
    if head == "log" and len(parts) > 2:
        return f"log/{parts[1]}", None
    return head, None


@dataclass(frozen=True, slots=True)
class Listed:
    """An entry of a folder the scans look into, as ``lstat`` saw it (a link is listed as the link)."""

    folder: Path  # one object per folder: a file's own path is made only when asked for
    name: str
    rel: str
    area: str
    stage: str | None
    st: os.stat_result

    @property
    def path(self) -> Path:
        return self.folder / self.name


@dataclass
class Listing:
    """What one walk found: the entries to look at, the folders and links it did not look into, stale notes."""

    files: list[Listed] = field(default_factory=list)
    refused: dict[str, FcopError] = field(default_factory=dict)  # folders and links not looked into (rel -> why)
    stale_notes: list[Path] = field(default_factory=list)


def walk_envelope_dirs(ws: FcopWorkspace, listing: Listing,
                       kinds: Iterable[EnvelopeKind] = tuple(EnvelopeKind)) -> Iterator[tuple[int, Iterator[Listed]]]:
    """Every folder files of ``kinds`` live in, ``SCAN_DEPTH`` folders deep, through the safe layer: the one
    definition of which folders are walked (see the module docstring). Yields folder by folder its entries (by
    name) with the folder's checked descriptor, open until the next folder is asked for, so the files are read
    through it; what is not looked into goes to ``listing``. Nothing per file is kept beyond its folder."""
    for root in sorted({d for kind in kinds for d in ws.envelope_dirs(kind)}):
        yield from _walk(ws, root, ws.relative(root), 0, listing)


def list_envelope_dirs(ws: FcopWorkspace, kinds: Iterable[EnvelopeKind] = tuple(EnvelopeKind)) -> Listing:
    """Every entry of :func:`walk_envelope_dirs` in one list."""
    listing = Listing()
    for _, files in walk_envelope_dirs(ws, listing, kinds):
        listing.files += files
    return listing


def _walk(ws: FcopWorkspace, directory: Path, rel_dir: str, depth: int,
          listing: Listing) -> Iterator[tuple[int, Iterator[Listed]]]:
    def refuse(exc: FcopError) -> None:
        listing.refused.setdefault(os.path.relpath(exc.path or ws.root, ws.root), exc)

    area, stage = place_of(f"{rel_dir}/-")  # every file of a folder is in the same place
    folders: list[str] = []
    try:
        with folder_fd(directory) as fd:
            entries = list_fd(fd, directory)
            entries.sort(key=_name, reverse=True)  # by name from its end: each file's entry is dropped once made
            notes = [name for name, st in entries if is_reason_note(name) and stat.S_ISREG(st.st_mode)]
            if notes:  # a note's file is beside it (only a folder with notes pays for the set)
                wanted = {reason_note_name(name) for name, _ in entries if not is_reason_note(name)}
                listing.stale_notes += [directory / name for name in notes if name not in wanted]
            for name, st in reversed(entries):
                what = _entry_kind(name, st)
                if what == "folder":
                    folders.append(name)
                elif what == "link":
                    refuse(FcopError(FcopReason.SYMLINK_REFUSED, f"{directory / name} is a symbolic link: never "
                                     "followed", directory / name))
            yield fd, _files(entries, directory, rel_dir, area, stage)
    except FileNotFoundError:
        return
    except FcopError as exc:  # a symlinked folder (or an unreadable one): never followed
        refuse(exc)
        return
    except OSError as exc:  # anything the safe layer did not name: this folder is refused, the walk goes on
        refuse(FcopError(FcopReason.IO_ERROR, f"cannot list {directory}: {exc.strerror or exc}", directory))
        return
    for name in folders:
        path = directory / name
        if depth < SCAN_DEPTH:
            yield from _walk(ws, path, f"{rel_dir}/{name}", depth + 1, listing)
        else:
            refuse(FcopError(FcopReason.FOLDER_TOO_DEEP, f"{path} is more than {SCAN_DEPTH} folders below an "
                             "envelope folder: files in it are never read", path))


def _name(entry: tuple[str, os.stat_result]) -> str:
    return entry[0]


def _files(entries: list[tuple[str, os.stat_result]], directory: Path, rel_dir: str, area: str,
           stage: str | None) -> Iterator[Listed]:
    """A folder's files by name, each made as it is asked for and its entry dropped from ``entries`` (sorted from
    the end): what a large folder's listing holds shrinks as its files are taken."""
    while entries:
        name, st = entries.pop()
        if _entry_kind(name, st) == "file":
            yield Listed(directory, name, f"{rel_dir}/{name}", area, stage, st)


def _entry_kind(name: str, st: os.stat_result) -> str:
    """What the walk makes of a folder's entry: skipped (in flight), a folder, a refused link, a note, a file."""
    if name.startswith(".") or name.endswith(".tmp"):
        return "skipped"
    if stat.S_ISDIR(st.st_mode):
        return "folder"
    if stat.S_ISLNK(st.st_mode) and envelope_prefix(name) is None:
        return "link"
    return "note" if is_reason_note(name) else "file"


def task_files(ws: FcopWorkspace) -> dict[str, list[tuple[Listed, FcopFilename]]]:
    """TASK files per id, with their parsed names: regular files with a well-formed TASK name wherever the
    scans take TASK files (the drift check and the projection look for a task's file here)."""
    found: dict[str, list[tuple[Listed, FcopFilename]]] = {}
    for f in list_envelope_dirs(ws, (EnvelopeKind.TASK,)).files:
        name = parse_filename(f.name) if f.name.endswith(".md") else None
        if name is not None and name.kind is EnvelopeKind.TASK and stat.S_ISREG(f.st.st_mode):
            found.setdefault(name.id, []).append((f, name))
    return found


class Scanner:
    """Stateful scanner of one workspace; call :meth:`scan` repeatedly (after watch events and periodically)."""

    def __init__(self, ws: FcopWorkspace, *, settle_s: float = 1.0, grace_s: float = 5.0,
                 max_bytes: int = DEFAULT_MAX_BYTES, clock: Callable[[], float] = time.time,
                 legacy_encoding: bool = False) -> None:
        self.ws = ws
        self.settle_s = settle_s
        self.grace_s = grace_s
        self.max_bytes = max_bytes
        self.clock = clock
        self.legacy_encoding = legacy_encoding  # the import reads GBK history; live input must be UTF-8
        self._seen: dict[str, bytes] = {}  # rel -> _Seen, packed
        self._unrows: set[str] = set()  # files gone from ``_seen`` whose folder_stats row is still there
        self._ghosts: set[str] = set()
        self._refused: set[str] = set()

    def _get(self, rel: str) -> _Seen | None:
        data = self._seen.get(rel)
        return None if data is None else _Seen.unpack(data)

    def _put(self, rel: str, seen: _Seen) -> None:
        if rel in self._unrows:  # its row is still there: another version of the file now
            self._unrows.discard(rel)
            seen.row = OLD_ROW
        self._seen[rel] = seen.pack()

    def _drop(self, rel: str) -> None:
        data = self._seen.pop(rel, None)
        if data is not None and _Seen.unpack(data).row != NO_ROW:
            self._unrows.add(rel)

    def absorb(self, other: Scanner) -> None:
        """Take over what ``other`` handed out (the import's full scan), so those files are not read again.
        ``other`` forgets each file as it is taken: the two scanners never both hold a record of every file."""
        theirs = other._seen
        for rel in list(theirs):  # in their order, which later saves follow
            data = theirs.pop(rel)
            seen, mine = _Seen.unpack(data), self._get(rel)
            if not seen.done:
                continue
            if mine is not None and mine.row != NO_ROW:  # folder_stats' row for it stays known
                same = mine.row == SAVED and (mine.key, mine.sha256) == (seen.key, seen.sha256)
                seen.row = SAVED if same else OLD_ROW
            self._put(rel, seen)

    def unsaved(self, older_than: float) -> tuple[Iterator[tuple[str, StatKey, str]], set[str]]:
        """What folder_stats lacks: (the files handed out, last changed before ``older_than`` (a clock time),
        whose row is not this version, as (rel, stat key, sha256) — what a later process may trust without
        reading them again; the rels whose row must go, their files forgotten). ``saved`` marks them done."""
        limit = int(older_than * 1e9)

        def changed() -> Iterator[tuple[str, StatKey, str]]:
            for rel, data in self._seen.items():
                s = _Seen.unpack(data)
                if s.row != SAVED and s.done and s.sha256 and s.key[1] < limit and s.key[3] < limit:
                    yield rel, s.key, s.sha256
        return changed(), set(self._unrows)

    def saved(self, changed: Iterable[str], removed: set[str]) -> None:
        """folder_stats now holds these files as the scanner knows them, and no row of ``removed``."""
        for rel in changed:
            seen = _Seen.unpack(self._seen[rel])
            seen.row = SAVED
            self._seen[rel] = seen.pack()
        self._unrows -= removed

    def trust(self, known: Iterable[tuple[str, StatKey, str]]) -> None:
        """Files an earlier process handled (folder_stats' rows): one whose stat key is unchanged is not read
        again (a changed one is looked at afresh)."""
        now = self.clock()
        for rel, key, sha in known:
            key = (_word(key[0]), _word(key[1]), _word(key[2]), _word(key[3]))  # an earlier release's row: raw values
            prev = self._get(rel)
            if prev is None:
                self._seen[rel] = _Seen(key, now, sha, ok=True, done=True, row=SAVED).pack()
            elif prev.row == NO_ROW:
                prev.row = SAVED if (prev.key, prev.sha256) == (key, sha) else OLD_ROW
                self._seen[rel] = prev.pack()

    def forget(self, rel: str) -> None:
        """Drop what is known about ``rel`` so the next scan looks at it afresh."""
        self._drop(rel)

    def scan(self) -> ScanBatch:
        batch = ScanBatch()
        lists = {EntryStatus.READY: batch.ready, EntryStatus.INVALID: batch.invalid,
                 EntryStatus.PENDING: batch.pending, EntryStatus.GHOST: batch.ghosts}
        for entry in self.stream(batch):
            lists[entry.status].append(entry)
        return batch

    def stream(self, batch: ScanBatch) -> Iterator[ScanEntry]:
        """One walk: each file listed, and read (once) if it changed, as its folder comes; an entry for every file
        to hand out is yielded at once, so a caller that consumes them as they come holds no file beyond the one
        in hand. Once the walk is done ``batch`` holds what is not per file: refused folders, stale notes,
        removed files."""
        listing = Listing()
        present: set[str] = set()
        for fd, files in walk_envelope_dirs(self.ws, listing):
            for f in files:
                present.add(f.rel)
                entry = self._visit(f, fd)
                if entry is not None:
                    yield entry
        batch.stale_notes, batch.refused = listing.stale_notes, listing.refused
        for rel, exc in listing.refused.items():  # reported once while it stays
            if rel in self._refused:
                continue
            if exc.reason is FcopReason.FOLDER_TOO_DEEP:  # a layout limit, not a refused write: logged only
                log.warning("fcop.not_scanned", path=rel, reason=exc.reason.value, message=exc.message)
            else:
                report(exc, "scan")
        self._refused = set(listing.refused)
        for rel in [r for r in self._seen if r not in present]:
            self._drop(rel)
            batch.removed.append(rel)
        self._ghosts &= present

    def _visit(self, f: Listed, fd: int) -> ScanEntry | None:
        rel, st = f.rel, f.st
        kind = envelope_prefix(f.name)

        def entry(status: EntryStatus, env: EnvelopeModel | None = None, err: FcopError | None = None,
                  sha: str | None = None) -> ScanEntry:
            return ScanEntry(path=f.path, rel=rel, area=f.area, stage=f.stage, size=st.st_size,
                             mtime_ns=st.st_mtime_ns, status=status, envelope=env, error=err, sha256=sha)

        if kind is None:
            if rel not in self._ghosts:
                self._ghosts.add(rel)
                log.warning("fcop.ghost_file", path=rel, warning=FcopWarning.GHOST_FILE.value)
                return entry(EntryStatus.GHOST)
            return None
        # ctime: a write cannot set it back
        key = (_word(st.st_size), _word(st.st_mtime_ns), _word(st.st_ino), _word(st.st_ctime_ns))
        data = self._seen.get(rel)
        if data is not None and data.startswith(_HANDED_OUT.pack(*key, True)):  # handed out, unchanged since
            return None
        prev = None if data is None else _Seen.unpack(data)
        now = self.clock()
        if prev is None or prev.key != key:
            env, err, sha = self._look(f, fd, kind)
            if err is not None and err.reason is FcopReason.SOURCE_MISSING:
                return None
            immediate = err is not None and err.reason in (FcopReason.SYMLINK_REFUSED, FcopReason.NOT_REGULAR_FILE,
                                                           FcopReason.BAD_FILENAME, FcopReason.MISPLACED_FILE,
                                                           FcopReason.INVALID_TASK_ID)
            age = now - st.st_mtime_ns / 1e9
            settled = immediate or age >= (self.settle_s if err is None else self.grace_s)
            prev = _Seen(key, now, sha, ok=err is None, done=False, row=OLD_ROW if prev and prev.row else NO_ROW)
        else:
            if now - prev.first_seen < (self.settle_s if prev.ok else self.grace_s):
                return entry(EntryStatus.PENDING)
            env, err, sha = self._look(f, fd, kind)
            if err is not None and err.reason is FcopReason.SOURCE_MISSING:
                return None
            settled = sha == prev.sha256 and (err is None) == prev.ok
            if not settled:
                prev = _Seen(key, now, sha, ok=err is None, done=False, row=OLD_ROW if prev.row else NO_ROW)
        prev.done = settled
        self._put(rel, prev)
        if not settled:
            return entry(EntryStatus.PENDING)
        if err is None:
            return entry(EntryStatus.READY, env, sha=sha)
        return entry(EntryStatus.INVALID, err=err, sha=sha)

    def _look(self, f: Listed, fd: int,
              kind: EnvelopeKind) -> tuple[EnvelopeModel | None, FcopError | None, str | None]:
        """Read (through the folder's checked descriptor ``fd``) and parse once: (envelope, error, sha256 of the
        bytes read); ``f.st`` is this scan's lstat."""
        if stat.S_ISLNK(f.st.st_mode):
            return None, FcopError(FcopReason.SYMLINK_REFUSED, "symbolic links are never followed", f.path), None
        allowed = _AREA_KINDS.get(f.area, frozenset()) | (_ARCHIVE_EXTRA if f.stage == "archive" else frozenset())
        if kind not in allowed:
            return None, FcopError(FcopReason.MISPLACED_FILE, f"a {kind.value} file does not belong in {f.area}/",
                                   f.path), None
        try:
            data = read_at(fd, f.name, self.max_bytes, f.path)
        except FileNotFoundError:
            return None, FcopError(FcopReason.SOURCE_MISSING, "vanished", f.path), None
        except FcopError as exc:
            return None, exc, None
        except OSError as exc:  # not named by the safe layer: this file is refused, never the walk
            return None, FcopError(FcopReason.IO_ERROR, f"cannot read: {exc.strerror or exc}", f.path), None
        sha = sha256_hex(data)
        try:
            return parse_envelope(f.name, data, max_bytes=self.max_bytes, legacy_encoding=self.legacy_encoding,
                                  sha256=sha), None, sha
        except FcopError as exc:
            exc.path = f.path
            return None, exc, sha
        except Exception as exc:  # noqa: BLE001 - a parser bug on one file refuses that file, never the walk
            log.warning("fcop.parse_crashed", path=f.rel, error=type(exc).__name__)
            return None, FcopError(FcopReason.MALFORMED_FRONT_MATTER,
                                   f"cannot be parsed ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})",
                                   f.path), sha
