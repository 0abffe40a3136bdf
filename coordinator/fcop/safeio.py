"""The one safe layer every kernel write, move and temp file under ``fcop/`` and ``workspace/`` goes through.

No partial file is ever visible, no file is overwritten by another, and no symlink is ever followed:

* **Confinement.** A path below a root declared with :func:`confine` (the FCoP root, the project
  folder that holds ``workspace/``) is reached by walking from that root one component at a time,
  each opened with ``O_DIRECTORY|O_NOFOLLOW`` relative to its parent's descriptor. A missing folder
  is made with ``mkdir`` in its parent's descriptor and re-opened the same way, so a link swapped in
  meanwhile is caught too. A symlink anywhere below the root, or at the file itself, is refused with
  ``symlink_refused``: a link an agent planted can never send a write outside the workspace. (A path
  below no root is walked from its own folder: only its last component is checked.)
* **New file**: a temp file with a random name (``.{name}.{random}.tmp``) is created with
  ``O_CREAT|O_EXCL|O_NOFOLLOW`` in the target's folder descriptor (a name planted in advance is never
  reused), filled, fsynced, published with ``link`` (fails instead of overwriting), its temp name
  unlinked and the folder fsynced.
* **Move** between folders: ``link`` + ``unlink`` + fsync of both folders; refuses to overwrite.
* **Rewrite** of an existing file replaces *that same file's* previous version with ``rename``
  between folder descriptors, after checking it is the version the caller read (sha256).
* **Reads** never follow symlinks and never block on FIFOs.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import secrets
import stat
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from taskkernel.coordinator.fcop.errors import FcopError, FcopReason
from taskkernel.kernel.logging import get_logger

log = get_logger("taskkernel.coordinator.fcop.safeio")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_TMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_TMP_STEM_BYTES = 200     # ".{stem}.{16 hex}.tmp" stays under NAME_MAX (255)
_TMP_ATTEMPTS = 4
_ROOTS: set[str] = set()


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


_refusals: dict[tuple[str, str], tuple[int, str | None]] = {}  # (op, reason) -> (count, last path)
_refusals_lock = threading.Lock()


def report(exc: FcopError, op: str, **context: str) -> None:
    """Log a refusal where an operator sees it (reason code and path) and count it for the coordinator's
    status (``drain_refusals``); the caller decides what goes on."""
    path = str(exc.path) if exc.path else None
    log.warning("fcop.refused", op=op, reason=exc.reason.value, path=path, message=exc.message, **context)
    with _refusals_lock:
        count, _ = _refusals.get((op, exc.reason.value), (0, None))
        _refusals[(op, exc.reason.value)] = (count + 1, path)


def drain_refusals() -> dict[tuple[str, str], tuple[int, str | None]]:
    """The refusals reported since the last call, per (operation, reason): a pass that could not write
    where it had to (a planted link) is not an ok pass."""
    with _refusals_lock:
        drained = dict(_refusals)
        _refusals.clear()
    return drained


# -- confinement ---------------------------------------------------------------------------------

def confine(root: Path | str) -> None:
    """Declare ``root`` trusted: every path below it is reached component by component from it."""
    _ROOTS.add(os.path.abspath(root))


def _anchor(path: Path) -> tuple[str, list[str]]:
    """(root, components below it): the deepest confined root holding ``path``, else its own folder."""
    full = os.path.abspath(path)  # normalised: no "." or ".." left to walk
    probe = full
    while probe not in _ROOTS:
        cut = probe.rfind(os.sep)
        if cut <= 0:
            head, tail = os.path.split(full)
            return head, [tail] if tail else []
        probe = probe[:cut]
    rest = full[len(probe) + 1:]
    return probe, rest.split(os.sep) if rest else []


def _folder_error(exc: OSError, dir_fd: int | None, name: str, shown: Path) -> Exception:
    if exc.errno == errno.ENOENT:
        return FileNotFoundError(errno.ENOENT, "no such folder", str(shown))
    if exc.errno in (errno.ENOTDIR, errno.ELOOP):
        with contextlib.suppress(OSError):
            if stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                return FcopError(FcopReason.SYMLINK_REFUSED, f"{shown} is a symbolic link: the kernel never "
                                                             "reads or writes through one", shown)
        return FcopError(FcopReason.IO_ERROR, f"{shown} is not a folder", shown)
    return FcopError(FcopReason.IO_ERROR, f"cannot open or make {shown}: {exc.strerror}", shown)


def _open_folder(dir_fd: int | None, name: str, create: bool) -> int:
    """``name`` in ``dir_fd`` (None: ``name`` is a root path) opened O_NOFOLLOW, made first if missing."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        if not create:
            raise
    try:
        if dir_fd is None:
            os.makedirs(name, exist_ok=True)  # the root's own parents are trusted
        else:
            os.mkdir(name, dir_fd=dir_fd)
    except FileExistsError:
        pass  # made meanwhile, or a dangling link: the re-open tells which
    return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)


