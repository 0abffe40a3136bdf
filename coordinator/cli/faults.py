"""Failures no command handled, as values (docs/cli.md, "Errors").

An infrastructure fault — a database URL that is not one, a database that cannot be reached or opened, a
full disk, a read-only directory, a damaged file — is one line on stderr plus the error envelope
``{"status": "error", "code", "message"}`` on stdout (in JSON mode), with a stable code and exit status.
A refusal raised as an exception (anything carrying a reason code) is a rejection, exit 2. Anything else
is ``internal_error``. The traceback never reaches the terminal: it goes to the CLI log file
(``.taskkernel/logs/cli.log`` in a workspace, else ``$XDG_STATE_HOME/taskkernel/cli.log``), and the line
says where.
"""

from __future__ import annotations

import errno
import os
import traceback
from datetime import UTC, datetime
from enum import Enum
from pathlib import Path

from taskkernel.coordinator.cli.output import Exit, report_error, report_rejection

_DISK_FULL = ("database or disk is full", "no space left on device")
_READ_ONLY = ("readonly database", "read-only file system", "attempt to write a readonly")
_UNREACHABLE = ("unable to open database file", "connection failed", "could not connect", "connection refused",
                "could not translate host name", "server closed the connection", "connection timeout")


def classify(exc: BaseException) -> tuple[str, str, Exit]:
    """(code, message, exit status) for an unhandled exception."""
    from sqlalchemy import exc as sa_exc

    from taskkernel.coordinator.config import ConfigError
    from taskkernel.kernel.store.db import is_corruption

    if isinstance(exc, ConfigError):  # taskkernel.toml read somewhere no command expected it: still its own code
        return exc.code, exc.message, Exit.USAGE
    text = " ".join(str(getattr(exc, "orig", None) or exc).split())
    lowered = text.lower()
    if isinstance(exc, sa_exc.ArgumentError | sa_exc.NoSuchModuleError):
        return ("database_url_invalid", f"not a database URL taskkernel can open ({text}); use "
                "sqlite:///path/to/file.db or postgresql+psycopg://user@host/db", Exit.USAGE)
    if is_corruption(exc):
        return "database_corrupt", f"the database is damaged or not a database: {text}", Exit.REJECTED
    if _errno(exc) == errno.ENOSPC or any(s in lowered for s in _DISK_FULL):
        return "disk_full", f"no space left to write: {text}", Exit.INTERNAL
    if _errno(exc) in (errno.EROFS, errno.EACCES, errno.EPERM) or any(s in lowered for s in _READ_ONLY):
        return "not_writable", f"cannot write: {text}", Exit.INTERNAL
    if isinstance(exc, sa_exc.OperationalError | sa_exc.InterfaceError) and any(s in lowered for s in _UNREACHABLE):
        return "database_unreachable", f"cannot reach the database: {text}", Exit.INTERNAL
    if isinstance(exc, sa_exc.DBAPIError):
        return "database_error", f"the database failed: {text}", Exit.INTERNAL
    if isinstance(exc, OSError):
        return "io_error", f"{exc.strerror or text}{f': {exc.filename}' if exc.filename else ''}", Exit.INTERNAL
    return "internal_error", f"taskkernel failed unexpectedly ({type(exc).__name__}: {text})", Exit.INTERNAL


def _errno(exc: BaseException) -> int | None:
    for candidate in (exc, getattr(exc, "orig", None), exc.__cause__, exc.__context__):
        if isinstance(candidate, OSError) and candidate.errno is not None:
            return candidate.errno
    return None


def _reason_of(exc: BaseException) -> str | None:
    """A refusal raised rather than returned (KernelError, FcopError, ChainKeyError): its reason code."""
    reason = getattr(exc, "reason", None)
    if isinstance(reason, Enum):
        reason = reason.value
    return reason if isinstance(reason, str) and reason else None


def log_path(workspace: str | None) -> Path:
    """Where the CLI's tracebacks go: the workspace's private folder if the command has a workspace."""
    from taskkernel.coordinator.workspace import Workspace

    try:
        return Workspace.locate(workspace).state_dir / "logs" / "cli.log"
    except Exception:  # noqa: BLE001 - no workspace, or one that cannot be read: the user's state folder
        state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
        return Path(state) / "taskkernel" / "cli.log"


def write_traceback(exc: BaseException, workspace: str | None, origin: str = "") -> Path | None:
    """Append the traceback to the CLI log (0600); the log's path, or None when it cannot be written. ``origin``
    names the server a fault happened in (mcp, serve)."""
    path = log_path(workspace)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as log:
            log.write(f"--- {datetime.now(UTC).isoformat()} pid {os.getpid()}{f' ({origin})' if origin else ''}\n")
            log.write("".join(traceback.format_exception(exc)))
    except Exception:  # noqa: BLE001 - a full disk cannot take the log either; the line still says what failed
        return None
    return path


def report_fault(exc: BaseException, workspace: str | None = None) -> int:
    """Say what failed in one line (and the envelope in JSON mode); return the exit status."""
    reason = _reason_of(exc)
    if reason is not None:
        report_rejection(reason, str(getattr(exc, "message", "") or exc))
        return int(Exit.REJECTED)
    code, message, status = classify(exc)
    where = write_traceback(exc, workspace)
    if where is not None and code in ("internal_error", "database_error", "io_error"):
        message = f"{message} (details in {where})"
    report_error(code, message)
    return int(status)
