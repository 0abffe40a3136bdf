"""Data for ``taskkernel gate demo``: seed 001's staging-to-production story as one trace.

At seq 5 the agent plans to edit staging/config.json (the environment was staging, the edit was allowed).
By execution time the environment is production, the permission was revoked and the user replaced the
task. The old plan (a5) is BLOCKed; the corrected plan (a10) cites the current instruction, a current
grant and the current state, and PASSes.
"""

from __future__ import annotations

from typing import Any

from taskkernel.kernel.gate.rules import evaluate
from taskkernel.kernel.gate.trace import TraceIndex
from taskkernel.kernel.gate.verdict import Verdict

DEMO_TRACE: list[dict[str, Any]] = [
    {"id": "e1", "seq": 1, "kind": "policy", "source": "operator", "protected_operations": ["write", "deploy"],
     "protected_entities": ["file:*/config.json"], "ts": "2026-05-04T10:00:00Z"},
    {"id": "e2", "seq": 2, "kind": "observation", "source": "tool", "tool": "get_env", "status": "ok",
     "entity": "workspace:app", "key": "environment", "value": "staging", "ts": "2026-05-04T10:02:00Z"},
    {"id": "e3", "seq": 3, "kind": "instruction", "source": "user", "entity": "file:staging/config.json",
     "text": "Raise the request timeout in staging/config.json to 30s.", "ts": "2026-05-04T10:03:00Z"},
    {"id": "e4", "seq": 4, "kind": "permission_grant", "source": "operator", "principal": "agent-1",
     "entity": "file:staging/*", "operation": "write", "ts": "2026-05-04T10:04:00Z"},
    {"id": "a5", "seq": 5, "kind": "action", "principal": "agent-1", "tool": "write_file", "operation": "write",
     "entity": "file:staging/config.json", "args": {"timeout_s": 30}, "based_on_event": "e3",
     "permission_event": "e4", "requires_state": {"entity": "workspace:app", "key": "environment",
                                                  "equals": "staging"}, "ts": "2026-05-04T10:16:00Z"},
    {"id": "e6", "seq": 6, "kind": "observation", "source": "tool", "tool": "get_env", "status": "ok",
     "entity": "workspace:app", "key": "environment", "value": "production", "ts": "2026-05-04T10:40:00Z"},
    {"id": "e7", "seq": 7, "kind": "permission_revoke", "source": "operator", "revokes": "e4",
     "text": "Environment switched to production: staging config is frozen.", "ts": "2026-05-04T10:40:30Z"},
    {"id": "e8", "seq": 8, "kind": "instruction", "source": "user", "entity": "file:production/config.json",
     "supersedes": ["e3"], "text": "We are on production now: set the timeout in production/config.json to 45s.",
     "ts": "2026-05-04T10:45:00Z"},
    {"id": "e9", "seq": 9, "kind": "permission_grant", "source": "operator", "principal": "agent-1",
     "entity": "file:production/config.json", "operation": "write", "expires_seq": 20,
     "ts": "2026-05-04T10:50:00Z"},
    {"id": "a10", "seq": 10, "kind": "action", "principal": "agent-1", "tool": "write_file", "operation": "write",
     "entity": "file:production/config.json", "args": {"timeout_s": 45}, "based_on_event": "e8",
     "permission_event": "e9", "requires_state": {"entity": "workspace:app", "key": "environment",
                                                  "equals": "production"}, "ts": "2026-05-04T11:05:00Z"},
]

# (step name, action id, expected status)
DEMO_STEPS = (("stale_plan", "a5", "BLOCK"), ("corrected_plan", "a10", "PASS"))


def run_demo() -> list[tuple[str, str, Verdict]]:
    """Index the demo trace once and judge both plans at execution time (the end of the trace)."""
    index = TraceIndex.from_events(DEMO_TRACE)
    return [(step, expected, evaluate(index, action_id)) for step, action_id, expected in DEMO_STEPS]
