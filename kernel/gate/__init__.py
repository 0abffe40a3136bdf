"""Execution gate: judge a planned tool call against the trace *at execution time* (docs/gate.md).

Typical use by an executor or the kernel::

    index = TraceIndex.from_file("trace.jsonl")      # or TraceIndex.from_events(kernel_events), once
    verdict = Gate.evaluate(index, "a1")             # PASS | BLOCK | INSUFFICIENT_EVIDENCE
    if verdict.decision is GateDecision.ALLOW: run_the_tool()

The component is pure: no database, no workspace, no clock; the trace is the only input.
"""

from __future__ import annotations

from taskkernel.kernel.gate.hybrid import proposal_digest, review
from taskkernel.kernel.gate.models import Action, GateDecision, GateReason, GateStatus
from taskkernel.kernel.gate.rules import evaluate
from taskkernel.kernel.gate.trace import TraceIndex
from taskkernel.kernel.gate.verdict import Check, Reason, Verdict


class Gate:
    """The two entry points as one namespace: ``Gate.evaluate(index, action)``, ``Gate.review(index, p, r)``."""

    evaluate = staticmethod(evaluate)
    review = staticmethod(review)


__all__ = ["Action", "Check", "Gate", "GateDecision", "GateReason", "GateStatus", "Reason", "TraceIndex", "Verdict",
           "evaluate", "proposal_digest", "review"]
