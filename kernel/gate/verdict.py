"""The verdict: status, decision, cited reasons and the per-rule checks, bound to an action and a trace digest.

An executor may run the tool only when the exit code is 0 *and* ``decision == "ALLOW"`` for *this*
``action_id`` and *this* ``trace_sha256`` (docs/gate.md, "Verdict JSON").
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict

from taskkernel.kernel.canonical import canonical_json
from taskkernel.kernel.gate.models import GateDecision, GateReason, GateStatus


class Reason(BaseModel):
    """One failing check: a stable code, the rule that failed and the events it concerns."""

    model_config = ConfigDict(frozen=True)

    code: GateReason
    rule: str
    event: str | None = None
    by: str | None = None
    detail: str


class Check(BaseModel):
    """One rule application. ``ok`` is None when the rule did not apply or lacked a needed event."""

    model_config = ConfigDict(frozen=True)

    rule: str
    ok: bool | None
    event: str | None = None
    detail: str | None = None


class Verdict(BaseModel):
    model_config = ConfigDict(frozen=True)

    status: GateStatus
    decision: GateDecision
    action_id: str | None
    trace_sha256: str | None
    trace_head_seq: int | None
    protected: bool | None = None
    policy_event: str | None = None
    reasons: list[Reason]
    checks: list[Check]
    cited_events: list[str]
    # hybrid path only (None for an action verdict)
    proposal_id: str | None = None
    review_id: str | None = None
    proposal_sha256: str | None = None
    derived: list[dict[str, Any]] | None = None
    semantic: list[Verdict] | None = None

    @property
    def passed(self) -> bool:
        return self.status is GateStatus.PASS

    def to_dict(self) -> dict[str, Any]:
        """The verdict JSON: hybrid-only fields appear only on a semantic verdict (``derived`` is a list there)."""
        out = self.model_dump(mode="json", exclude={"semantic"})
        if self.derived is None:
            for key in ("proposal_id", "review_id", "proposal_sha256", "derived"):
                out.pop(key)
        if self.semantic is not None:
            out["semantic"] = [v.to_dict() for v in self.semantic]
        return out

    def to_json(self) -> str:
        return canonical_json(self.to_dict())

    def as_event(self) -> dict[str, Any]:
        """Data of the ``gate_decision`` event the kernel records for every verdict (auditable, replayable)."""
        return {"type": "gate_decision", "action_id": self.action_id, "proposal_id": self.proposal_id,
                "status": self.status.value, "decision": self.decision.value,
                "trace_sha256": self.trace_sha256, "trace_head_seq": self.trace_head_seq,
                "reasons": [r.model_dump(mode="json") for r in self.reasons],
                "cited_events": list(self.cited_events)}


def status_of(reasons: Iterable[Reason]) -> GateStatus:
    """BLOCK if any reason blocks; else INSUFFICIENT_EVIDENCE if any evidence is missing; else PASS."""
    status = GateStatus.PASS
    for reason in reasons:
        if reason.code.blocks:
            return GateStatus.BLOCK
        status = GateStatus.INSUFFICIENT_EVIDENCE
    return status


class Recorder:
    """Collects checks, reasons and cited events while rules run, then builds the verdict."""

    __slots__ = ("checks", "reasons", "cited")

    def __init__(self) -> None:
        self.checks: list[Check] = []
        self.reasons: list[Reason] = []
        self.cited: set[str] = set()

    def ok(self, rule: str, event: str | None = None, detail: str | None = None) -> None:
        self.checks.append(Check(rule=rule, ok=True, event=event, detail=detail))

    def skip(self, rule: str, detail: str, event: str | None = None) -> None:
        self.checks.append(Check(rule=rule, ok=None, event=event, detail=detail))

    def fail(self, rule: str, code: GateReason, detail: str, event: str | None = None, by: str | None = None) -> None:
        self.checks.append(Check(rule=rule, ok=False, event=event, detail=detail))
        self.reasons.append(Reason(code=code, rule=rule, event=event, by=by, detail=detail))

    def cite(self, *ids: str | None) -> None:
        self.cited.update(i for i in ids if i)

    def verdict(self, *, action_id: str | None, trace_sha256: str | None, trace_head_seq: int | None,
                order: dict[str, int], **extra: Any) -> Verdict:
        status = status_of(self.reasons)
        cited = sorted((i for i in self.cited if i in order), key=order.__getitem__)
        return Verdict(status=status, decision=GateDecision.ALLOW if status is GateStatus.PASS else GateDecision.BLOCK,
                       action_id=action_id, trace_sha256=trace_sha256, trace_head_seq=trace_head_seq,
                       reasons=self.reasons, checks=self.checks, cited_events=cited, **extra)