def _walk(root: str, parts: Sequence[str], *, create: bool) -> int:
    """A descriptor of ``root/parts…``: the root itself and every component below it opened O_NOFOLLOW."""
    fd: int | None = None
    try:
        for depth, name in enumerate([root, *parts]):
            try:
                child = _open_folder(fd, name, create)
            except OSError as exc:  # the path is built only now: walks are hot, refusals are rare
                raise _folder_error(exc, fd, name, Path(root, *parts[:depth])) from exc
            if fd is not None:
                os.close(fd)
            fd = child
    except BaseException:
        if fd is not None:
            os.close(fd)
        raise
    assert fd is not None
    return fd


def _open_parent(path: Path, *, create: bool) -> tuple[int, str]:
    root, parts = _anchor(path)
    if not parts:
        raise FcopError(FcopReason.PATH_ESCAPE, f"{path} is a confinement root, not an entry in one", path)
    return _walk(root, parts[:-1], create=create), parts[-1]


@contextlib.contextmanager
def parent_fd(path: Path, *, create: bool = False) -> Iterator[tuple[int, str]]:
    """(descriptor of ``path``'s folder, ``path``'s name), every folder on the way checked.

    FileNotFoundError when a folder is missing (unless ``create``); FcopError(symlink_refused) for a link.
    """
    fd, name = _open_parent(path, create=create)
    try:
        yield fd, name
    finally:
        os.close(fd)


def ensure_dir(path: Path) -> None:
    """Make the folder ``path`` and its missing parents, refusing any symlinked component."""
    root, parts = _anchor(Path(path))
    os.close(_walk(root, parts, create=True))


@contextlib.contextmanager
def folder_fd(path: Path) -> Iterator[int]:
    """A descriptor of the folder ``path``, every folder on the way checked: the scans list a folder and read its
    files through it (one checked walk per folder, not one per file)."""
    root, parts = _anchor(Path(path))
    fd = _walk(root, parts, create=False)
    try:
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def _entries(path: Path) -> Iterator[Iterator[os.DirEntry[str]]]:
    """The entries of the folder ``path``, read through its checked descriptor."""
    with folder_fd(path) as fd, os.scandir(fd) as entries:
        yield entries


def list_fd(fd: int, shown: Path | None = None) -> list[tuple[str, os.stat_result]]:
    """(name, lstat) of every entry of the open folder ``fd`` (an entry that vanishes meanwhile is left out).

    Any other OSError (a folder readable but not searchable, EIO) is FcopError(io_error) naming ``shown``: the
    folder is refused as a whole, never a crash of the caller's walk."""
    out = []
    try:
        with os.scandir(fd) as entries:
            for entry in entries:
                with contextlib.suppress(FileNotFoundError):
                    out.append((entry.name, entry.stat(follow_symlinks=False)))
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise FcopError(FcopReason.IO_ERROR, f"cannot list: {exc.strerror or exc}", shown) from exc
    return out


def list_dir(path: Path) -> list[tuple[str, os.stat_result]]:
    """(name, lstat) of every entry of the folder ``path`` (an entry that vanishes meanwhile is left out)."""
    with folder_fd(path) as fd:
        return list_fd(fd, path)


def list_names(path: Path) -> list[tuple[str, bool]]:
    """(name, is a folder) of every entry of ``path``, without a stat per entry: a name that vanishes while
    it is listed (a temp file just published) is still returned."""
    out = []
    with _entries(path) as entries:
        for entry in entries:
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                is_dir = False
            out.append((entry.name, is_dir))
    return out


def lstat(path: Path) -> os.stat_result:
    """``os.lstat`` with every folder on the way checked (FileNotFoundError if absent)."""
    with parent_fd(path) as (fd, name):
        return os.stat(name, dir_fd=fd, follow_symlinks=False)


def lexists(path: Path) -> bool:
    try:
        lstat(path)
    except FileNotFoundError:
        return False
    return True


def unlink(path: Path) -> None:
    with parent_fd(path) as (fd, name):
        os.unlink(name, dir_fd=fd)
        os.fsync(fd)


