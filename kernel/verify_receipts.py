"""What makes a receipt wrong: the one rule verify's sequential check (kernel/verify.py) and its parallel proof
(kernel/verify_parallel.py) both apply."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any


def receipt_problem(task_id: str | None, first_pos: int, last_pos: int, result: str, first_stream: str | None,
                    last_stream: str | None, version: int | None, meta: str | None, key: str,
                    loads: Callable[[str], Any] = json.loads) -> str | None:
    """Why a receipt does not match the events it names, or None. ``loads``: the JSON parser (the parallel proof
    passes orjson's, for which anything it cannot read is a problem and so goes to the sequential check)."""
    stream = f"task:{task_id}"
    if first_stream is None or last_stream is None:
        return f"positions {first_pos}..{last_pos} are missing from the log"
    if first_pos > last_pos or first_stream != stream or last_stream != stream:
        return f"positions {first_pos}..{last_pos} are not events of {stream}"
    try:
        command_id = loads(meta or "{}").get("command_id")
        revision = loads(result).get("revision")
    except (ValueError, AttributeError):
        return "its result or its event's meta is not a JSON object"
    if not isinstance(command_id, str) or (key != command_id and not key.endswith("\x1f" + command_id)):
        return f"position {last_pos} was written by command {command_id!r}, not by this one"
    if revision is not None and revision != version:
        return f"it answers revision {revision}, its event at position {last_pos} is revision {version}"
    return None
