"""structlog, configured once: JSON lines when stderr is not a terminal, readable console otherwise.

structlog (and the rich console it brings) is imported at the first log call, not when a module that logs is
imported: a CLI read that never logs does not pay for it."""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import TYPE_CHECKING, Any, TextIO, cast

if TYPE_CHECKING:
    import structlog

_pending: str | None = None  # the level asked for by configure_logging, applied before the first log line
_configured = False
_lock = threading.Lock()  # threads logging for the first time at once wait for one set-up, never use defaults


def configure_logging(level: str | None = None) -> None:
    """Ask for the process's logging set-up; it takes effect before the first log line (or now, if structlog
    is already in use)."""
    global _pending
    with _lock:
        if _configured or _pending is not None:
            return
        _pending = level or os.environ.get("TASKKERNEL_LOG_LEVEL", "WARNING")
        if "structlog" in sys.modules:
            _apply_locked()


def prefer_level(level: str) -> None:
    """A command's own default level (``up``: INFO, a line per run), unless TASKKERNEL_LOG_LEVEL names one;
    only before the first log line."""
    global _pending
    with _lock:
        if not _configured and "TASKKERNEL_LOG_LEVEL" not in os.environ:
            _pending = level


def _apply_pending() -> None:
    with _lock:
        _apply_locked()


def _apply_locked() -> None:
    global _configured
    if _pending is None or _configured:
        return
    import structlog

    lvl = getattr(logging, _pending.upper(), logging.WARNING)
    renderer: structlog.typing.Processor
    renderer = structlog.dev.ConsoleRenderer() if sys.stderr.isatty() else structlog.processors.JSONRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=cast("TextIO", _CurrentStderr())),
        cache_logger_on_first_use=True,
    )
    _configured = True  # only once structlog is configured: no thread logs through its defaults meanwhile


class _CurrentStderr:
    """Whatever ``sys.stderr`` is when a line is written: a live view that redirects it (rich's Live) gets the
    lines and prints them above itself instead of having them painted over."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


class _LazyLogger:
    """Stands for ``structlog.get_logger(name)`` until it is first used."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._logger: Any = None

    def __getattr__(self, attr: str) -> Any:
        if self._logger is None:
            _apply_pending()
            import structlog

            self._logger = structlog.get_logger(self._name)
        return getattr(self._logger, attr)


def get_logger(name: str) -> structlog.typing.FilteringBoundLogger:
    return cast("structlog.typing.FilteringBoundLogger", _LazyLogger(name))
