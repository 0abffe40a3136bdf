"""Tool results: one structured document per call, within an output budget, and its text.

The structured document is the whole typed result, and the text content is that same document as compact JSON
(``text``): hosts that hand the model only a result's text (Gemini CLI) show it everything, as the MCP
specification's Structured Content section asks. A document is measured as that UTF-8 JSON. Past the budget
(``[mcp] output_budget``, default 16 KiB) a list is cut from its end with ``truncated: true`` and a cursor that
continues exactly after the last item kept, and a long text is cut with ``*_truncated: true`` and the call that
reads on (``get_task`` with a ``body_offset``); the text is cut with it, being the same bytes.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from taskkernel.kernel.canonical import canonical_json

if TYPE_CHECKING:
    from taskkernel.kernel.model.commands import CommandResult
    from taskkernel.kernel.reasons import KernelError

DEFAULT_BUDGET = 16384


@dataclass(frozen=True)
class Outcome:
    """What one tool call answers: the structured document, and whether it is a refusal."""

    structured: dict[str, Any]
    error: bool = False

    @property
    def text(self) -> str:
        """The text content: the document as compact JSON, the very bytes ``size`` measures."""
        return orjson.dumps(self.structured).decode()


class CursorError(ValueError):
    """A cursor this listing did not print (the message says what to do)."""


def size(document: Any) -> int:
    """Bytes of ``document`` as the transport writes it (compact UTF-8 JSON)."""
    return len(orjson.dumps(document))


def refusal(reason: str, message: str, *, task_id: str | None = None, revision: int | None = None,
            round_: int | None = None, hint: str | None = None) -> Outcome:
    return Outcome({"status": "rejected", "reason": reason, "message": message, "task_id": task_id,
                    "revision": revision, "round": round_, "hint": hint}, True)


def refused(exc: KernelError, task_id: str | None = None) -> Outcome:
    return refusal(exc.reason.value, exc.message, task_id=task_id)


def command_outcome(result: CommandResult, key: str | None, hint: str | None = None) -> Outcome:
    """`taskkernel submit`'s document for a kernel result; a rejection is a refusal (isError)."""
    return Outcome({**result.wire(), "idempotency_key": key or None, "hint": hint}, result.status == "rejected")


def fit(outcome: Outcome, budget: int) -> Outcome:
    """``outcome`` within ``budget`` whatever it holds: the tools cut their own documents (lists with a cursor,
    texts with the call that reads on); anything still over (a refusal quoting a long value) has its longest
    strings and lists halved (``squeeze``), with ``truncated: true`` where the document has that field."""
    if size(outcome.structured) <= budget:
        return outcome
    doc = orjson.loads(orjson.dumps(outcome.structured))  # a copy: squeeze cuts in place
    if "truncated" in doc:
        doc["truncated"] = True
    squeeze(doc, budget, keep=frozenset({"status", "reason", "truncated"}))
    return Outcome(doc, outcome.error)


def cut_list(document: dict[str, Any], key: str, budget: int, cursor_after: Callable[[Any], str | None],
             minimum: int = 0) -> dict[str, Any]:
    """``document`` with its list ``key`` cut from the end until the document fits ``budget``: then
    ``truncated`` is true and ``next_cursor`` is ``cursor_after(last item kept)`` (``minimum`` items are kept
    whatever the size). Cuts by halving, then item by item, so a long list costs a few measurements."""
    items = document[key]
    if size(document) <= budget or len(items) <= minimum:
        return document
    low, high = minimum, len(items)  # the largest count that fits lies in [low, high)
    while high - low > 1:
        mid = (low + high) // 2
        if size({**document, key: items[:mid], "truncated": True, "next_cursor": "x" * 200}) <= budget:
            low = mid
        else:
            high = mid
    kept = items[:low]
    return {**document, key: kept, "truncated": True,
            "next_cursor": cursor_after(kept[-1]) if kept else document.get("next_cursor") or cursor_after(None)}


SQUEEZE_FLOOR = 48  # bytes: a string or list this small is left as it is (ids, codes, short names)


def squeeze(document: Any, budget: int, keep: frozenset[str] = frozenset(), rigid: frozenset[str] = frozenset()
            ) -> bool:
    """The last resort of a cut: halve the largest string (ending it in "…") or list (keeping its first half)
    anywhere in ``document`` (in place, never under a key in ``keep``) until it fits ``budget`` or nothing larger
    than SQUEEZE_FLOOR is left; a list under a key in ``rigid`` keeps its length (its items are cut). Types never
    change, so the document still matches its schema. True if anything was cut."""
    cut = False
    while size(document) > budget:
        found = _largest(document, keep, rigid)
        if found is None:
            break
        holder, key = found
        value = holder[key]
        holder[key] = value[:len(value) // 2] + "…" if isinstance(value, str) else value[:len(value) // 2]
        cut = True
    return cut


def _largest(node: Any, keep: frozenset[str], rigid: frozenset[str]) -> tuple[Any, Any] | None:
    best: tuple[int, Any, Any] | None = None
    stack: list[Any] = [node]
    while stack:
        current = stack.pop()
        items = current.items() if isinstance(current, dict) else enumerate(current)
        for key, value in items:
            if isinstance(key, str) and key in keep:
                continue
            if isinstance(value, str) or (isinstance(value, list) and key not in rigid):
                n = size(value)
                if n > SQUEEZE_FLOOR and (best is None or n > best[0]):
                    best = (n, current, key)
            if isinstance(value, dict | list):
                stack.append(value)
    return None if best is None else (best[1], best[2])


def cut_text(text: str, offset: int, chars: int) -> tuple[str, int | None]:
    """``text`` from character ``offset``, at most ``chars`` characters; and where the rest starts (None: all
    of it was given)."""
    end = offset + max(chars, 0)
    return text[offset:end], (end if end < len(text) else None)


# -- cursors of the listings that are not task pages (resume's instructions, usage rows) --------------------------

def encode(body: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(canonical_json(body).encode("utf-8")).decode("ascii").rstrip("=")


def decode(cursor: str, kind: str, wanted: dict[str, Any]) -> dict[str, Any]:
    """The body of a cursor printed by ``kind`` for the same ``wanted`` arguments, else CursorError."""
    try:
        body = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("utf-8"))
        if not isinstance(body, dict) or body.get("kind") != kind:
            raise ValueError(kind)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise CursorError(f"{cursor[:40]!r} is not a cursor {kind} printed; call it again without a cursor") from None
    made_for = {k: body.get(k) for k in wanted}
    if made_for != wanted:
        raise CursorError(f"this cursor continues {kind} with {made_for}, not with {wanted}: repeat those arguments, "
                          "or call it again without a cursor")
    return body
