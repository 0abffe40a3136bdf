"""Canonical JSON and digests: one byte form per value, so hashes are reproducible."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Any


def canonical_json(value: Any) -> str:
    """Sorted keys, no insignificant whitespace, UTF-8 kept as is."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_hex(text: str | bytes) -> str:
    data = text.encode("utf-8") if isinstance(text, str) else text
    return hashlib.sha256(data).hexdigest()


def digest(value: Any) -> str:
    return sha256_hex(canonical_json(value))


def utc_now_iso() -> str:
    """UTC timestamp with microseconds and a Z suffix; sorts lexicographically."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
