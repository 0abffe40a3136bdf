"""The decision procedure: pre-phase P1-P3, then R1-R14 in the documented order (docs/gate.md).

Every rule runs; a rule is skipped only when an event it needs is missing (recorded as ``ok: null``).
Within a rule that concerns several bases the bases are taken in the order the action lists them, so
``reasons[0]`` is always the first failing rule.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from taskkernel.kernel.gate.match import entity_covered, entity_is, op_covered, same_value
from taskkernel.kernel.gate.models import (
    GRANT_AUTHORS,
    Action,
    GateReason,
    Instruction,
    Observation,
    PermissionGrant,
)
from taskkernel.kernel.gate.trace import Event, TraceIndex
from taskkernel.kernel.gate.verdict import Recorder, Verdict

R = GateReason
ActionRef = str | Mapping[str, Any] | Action | None


def evaluate(index: TraceIndex, action: ActionRef = None, *, admitted: Iterable[Verdict] = ()) -> Verdict:
    """Judge ``action`` against the trace as of its last event.

    ``action`` is an action id in the trace, an action not (yet) in the trace (a dict or ``Action``; without
    ``seq`` it counts as planned now, after the last event), or None for the trace's last action.
    ``admitted`` are passing hybrid verdicts whose derived supersessions also count for R6.
    """
    rec = Recorder()
    action_id = action if isinstance(action, str) else _id_of(action)

    def done(**extra: Any) -> Verdict:
        return rec.verdict(action_id=action_id, trace_sha256=index.sha256, trace_head_seq=index.head_seq,
                           order=index.seq_of, **extra)

    if index.problem is not None:  # P1
        problem = index.problem
        rec.fail(problem.rule, problem.code, problem.detail, event=problem.event)
        return done()
    rec.ok("P1")
    act = _select(index, action, rec)  # P2, P3
    if act is None:
        return done()
    action_id = act.id
    assert act.entity is not None and act.operation is not None
    derived = {d["supersedes"]: d["by"][0] for v in admitted if v.passed for d in (v.derived or [])}
    _basis_rules(index, act, rec, derived)
    protected, policy_id = _protected(index, act)
    _permission_rules(index, act, protected, rec)
    _state_rules(index, act, rec)
    return done(protected=protected, policy_event=policy_id)


def _id_of(action: ActionRef) -> str | None:
    if isinstance(action, Action):
        return action.id
    if isinstance(action, Mapping) and isinstance(action.get("id"), str):
        return str(action["id"])
    return None


def _select(index: TraceIndex, action: ActionRef, rec: Recorder) -> Action | None:
    """P2 (the action exists) and P3 (it names one entity and an operation)."""
    if action is None:
        act = index.last_action
        if act is None:
            rec.fail("P2", R.NO_ACTION, "the trace holds no action event")
            return None
    elif isinstance(action, str):
        found = index.by_id.get(action)
        if not isinstance(found, Action):
            what = "no event" if found is None else f"a {found.kind} event, not an action"
            rec.fail("P2", R.NO_ACTION, f"action {action!r} not found: the trace has {what} with that id",
                     event=action if found else None)
            return None
        act = found
    else:
        try:
            act = action if isinstance(action, Action) else _standalone(index, action)
        except ValidationError as exc:
            rec.ok("P2")
            first = exc.errors(include_url=False)[0]
            loc = ".".join(str(p) for p in first["loc"])
            rec.fail("P3", R.ACTION_INCOMPLETE, f"malformed action: {loc}: {first['msg']}", event=_id_of(action))
            return None
    rec.ok("P2", event=act.id)
    missing = [f for f in ("entity", "operation") if not getattr(act, f)]
    if missing:
        rec.fail("P3", R.ACTION_INCOMPLETE, f"action {act.id} has no {' and no '.join(missing)}", event=act.id)
        return None
    rec.ok("P3", event=act.id)
    return act


def _standalone(index: TraceIndex, action: Mapping[str, Any]) -> Action:
    raw = {"kind": "action", **action}
    if "seq" not in raw:
        raw["seq"] = (index.head_seq or 0) + 1
    return Action.model_validate(raw)


def _basis_rules(index: TraceIndex, act: Action, rec: Recorder, derived: Mapping[str, str]) -> None:
    bases = act.bases
    if not bases:
        rec.fail("R1", R.MISSING_BASIS, f"action {act.id} has no based_on_event", event=act.id)
        for rule in ("R2", "R3", "R4", "R5", "R6"):
            rec.skip(rule, "no basis to check")
        return
    rec.ok("R1")
    found: list[Event] = []
    for b in bases:
        ev = index.by_id.get(b)
        if ev is None:
            rec.fail("R2", R.UNKNOWN_EVENT, f"basis {b!r} is not an event of the trace", event=b)
        else:
            rec.ok("R2", event=b)
            rec.cite(b)
            found.append(ev)
    if not found:
        for rule in ("R3", "R4", "R5", "R6"):
            rec.skip(rule, "no basis event exists")
        return
    for ev in found:
        if ev.seq < act.seq:
            rec.ok("R3", event=ev.id)
        else:
            rec.fail("R3", R.TEMPORAL_ORDER, f"basis {ev.id} (seq {ev.seq}) is not before action {act.id} "
                     f"(seq {act.seq}): it did not exist when the plan was made", event=ev.id)
    for ev in found:
        _basis_trust(ev, rec)
    for ev in found:
        entity = getattr(ev, "entity", None)
        if entity_is(entity, act.entity or ""):
            rec.ok("R5", event=ev.id)
        else:
            rec.fail("R5", R.ENTITY_MISMATCH, f"basis {ev.id} is about {entity!r}, the action about "
                     f"{act.entity!r}", event=ev.id)
    for ev in found:
        by = index.superseded_by.get(ev.id) or derived.get(ev.id)
        if by is None:
            rec.ok("R6", event=ev.id)
        else:
            rec.cite(by)
            how = "" if ev.id in index.superseded_by else " (admitted semantic change)"
            rec.fail("R6", R.SUPERSEDED_BASIS, f"{ev.kind} {ev.id} superseded by {by}{how}", event=ev.id, by=by)


def _basis_trust(ev: Event, rec: Recorder) -> None:
    """R4: a basis is a user/operator instruction or a tool's ok read."""
    if isinstance(ev, Instruction | Observation):
        if ev.trusted:
            rec.ok("R4", event=ev.id)
        elif isinstance(ev, Observation):
            rec.fail("R4", R.UNTRUSTED_BASIS, f"observation {ev.id} is a failed read (source {ev.source}, "
                     f"status {ev.status}); it cannot support an action", event=ev.id)
        else:
            rec.fail("R4", R.UNTRUSTED_BASIS, f"instruction {ev.id} was written by {ev.source!r}, not the user "
                     "or an operator", event=ev.id)
    else:
        rec.fail("R4", R.INVALID_BASIS_KIND, f"basis {ev.id} is a {ev.kind}, not an instruction or observation",
                 event=ev.id)


