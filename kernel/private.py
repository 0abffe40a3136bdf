"""Files only the workspace owner may read: the state directory (0700), the database, the owner's
credential and the chain key (0600). Created without following a symlink and never widened later."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: Path) -> Path:
    """Create ``path`` as 0700, and its missing parents too (``mkdir(parents=True)`` would make them with the
    umask's 0755); an existing directory is narrowed to 0700. A symlink in its place is refused: the state
    directory must be the workspace's own."""
    if not path.parent.exists():
        private_dir(path.parent)
    path.mkdir(mode=DIR_MODE, exist_ok=True)
    if path.is_symlink():
        raise OSError(f"{path} is a symlink; refusing to keep private state there")
    os.chmod(path, DIR_MODE)
    return path


def write_private(path: Path, data: bytes) -> None:
    """Create ``path`` as a new 0600 file holding ``data`` (fsynced); an existing file is never replaced."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_private(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        with os.fdopen(fd, "rb", closefd=False) as fh:
            return fh.read()
    finally:
        os.close(fd)


def read_secret(path: Path) -> bytes:
    """A secret written by ``load_or_create_secret``; never creates one."""
    return bytes.fromhex(read_private(path).decode("ascii").strip())


def load_or_create_secret(path: Path, nbytes: int = 32) -> bytes:
    """A random secret kept in a 0600 file (created on first use; a racing creator's file wins)."""
    try:
        return read_secret(path)
    except FileNotFoundError:
        pass
    with contextlib.suppress(FileExistsError):
        write_private(path, secrets.token_hex(nbytes).encode("ascii") + b"\n")
    return read_secret(path)


def narrow(path: Path) -> None:
    """Make an existing file 0600 (databases created by a library, logs); missing files are ignored."""
    try:
        os.chmod(path, FILE_MODE, follow_symlinks=False)
    except FileNotFoundError:
        pass
    except NotImplementedError:  # platforms without lchmod: never chmod through a symlink
        if not path.is_symlink():
            os.chmod(path, FILE_MODE)
