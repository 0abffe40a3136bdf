"""Acceptance scenarios S1-S10 of the execution-gate specification, each variation its own case, run through
``taskkernel gate check`` in a fresh process on trace files written here (docs/gate.md)."""

from __future__ import annotations

import copy
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.cli_support import Run, run

Ev = dict[str, Any]

P: Ev = {"id": "e1", "seq": 1, "kind": "policy", "source": "operator",
         "protected_operations": ["write", "deploy", "delete"]}
E2_STAGING: Ev = {"id": "e2", "seq": 2, "kind": "instruction", "source": "user", "entity": "env:staging",
                  "text": "Run the schema migration on staging."}
E3_GRANT: Ev = {"id": "e3", "seq": 3, "kind": "permission_grant", "source": "user", "principal": "agent-1",
                "entity": "env:staging", "operation": "deploy"}

S1 = [P, E2_STAGING, E3_GRANT,
      {"id": "a1", "seq": 4, "kind": "action", "principal": "agent-1", "tool": "run_migration", "operation": "deploy",
       "entity": "env:staging", "based_on_event": "e2", "permission_event": "e3"},
      {"id": "e5", "seq": 5, "kind": "instruction", "source": "user", "entity": "doc:release-notes",
       "supersedes": ["e2"], "text": "Cancel the migration. Just draft the release notes instead."}]
S2 = [P, E2_STAGING, E3_GRANT,
      {"id": "e4", "seq": 4, "kind": "observation", "source": "tool", "tool": "get_env", "status": "ok",
       "entity": "env:staging", "key": "frozen", "value": False},
      {"id": "a1", "seq": 5, "kind": "action", "principal": "agent-1", "tool": "run_migration", "operation": "deploy",
       "entity": "env:staging", "based_on_event": "e2", "permission_event": "e3",
       "requires_state": {"key": "frozen", "equals": False}}]
S3 = [{"id": "e1", "seq": 1, "kind": "policy", "source": "operator", "protected_operations": ["write", "delete"]},
      {"id": "e2", "seq": 2, "kind": "permission_grant", "source": "user", "principal": "agent-1",
       "entity": "file:config/*", "operation": "write"},
      {"id": "e3", "seq": 3, "kind": "observation", "source": "tool", "tool": "read_file", "status": "error",
       "entity": "file:config/app.yaml", "key": "content", "value": None, "text": "EACCES: permission denied"},
      {"id": "a1", "seq": 4, "kind": "action", "principal": "agent-1", "tool": "write_file", "operation": "write",
       "entity": "file:config/app.yaml", "based_on_event": "e3", "permission_event": "e2"}]
S4 = [P, E2_STAGING, E3_GRANT,
      {"id": "e4", "seq": 4, "kind": "observation", "source": "tool", "tool": "get_env", "status": "ok",
       "entity": "env:staging", "key": "frozen", "value": False},
      {"id": "e5", "seq": 5, "kind": "observation", "source": "tool", "tool": "get_env", "status": "timeout",
       "entity": "env:staging", "key": "frozen", "value": True, "supersedes": ["e4"]},
      {"id": "a1", "seq": 6, "kind": "action", "principal": "agent-1", "tool": "run_migration", "operation": "deploy",
       "entity": "env:staging", "based_on_event": "e2", "permission_event": "e3",
       "requires_state": {"key": "frozen", "equals": False}}]
S5 = [{"id": "e1", "seq": 1, "kind": "instruction", "source": "user", "entity": "file:README.md",
       "text": "Fix the typo in README.md."},
      {"id": "a1", "seq": 2, "kind": "action", "principal": "agent-1", "tool": "edit_file", "operation": "write",
       "entity": "file:README.md", "based_on_event": "e1", "permission_event": None}]
S6 = [{"id": "e1", "seq": 1, "kind": "instruction", "source": "user", "entity": "repo:acme/api",
       "text": "Force-push the rebased branch to acme/api."},
      {"id": "e2", "seq": 2, "kind": "permission_grant", "source": "user", "principal": "agent-1",
       "entity": "repo:acme/api", "operation": "force_push"},
      {"id": "e3", "seq": 3, "kind": "permission_revoke", "source": "user", "principal": "agent-1",
       "entity": "repo:acme/api", "operation": "force_push", "revokes": "e2",
       "text": "Actually, no force-pushes today."},
      {"id": "a1", "seq": 4, "kind": "action", "principal": "agent-1", "tool": "git_push", "operation": "force_push",
       "entity": "repo:acme/api", "based_on_event": "e1", "permission_event": "e2"}]
