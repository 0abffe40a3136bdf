"""Pure replay rules: scenarios, legacy and mixed logs, as-of cutoffs, rollback markers, file parsing."""

from __future__ import annotations

import json
from typing import Any

import pytest

from taskkernel.kernel.sessionlog import LogFileError, Rec, SessionReason, parse_lines, replay
from tests.sessionlog_support import SCENARIOS, line


def recs(*lines: dict[str, Any]) -> list[Rec]:
    return parse_lines([json.dumps(x) for x in lines])["s1"]


def msg(input_id: str, seq: int | None, **kw: Any) -> dict[str, Any]:
    return line(input_id, "message", seq, payload={"text": input_id}, **kw)


def decision(records: list[Rec], **kw: Any) -> str:
    result = replay(records, reducer="permission", **kw)
    return result.to_json()["state"]["decision"] if result.known else "unknown"


@pytest.mark.parametrize("sc", SCENARIOS, ids=lambda sc: sc.name)
def test_seed_scenarios(sc: Any) -> None:
    records = recs(*sc.stored)
    assert decision(records, order="record") == sc.record_order
    assert decision(records) == sc.acceptance
    if sc.reason:
        assert replay(records).reason == sc.reason


def test_permission_state_shape_for_several_pairs() -> None:
    records = recs(line("a1", "allow", 1), line("a2", "allow", 2, payload={"permission": "deploy", "scope": "prod"}),
                   line("r3", "revoke", 3, payload={"permission": "merge", "scope": "repo"}))
    state = replay(records, reducer="permission").to_json()["state"]
    assert state["decision"] is None  # several (permission, scope) pairs: read the map
    assert state["permissions"] == {
        "deploy": {"env:staging": {"decision": "allow", "seq": 1, "input_id": "a1"},
                   "prod": {"decision": "allow", "seq": 2, "input_id": "a2"}},
        "merge": {"repo": {"decision": "deny", "seq": 3, "input_id": "r3"}},
    }
    assert replay([], reducer="permission").to_json()["state"] == {"decision": "deny", "permissions": {}}


def test_revoke_in_another_scope_does_not_touch_a_grant() -> None:
    records = recs(line("a1", "allow", 1), line("r2", "revoke", 2, payload={"permission": "deploy", "scope": "prod"}))
    state = replay(records, reducer="permission").state
    assert state[("deploy", "env:staging")][0] == "allow"
    assert state[("deploy", "prod")][0] == "deny"


def test_all_legacy_log_replays_in_record_order_and_is_flagged() -> None:
    records = recs(line("r", "revoke", None), line("a", "allow", None))
    result = replay(records, reducer="permission")
    assert result.known and result.legacy and result.order == ["r", "a"]
    assert result.to_json()["state"]["decision"] == "allow"
    # In an all-legacy log, record positions stand in for sequences.
    assert replay(records, as_of=1, reducer="permission").to_json()["state"]["decision"] == "deny"


def test_mixed_log_is_unknown_unless_the_unsequenced_records_are_marked_legacy() -> None:
    mixed = recs(msg("old", None), msg("new", 1))
    assert (replay(mixed).status, replay(mixed).reason) == ("unknown", SessionReason.MISSING_SEQUENCE)
    assert replay(mixed, as_of=1).reason == SessionReason.MISSING_SEQUENCE  # it may have been accepted <= 1

    marked = recs(msg("n2", 2), msg("old-b", None, legacy=True), msg("n1", 1), msg("old-a", None, legacy=True))
    result = replay(marked)
    assert result.known and result.legacy
    assert result.order == ["old-b", "old-a", "n1", "n2"]  # legacy first, in record order, then by sequence
    assert replay(marked, as_of=1).order == ["old-b", "old-a", "n1"]


def test_refused_records_never_take_part() -> None:
    records = recs(msg("x", None, accepted=False), msg("a", 1), msg("y", 1, accepted=False))
    result = replay(records)
    assert result.known and result.order == ["a"] and result.excluded == ["x", "y"] and not result.legacy


def test_as_of_ignores_damage_after_the_cutoff() -> None:
    records = recs(msg("m4", 4), msg("m2", 2), msg("m1", 1), msg("m4b", 4))
    assert replay(records).reason == SessionReason.DUPLICATE_SEQUENCE
    assert replay(records, as_of=2).order == ["m1", "m2"]
    assert replay(records, as_of=3).reason == SessionReason.MISSING_SEQUENCE
    assert replay(records, as_of=0).order == []


