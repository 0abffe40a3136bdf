"""Unit tests of the gate's rules (P1-P3, R1-R14), its trace reader and the verdict it returns."""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

import pytest

from taskkernel.kernel.gate import Gate, GateDecision, GateReason, GateStatus, TraceIndex, Verdict
from tests.test_gate_scenarios import S1, S2, S5, S6, S8, Ev

R = GateReason


def judge(events: list[Ev], action: Any = None) -> Verdict:
    return Gate.evaluate(TraceIndex.from_events(events), action)


def s2(**changes: dict[str, Any]) -> list[Ev]:
    """S2 with fields of events changed, keyed by event id."""
    events = copy.deepcopy(S2)
    for ev in events:
        ev.update(changes.get(ev["id"], {}))
    return events


def codes(v: Verdict) -> list[str]:
    return [r.code.value for r in v.reasons]


def ev(id: str, seq: int, kind: str, **fields: Any) -> Ev:
    return {"id": id, "seq": seq, "kind": kind, **fields}


# ---- verdict shape ---------------------------------------------------------------------------------------

def test_pass_verdict_is_bound_to_action_and_trace_bytes() -> None:
    data = "".join(json.dumps(e) + "\n" for e in S2).encode()
    v = Gate.evaluate(TraceIndex.from_bytes(data))
    assert v.status is GateStatus.PASS and v.decision is GateDecision.ALLOW and v.passed
    assert v.action_id == "a1" and v.trace_head_seq == 5
    assert v.trace_sha256 == hashlib.sha256(data).hexdigest()
    assert v.protected is True and v.policy_event == "e1"
    assert v.cited_events == ["e2", "e3", "e4"]
    assert [c.rule for c in v.checks] == ["P1", "P2", "P3", "R1", "R2", "R3", "R4", "R5", "R6", "R7", "R8", "R9",
                                          "R10", "R11", "R12", "R13", "R14"]
    assert all(c.ok for c in v.checks)
    out = json.loads(v.to_json())
    assert set(out) == {"status", "decision", "action_id", "trace_sha256", "trace_head_seq", "protected",
                        "policy_event", "reasons", "checks", "cited_events"}