def _protected(index: TraceIndex, act: Action) -> tuple[bool, str | None]:
    """With no trusted policy every operation but ``read`` is protected (fail closed)."""
    assert act.operation is not None and act.entity is not None
    policy = index.policy
    if policy is None:
        return act.operation != "read", None
    hit = (op_covered(policy.protected_operations, act.operation)
           or entity_covered(policy.protected_entities, act.entity))
    return hit, policy.id


def _permission_rules(index: TraceIndex, act: Action, protected: bool, rec: Recorder) -> None:
    """R7-R12. A cited permission is checked even when the operation is not protected: a claim must hold."""
    pid = act.permission_event
    if protected and not pid:
        rec.fail("R7", R.MISSING_PERMISSION, f"{act.operation} on {act.entity} is protected and action {act.id} "
                 "cites no permission_event", event=act.id)
    else:
        rec.ok("R7", detail=None if protected else "operation not protected")
    if not pid:
        for rule in ("R8", "R9", "R10", "R11", "R12"):
            rec.skip(rule, "no permission_event")
        return
    grant = index.by_id.get(pid)
    if grant is None:
        rec.fail("R8", R.UNKNOWN_EVENT, f"permission {pid!r} is not an event of the trace", event=pid)
        for rule in ("R9", "R10", "R11", "R12"):
            rec.skip(rule, "permission event missing")
        return
    rec.ok("R8", event=pid)
    rec.cite(pid)
    if not isinstance(grant, PermissionGrant):
        rec.fail("R9", R.INVALID_PERMISSION_KIND, f"permission {pid} is a {grant.kind}, not a permission_grant",
                 event=pid)
        for rule in ("R10", "R11", "R12"):
            rec.skip(rule, "permission event is not a grant")
        return
    if grant.seq < act.seq:
        rec.ok("R9", event=pid)
    else:
        rec.fail("R9", R.TEMPORAL_ORDER, f"grant {pid} (seq {grant.seq}) is not before action {act.id} "
                 f"(seq {act.seq})", event=pid)
    if grant.source in GRANT_AUTHORS:
        rec.ok("R10", event=pid)
    else:
        rec.fail("R10", R.UNTRUSTED_PERMISSION, f"grant {pid} was written by {grant.source!r}; only the user, an "
                 "operator or the system can grant", event=pid)
    _scope(grant, act, rec)
    _current(index, grant, act, rec)


