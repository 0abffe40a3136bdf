"""The `taskkernel gate` command contract: exit codes, malformed input, action selection and the demo."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.test_gate_scenarios import S1, S2, gate, write_jsonl


@pytest.mark.parametrize(("content", "needle"), [
    ('{"id": "e1", "seq": 1, "kind": "instruction", "source": "user"}\n{"id": "e2", "seq": \n',
     "line 2: not valid JSON"),
    ('{"id": "e1", "seq": "1", "kind": "instruction", "source": "user"}\n', "line 1: instruction event: seq"),
    ('{"id": "e1", "kind": "instruction", "source": "user"}\n', "line 1: missing required field(s) seq"),
    ('{"id": "e1", "seq": 1, "kind": "permission_grant", "source": "user", "entity": "x"}\n', "operation"),
])
def test_malformed_trace_exits_2_with_a_clear_reason(tmp_path: Path, content: str, needle: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content, encoding="utf-8")
    run = gate("check", str(path), cwd=tmp_path)
    assert run.code == 2, run.err
    out = run.json
    assert out["status"] == "INSUFFICIENT_EVIDENCE" and out["decision"] == "BLOCK"
    assert out["reasons"][0]["code"] == "TRACE_INVALID" and needle in out["reasons"][0]["detail"], out
    assert "TRACE_INVALID" in run.err


def test_unreadable_trace_exits_2(tmp_path: Path) -> None:
    run = gate("check", str(tmp_path / "nope.jsonl"), "--action", "a1", cwd=tmp_path)
    assert run.code == 2
    out = run.json
    assert out["reasons"][0]["code"] == "TRACE_INVALID" and out["action_id"] == "a1" and out["trace_sha256"] is None


@pytest.mark.parametrize("args", [
    ("check",),
    ("check", "t.jsonl", "--proposal", "p.json"),
    ("check", "t.jsonl", "--frobnicate"),
    ("nosuchcommand",),
])
def test_usage_errors_exit_64(tmp_path: Path, args: tuple[str, ...]) -> None:
    write_jsonl(tmp_path / "t.jsonl", S2)
    assert gate(*args, cwd=tmp_path).code == 64


def test_action_option_selects_the_action(tmp_path: Path) -> None:
    events = [*S1, {"id": "a6", "seq": 6, "kind": "action", "principal": "agent-1", "tool": "write",
                    "operation": "write", "entity": "doc:release-notes", "based_on_event": "e5",
                    "permission_event": None}]
    path = write_jsonl(tmp_path / "t.jsonl", events)
    first = gate("check", str(path), "--action", "a1", cwd=tmp_path)
    assert first.code == 2 and first.json["action_id"] == "a1" and first.json["status"] == "BLOCK"
    last = gate("check", str(path), cwd=tmp_path)  # default: the last action; write is protected by e1
    assert last.json["action_id"] == "a6" and last.json["reasons"][0]["code"] == "MISSING_PERMISSION"
    missing = gate("check", str(path), "--action", "a9", cwd=tmp_path)
    assert missing.code == 2 and missing.json["reasons"][0]["code"] == "NO_ACTION"


def test_demo_blocks_the_stale_plan_and_passes_the_corrected_one(tmp_path: Path) -> None:
    run = gate("demo", cwd=tmp_path)
    assert run.code == 0, run.err
    lines = [json.loads(line) for line in run.out.splitlines()]
    assert [(d["step"], d["verdict"]["status"]) for d in lines] == [("stale_plan", "BLOCK"), ("corrected_plan", "PASS")]
    stale = lines[0]["verdict"]
    assert [r["code"] for r in stale["reasons"]] == ["SUPERSEDED_BASIS", "PERMISSION_NOT_CURRENT", "STATE_DISALLOWS"]
    assert lines[1]["verdict"]["decision"] == "ALLOW"
    assert lines[0]["verdict"]["trace_sha256"] == lines[1]["verdict"]["trace_sha256"]
    assert "stale_plan" in run.err and os.listdir(tmp_path) == []  # no workspace, no database
