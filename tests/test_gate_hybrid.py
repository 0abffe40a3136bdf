"""Unit tests of the hybrid proposal/review path beyond S10, and of admitting its result into an action verdict."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from taskkernel.kernel.gate import Gate, GateStatus, TraceIndex, Verdict, proposal_digest
from tests.test_gate_scenarios import (
    S10_DIGEST,
    S10_PROPOSAL,
    S10_REVIEW,
    S10_TRACE,
    Ev,
    gate,
    spec_digest,
    write_json,
    write_jsonl,
)

ACTION: Ev = {"id": "a3", "seq": 3, "kind": "action", "principal": "agent-1", "tool": "rerun_job", "operation": "read",
              "entity": "service:reporting", "based_on_event": "e1", "permission_event": None}


def run(trace: list[Ev] = S10_TRACE, proposal: Any = None, review: Any = None, rebind: bool = True) -> Verdict:
    proposal = copy.deepcopy(S10_PROPOSAL) if proposal is None else proposal
    review = copy.deepcopy(S10_REVIEW) if review is None else review
    if rebind and isinstance(proposal, dict) and isinstance(review, dict):
        review["proposal_sha256"] = spec_digest(proposal)
    return Gate.review(TraceIndex.from_events(trace), proposal, review)


def codes(v: Verdict) -> list[str]:
    return [r.code.value for r in v.reasons]


def test_digest_matches_the_spec_and_ignores_key_order() -> None:
    assert proposal_digest(S10_PROPOSAL) == S10_DIGEST
    assert proposal_digest(dict(reversed(list(S10_PROPOSAL.items())))) == S10_DIGEST


def test_pass_cites_the_evidence() -> None:
    v = run()
    assert v.status is GateStatus.PASS and v.cited_events == ["e1", "e2"] and v.review_id == "r1"
    assert [c.rule for c in v.checks if c.ok is False] == []


def test_unknown_event_is_insufficient() -> None:
    p = copy.deepcopy(S10_PROPOSAL)
    p["claims"][1]["event_id"] = "e9"
    v = run(proposal=p)
    assert v.status is GateStatus.INSUFFICIENT_EVIDENCE and codes(v) == ["UNKNOWN_EVENT"]


def test_quotes_must_come_from_trusted_events() -> None:
    trace = copy.deepcopy(S10_TRACE)
    trace[1]["source"] = "agent"  # injected "change of plan"
    assert codes(run(trace)) == ["UNTRUSTED_EVIDENCE"]


def test_superseded_since_the_proposal() -> None:
    trace = [*S10_TRACE, {"id": "e3", "seq": 3, "kind": "instruction", "source": "user",
                          "entity": "service:reporting", "supersedes": ["e2"], "text": "Forget db-2."}]
    v = run(trace)
    assert codes(v) == ["SUPERSEDED_EVIDENCE"] and v.reasons[0].by == "e3"
    # the old value being replaced before the proposal was made is the point of the change, not a failure
    replaced = copy.deepcopy(S10_TRACE)
    replaced[1]["supersedes"] = ["e1"]
    assert run(replaced).passed


def test_as_of_after_the_trace_end() -> None:
    p = copy.deepcopy(S10_PROPOSAL)
    p["as_of_seq"] = 7
    assert codes(run(proposal=p)) == ["TEMPORAL_ORDER"]


def test_structure_problems_are_incomplete() -> None:
    p = copy.deepcopy(S10_PROPOSAL)
    p["changes"][0]["supported_by"] = ["c7"]
    v = run(proposal=p)
    assert codes(v) == ["SEMANTIC_INCOMPLETE"] and "unknown claim 'c7'" in v.reasons[0].detail
    assert codes(run(proposal=[1, 2], rebind=False)) == ["SEMANTIC_INCOMPLETE"]
    p = copy.deepcopy(S10_PROPOSAL)
    p["changes"] = []
    assert codes(run(proposal=p)) == ["SEMANTIC_INCOMPLETE"]
    p = copy.deepcopy(S10_PROPOSAL)
    p["as_of_seq"] = "2"
    assert codes(run(proposal=p)) == ["SEMANTIC_INCOMPLETE"]


def test_numbers_must_appear_in_the_quote() -> None:
    trace = [{"id": "e1", "seq": 1, "kind": "instruction", "source": "user", "entity": "svc:x", "text": "timeout 30s"},
             {"id": "e2", "seq": 2, "kind": "instruction", "source": "user", "entity": "svc:x", "text": "make it 45s"}]
    p: Ev = {"proposal_id": "p", "run_id": "A", "entity": "svc:x", "as_of_seq": 2,
         "claims": [{"claim_id": "c0", "event_id": "e1", "entity": "svc:x", "field": "t", "value": 30, "quote": "30s"},
                    {"claim_id": "c1", "event_id": "e2", "entity": "svc:x", "field": "t", "value": 45,
                     "quote": "it 45s"}],
         "changes": [{"field": "t", "from": 30, "to": 45, "from_claim": "c0", "supported_by": ["c1"]}]}
    r = {**S10_REVIEW, "proposal_id": "p", "covered_fields": ["t"]}
    assert run(trace, p, r).passed
    p["claims"][1]["value"] = 46
    p["changes"][0]["to"] = 46
    assert codes(run(trace, p, r)) == ["UNSUPPORTED_VALUE"]


def test_malformed_trace() -> None:
    v = run([{"id": "e1", "seq": 1}])
    assert v.status is GateStatus.INSUFFICIENT_EVIDENCE and codes(v) == ["TRACE_INVALID"]


def test_admitted_change_supersedes_the_old_basis() -> None:
    trace = [*S10_TRACE, ACTION]
    index = TraceIndex.from_events(trace)
    assert Gate.evaluate(index, "a3").passed  # free text alone: the gate cannot see the change of plan
    semantic = run(trace)
    assert semantic.passed
    v = Gate.evaluate(index, "a3", admitted=[semantic])
    assert v.status is GateStatus.BLOCK and v.reasons[0].code.value == "SUPERSEDED_BASIS" and v.reasons[0].by == "e2"
    rejected = run(trace, review={**S10_REVIEW, "decision": "reject"})
    assert Gate.evaluate(index, "a3", admitted=[rejected]).passed  # a failed proposal admits nothing


def test_cli_action_with_proposal_attaches_the_semantic_verdict(tmp_path: Path) -> None:
    trace = write_jsonl(tmp_path / "t.jsonl", [*S10_TRACE, ACTION])
    args = ("check", str(trace), "--proposal", str(write_json(tmp_path / "p.json", S10_PROPOSAL)),
            "--review", str(write_json(tmp_path / "r.json", S10_REVIEW)))
    res = gate(*args, "--action", "a3", cwd=tmp_path)
    out = res.json
    assert res.code == 2 and out["action_id"] == "a3" and out["reasons"][0]["code"] == "SUPERSEDED_BASIS"
    assert out["semantic"][0]["status"] == "PASS" and out["semantic"][0]["proposal_id"] == "p1"
    (tmp_path / "r.json").write_text("{not json", encoding="utf-8")
    res = gate(*args, cwd=tmp_path)
    assert res.code == 2 and res.json["reasons"][0]["code"] == "SEMANTIC_INCOMPLETE"
    assert "is not JSON" in res.json["reasons"][0]["detail"]