def _scope(grant: PermissionGrant, act: Action, rec: Recorder) -> None:
    """R11: entity (glob), operation and principal (when the grant names one) all cover the action."""
    assert act.entity is not None and act.operation is not None
    misses = []
    if not entity_covered(grant.entity, act.entity):
        misses.append(f"entity {act.entity!r} not in {grant.entity!r}")
    if not op_covered(grant.operation, act.operation):
        misses.append(f"operation {act.operation!r} not in {grant.operation!r}")
    if grant.principal is not None and grant.principal != act.principal:
        misses.append(f"principal {act.principal!r} is not {grant.principal!r}")
    if misses:
        rec.fail("R11", R.PERMISSION_SCOPE_MISMATCH, f"grant {grant.id} does not cover the action: "
                 + "; ".join(misses), event=grant.id)
    else:
        rec.ok("R11", event=grant.id)


def _current(index: TraceIndex, grant: PermissionGrant, act: Action, rec: Recorder) -> None:
    """R12: not superseded/revoked, not expired, and no later trusted revoke covers this action."""
    by = index.superseded_by.get(grant.id)
    head = index.head_seq
    detail = None
    if by is not None:
        detail = f"grant {grant.id} superseded or revoked by {by}"
    elif grant.expires_seq is not None and head is not None and grant.expires_seq <= head:
        detail = f"grant {grant.id} expired at seq {grant.expires_seq} (trace ends at {head})"
    else:
        assert act.entity is not None and act.operation is not None
        for rev in index.revokes_covering(act.operation, act.entity):
            if rev.seq > grant.seq and (rev.principal is None or rev.principal == act.principal):
                by = rev.id
                detail = f"revoke {rev.id} covers {act.operation} on {act.entity} after grant {grant.id}"
                break
    if detail is None:
        rec.ok("R12", event=grant.id)
    else:
        rec.cite(by)
        rec.fail("R12", R.PERMISSION_NOT_CURRENT, detail, event=grant.id, by=by)


def _state_rules(index: TraceIndex, act: Action, rec: Recorder) -> None:
    """R13/R14: the precondition holds on the latest trusted read at the end of the trace."""
    need = act.requires_state
    if need is None:
        rec.skip("R13", "no requires_state")
        rec.skip("R14", "no requires_state")
        return
    entity = need.entity or act.entity or ""
    obs = index.state.get((entity, need.key))
    if obs is None:
        rec.fail("R13", R.STATE_UNKNOWN, f"no trusted read of {need.key!r} on {entity}", event=act.id)
        rec.skip("R14", "state unknown")
        return
    rec.ok("R13", event=obs.id)
    rec.cite(obs.id)
    if same_value(obs.value, need.equals):
        rec.ok("R14", event=obs.id)
    else:
        rec.fail("R14", R.STATE_DISALLOWS, f"{entity} {need.key} is {obs.value!r} (read {obs.id}), the action "
                 f"requires {need.equals!r}", event=obs.id)
