"""Acceptance-sequenced session log (issue 3): what each session was told, in the order the
host accepted it, replayable as ``known``/``unknown`` whatever the storage order. See docs/sessionlog.md."""

from taskkernel.kernel.sessionlog.interchange import LogFileError, parse_lines, read_file
from taskkernel.kernel.sessionlog.log import SessionLog
from taskkernel.kernel.sessionlog.models import (
    AcceptResult,
    InputKind,
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
