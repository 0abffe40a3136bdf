"""Protected actions: a `perform` command is judged by the execution gate against the log *now*.

The trace is built from the kernel's own session log (acceptance order, so storage order
cannot mislead it): instructions, grants, revocations and tool observations, each trusted
according to the credential it was accepted from, never according to its payload. A policy
event derived from the task's risk level (and the acting role) says which operations are
protected; irreversible tasks protect everything. Every verdict is appended to the log
(stream `gate:<task>`); only PASS lets the command append its `action_authorized` event and
its effect. A grant declared `single_use` is consumed by the action it authorized.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from taskkernel.kernel.commands import EVIDENCE_KEY
from taskkernel.kernel.gate import GateStatus, TraceIndex, evaluate
from taskkernel.kernel.model.commands import Command, CommandType, PerformPayload
from taskkernel.kernel.model.principal import Principal
from taskkernel.kernel.reasons import KernelError, ReasonCode
from taskkernel.kernel.sessionlog import Rec, SessionLog
from taskkernel.kernel.sessionlog.authority import check_read
from taskkernel.kernel.sessionlog.models import SessionLogError
from taskkernel.kernel.sessionlog.replay import replay
from taskkernel.kernel.store.db import UnitOfWork
from taskkernel.kernel.store.events import EventStore, NewEvent

DEFAULT_SESSION = "admin"
SEQ_STRIDE = 10  # session sequence s -> trace seq s*10; a plan formed at s sits at s*10+5
SOURCE_OF_ROLE = {"ADMIN": "user", "OPERATOR": "operator", "SYSTEM": "system", "TOOL": "tool"}
DEFAULT_PROTECTED: Mapping[str, Sequence[str]] = {
    "low": ("write", "delete", "deploy", "force_push", "migrate"),
    "medium": ("write", "delete", "deploy", "force_push", "migrate"),
    "high": ("*",),
}


def source_of(accepted_by: str | None) -> str:
    """Trust comes from who the host accepted the input from; unknown provenance is the agent's."""
    role = (accepted_by or "").split(":", 1)[0]
    return SOURCE_OF_ROLE.get(role, "agent")


def _seq(session_seq: int) -> int:
    return session_seq * SEQ_STRIDE


def trace_event(r: Rec) -> dict[str, Any] | None:
    """One accepted session input as a gate trace event (None for bookkeeping kinds)."""
    p, base = r.payload, {"id": r.input_id, "seq": _seq(r.seq or 0), "source": source_of(r.accepted_by)}
    if p.get("supersedes"):
        base["supersedes"] = list(p["supersedes"])
    if r.kind in ("message", "steer", "queued", "answer"):
        return {**base, "kind": "instruction", "entity": p.get("entity", "session"), "text": p.get("text", "")}
    if r.kind in ("allow", "revoke"):
        ev = {**base, "kind": "permission_grant" if r.kind == "allow" else "permission_revoke",
              "entity": p["scope"], "operation": p["permission"]}
        for key in ("principal", "revokes", "text"):
            if key in p:
                ev[key] = p[key]
        if "expires_seq" in p:
            ev["expires_seq"] = _seq(int(p["expires_seq"]))
        return ev
    if r.kind == "observation":
        return {**base, "kind": "observation", **{k: p.get(k) for k in ("tool", "status", "entity", "key", "value")}}
    return None


class DamagedLog(ValueError):
    """The session the gate would judge by does not replay as ``known``."""


def build_trace(records: Sequence[Rec], protected: Sequence[str] | None) -> list[dict[str, Any]]:
    """Accepted, sequenced inputs in acceptance order, behind the kernel's policy event (none = protect all). A log
    that does not replay as ``known`` (a lost sequence, an accepted input without one, a lost tail) raises
    ValueError: the gate never judges a damaged history as if it were whole (fail closed)."""
    verdict = replay(records)
    if not verdict.known:
        raise DamagedLog(f"the session log does not replay ({verdict.reason}: {verdict.detail}): nothing it "
                         "holds can authorize an action")
    events: list[dict[str, Any]] = []
    if protected is not None:
        events.append({"id": "kernel-policy", "seq": 1, "kind": "policy", "source": "system",
                       "protected_operations": list(protected)})
    for r in sorted((r for r in records if r.accepted and r.seq is not None), key=lambda r: r.seq or 0):
        ev = trace_event(r)
        if ev is not None:
            events.append(ev)
    return events