def test_from_events_digest_is_canonical_jsonl() -> None:
    index = TraceIndex.from_events(S2)
    text = "".join(json.dumps(e, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n" for e in S2)
    assert index.sha256 == hashlib.sha256(text.encode()).hexdigest()


def test_verdict_event_for_the_kernel_log() -> None:
    event = judge(S1).as_event()
    assert event["type"] == "gate_decision" and event["action_id"] == "a1" and event["status"] == "BLOCK"
    assert event["reasons"][0]["code"] == "SUPERSEDED_BASIS" and event["trace_head_seq"] == 5


def test_block_outranks_insufficient_and_reasons_follow_rule_order() -> None:
    events = s2(a1={"based_on_event": None}, e3={"source": "agent"})
    v = judge(events)
    assert v.status is GateStatus.BLOCK
    assert codes(v) == ["MISSING_BASIS", "UNTRUSTED_PERMISSION"]  # R1 before R10, both reported


def test_every_rule_runs_and_all_reasons_are_reported() -> None:
    events = s2(e2={"entity": "env:prod"}, e3={"operation": "write"}, a1={"requires_state": {"key": "frozen",
                                                                                         "equals": True}})
    assert codes(judge(events)) == ["ENTITY_MISMATCH", "PERMISSION_SCOPE_MISMATCH", "STATE_DISALLOWS"]


# ---- P1: the trace itself ---------------------------------------------------------------------------------

def _raw(lines: list[str]) -> Verdict:
    return Gate.evaluate(TraceIndex.from_bytes(("\n".join(lines) + "\n").encode()))


GOOD = [json.dumps(e) for e in S2]


@pytest.mark.parametrize(("lines", "needle"), [
    (GOOD[:2] + ['{"id": "e3", "seq": 3,'] + GOOD[3:], "line 3: not valid JSON"),
    (GOOD[:2] + ['[1, 2]'] + GOOD[3:], "line 3: expected a JSON object"),
    (GOOD[:2] + ['{"id": "e3", "kind": "instruction", "source": "user"}'] + GOOD[3:], "missing required field(s) seq"),
    (GOOD[:1] + [json.dumps({**S2[1], "seq": "2"})] + GOOD[2:], "line 2: instruction event: seq"),
    (GOOD[:1] + [json.dumps({**S2[1], "seq": True})] + GOOD[2:], "seq: Input should be a valid integer"),
    (GOOD[:1] + [json.dumps({**S2[1], "kind": "memo"})] + GOOD[2:], "unknown kind 'memo'"),
    (GOOD[:1] + [json.dumps({**S2[1], "source": "root"})] + GOOD[2:], "source"),
    (GOOD[:1] + [json.dumps({k: v for k, v in S2[1].items() if k != "source"})] + GOOD[2:], "source: Field required"),
    (GOOD[:3] + [json.dumps({k: v for k, v in S2[3].items() if k != "key"})] + GOOD[4:], "needs 'entity' and 'key'"),
    (GOOD[:2] + [json.dumps({k: v for k, v in S2[2].items() if k != "operation"})] + GOOD[3:], "operation"),
    ([json.dumps({k: v for k, v in S2[0].items() if k != "protected_operations"})] + GOOD[1:],
     "protected_operations"),
    (GOOD[:1] + [json.dumps({**S2[1], "id": "e1"})] + GOOD[2:], "duplicate id 'e1'"),
    (GOOD[:1] + ['{"id": "e2", "id": "e9", "seq": 2, "kind": "instruction", "source": "user"}'] + GOOD[2:],
     "duplicate key 'id'"),
    (GOOD[:3] + [json.dumps({**S2[3], "value": "NaN"}).replace('"NaN"', "NaN")] + GOOD[4:], "NaN"),
    (GOOD[:1] + [json.dumps({**S2[1], "supersedes": ["e3"]})] + GOOD[2:], "refers to 'e3', which is not an earlier"),
    (GOOD + [json.dumps(ev("e6", 6, "permission_revoke", source="user", revokes="e42"))], "'e42'"),
    (GOOD + [json.dumps(ev("e6", 6, "permission_revoke", source="user"))], "needs 'revokes' or both"),
    (GOOD[:4] + [json.dumps({**S2[4], "seq": 3})], "seq 3 of 'a1' is not greater than the previous seq 4"),
    (GOOD[:4] + [json.dumps({**S2[4], "entity": ["env:staging"]})], "action event: entity"),
])
def test_malformed_trace_is_insufficient_evidence_with_a_clear_reason(lines: list[str], needle: str) -> None:
    v = _raw(lines)
    assert v.status is GateStatus.INSUFFICIENT_EVIDENCE and v.decision is GateDecision.BLOCK
    assert codes(v) == ["TRACE_INVALID"]
    assert needle in v.reasons[0].detail, v.reasons[0].detail
    assert v.trace_sha256 is not None


def test_non_utf8_and_unreadable_traces(tmp_path: Any) -> None:
    v = Gate.evaluate(TraceIndex.from_bytes(b'{"id": "\xff"}\n'))
    assert codes(v) == ["TRACE_INVALID"] and "not UTF-8" in v.reasons[0].detail
    v = Gate.evaluate(TraceIndex.from_file(tmp_path / "missing.jsonl"), "a1")
    assert codes(v) == ["TRACE_INVALID"] and "cannot read" in v.reasons[0].detail
    assert v.action_id == "a1" and v.trace_sha256 is None


def test_blank_lines_are_ignored() -> None:
    assert _raw(GOOD[:2] + ["", "   "] + GOOD[2:]).status is GateStatus.PASS


# ---- P2 / P3 ----------------------------------------------------------------------------------------------

def test_no_action() -> None:
    assert codes(judge(S2[:4])) == ["NO_ACTION"]
    assert codes(judge([])) == ["NO_ACTION"]
    v = judge(S2, "e2")
    assert codes(v) == ["NO_ACTION"] and "instruction event, not an action" in v.reasons[0].detail
    assert codes(judge(S2, "zz")) == ["NO_ACTION"]


@pytest.mark.parametrize("drop", ["entity", "operation"])
def test_action_incomplete(drop: str) -> None:
    events = copy.deepcopy(S2)
    del events[4][drop]
    v = judge(events)
    assert v.status is GateStatus.INSUFFICIENT_EVIDENCE and codes(v) == ["ACTION_INCOMPLETE"]


def test_action_selected_by_id_and_later_events_still_count() -> None:
    events = [*S2, ev("a2", 6, "action", principal="agent-1", operation="deploy", entity="env:staging",
                      based_on_event="e99", permission_event="e3")]
    assert judge(events, "a1").passed
    assert codes(judge(events)) == ["UNKNOWN_EVENT"]  # default: the last action


def test_standalone_action_not_yet_in_the_trace() -> None:
    action = {k: v for k, v in S2[4].items() if k not in ("seq", "kind")}
    v = judge(S2[:4], action)
    assert v.passed and v.action_id == "a1"
    v = judge(S2[:4], {**action, "entity": 7})
    assert codes(v) == ["ACTION_INCOMPLETE"] and "entity" in v.reasons[0].detail


# ---- R1-R6: the basis --------------------------------------------------------------------------------------

def test_r1_empty_basis_list_is_missing() -> None:
    assert codes(judge(s2(a1={"based_on_event": []}))) == ["MISSING_BASIS"]


def test_r2_each_basis_must_exist() -> None:
    v = judge(s2(a1={"based_on_event": ["e2", "e77"]}))
    assert codes(v) == ["UNKNOWN_EVENT"] and v.reasons[0].event == "e77"


def test_r3_basis_from_after_the_plan() -> None:
    events = [*S2, ev("e6", 6, "instruction", source="user", entity="env:staging", text="go")]
    v = judge(events, {"id": "late", "seq": 5, "kind": "action", "principal": "agent-1", "operation": "deploy",
                       "entity": "env:staging", "based_on_event": "e6", "permission_event": "e3"})
    assert codes(v) == ["TEMPORAL_ORDER"] and v.reasons[0].rule == "R3"


@pytest.mark.parametrize(("basis_change", "code"), [
    ({"source": "agent"}, "UNTRUSTED_BASIS"),
    ({"source": "tool"}, "UNTRUSTED_BASIS"),
    ({"source": "system"}, "UNTRUSTED_BASIS"),
])
def test_r4_instruction_author(basis_change: dict[str, Any], code: str) -> None:
    assert codes(judge(s2(e2=basis_change))) == [code]


def test_r4_basis_kind_and_observation_trust() -> None:
    assert codes(judge(s2(a1={"based_on_event": "e3"}))) == ["INVALID_BASIS_KIND"]
    assert codes(judge(s2(a1={"based_on_event": "e1"}))) == ["INVALID_BASIS_KIND", "ENTITY_MISMATCH"]
    assert judge(s2(a1={"based_on_event": ["e2", "e4"]})).passed  # a tool's ok read is a valid basis
    for change in ({"status": "partial"}, {"source": "agent"}):
        assert codes(judge(s2(a1={"based_on_event": ["e2", "e4"]}, e4=change)))[0] == "UNTRUSTED_BASIS"


def test_r5_list_entity_names_the_action_entity() -> None:
    assert judge(s2(e2={"entity": ["env:staging", "env:prod"]})).passed
    assert codes(judge(s2(e2={"entity": None}))) == ["ENTITY_MISMATCH"]


def test_r6_observation_basis_changed_value_supersedes_equal_value_confirms() -> None:
    base = s2(a1={"based_on_event": ["e2", "e4"]})
    confirm = [*base, ev("e6", 6, "observation", source="tool", status="ok", entity="env:staging", key="frozen",
                         value=False)]
    assert judge(confirm, "a1").passed
    changed = [*base, ev("e6", 6, "observation", source="tool", status="ok", entity="env:staging", key="frozen",
                         value=0)]  # 0 is not false
    v = judge(changed, "a1")
    assert codes(v) == ["SUPERSEDED_BASIS", "STATE_DISALLOWS"] and v.reasons[0].by == "e6"


@pytest.mark.parametrize(("author", "superseded"), [
    ({"kind": "instruction", "source": "operator"}, True),
    ({"kind": "policy", "source": "operator", "protected_operations": ["deploy"]}, True),
    ({"kind": "instruction", "source": "system"}, False),
    ({"kind": "instruction", "source": "agent"}, False),
    ({"kind": "observation", "source": "tool", "status": "ok", "entity": "env:staging", "key": "x", "value": 1}, False),
])
def test_r6_who_may_supersede_an_instruction(author: dict[str, Any], superseded: bool) -> None:
    events = [*S2, {"id": "e6", "seq": 6, "supersedes": ["e2"], **author}]
    v = judge(events, "a1")
    assert (codes(v) == ["SUPERSEDED_BASIS"]) is superseded, v.reasons


def test_r6_trusted_read_may_supersede_a_read_but_a_failed_one_may_not() -> None:
    base = s2(a1={"based_on_event": ["e2", "e4"], "requires_state": None})
    obs = {"kind": "observation", "source": "tool", "entity": "env:staging", "key": "other", "value": 1,
           "supersedes": ["e4"]}
    assert codes(judge([*base, {"id": "e6", "seq": 6, "status": "ok", **obs}], "a1")) == ["SUPERSEDED_BASIS"]
    assert judge([*base, {"id": "e6", "seq": 6, "status": "denied", **obs}], "a1").passed


# ---- R7-R12: the permission --------------------------------------------------------------------------------

def test_r7_protection_defaults_and_policy() -> None:
    assert codes(judge(S5)) == ["MISSING_PERMISSION"]
    read = copy.deepcopy(S5)
    read[1]["operation"] = "read"
    v = judge(read)
    assert v.passed and v.protected is False  # no policy: only `read` is unprotected
    # an agent-written policy is not a policy: the default (all but read protected) still applies
    agent_policy = [ev("p0", 0, "policy", source="agent", protected_operations=[]), *S5]
    assert codes(judge(agent_policy)) == ["MISSING_PERMISSION"]
    # the action's own claim is ignored
    claimed = copy.deepcopy(S5)
    claimed[1]["protected"] = False
    assert codes(judge(claimed)) == ["MISSING_PERMISSION"]
    # a policy protecting an entity glob
    entity_policy = [ev("p0", 0, "policy", source="operator", protected_operations=[],
                        protected_entities=["file:*.md"]), *S5]
    assert codes(judge(entity_policy)) == ["MISSING_PERMISSION"]
    open_policy = [ev("p0", 0, "policy", source="operator", protected_operations=["deploy"]), *S5]
    assert judge(open_policy).passed


def test_r7_last_trusted_policy_applies() -> None:
    events = [ev("p0", -1, "policy", source="operator", protected_operations=[]),
              *S5, ev("p9", 3, "policy", source="system", protected_operations=["write"])]
    v = judge(events, "a1")
    assert codes(v) == ["MISSING_PERMISSION"] and v.policy_event == "p9"


def test_r8_permission_must_exist() -> None:
    v = judge(s2(a1={"permission_event": "e42"}))
    assert codes(v) == ["UNKNOWN_EVENT"] and v.reasons[0].rule == "R8"


def test_r9_kind_and_order() -> None:
    v = judge(s2(a1={"permission_event": "e2"}))
    assert codes(v) == ["INVALID_PERMISSION_KIND"]
    late = [*S2, ev("g6", 6, "permission_grant", source="user", principal="agent-1", entity="env:staging",
                    operation="deploy")]
    v = judge(late, {**S2[4], "id": "x", "permission_event": "g6"})
    assert codes(v) == ["TEMPORAL_ORDER"] and v.reasons[0].rule == "R9"


def test_r10_only_user_operator_system_grant() -> None:
    for source in ("user", "operator", "system"):
        assert judge(s2(e3={"source": source})).passed
    for source in ("agent", "tool"):
        assert codes(judge(s2(e3={"source": source}))) == ["UNTRUSTED_PERMISSION"]


@pytest.mark.parametrize(("grant", "ok"), [
    ({"entity": "env:*"}, True),
    ({"entity": ["env:prod", "env:staging"]}, True),
    ({"entity": "env:stag"}, False),
    ({"operation": ["write", "deploy"]}, True),
    ({"operation": "*"}, True),
    ({"operation": "write"}, False),
    ({"principal": None}, True),
    ({"principal": "agent-2"}, False),
])
def test_r11_scope(grant: dict[str, Any], ok: bool) -> None:
    v = judge(s2(e3=grant))
    assert v.passed if ok else codes(v) == ["PERMISSION_SCOPE_MISMATCH"]


def test_r12_revoked_superseded_expired() -> None:
    assert codes(judge(S6)) == ["PERMISSION_NOT_CURRENT"] and judge(S6).reasons[0].by == "e3"
    regrant = [*S2, ev("g6", 6, "permission_grant", source="operator", principal="agent-1", entity="env:staging",
                       operation="deploy", expires_seq=9)]
    v = judge(regrant, "a1")
    assert codes(v) == ["PERMISSION_NOT_CURRENT"] and v.reasons[0].by == "g6"
    assert judge(s2(e3={"expires_seq": 6})).passed
    assert codes(judge(s2(e3={"expires_seq": 5}))) == ["PERMISSION_NOT_CURRENT"]


def test_r12_revokes_by_scope_and_by_whom() -> None:
    wide = [*S2, ev("r6", 6, "permission_revoke", source="operator", entity="env:*", operation="deploy")]
    v = judge(wide, "a1")
    assert codes(v) == ["PERMISSION_NOT_CURRENT"] and v.reasons[0].by == "r6"
    other_op = [*S2, ev("r6", 6, "permission_revoke", source="operator", entity="env:*", operation="delete")]
    assert judge(other_op, "a1").passed
    by_agent = [*S2, ev("r6", 6, "permission_revoke", source="agent", revokes="e3")]
    assert judge(by_agent, "a1").passed  # an agent cannot revoke either: no authority over grants
    explicit = [*S2, ev("i6", 6, "instruction", source="user", entity="env:staging", supersedes=["e3"])]
    assert codes(judge(explicit, "a1")) == ["PERMISSION_NOT_CURRENT"]


def test_r12_unprotected_action_citing_a_dead_grant_is_still_blocked() -> None:
    events = [*s2(e1={"protected_operations": ["write"]}), ev("r6", 6, "permission_revoke", source="user",
                                                             revokes="e3")]
    v = judge(events, "a1")
    assert v.protected is False and codes(v) == ["PERMISSION_NOT_CURRENT"]


# ---- R13/R14: state ----------------------------------------------------------------------------------------

def test_r13_r14_state() -> None:
    assert codes(judge(S8)) == ["STATE_DISALLOWS"] and judge(S8).reasons[0].event == "e6"
    failed_only = s2(e4={"status": "error"})
    assert codes(judge(failed_only)) == ["STATE_UNKNOWN"]
    other_entity = s2(a1={"requires_state": {"entity": "env:global", "key": "frozen", "equals": False}})
    assert codes(judge(other_entity)) == ["STATE_UNKNOWN"]
    assert codes(judge(s2(e4={"value": 0}))) == ["STATE_DISALLOWS"]  # JSON false is not 0
    assert judge(s2(e4={"value": {"a": [1, False]}}, a1={"requires_state": {"key": "frozen",
                                                                           "equals": {"a": [1.0, False]}}})).passed
