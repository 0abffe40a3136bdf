"""Canonical JSON and digests: one byte form per value, so hashes are reproducible."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Any

import orjson

_ORJSON_OPTIONS = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS


def canonical_json(value: Any) -> str:
    """Sorted keys, no insignificant whitespace, UTF-8 kept as is.

    orjson produces exactly ``json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False)``
    for JSON data, several times faster (this runs ~5 times per command); values it cannot encode
    (integers beyond 64 bits) take the standard library path, deterministically.
    """
    try:
        return orjson.dumps(value, option=_ORJSON_OPTIONS).decode("utf-8")
    except TypeError:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_hex(text: str | bytes) -> str:
    data = text.encode("utf-8") if isinstance(text, str) else text
    return hashlib.sha256(data).hexdigest()


def digest(value: Any) -> str:
    return sha256_hex(canonical_json(value))


def utc_now_iso() -> str:
    """UTC timestamp with microseconds and a Z suffix; sorts lexicographically."""
    return datetime.now(UTC).isoformat(timespec="microseconds")[:-6] + "Z"  # 3x faster than strftime