# -- reads ---------------------------------------------------------------------------------------

def _open_file(dir_fd: int, name: str, shown: Path) -> int:
    """A read descriptor of a regular file (FileNotFoundError if gone; FcopError for a link or a FIFO)."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise FcopError(FcopReason.SYMLINK_REFUSED, "symbolic links are never followed", shown) from exc
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            raise FileNotFoundError(str(shown)) from exc
        if exc.errno in (errno.ENXIO, errno.EISDIR):
            raise FcopError(FcopReason.NOT_REGULAR_FILE, "not a regular file", shown) from exc
        raise FcopError(FcopReason.IO_ERROR, f"cannot open: {exc.strerror}", shown) from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise FcopError(FcopReason.NOT_REGULAR_FILE, "not a regular file", shown)
    return fd


def open_read(path: Path) -> int:
    """A read descriptor of the regular file ``path`` (the caller closes it)."""
    with parent_fd(path) as (dir_fd, name):
        return _open_file(dir_fd, name, path)


def _read_fd(fd: int, max_bytes: int, shown: Path) -> tuple[bytes, os.stat_result]:
    try:
        st = os.fstat(fd)
        if st.st_size > max_bytes:
            raise FcopError(FcopReason.FILE_TOO_LARGE, f"file is {st.st_size} bytes; the limit is {max_bytes}",
                            shown)
        chunks, total = [], 0
        while total <= max_bytes:
            chunk = os.read(fd, max_bytes + 1 - total)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > max_bytes:
            raise FcopError(FcopReason.FILE_TOO_LARGE, f"file grew beyond the limit of {max_bytes} bytes", shown)
        return b"".join(chunks), st
    except OSError as exc:  # EIO and the like: this file is refused, the caller's walk goes on
        raise FcopError(FcopReason.IO_ERROR, f"cannot read: {exc.strerror or exc}", shown) from exc
    finally:
        os.close(fd)


def read_at(dir_fd: int, name: str, max_bytes: int, shown: Path) -> bytes:
    """``read_bytes`` of the entry ``name`` of an open checked folder (``folder_fd``); ``shown`` names it in errors."""
    return _read_fd(_open_file(dir_fd, name, shown), max_bytes, shown)[0]


def read_bytes(path: Path, max_bytes: int) -> tuple[bytes, os.stat_result]:
    """Read a regular file without following a symlink or blocking on a FIFO.

    Raises FileNotFoundError if it vanished (callers treat that as "gone"), or
    FcopError: symlink_refused, not_regular_file, file_too_large.
    """
    return _read_fd(open_read(path), max_bytes, path)


# -- writes --------------------------------------------------------------------------------------

def _create_tmp(dir_fd: int, name: str, shown: Path) -> tuple[int, str]:
    """A fresh temp file beside ``name``: random, O_EXCL, O_NOFOLLOW, so no existing entry is ever reused."""
    stem = os.fsencode(name)[:_TMP_STEM_BYTES]
    for _ in range(_TMP_ATTEMPTS):
        tmp = os.fsdecode(b"." + stem + f".{secrets.token_hex(8)}.tmp".encode())
        try:
            return os.open(tmp, _TMP_FLAGS, 0o644, dir_fd=dir_fd), tmp
        except FileExistsError:
            continue
        except OSError as exc:
            raise FcopError(FcopReason.IO_ERROR, f"cannot create a temp file: {exc.strerror}", shown) from exc
    raise FcopError(FcopReason.IO_ERROR, "no free temp file name", shown)


def _fill(fd: int, data: bytes) -> None:
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class Reserved:
    """A temp file created for ``name`` in the folder ``dir_fd`` (see :func:`open_tmp`)."""

    dir_fd: int
    name: str
    fd: int
    tmp: str


def open_tmp(path: Path) -> Reserved:
    """Create the temp file that will become ``path`` (its name also reserves the number in it, see numbering)."""
    dir_fd, name = _open_parent(Path(path), create=True)
    try:
        fd, tmp = _create_tmp(dir_fd, name, Path(path))
    except BaseException:
        os.close(dir_fd)
        raise
    return Reserved(dir_fd, name, fd, tmp)


def publish_reserved(reserved: Reserved, path: Path, data: bytes) -> str:
    """Fill the temp file of :func:`open_tmp` and publish it at ``path`` without overwrite; returns its sha256."""
    dir_fd = reserved.dir_fd
    try:
        _fill(reserved.fd, data)
        try:
            os.link(reserved.tmp, reserved.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
        except FileExistsError:
            raise FcopError(FcopReason.TARGET_EXISTS, "refusing to overwrite an existing file", path) from None
        except OSError as exc:
            raise FcopError(FcopReason.IO_ERROR, f"cannot publish: {exc.strerror}", path) from exc
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(reserved.tmp, dir_fd=dir_fd)
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return sha256_hex(data)


def write_new(path: Path, data: bytes) -> str:
    """Publish a new file atomically; FcopError(target_exists) if the name is taken. Returns its sha256."""
    return publish_reserved(open_tmp(path), path, data)


def rewrite(path: Path, data: bytes, *, expect_sha256: str | None) -> str:
    """Replace ``path`` with a new version, if it still holds ``expect_sha256``; returns the new sha256.

    ``expect_sha256=None`` is for files the kernel derives or owns (ledger, views, tool output): no
    check, and the file (with its folders) is made if missing. Either way the entry replaced must be
    a regular file, never a link. Callers serialise rewrites of one file (see :func:`locked`); the
    check catches a human or agent edit made since the caller read it.
    """
    path = Path(path)
    with parent_fd(path, create=expect_sha256 is None) as (dir_fd, name):
        try:
            mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
        except FileNotFoundError:
            if expect_sha256 is not None:
                raise FcopError(FcopReason.SOURCE_MISSING, "the file to rewrite is gone", path) from None
        else:
            if stat.S_ISLNK(mode):
                raise FcopError(FcopReason.SYMLINK_REFUSED, "refusing to replace a symbolic link", path)
            if not stat.S_ISREG(mode):
                raise FcopError(FcopReason.NOT_REGULAR_FILE, "refusing to replace what is not a regular file",
                                path)
        if expect_sha256 is not None:
            current, _ = _read_fd(_open_file(dir_fd, name, path), 1 << 30, path)
            if sha256_hex(current) != expect_sha256:
                raise FcopError(FcopReason.CONTENT_CHANGED, "the file changed since it was read", path)
        fd, tmp = _create_tmp(dir_fd, name, path)
        try:
            _fill(fd, data)
            os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)  # that same file's previous version
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=dir_fd)
        os.fsync(dir_fd)
    return sha256_hex(data)


class Staged:
    """A file the kernel derives (the ledger, a view) written a chunk at a time into a temp file beside it, so no
    writer holds the whole text: ``commit`` puts it in place only if its bytes differ from the file's (as
    :func:`rewrite` with ``expect_sha256=None``: folders made, a link or a non-regular entry refused)."""

    _CHUNK = 1 << 16

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._dir_fd, self._name = _open_parent(self.path, create=True)
        try:
            with contextlib.suppress(FileNotFoundError):
                mode = os.stat(self._name, dir_fd=self._dir_fd, follow_symlinks=False).st_mode
                if stat.S_ISLNK(mode):
                    raise FcopError(FcopReason.SYMLINK_REFUSED, "refusing to replace a symbolic link", self.path)
                if not stat.S_ISREG(mode):
                    raise FcopError(FcopReason.NOT_REGULAR_FILE, "refusing to replace what is not a regular file",
                                    self.path)
            self._fd, self._tmp = _create_tmp(self._dir_fd, self._name, self.path)
        except BaseException:
            os.close(self._dir_fd)
            raise
        self._hash, self._held, self.size = hashlib.sha256(), 0, 0
        self._pending: list[bytes] = []

    def write(self, text: str) -> None:
        self._add(text.encode("utf-8"))

    def _add(self, data: bytes) -> None:
        self._pending.append(data)
        self._held += len(data)
        if self._held >= self._CHUNK:
            self._flush()

    def commit(self) -> bool:
        """Put the new bytes in place unless the file holds them already; True if it was written. Raises FcopError:
        content_changed when the temp name no longer holds this file (someone who may write the folder replaced
        it), io_error when the file system refuses."""
        try:
            self._flush()
            if self._holds(self._hash.hexdigest()):
                return False
            os.fsync(self._fd)
            self._check_own(self._tmp)
            os.rename(self._tmp, self._name, src_dir_fd=self._dir_fd, dst_dir_fd=self._dir_fd)
            os.fsync(self._dir_fd)
            self._check_own(self._name)  # a swap between the check and the rename is reported, if not prevented
            return True
        except OSError as exc:
            raise FcopError(FcopReason.IO_ERROR, f"cannot put the file in place: {exc.strerror}", self.path) from exc
        finally:
            self.discard()

    def _check_own(self, name: str) -> None:
        mine, found = os.fstat(self._fd), os.stat(name, dir_fd=self._dir_fd, follow_symlinks=False)
        if (mine.st_dev, mine.st_ino) != (found.st_dev, found.st_ino):
            raise FcopError(FcopReason.CONTENT_CHANGED, "the staged file was replaced before it was put in place",
                            self.path)

    def discard(self) -> None:
        """Drop the temp file (nothing of it is published); idempotent, and both descriptors are closed whatever
        the folder holds under the temp name by now."""
        dir_fd, self._dir_fd = self._dir_fd, -1
        if dir_fd < 0:
            return
        try:
            os.close(self._fd)
            with contextlib.suppress(OSError):
                os.unlink(self._tmp, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)

    def _flush(self) -> None:
        for data in self._pending:
            self._hash.update(data)
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view):]
        self.size += self._held
        self._pending, self._held = [], 0

    def _holds(self, sha: str) -> bool:
        """Does the file in place hold exactly the bytes written (read a chunk at a time)?"""
        try:
            fd = _open_file(self._dir_fd, self._name, self.path)
        except FileNotFoundError:
            return False
        try:
            if os.fstat(fd).st_size != self.size:
                return False
            digest = hashlib.sha256()
            while chunk := os.read(fd, self._CHUNK):
                digest.update(chunk)
            return digest.hexdigest() == sha
        finally:
            os.close(fd)


def move_no_overwrite(src: Path, dst: Path) -> Path:
    """Move ``src`` to ``dst`` (a full path) with link + unlink; never overwrites; symlinks moved as links.

    Resumes a move interrupted between link and unlink (``dst`` already the same inode).
    """
    src, dst = Path(src), Path(dst)
    try:
        src_fd, src_name = _open_parent(src, create=False)
    except FileNotFoundError:
        raise FcopError(FcopReason.SOURCE_MISSING, f"{src} no longer exists", src) from None
    try:
        with parent_fd(dst, create=True) as (dst_fd, dst_name):
            try:
                os.link(src_name, dst_name, src_dir_fd=src_fd, dst_dir_fd=dst_fd, follow_symlinks=False)
            except FileExistsError:
                try:
                    same = os.path.samestat(os.stat(src_name, dir_fd=src_fd, follow_symlinks=False),
                                            os.stat(dst_name, dir_fd=dst_fd, follow_symlinks=False))
                except FileNotFoundError:
                    same = False
                if not same:
                    raise FcopError(FcopReason.TARGET_EXISTS, f"{dst} already exists; refusing to overwrite it",
                                    src) from None
            except FileNotFoundError:
                raise FcopError(FcopReason.SOURCE_MISSING, f"{src} no longer exists", src) from None
            except OSError as exc:
                raise FcopError(FcopReason.IO_ERROR, f"cannot link {src} to {dst}: {exc.strerror}", src) from exc
            os.fsync(dst_fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(src_name, dir_fd=src_fd)
        os.fsync(src_fd)
    finally:
        os.close(src_fd)
    return dst


@contextlib.contextmanager
def locked(lock_file: Path, *, wait: bool = True) -> Iterator[bool]:
    """An exclusive ``flock`` on ``lock_file`` (made 0600 if needed, never through a link); released on exit or
    death. Yields whether it is held: ``wait=False`` takes it only if it is free now (a holder that is stopped,
    not dead, keeps it for as long as it is stopped)."""
    lock_file = Path(lock_file)
    with parent_fd(lock_file, create=True) as (dir_fd, name):
        try:
            fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise FcopError(FcopReason.SYMLINK_REFUSED, "a lock file is never a symbolic link",
                                lock_file) from exc
            raise FcopError(FcopReason.IO_ERROR, f"cannot open the lock: {exc.strerror}", lock_file) from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise FcopError(FcopReason.NOT_REGULAR_FILE, "a lock file must be a regular file", lock_file)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def safe_join(root: Path, relative: str) -> Path:
    """``root/relative`` if it stays inside ``root`` without passing through a symlink; else path_escape."""
    candidate = Path(os.path.normpath(root / relative))
    base = Path(os.path.normpath(root))
    if ".." in Path(relative).parts or not candidate.is_relative_to(base) or Path(relative).is_absolute():
        raise FcopError(FcopReason.PATH_ESCAPE, f"{relative!r} points outside {root}", relative)
    probe = base
    for part in candidate.relative_to(base).parts:
        probe = probe / part
        if probe.is_symlink():
            raise FcopError(FcopReason.SYMLINK_REFUSED, f"{probe} is a symbolic link", probe)
    return candidate
