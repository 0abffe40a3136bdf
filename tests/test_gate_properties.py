"""Property: on random traces, a PASS never coexists with a violated precondition of the specification.

The oracle below is a deliberately naive, independent restatement of what the spec makes *necessary*
for PASS (docs/gate.md, R1-R14): quadratic scans over the raw dicts, no shared code with the gate.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from taskkernel.kernel.gate import Gate, GateDecision, GateStatus, TraceIndex

SOURCES = ["user", "operator", "system", "tool", "agent"]
ENTITIES = ["env:a", "env:b"]
OPS = ["read", "deploy"]
VALUES = [0, 1, True, False, "x"]
Ev = dict[str, Any]


def _jeq(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


def _trusted_basis(e: Ev) -> bool:
    if e["kind"] == "instruction":
        return e["source"] in ("user", "operator")
    return e["kind"] == "observation" and e["source"] == "tool" and e["status"] == "ok"


def _may_supersede(x: Ev, target: Ev) -> bool:
    if x["kind"] == "observation" and not (x["source"] == "tool" and x["status"] == "ok"):
        return False  # a failed observation's supersedes is ignored
    if target["kind"] == "observation":
        return x["kind"] == "observation"
    if target["kind"] == "permission_grant":
        return x.get("source") in ("user", "operator", "system")
    return x.get("source") in ("user", "operator")


def _as_set(v: Any) -> frozenset[str]:
    return frozenset([v] if isinstance(v, str) else v)


def violations(events: list[Ev], action: Ev) -> list[str]:
    """Necessary conditions for PASS that the trace breaks (empty list: none found)."""
    found: list[str] = []
    by_id = {e["id"]: e for e in events}
    last = events[-1]["seq"]
    bases = [action["based_on_event"]] if isinstance(action["based_on_event"], str) else action["based_on_event"]
    if not bases:
        found.append("R1 no basis")
    for b in bases:
        e = by_id.get(b)
        if e is None:
            found.append("R2 unknown basis")
            continue
        if e["seq"] >= action["seq"]:
            found.append("R3 basis not before the action")
        if not _trusted_basis(e):
            found.append("R4 untrusted basis")
        if e.get("entity") != action["entity"]:
            found.append("R5 entity")
        for x in events:
            if x["seq"] <= e["seq"]:
                continue
            if b in (x.get("supersedes") or []) and _may_supersede(x, e):
                found.append("R6 explicitly superseded")
            if (e["kind"] == "observation" and _trusted_basis(e) and x["kind"] == "observation" and _trusted_basis(x)
                    and (x["entity"], x["key"]) == (e["entity"], e["key"]) and not _jeq(x["value"], e["value"])):
                found.append("R6 read changed")
    policies = [e for e in events if e["kind"] == "policy" and e["source"] in ("operator", "system")]
    protected = action["operation"] != "read" if not policies else action["operation"] in policies[-1][
        "protected_operations"]
    if protected:
        g = by_id.get(action["permission_event"] or "")
        if g is None or g["kind"] != "permission_grant":
            found.append("R7-R9 no grant")
        else:
            if g["seq"] >= action["seq"]:
                found.append("R9 grant not before the action")
            if g["source"] not in ("user", "operator", "system"):
                found.append("R10 untrusted grant")
            if not (g["entity"] == action["entity"] or g["entity"] == "env:*"):
                found.append("R11 entity")
            if not ({"*", action["operation"]} & _as_set(g["operation"])):
                found.append("R11 operation")
            if g.get("principal") not in (None, action["principal"]):
                found.append("R11 principal")
            if g.get("expires_seq") is not None and g["expires_seq"] <= last:
                found.append("R12 expired")
            triple = (g.get("principal"), g["entity"], _as_set(g["operation"]))
            for x in events:
                if x["seq"] <= g["seq"] or x.get("source") not in ("user", "operator", "system"):
                    continue
                if x.get("revokes") == g["id"] or g["id"] in (x.get("supersedes") or []):
                    found.append("R12 revoked")
                if (x["kind"] in ("permission_grant", "permission_revoke") and "operation" in x
                        and (x.get("principal"), x.get("entity"), _as_set(x["operation"])) == triple):
                    found.append("R12 replaced")
    need = action.get("requires_state")
    if need:
        reads = [e for e in events if e["kind"] == "observation" and _trusted_basis(e)
                 and (e["entity"], e["key"]) == (action["entity"], need["key"])]
        if not reads:
            found.append("R13 state unknown")
        elif not _jeq(reads[-1]["value"], need["equals"]):
            found.append("R14 state disallows")
    return found


def _noise(draw: st.DrawFn, kind: str, n: int) -> Ev:
    ev: Ev = {"kind": kind, "source": draw(st.sampled_from(SOURCES))}
    if kind == "instruction":
        ev["entity"] = draw(st.sampled_from(ENTITIES))
    elif kind == "observation":
        ev.update(source=draw(st.sampled_from(["tool", "tool", "agent"])),
                  status=draw(st.sampled_from(["ok", "ok", "error", "timeout"])),
                  entity=draw(st.sampled_from(ENTITIES)), key="k", value=draw(st.sampled_from(VALUES)))
    elif kind == "permission_grant":
        ev.update(principal=draw(st.sampled_from([None, "ag", "other"])),
                  entity=draw(st.sampled_from([*ENTITIES, "env:*"])),
                  operation=draw(st.sampled_from([*OPS, "*", ["read", "deploy"]])),
                  expires_seq=draw(st.none() | st.integers(0, n + 2)))
    elif kind == "permission_revoke":
        ev.update(principal="ag", entity=draw(st.sampled_from(ENTITIES)), operation="deploy")
    else:
        ev["protected_operations"] = draw(st.lists(st.sampled_from(OPS), unique=True))
    return ev


@st.composite
def traces(draw: st.DrawFn) -> tuple[list[Ev], Ev]:
    """Near-valid traces: a golden instruction, grant and read (each possibly perturbed) among random noise."""
    op, ent = draw(st.sampled_from(OPS)), draw(st.sampled_from(ENTITIES))
    value = draw(st.sampled_from(VALUES))

    def mostly(good: Any, *others: Any) -> Any:
        return draw(st.sampled_from([good] * (2 * len(others) + 2) + list(others)))

    golden: list[Ev] = [
        {"id": "gi", "kind": "instruction", "source": mostly("user", "operator", "agent"),
         "entity": mostly(ent, "env:c")},
        {"id": "gg", "kind": "permission_grant", "source": mostly("user", "system", "agent", "tool"),
         "principal": mostly("ag", None, "other"), "entity": mostly(ent, "env:*", "env:c"),
         "operation": mostly(op, "*", [op, "x"], "x"), "expires_seq": mostly(None, 3, 30)},
        {"id": "gr", "kind": "observation", "source": "tool", "status": mostly("ok", "error"), "entity": ent,
         "key": "k", "value": value},
    ]
    kinds = ["instruction", "observation", "permission_grant", "permission_revoke", "policy"]
    n_noise = draw(st.integers(0, 6))
    noise = [_noise(draw, draw(st.sampled_from(kinds)), n_noise + 4) for _ in range(n_noise)]
    split = draw(st.integers(0, n_noise))
    before = draw(st.permutations(golden + noise[:split]))
    action: Ev = {"id": "act", "kind": "action", "principal": "ag", "tool": "t", "operation": op, "entity": ent,
                  "based_on_event": mostly("gi", ["gi", "gr"], "gr", "zz", "act", []),
                  "permission_event": mostly("gg", None, "gi", "zz"),
                  "requires_state": mostly({"key": "k", "equals": value}, None, {"key": "k", "equals": "other"})}
    after = noise[split:]
    if draw(st.integers(0, 3)) == 0:  # a revoke of the golden grant, by someone
        after.insert(0, {"id": "gv", "kind": "permission_revoke", "source": draw(st.sampled_from(SOURCES)),
                         "revokes": "gg"})
    events: list[Ev] = []
    for seq, ev in enumerate([*before, action, *after], 1):
        ev = {**ev, "id": ev.get("id", f"e{seq}"), "seq": seq}
        prior = [e["id"] for e in events if e["kind"] != "policy"]
        if "revokes" not in ev and ev["kind"] == "permission_revoke" and len(prior) > 0 and draw(st.booleans()):
            ev = {k: v for k, v in ev.items() if k not in ("principal", "entity", "operation")}
            ev["revokes"] = draw(st.sampled_from(prior))
        if len(prior) > 0 and ev["kind"] not in ("policy", "action") and ev["id"].startswith("e") and draw(
                st.integers(0, 3)) == 0:
            ev["supersedes"] = draw(st.lists(st.sampled_from(prior), min_size=1, max_size=2, unique=True))
        events.append(ev)
    return events, next(e for e in events if e["id"] == "act")


STATUSES: list[GateStatus] = []


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traces())
def _pass_implies_every_precondition(case: tuple[list[Ev], Ev]) -> None:
    events, action = case
    verdict = Gate.evaluate(TraceIndex.from_events(events), action["id"])
    STATUSES.append(verdict.status)
    assert (verdict.decision is GateDecision.ALLOW) == (verdict.status is GateStatus.PASS)
    assert (verdict.status is GateStatus.BLOCK) == any(r.code.blocks for r in verdict.reasons)
    if verdict.status is GateStatus.PASS:
        assert violations(events, action) == [], (events, verdict.checks)
    else:
        assert verdict.reasons and any(c.ok is False for c in verdict.checks)


def test_pass_never_coexists_with_a_violated_precondition() -> None:
    STATUSES.clear()
    _pass_implies_every_precondition()
    # the property is only meaningful if the generator reaches every outcome
    assert {GateStatus.PASS, GateStatus.BLOCK, GateStatus.INSUFFICIENT_EVIDENCE} <= set(STATUSES), set(STATUSES)