class GateGuard:
    """Kernel guard for `perform`: evaluates the gate inside the command's transaction."""

    def __init__(self, log: SessionLog, store: EventStore, *, default_session: str = DEFAULT_SESSION,
                 protected_by_risk: Mapping[str, Sequence[str]] = DEFAULT_PROTECTED,
                 protected_by_role: Mapping[str, Sequence[str]] | None = None) -> None:
        self.log = log
        self.store = store
        self.default_session = default_session
        self.protected_by_risk = protected_by_risk
        self.protected_by_role = protected_by_role or {}

    def _check_readable(self, uow: UnitOfWork, session: str, principal: Principal) -> None:
        try:
            check_read(session, self.log.owner(session, uow.conn), principal, self.log.admin_sessions)
        except SessionLogError as exc:
            raise KernelError(ReasonCode.ROLE_NOT_AUTHORIZED, f"{exc.message}; the gate judges this action "
                                                              f"against session {self.default_session!r} or one "
                                                              "you may read") from exc

    def protected_operations(self, risk_level: str, role: str) -> list[str] | None:
        """None means no policy event: the gate then protects every operation except read."""
        if risk_level == "irreversible":
            return None
        ops = set(self.protected_by_risk.get(risk_level, ("*",))) | set(self.protected_by_role.get(role, ()))
        return sorted(ops)

    def __call__(self, uow: UnitOfWork, cmd: Command, doc: dict[str, Any] | None, principal: Principal) -> None:
        if cmd.type is not CommandType.PERFORM or doc is None:
            return
        payload = cmd.validated_payload()
        assert isinstance(payload, PerformPayload)
        session = cmd.permission_session or self.default_session
        if session != self.default_session:  # another session is read only if its reader may read it: a
            self._check_readable(uow, session, principal)  # verdict quotes the inputs it weighed
        records = self.log.records(session, uow.conn)
        head = max((r.seq or 0 for r in records), default=0)
        try:
            trace = build_trace(records, self.protected_operations(doc["risk_level"], principal.role))
        except DamagedLog as exc:
            raise KernelError(ReasonCode.GATE_INSUFFICIENT_EVIDENCE, f"session {session!r}: {exc}") from exc
        except (KeyError, TypeError, ValueError) as exc:  # an input the gate cannot read: fail closed
            raise KernelError(ReasonCode.GATE_INSUFFICIENT_EVIDENCE,
                              f"session {session!r} holds an input the gate cannot read ({exc!r})") from exc
        plan_seq = head if payload.plan_seq is None else min(payload.plan_seq, head)
        action = {"id": cmd.idempotency_key, "seq": _seq(plan_seq) + SEQ_STRIDE // 2, "kind": "action",
                  "principal": principal.role, "tool": payload.tool, "operation": payload.operation,
                  "entity": payload.entity, "args": payload.args, "based_on_event": payload.based_on_event,
                  "permission_event": payload.permission_event,
                  "requires_state": payload.requires_state.model_dump() if payload.requires_state else None}
        verdict = evaluate(TraceIndex.from_events(trace), action)
        record = {**verdict.as_event(), "task_id": doc["task_id"], "round": doc["round"], "session": session,
                  "session_head_seq": head, "plan_seq": plan_seq, "by": principal.id}
        self.store.append_at_head(uow, f"gate:{doc['task_id']}", [NewEvent("gate_decision", record)],
                                  {"actor": principal.agent, "role": principal.role,
                                   "command_id": cmd.idempotency_key, "command_type": cmd.type.value})
        if verdict.status is not GateStatus.PASS:
            first = verdict.reasons[0]
            code = (ReasonCode.GATE_BLOCKED if verdict.status is GateStatus.BLOCK
                    else ReasonCode.GATE_INSUFFICIENT_EVIDENCE)
            raise KernelError(code, f"{verdict.status.value} {first.code}: {first.detail} "
                                    f"(trace {(verdict.trace_sha256 or '')[:12]}, session {session!r} at {head})")
        self._consume_single_use(uow, session, records, payload, cmd.idempotency_key)
        uow.cache[EVIDENCE_KEY] = {"verdict": {"status": verdict.status.value, "trace_sha256": verdict.trace_sha256,
                                               "session": session, "session_head_seq": head,
                                               "cited_events": list(verdict.cited_events)}}

    def _consume_single_use(self, uow: UnitOfWork, session: str, records: Sequence[Rec], payload: PerformPayload,
                            action_id: str) -> None:
        grant = next((r for r in records if r.input_id == payload.permission_event and r.kind == "allow"), None)
        if grant is None or not grant.payload.get("single_use"):
            return
        self.log.accept_in(uow.conn, session, {
            "input_id": f"consumed:{grant.input_id}", "kind": "revoke",
            "payload": {"permission": grant.payload["permission"], "scope": grant.payload["scope"],
                        "revokes": grant.input_id, "consumed_by": action_id}}, accepted_by="SYSTEM:kernel")
