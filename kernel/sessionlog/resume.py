"""Compaction-safe resume (the seed 002 failure).

After a ``compaction`` the session continues from the last ``progress`` checkpoint accepted
*before* that compaction; instructions accepted *after* it take priority. Instructions that the
summary mentions (or that were accepted before the compaction) are history, never commands.
When the anchor cannot be determined, the answer is ``anchor: null`` / ``no_safe_anchor`` and
nothing is resumed automatically.

Reading is bounded: only the newest ``max_inputs`` accepted inputs (default 10 000) and at most
``max_bytes`` of payload JSON (default 64 MiB) are read, newest first. If the decision depends on
anything older (no compaction inside the window of a longer log, no checkpoint before the
compaction inside the window, a rollback reaching before the window) the cause is
``read_bound_exceeded``. The answer depends only on the log's content, so it is deterministic.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal

from pydantic import BaseModel

from taskkernel.kernel.canonical import canonical_json
from taskkernel.kernel.sessionlog.models import INSTRUCTION_KINDS, InputKind, Rec, SessionReason
from taskkernel.kernel.sessionlog.replay import RollbackOutOfWindow, effective_context, replay

DEFAULT_MAX_INPUTS = 10_000
DEFAULT_MAX_BYTES = 64 * 2**20
MAX_ANCHOR_TEXT = 4_000  # characters of checkpoint text returned; the rest is cut, flagged


class Anchor(BaseModel):
    seq: int | None
    input_id: str
    text: str
    text_truncated: bool
    completed_tool_calls: int
    done: bool


class CompactionRef(BaseModel):
    seq: int | None
    input_id: str
    covers_to_seq: int | None


class Instruction(BaseModel):
    seq: int | None
    input_id: str
    kind: str
    text: str


class ReadBound(BaseModel):
    max_inputs: int
    max_bytes: int
    inputs_read: int
    bytes_read: int
    from_seq: int | None  # first sequence read (None: nothing sequenced read)
    to_seq: int | None
    complete: bool  # the whole log fit inside the bound


class ResumeAnswer(BaseModel):
    session: str
    status: Literal["resume", "complete", "no_safe_anchor"]
    reason: SessionReason | None  # NO_SAFE_ANCHOR when anchor is None
    cause: SessionReason | None  # why there is no anchor
    anchor: Anchor | None
    compaction: CompactionRef | None
    instructions: list[Instruction]  # accepted after the compaction (or after the anchor if none)
    read: ReadBound


def payload_bytes(r: Rec) -> int:
    return len(canonical_json(r.payload).encode("utf-8"))


class Window:
    """Newest-first reader that stops at the bound; yields the window in acceptance order."""

    def __init__(self, max_inputs: int, max_bytes: int) -> None:
        if max_inputs < 1 or max_bytes < 1:
            raise ValueError("read bounds must be positive")
        self.max_inputs = max_inputs
        self.max_bytes = max_bytes
        self.bytes_read = 0
        self.records: list[Rec] = []
        self.full = False  # stopped because of the bound

    def take(self, newest_first: Iterable[Rec]) -> None:
        for r in newest_first:
            size = payload_bytes(r)
            if len(self.records) >= self.max_inputs or self.bytes_read + size > self.max_bytes:
                self.full = True
                return
            self.records.append(r)
            self.bytes_read += size

    def ordered(self) -> list[Rec]:
        return self.records[::-1]


def resume_from_records(
    session: str, records: Sequence[Rec], *, max_inputs: int = DEFAULT_MAX_INPUTS,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> ResumeAnswer:
    """Resume over an interchange log (any storage order); it must replay as ``known`` first."""
    result = replay(records)
    bound = Window(max_inputs, max_bytes)
    if not result.known:
        return damaged(session, result.reason, bound, [])  # type: ignore[arg-type]
    entries: list[Rec] = result.state[1]  # the inputs reducer keeps the full replayed list
    legacy = [r for r in entries if r.seq is None]
    sequenced = [r for r in entries if r.seq is not None]
    bound.take(reversed(sequenced))
    window = bound.ordered()
    if not bound.full:
        bound.take(reversed(legacy))
    legacy_read = [r for r in bound.ordered() if r.seq is None]
    return decide(session, legacy_read, window, bound, complete=not bound.full)


def decide(session: str, legacy: list[Rec], window: list[Rec], bound: Window, *, complete: bool) -> ResumeAnswer:
    """The resume rule over a verified, contiguous window (``legacy`` only when ``complete``)."""
    read = _read_info(bound, window, complete)
    base = window[0].seq - 1 if window and window[0].seq is not None else 0
    try:
        ctx = effective_context(legacy if complete else [], window, base)
    except RollbackOutOfWindow:
        return _no_anchor(session, SessionReason.READ_BOUND_EXCEEDED, None, [], read)
    last_compaction = next((i for i in range(len(ctx) - 1, -1, -1) if ctx[i].kind == InputKind.COMPACTION), None)
    if last_compaction is None and not complete:
        return _no_anchor(session, SessionReason.READ_BOUND_EXCEEDED, None, [], read)
    history = ctx if last_compaction is None else ctx[:last_compaction]
    anchor_at = next((i for i in range(len(history) - 1, -1, -1) if history[i].kind == InputKind.PROGRESS), None)
    after = last_compaction if last_compaction is not None else anchor_at
    pending = ctx if after is None else ctx[after + 1 :]
    instructions = [
        Instruction(seq=r.seq, input_id=r.input_id, kind=r.kind, text=r.payload["text"])
        for r in pending if r.kind in INSTRUCTION_KINDS
    ]
    compaction = None
    if last_compaction is not None:
        c = ctx[last_compaction]
        compaction = CompactionRef(seq=c.seq, input_id=c.input_id, covers_to_seq=c.payload.get("covers_to_seq"))
    if anchor_at is None:
        cause = SessionReason.NO_CHECKPOINT if complete else SessionReason.READ_BOUND_EXCEEDED
        return _no_anchor(session, cause, compaction, instructions, read)
    p = history[anchor_at]
    text = p.payload["text"]
    anchor = Anchor(
        seq=p.seq, input_id=p.input_id, text=text[:MAX_ANCHOR_TEXT], text_truncated=len(text) > MAX_ANCHOR_TEXT,
        completed_tool_calls=p.payload["completed_tool_calls"], done=bool(p.payload.get("done", False)),
    )
    return ResumeAnswer(
        session=session, status="complete" if anchor.done else "resume", reason=None, cause=None,
        anchor=anchor, compaction=compaction, instructions=instructions, read=read,
    )


def damaged(session: str, cause: SessionReason, bound: Window, window: list[Rec]) -> ResumeAnswer:
    """The answer for a log that does not replay (gap, duplicate): no anchor, nothing resumed."""
    return _no_anchor(session, cause, None, [], _read_info(bound, window, False))


def _no_anchor(
    session: str, cause: SessionReason | None, compaction: CompactionRef | None,
    instructions: list[Instruction], read: ReadBound,
) -> ResumeAnswer:
    return ResumeAnswer(
        session=session, status="no_safe_anchor", reason=SessionReason.NO_SAFE_ANCHOR, cause=cause,
        anchor=None, compaction=compaction, instructions=instructions, read=read,
    )


def _read_info(bound: Window, window: list[Rec], complete: bool) -> ReadBound:
    return ReadBound(
        max_inputs=bound.max_inputs, max_bytes=bound.max_bytes, inputs_read=len(bound.records),
        bytes_read=bound.bytes_read, from_seq=window[0].seq if window else None,
        to_seq=window[-1].seq if window else None, complete=complete,
    )
