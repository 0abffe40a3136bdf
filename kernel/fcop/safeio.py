"""Crash-safe file primitives: no partial file is ever visible, no file is ever overwritten by another.

* A new file is written to ``.{name}.tmp`` in the same directory (created with
  ``O_CREAT|O_EXCL``, which doubles as the reservation of the name), fsynced,
  published with ``os.link`` (fails instead of overwriting) and the temp name
  unlinked, then the directory is fsynced.
* A move between folders is ``os.link`` + ``unlink`` + fsync of both folders:
  it refuses to overwrite, unlike ``os.replace``/``rename``.
* A rewrite of an existing file (appending a transition, refreshing a derived
  view) replaces *that same file's* previous version: it checks the content
  it replaces is the version the caller read (compare-and-swap on sha256).
* Reads never follow symlinks and never block on FIFOs.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from kernel.fcop.errors import FcopError, FcopReason

STALE_TMP_SECONDS = 60.0


def tmp_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp")


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_bytes(path: Path, max_bytes: int) -> tuple[bytes, os.stat_result]:
    """Read a regular file without following a symlink or blocking on a FIFO.

    Raises FileNotFoundError if it vanished (callers treat that as "gone"), or
    FcopError: symlink_refused, not_regular_file, file_too_large.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise FcopError(FcopReason.SYMLINK_REFUSED, "symbolic links are never followed", path) from exc
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            raise FileNotFoundError(str(path)) from exc
        if exc.errno in (errno.ENXIO, errno.EISDIR):
            raise FcopError(FcopReason.NOT_REGULAR_FILE, "not a regular file", path) from exc
        raise FcopError(FcopReason.IO_ERROR, f"cannot open: {exc.strerror}", path) from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FcopError(FcopReason.NOT_REGULAR_FILE, "not a regular file", path)
        if st.st_size > max_bytes:
            raise FcopError(FcopReason.FILE_TOO_LARGE, f"file is {st.st_size} bytes; the limit is {max_bytes}",
                            path)
        chunks, total = [], 0
        while total <= max_bytes:
            chunk = os.read(fd, max_bytes + 1 - total)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > max_bytes:
            raise FcopError(FcopReason.FILE_TOO_LARGE, f"file grew beyond the limit of {max_bytes} bytes", path)
        return b"".join(chunks), st
    finally:
        os.close(fd)


def open_tmp(path: Path, stale_after: float = STALE_TMP_SECONDS) -> int:
    """Create ``.{name}.tmp`` exclusively; a temp file older than ``stale_after`` s is a crash leftover."""
    tmp = tmp_path(path)
    for _ in range(2):
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        except FileExistsError:
            try:
                age = time.time() - os.lstat(tmp).st_mtime
            except FileNotFoundError:
                continue
            if age < stale_after:
                raise FcopError(FcopReason.TARGET_EXISTS, f"{tmp.name} exists: another writer is publishing "
                                                          f"{path.name}", path) from None
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    raise FcopError(FcopReason.TARGET_EXISTS, f"cannot reserve {tmp.name}", path)


def _fill(fd: int, data: bytes) -> None:
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def publish_reserved(fd: int, path: Path, data: bytes) -> str:
    """Fill the reserved temp file (``fd`` from :func:`open_tmp`) and publish it at ``path`` without overwrite."""
    tmp = tmp_path(path)
    try:
        _fill(fd, data)
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise FcopError(FcopReason.TARGET_EXISTS, "refusing to overwrite an existing file", path) from None
        except OSError as exc:
            raise FcopError(FcopReason.IO_ERROR, f"cannot publish: {exc.strerror}", path) from exc
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    fsync_dir(path.parent)
    return sha256_hex(data)


def write_new(path: Path, data: bytes) -> str:
    """Publish a new file atomically; FcopError(target_exists) if the name is taken. Returns its sha256."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if os.path.lexists(path):
        raise FcopError(FcopReason.TARGET_EXISTS, "refusing to overwrite an existing file", path)
    return publish_reserved(open_tmp(path), path, data)


def rewrite(path: Path, data: bytes, *, expect_sha256: str | None) -> str:
    """Replace ``path`` with a new version, if it still holds ``expect_sha256`` (None: derived file, no check).

    Callers serialise rewrites of one file (see :func:`locked`); the check here
    catches a human or agent edit made since the caller read the file.
    """
    fd = open_tmp(path)
    tmp = tmp_path(path)
    try:
        if expect_sha256 is not None:
            try:
                current, _ = read_bytes(path, 1 << 30)
            except FileNotFoundError:
                raise FcopError(FcopReason.SOURCE_MISSING, "the file to rewrite is gone", path) from None
            if sha256_hex(current) != expect_sha256:
                raise FcopError(FcopReason.CONTENT_CHANGED, "the file changed since it was read", path)
        fill_fd, fd = fd, -1
        _fill(fill_fd, data)
        os.replace(tmp, path)  # the previous version of this same file, checked just above
    finally:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    fsync_dir(path.parent)
    return sha256_hex(data)


def move_no_overwrite(src: Path, dst: Path) -> Path:
    """Move ``src`` to ``dst`` (a full path) with link + unlink; never overwrites; symlinks moved as links.

    Resumes a move interrupted between link and unlink (``dst`` already the same inode).
    """
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst, follow_symlinks=False)
    except FileExistsError:
        try:
            same = os.path.samestat(os.lstat(src), os.lstat(dst))
        except FileNotFoundError:
            same = False
        if not same:
            raise FcopError(FcopReason.TARGET_EXISTS, f"{dst} already exists; refusing to overwrite it",
                            src) from None
    except FileNotFoundError:
        raise FcopError(FcopReason.SOURCE_MISSING, f"{src} no longer exists", src) from None
    except OSError as exc:
        raise FcopError(FcopReason.IO_ERROR, f"cannot link {src} to {dst}: {exc.strerror}", src) from exc
    fsync_dir(dst.parent)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(src)
    fsync_dir(src.parent)
    return dst


@contextlib.contextmanager
def locked(lock_file: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``lock_file`` (created if needed); released on exit or process death."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
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
            raise FcopError(FcopReason.SYMLINK_REFUSED, f"{probe} is a symbolic link", relative)
    return candidate
