"""The session log's input kinds, and which of them are instructions: plain enums, no pydantic.

A read that counts a task's pending instructions (``task show``, kernel/instructions.py) needs these names only;
models.py re-exports them with the payload models that validate an input.
"""

from __future__ import annotations

from enum import StrEnum


class InputKind(StrEnum):
    MESSAGE = "message"  # user / ADMIN instruction
    STEER = "steer"  # mid-turn instruction
    QUEUED = "queued"  # prompt queued while a turn runs
    ANSWER = "answer"  # human answer to an agent's question
    ALLOW = "allow"  # grant of a named permission in a scope
    REVOKE = "revoke"  # revocation of a named permission in a scope
    PROGRESS = "progress"  # agent progress checkpoint with its completed tool-call count
    COMPACTION = "compaction"  # summary replacing history up to a sequence number
    ROLLBACK = "rollback"  # marker rewinding the replayed context to a sequence boundary
    OBSERVATION = "observation"  # a tool's read of some state (entity/key/value), evidence for the gate


# Kinds whose text is something to *do*; everything else is bookkeeping.
INSTRUCTION_KINDS = frozenset({InputKind.MESSAGE, InputKind.STEER, InputKind.QUEUED, InputKind.ANSWER})
INSTRUCTION_KIND_NAMES = tuple(sorted(k.value for k in INSTRUCTION_KINDS))  # as stored (a column's values)
