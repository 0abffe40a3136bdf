"""Acceptance-sequenced session log (issue 3): what each session was told, in the order the
host accepted it, replayable as ``known``/``unknown`` whatever the storage order. See docs/sessionlog.md.

Names are imported from their module on first use (PEP 562), so a read that only counts a task's pending
instructions (``task show``: kinds.py and tables.py) does not load the log, its pydantic models and replay."""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from taskkernel.kernel.sessionlog.interchange import LogFileError, parse_lines, read_file
    from taskkernel.kernel.sessionlog.kinds import InputKind
    from taskkernel.kernel.sessionlog.log import SessionLog
    from taskkernel.kernel.sessionlog.models import (
        AcceptResult,
        PermissionDecision,
        Rec,
        SessionInput,
        SessionLogError,
        SessionReason,
        TurnResult,
    )
    from taskkernel.kernel.sessionlog.reducers import Reducer, register_reducer
    from taskkernel.kernel.sessionlog.replay import Order, ReplayResult, replay
    from taskkernel.kernel.sessionlog.resume import ResumeAnswer, resume_from_records
    from taskkernel.kernel.sessionlog.tables import install

_WHERE: dict[str, str] = {
    "AcceptResult": "models",
    "InputKind": "kinds",
    "LogFileError": "interchange",
    "Order": "replay",
    "PermissionDecision": "models",
    "Rec": "models",
    "Reducer": "reducers",
    "ReplayResult": "replay",
    "ResumeAnswer": "resume",
    "SessionInput": "models",
    "SessionLog": "log",
    "SessionLogError": "models",
    "SessionReason": "models",
    "TurnResult": "models",
    "install": "tables",
    "parse_lines": "interchange",
    "read_file": "interchange",
    "register_reducer": "reducers",
    "replay": "replay",
    "resume_from_records": "resume",
}

__all__ = [
    "AcceptResult",
    "InputKind",
    "LogFileError",
    "Order",
    "PermissionDecision",
    "Rec",
    "Reducer",
    "ReplayResult",
    "ResumeAnswer",
    "SessionInput",
    "SessionLog",
    "SessionLogError",
    "SessionReason",
    "TurnResult",
    "install",
    "parse_lines",
    "read_file",
    "register_reducer",
    "replay",
    "resume_from_records",
]


class _Package(types.ModuleType):
    """``replay`` is both a submodule and the function exported here: importing the submodule binds it on the
    package, which would hide the function from ``from taskkernel.kernel.sessionlog import replay``. The package's
    ``replay`` stays the function (as when every name was imported eagerly); the submodule is in sys.modules."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and name in _WHERE and _WHERE[name] == name:
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
