"""Shared pieces of the session-log tests: the seed 000 scenarios and a fresh-process CLI runner."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.cli_support import run

PERM = {"permission": "deploy", "scope": "env:staging"}


def line(input_id: str, kind: str, seq: int | None, *, accepted: bool = True, session: str = "s1",
         **extra: Any) -> dict[str, Any]:
    payload = extra.pop("payload", PERM)
    return {"session": session, "input_id": input_id, "kind": kind, "accepted": accepted, "accept_seq": seq,
            "payload": payload, **extra}


@dataclass(frozen=True)
class Scenario:
    """Records listed in the order they are *stored* (the file's line order)."""

    name: str
    stored: tuple[dict[str, Any], ...]
    record_order: str  # expected decision of a recording-order replay
    acceptance: str  # expected decision of an acceptance-order replay, or "unknown"
    reason: str | None = None  # expected reason when unknown
    excluded: tuple[str, ...] = ()


# Seed 000, table of section 3 (allow = 允许, revoke/deny = 禁止, unknown = 未知).
SCENARIOS = (
    Scenario("O0", (line("a1", "allow", 1), line("r2", "revoke", 2)), "deny", "deny"),
    Scenario("O1", (line("r2", "revoke", 2), line("a1", "allow", 1)), "allow", "deny"),
    Scenario("O2", (line("a2", "allow", 2), line("r1", "revoke", 1)), "deny", "allow"),
    Scenario("O3", (line("r2", "revoke", 2), line("r1", "revoke", 1)), "deny", "deny"),
    Scenario("O4", (line("a1", "allow", 1), line("r2", "revoke", 2), line("a3", "allow", None, accepted=False)),
             "deny", "deny", excluded=("a3",)),
    Scenario("O5", (line("r2", "revoke", None), line("a1", "allow", 1)), "allow", "unknown", "missing_sequence"),
    Scenario("O5-gap", (line("r3", "revoke", 3), line("a1", "allow", 1)), "allow", "unknown", "missing_sequence"),
    Scenario("O6", (line("r1", "revoke", 1), line("a1", "allow", 1)), "allow", "unknown", "duplicate_sequence"),
)


def write_jsonl(path: Path, records: list[dict[str, Any]] | tuple[dict[str, Any], ...]) -> Path:
    """Write one record per line, fsyncing after each, like an append-only log would."""
    with path.open("w", encoding="utf-8") as fh:
        for rec in records:
            fh.write(json.dumps(rec) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
    return path


cli = run  # ``taskkernel ARGS`` in a fresh interpreter (the real entry point)