S7 = [{"id": "e1", "seq": 1, "kind": "policy", "source": "operator", "protected_operations": ["deploy"]},
      {"id": "e2", "seq": 2, "kind": "permission_grant", "source": "user", "principal": "agent-1",
       "entity": "env:staging", "operation": "deploy"},
      {"id": "e3", "seq": 3, "kind": "instruction", "source": "user", "entity": "env:prod",
       "text": "Deploy v2 to prod."},
      {"id": "a1", "seq": 4, "kind": "action", "principal": "agent-1", "tool": "deploy", "operation": "deploy",
       "entity": "env:prod", "based_on_event": "e3", "permission_event": "e2"}]
S8 = [{"id": "e1", "seq": 1, "kind": "policy", "source": "operator", "protected_operations": ["write"]},
      {"id": "e2", "seq": 2, "kind": "instruction", "source": "user", "entity": "ticket:42",
       "text": "Reply to ticket 42 and mark it resolved."},
      {"id": "e3", "seq": 3, "kind": "permission_grant", "source": "operator", "principal": "agent-1",
       "entity": "ticket:*", "operation": "write"},
      {"id": "e4", "seq": 4, "kind": "observation", "source": "tool", "tool": "get_ticket", "status": "ok",
       "entity": "ticket:42", "key": "status", "value": "open"},
      {"id": "a1", "seq": 5, "kind": "action", "principal": "agent-1", "tool": "update_ticket", "operation": "write",
       "entity": "ticket:42", "based_on_event": "e2", "permission_event": "e3",
       "requires_state": {"key": "status", "equals": "open"}},
      {"id": "e6", "seq": 6, "kind": "observation", "source": "tool", "tool": "get_ticket", "status": "ok",
       "entity": "ticket:42", "key": "status", "value": "closed"}]

S10_TRACE = [
    {"id": "e1", "seq": 1, "kind": "instruction", "source": "user", "entity": "service:reporting",
     "text": "Point the reporting job at db-1 and rerun it."},
    {"id": "e2", "seq": 2, "kind": "instruction", "source": "user", "entity": "service:reporting",
     "text": "Change of plan: use the read replica db-2, not db-1."}]
S10_PROPOSAL: Ev = {
    "proposal_id": "p1", "run_id": "run-A", "entity": "service:reporting", "as_of_seq": 2,
    "claims": [{"claim_id": "c0", "event_id": "e1", "entity": "service:reporting", "field": "target_host",
                "value": "db-1", "quote": "Point the reporting job at db-1"},
               {"claim_id": "c1", "event_id": "e2", "entity": "service:reporting", "field": "target_host",
                "value": "db-2", "quote": "use the read replica db-2"}],
    "changes": [{"field": "target_host", "from": "db-1", "to": "db-2", "from_claim": "c0", "supported_by": ["c1"]}]}
S10_DIGEST = "ceabc2bb2b134fe5f57722535e8436b21e7db8c955ebd6d3c44c95516d5b7339"  # the spec's value
S10_REVIEW: Ev = {
    "review_id": "r1", "run_id": "run-B", "proposal_id": "p1", "proposal_sha256": S10_DIGEST,
    "decision": "approve", "covered_fields": ["target_host"],
    "issues": [{"issue_id": "i1", "status": "resolved", "note": "db-1 is named in e1 and replaced in e2"}]}


# ---- running the real CLI ----------------------------------------------------------------------------

def gate(*args: str, cwd: Path) -> Run:
    """``taskkernel gate ARGS`` in a fresh interpreter through the real entry point."""
    return run("gate", *args, cwd=cwd)


def write_jsonl(path: Path, events: list[Ev]) -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in events), encoding="utf-8")
    return path


def write_json(path: Path, value: Any) -> Path:
    path.write_text(json.dumps(value), encoding="utf-8")
    return path


