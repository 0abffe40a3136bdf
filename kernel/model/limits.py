"""The most a command may carry: what the folder projection can still write as an FCoP file.

A TASK file keeps its subject, thread key, parent and references in the front matter (at most
``frontmatter.MAX_FRONT_MATTER_CHARS`` characters, its growing ``transitions:`` included) and its body after
it; the whole file must stay under ``parse.DEFAULT_MAX_BYTES`` to be read back and to take more transitions.
With every field below at its limit and written in the characters YAML escapes the most (a control
character is four), the front matter takes about half its limit, leaving the rest for a long history, and the
file about 0.53 MiB. Sizes are UTF-8 bytes. Beyond a limit a command is refused at the shape check with
``payload_too_large`` (errors of type PAYLOAD_TOO_LARGE_ERROR); nothing is stored.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import AfterValidator, Field
from pydantic_core import ErrorDetails, PydanticCustomError

PAYLOAD_TOO_LARGE_ERROR = "payload_too_large"  # the pydantic error type of a field beyond its limit
MAX_BODY_BYTES = 512 * 1024  # a task, report or record body
MAX_REFERENCES = 32  # references of one task, report or record
MAX_REFERENCE_BYTES = 200  # each reference
MAX_THREAD_KEY_BYTES = 200  # a command's thread_key
MAX_REASON_BYTES = 8 * 1024  # a reject/archive/force_archive reason (a REVIEW file's rationale)


def _too_large(size: int, limit: int, unit: str) -> PydanticCustomError:
    return PydanticCustomError(PAYLOAD_TOO_LARGE_ERROR, "{size} {unit}, over the limit of {limit} {unit}",
                               {"size": size, "limit": limit, "unit": unit})


def _bytes_at_most(limit: int) -> AfterValidator:
    def check(value: str) -> str:
        if len(value) * 4 > limit and (size := len(value.encode("utf-8"))) > limit:  # 4 bytes per character at most
            raise _too_large(size, limit, "bytes")
        return value
    return AfterValidator(check)


def _count_at_most(limit: int) -> AfterValidator:
    def check(value: list[str]) -> list[str]:
        if len(value) > limit:
            raise _too_large(len(value), limit, "items")
        return value
    return AfterValidator(check)


Body = Annotated[str, _bytes_at_most(MAX_BODY_BYTES)]
Reference = Annotated[str, _bytes_at_most(MAX_REFERENCE_BYTES)]
References = Annotated[list[Reference], _count_at_most(MAX_REFERENCES)]
ThreadKey = Annotated[str, _bytes_at_most(MAX_THREAD_KEY_BYTES)]
Reason = Annotated[str, Field(min_length=1), _bytes_at_most(MAX_REASON_BYTES)]


def too_large_message(errors: Sequence[ErrorDetails | dict[str, Any]]) -> str | None:
    """``field: size, over the limit of N`` for each field beyond its limit (None if there is none)."""
    parts = [f"{'.'.join(str(x) for x in e['loc']) or 'command'}: {e['msg']}" for e in errors
             if e["type"] == PAYLOAD_TOO_LARGE_ERROR]
    return "; ".join(parts[:5]) or None