def test_declared_log_length_exposes_a_lost_tail() -> None:
    whole = recs(msg("m1", 1, log_last_seq=3), msg("m2", 2, log_last_seq=3), msg("m3", 3, log_last_seq=3))
    assert replay(whole).known
    truncated = whole[:2]
    assert replay(truncated).reason == SessionReason.MISSING_SEQUENCE
    assert replay(truncated, as_of=2).known
    # Only unsequenced records left, but the log says sequences existed: not a legacy log.
    assert replay(recs(msg("m", None, log_last_seq=3))).reason == SessionReason.MISSING_SEQUENCE


def test_one_input_at_two_sequences_is_unknown() -> None:
    assert replay(recs(msg("m", 1), msg("m", 2))).reason == SessionReason.DUPLICATE_INPUT


def test_rollback_rewinds_to_the_boundary_without_rewriting_history() -> None:
    records = recs(line("a1", "allow", 1), msg("m2", 2), line("r3", "revoke", 3),
                   line("rb4", "rollback", 4, payload={"to_seq": 2}), msg("m5", 5))
    result = replay(records)
    assert result.order == ["a1", "m2", "r3", "rb4", "m5"]  # history stays
    state = result.to_json()["state"]
    assert [x["input_id"] for x in state["inputs"]] == ["a1", "m2", "m5"] and state["rolled_back"] == ["r3"]
    assert decision(records) == "allow"  # the revoke was rolled back
    assert decision(records, as_of=3) == "deny"  # ...but before the marker it applied


def test_rollback_restores_the_context_as_of_its_boundary() -> None:
    # rb5 rewinds to 2: the earlier marker rb3 lies after that boundary, so its effect is undone too.
    records = recs(msg("m1", 1), msg("m2", 2), line("rb3", "rollback", 3, payload={"to_seq": 1}), msg("m4", 4),
                   line("rb5", "rollback", 5, payload={"to_seq": 2}))
    assert [x["input_id"] for x in replay(records).to_json()["state"]["inputs"]] == ["m1", "m2"]
    after_rb3 = replay(records, as_of=4).to_json()["state"]
    assert [x["input_id"] for x in after_rb3["inputs"]] == ["m1", "m4"]


def test_recording_order_applies_rollback_boundaries_to_positions() -> None:
    # Stored inverted: a naive reader treats positions as the boundary and keeps the wrong input.
    stored = recs(msg("m2", 2), msg("m1", 1), line("rb3", "rollback", 3, payload={"to_seq": 1}))
    assert [x["input_id"] for x in replay(stored).to_json()["state"]["inputs"]] == ["m1"]
    naive = replay(stored, order="record").to_json()["state"]
    assert [x["input_id"] for x in naive["inputs"]] == ["m2"]


@pytest.mark.parametrize(("content", "needle"), [
    ('{"session": "s1", "input_id": "i1", "kind": "allow"', "line 1: not JSON"),
    (json.dumps(line("i1", "allow", 1)) + "\n" + json.dumps(line("i2", "teleport", 2)), "line 2: kind"),
    (json.dumps(line("i1", "allow", 1, payload={"permission": "deploy"})), "line 1: allow: scope"),
    (json.dumps(line("i1", "rollback", 1, payload={"to_seq": 1})), "must be below its own sequence"),
    (json.dumps(line("i1", "allow", 1, legacy=True)), "legacy cannot carry an accept_seq"),
    (json.dumps(line("i1", "allow", 0)), "line 1: accept_seq"),
    (json.dumps(line("i1", "allow", True)), "line 1: accept_seq"),
    ("[1, 2]", "line 1"),
])
def test_parse_errors_name_the_line(content: str, needle: str) -> None:
    with pytest.raises(LogFileError) as err:
        parse_lines(content.splitlines())
    assert err.value.reason == SessionReason.UNREADABLE_FILE and needle in err.value.message


def test_refused_record_payload_is_not_validated_and_unknown_fields_are_ignored() -> None:
    parsed = parse_lines([json.dumps(line("x", "allow", None, accepted=False, payload={"junk": 1}, note="n"))])
    assert parsed["s1"][0].accepted is False and replay(parsed["s1"]).excluded == ["x"]
    with pytest.raises(LogFileError):
        parse_lines([json.dumps(line("x", "allow", 1, payload={"junk": 1}))])