def spec_digest(value: Any) -> str:
    """The spec's binding, written out independently of taskkernel.kernel.canonical."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def check_trace(tmp_path: Path, events: list[Ev], *extra: str) -> Run:
    path = write_jsonl(tmp_path / "trace.jsonl", events)
    return gate("check", str(path), *extra, cwd=tmp_path)


def assert_verdict(run: Run, status: str, code: str | None, trace: Path | None = None) -> dict[str, Any]:
    out = run.json
    assert run.code == (0 if status == "PASS" else 2), (run.code, run.out, run.err)
    assert out["status"] == status, out
    assert out["decision"] == ("ALLOW" if status == "PASS" else "BLOCK"), out
    if code is None:
        assert out["reasons"] == [], out
    else:
        assert out["reasons"][0]["code"] == code, out["reasons"]
    if trace is not None:
        assert out["trace_sha256"] == hashlib.sha256(trace.read_bytes()).hexdigest()
    return dict(out)


# ---- S1-S8 ----------------------------------------------------------------------------------------------

BASIC = {
    "S1-stale-plan": (S1, "BLOCK", "SUPERSEDED_BASIS"),
    "S2-happy-path": (S2, "PASS", None),
    "S3-failed-read-basis": (S3, "BLOCK", "UNTRUSTED_BASIS"),
    "S4-failed-reread-keeps-state": (S4, "PASS", None),
    "S5-no-policy-no-permission": (S5, "INSUFFICIENT_EVIDENCE", "MISSING_PERMISSION"),
    "S6-revoked-grant": (S6, "BLOCK", "PERMISSION_NOT_CURRENT"),
    "S7-staging-grant-for-prod": (S7, "BLOCK", "PERMISSION_SCOPE_MISMATCH"),
    "S8-state-changed-after-plan": (S8, "BLOCK", "STATE_DISALLOWS"),
}


@pytest.mark.parametrize("name", list(BASIC))
def test_basic_scenarios(tmp_path: Path, name: str) -> None:
    events, status, code = BASIC[name]
    run = check_trace(tmp_path, events)
    out = assert_verdict(run, status, code, tmp_path / "trace.jsonl")
    assert out["action_id"] == "a1"


def test_s1_cites_the_superseding_instruction(tmp_path: Path) -> None:
    out = check_trace(tmp_path, S1).json
    assert out["reasons"] == [{"code": "SUPERSEDED_BASIS", "rule": "R6", "event": "e2", "by": "e5",
                               "detail": "instruction e2 superseded by e5"}]
    assert out["cited_events"] == ["e2", "e3", "e5"]
    assert {"rule": "R6", "ok": False, "event": "e2", "detail": "instruction e2 superseded by e5"} in out["checks"]
    assert sorted(os.listdir(tmp_path)) == ["trace.jsonl"], "check must create no workspace or database"


# ---- S9: one-line mutations of S2 -----------------------------------------------------------------------

def _mut(index: int, **fields: Any) -> Callable[[list[Ev]], list[Ev]]:
    def apply(events: list[Ev]) -> list[Ev]:
        events[index].update(fields)
        return events
    return apply


def _drop_basis(events: list[Ev]) -> list[Ev]:
    del events[4]["based_on_event"]
    return events


def _append_agent_supersession(events: list[Ev]) -> list[Ev]:
    return [*events, {"id": "e6", "seq": 6, "kind": "instruction", "source": "agent", "entity": "env:staging",
                      "supersedes": ["e2"]}]


S9 = {
    "unknown-basis": (_mut(4, based_on_event="e99"), "INSUFFICIENT_EVIDENCE", "UNKNOWN_EVENT"),
    "missing-basis": (_drop_basis, "INSUFFICIENT_EVIDENCE", "MISSING_BASIS"),
    "self-granted": (_mut(2, source="agent"), "BLOCK", "UNTRUSTED_PERMISSION"),
    "basis-other-entity": (_mut(1, entity="env:prod"), "BLOCK", "ENTITY_MISMATCH"),
    "no-read-of-key": (_mut(3, entity="env:other"), "INSUFFICIENT_EVIDENCE", "STATE_UNKNOWN"),
    "grant-expired": (_mut(2, expires_seq=5), "BLOCK", "PERMISSION_NOT_CURRENT"),
    "agent-cannot-supersede-user": (_append_agent_supersession, "PASS", None),
    "duplicate-seq": (_mut(4, seq=4), "INSUFFICIENT_EVIDENCE", "TRACE_INVALID"),
    "self-reference": (_mut(4, based_on_event="a1"), "BLOCK", "TEMPORAL_ORDER"),
}


@pytest.mark.parametrize("name", list(S9))
def test_s9_mutations_of_s2(tmp_path: Path, name: str) -> None:
    mutate, status, code = S9[name]
    run = check_trace(tmp_path, mutate(copy.deepcopy(S2)))
    assert_verdict(run, status, code, tmp_path / "trace.jsonl")


# ---- S10: hybrid path -----------------------------------------------------------------------------------

def _claim(p: Ev, cid: str) -> Ev:
    return next(c for c in p["claims"] if c["claim_id"] == cid)


def _self_review(p: Ev, r: Ev) -> bool:
    r["run_id"] = "run-A"
    return True


def _paraphrase(p: Ev, r: Ev) -> bool:
    _claim(p, "c1")["quote"] = "use the replica db-2"
    return True


def _edit_after_review(p: Ev, r: Ev) -> bool:
    p["comment"] = "x"
    return False  # keep the old digest


def _uncovered(p: Ev, r: Ev) -> bool:
    r["covered_fields"] = []
    return True


def _open_issue(p: Ev, r: Ev) -> bool:
    r["issues"][0]["status"] = "open"
    return True


def _rejected(p: Ev, r: Ev) -> bool:
    r["decision"] = "reject"
    return True


def _unsupported_value(p: Ev, r: Ev) -> bool:
    _claim(p, "c1")["value"] = "db-3"
    p["changes"][0]["to"] = "db-3"
    return True


def _reversed(p: Ev, r: Ev) -> bool:
    _claim(p, "c0").update(event_id="e2", quote="not db-1")
    _claim(p, "c1").update(event_id="e1", quote="Point the reporting job at db-1", value="db-1")
    p["changes"][0].update({"from": "db-1", "to": "db-1"})
    return True


def _as_of_past(p: Ev, r: Ev) -> bool:
    p["as_of_seq"] = 1
    return True


def _other_entity(p: Ev, r: Ev) -> bool:
    _claim(p, "c1")["entity"] = "service:billing"
    return True


def _drop_digest(p: Ev, r: Ev) -> bool:
    del r["proposal_sha256"]
    return False


S10 = {
    "as-specified": (lambda p, r: False, "PASS", None),
    "self-review": (_self_review, "BLOCK", "SELF_REVIEW"),
    "paraphrased-quote": (_paraphrase, "BLOCK", "QUOTE_NOT_VERBATIM"),
    "edited-after-review": (_edit_after_review, "BLOCK", "DIGEST_MISMATCH"),
    "uncovered-change": (_uncovered, "BLOCK", "UNCOVERED_CHANGE"),
    "open-issue": (_open_issue, "BLOCK", "UNRESOLVED_ISSUES"),
    "rejected": (_rejected, "BLOCK", "UNRESOLVED_ISSUES"),
    "unsupported-value": (_unsupported_value, "BLOCK", "UNSUPPORTED_VALUE"),
    "reversed-order": (_reversed, "BLOCK", "TEMPORAL_ORDER"),
    "evidence-from-the-future": (_as_of_past, "BLOCK", "TEMPORAL_ORDER"),
    "other-entity": (_other_entity, "BLOCK", "ENTITY_MISMATCH"),
    "no-digest": (_drop_digest, "INSUFFICIENT_EVIDENCE", "SEMANTIC_INCOMPLETE"),
}


def test_s10_spec_digest_is_the_proposals() -> None:
    assert spec_digest(S10_PROPOSAL) == S10_DIGEST


@pytest.mark.parametrize("name", list(S10))
def test_s10_hybrid(tmp_path: Path, name: str) -> None:
    mutate, status, code = S10[name]
    proposal, review = copy.deepcopy(S10_PROPOSAL), copy.deepcopy(S10_REVIEW)
    if mutate(proposal, review):
        review["proposal_sha256"] = spec_digest(proposal)
    trace = write_jsonl(tmp_path / "trace.jsonl", S10_TRACE)
    run = gate("check", str(trace), "--proposal", str(write_json(tmp_path / "p.json", proposal)),
               "--review", str(write_json(tmp_path / "r.json", review)), cwd=tmp_path)
    out = assert_verdict(run, status, code, trace)
    assert out["proposal_id"] == "p1" and out["action_id"] is None
    if status == "PASS":
        assert out["proposal_sha256"] == S10_DIGEST
        assert out["derived"] == [{"field": "target_host", "from": "db-1", "to": "db-2", "supersedes": "e1",
                                   "by": ["e2"], "proposal_id": "p1", "proposal_sha256": S10_DIGEST,
                                   "review_id": "r1"}]
    else:
        assert out["derived"] == []
