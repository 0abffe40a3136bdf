"""The hybrid semantic path: an LLM proposal and an independent review, admitted only by deterministic checks.

It covers changes stated only in free text ("use db-2, not db-1"). Checks H0-H8 run in order (docs/gate.md);
a PASS yields ``derived`` supersessions the kernel may record as cited events. The checks are lexical: a
digest proves integrity, not correctness, and a quoted value may still be negated in the text.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from taskkernel.kernel.canonical import canonical_json, digest
from taskkernel.kernel.gate.match import entity_is, same_value
from taskkernel.kernel.gate.models import Claim, GateReason, Instruction, Observation, Proposal, Review
from taskkernel.kernel.gate.trace import Event, TraceIndex
from taskkernel.kernel.gate.verdict import Recorder, Verdict

R = GateReason
M = TypeVar("M", bound=BaseModel)


def proposal_digest(proposal: Mapping[str, Any]) -> str:
    """SHA-256 of the whole proposal as canonical JSON (sorted keys, no whitespace, UTF-8 kept)."""
    return digest(proposal)


def review(index: TraceIndex, proposal: Any, review: Any) -> Verdict:
    """Check ``review`` of ``proposal`` (raw JSON values) against the trace."""
    rec = Recorder()
    pid = proposal.get("proposal_id") if isinstance(proposal, Mapping) else None
    rid = review.get("review_id") if isinstance(review, Mapping) else None
    sha = proposal_digest(proposal) if isinstance(proposal, Mapping) else None

    def done(derived: list[dict[str, Any]] | None = None) -> Verdict:
        return rec.verdict(action_id=None, trace_sha256=index.sha256, trace_head_seq=index.head_seq,
                           order=index.seq_of, proposal_id=pid if isinstance(pid, str) else None,
                           review_id=rid if isinstance(rid, str) else None, proposal_sha256=sha,
                           derived=derived if derived is not None and not rec.reasons else [])

    if index.problem is not None:
        rec.fail(index.problem.rule, index.problem.code, index.problem.detail, event=index.problem.event)
        return done()
    rec.ok("P1")
    prop = _shape(Proposal, proposal, "proposal", rec)
    rev = _shape(Review, review, "review", rec)
    if prop is None or rev is None or not _claim_refs(prop, rec):
        return done()
    rec.ok("H0")
    assert isinstance(proposal, Mapping) and sha is not None
    events = _cited_events(index, prop, rec)
    _quotes(prop, events, rec)
    _temporal(index, prop, events, rec)
    _scope(prop, events, rec)
    _values(prop, rec)
    if rev.run_id == prop.run_id:
        rec.fail("H5", R.SELF_REVIEW, f"review {rev.review_id} comes from the proposing run {rev.run_id}",
                 event=rev.review_id)
    else:
        rec.ok("H5")
    if rev.proposal_id != prop.proposal_id or rev.proposal_sha256 != sha:
        rec.fail("H6", R.DIGEST_MISMATCH, f"review {rev.review_id} is bound to {rev.proposal_id}/"
                 f"{rev.proposal_sha256[:16]}..., the proposal is {prop.proposal_id}/{sha[:16]}...",
                 event=rev.review_id)
    else:
        rec.ok("H6")
    uncovered = sorted({c.field for c in prop.changes} - set(rev.covered_fields))
    if uncovered:
        rec.fail("H7", R.UNCOVERED_CHANGE, f"review does not cover changed field(s) {', '.join(uncovered)}",
                 event=rev.review_id)
    else:
        rec.ok("H7")
    open_issues = [i.issue_id or "?" for i in rev.issues if i.status != "resolved"]
    if rev.decision != "approve" or open_issues:
        why = f"decision is {rev.decision!r}" if rev.decision != "approve" else ""
        if open_issues:
            why += ("; " if why else "") + f"open issue(s) {', '.join(open_issues)}"
        rec.fail("H8", R.UNRESOLVED_ISSUES, why, event=rev.review_id)
    else:
        rec.ok("H8")
    claims = {c.claim_id: c for c in prop.claims}
    derived = [{"field": ch.field, "from": ch.from_, "to": ch.to,
                "supersedes": claims[ch.from_claim].event_id,
                "by": [claims[s].event_id for s in ch.supported_by],
                "proposal_id": prop.proposal_id, "proposal_sha256": sha, "review_id": rev.review_id}
               for ch in prop.changes]
    return done(derived)


def unreadable(index: TraceIndex, detail: str) -> Verdict:
    """The verdict when the proposal or review cannot even be read: a gap in the evidence, never a crash."""
    rec = Recorder()
    rec.fail("H0", R.SEMANTIC_INCOMPLETE, detail)
    return rec.verdict(action_id=None, trace_sha256=index.sha256, trace_head_seq=index.head_seq,
                       order=index.seq_of, derived=[])


def _shape(model: type[M], raw: Any, what: str, rec: Recorder) -> M | None:
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        errs = exc.errors(include_url=False)
        where = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or what}: {e['msg']}" for e in errs[:3])
        rec.fail("H0", R.SEMANTIC_INCOMPLETE, f"{what} is incomplete: {where}")
        return None


def _claim_refs(prop: Proposal, rec: Recorder) -> bool:
    ids = [c.claim_id for c in prop.claims]
    known = set(ids)
    problems = [f"duplicate claim_id {i!r}" for i in sorted(known) if ids.count(i) > 1]
    for ch in prop.changes:
        problems += [f"change of {ch.field!r} refers to unknown claim {ref!r}"
                     for ref in (ch.from_claim, *ch.supported_by) if ref not in known]
        if not ch.supported_by:
            problems.append(f"change of {ch.field!r} has no supported_by claim")
    for p in problems:
        rec.fail("H0", R.SEMANTIC_INCOMPLETE, p)
    return not problems


def _cited_events(index: TraceIndex, prop: Proposal, rec: Recorder) -> dict[str, Event]:
    """The event each claim cites; a missing one is a gap in the evidence, and its claim is not checked further."""
    events: dict[str, Event] = {}
    for c in prop.claims:
        ev = index.by_id.get(c.event_id)
        if ev is None:
            rec.fail("H0", R.UNKNOWN_EVENT, f"claim {c.claim_id} cites {c.event_id!r}, not an event of the trace",
                     event=c.event_id)
        else:
            rec.cite(ev.id)
            events[c.claim_id] = ev
    return events


def _quotes(prop: Proposal, events: dict[str, Event], rec: Recorder) -> None:
    """H1: each quote is verbatim from the cited event, and that event is a trusted instruction or read."""
    for c in prop.claims:
        ev = events.get(c.claim_id)
        if ev is None:
            continue
        if not c.quote or c.quote not in (ev.text or ""):
            rec.fail("H1", R.QUOTE_NOT_VERBATIM, f"claim {c.claim_id}: {c.quote!r} is not a verbatim part of "
                     f"{ev.id}'s text", event=ev.id)
        elif not (isinstance(ev, Instruction | Observation) and ev.trusted):
            rec.fail("H1", R.UNTRUSTED_EVIDENCE, f"claim {c.claim_id} quotes {ev.kind} {ev.id} by "
                     f"{getattr(ev, 'source', None)!r}, not a user/operator instruction or a tool's ok read",
                     event=ev.id)
        else:
            rec.ok("H1", event=ev.id)


def _temporal(index: TraceIndex, prop: Proposal, events: dict[str, Event], rec: Recorder) -> None:
    """H2: evidence existed at ``as_of_seq``; each old value precedes its new support; nothing went stale since."""
    head = index.head_seq if index.head_seq is not None else prop.as_of_seq - 1
    if prop.as_of_seq > head:
        rec.fail("H2", R.TEMPORAL_ORDER, f"as_of_seq {prop.as_of_seq} is after the trace's last seq {head}")
    for c in prop.claims:
        ev = events.get(c.claim_id)
        if ev is not None and ev.seq > prop.as_of_seq:
            rec.fail("H2", R.TEMPORAL_ORDER, f"claim {c.claim_id} cites {ev.id} (seq {ev.seq}) from after "
                     f"as_of_seq {prop.as_of_seq}", event=ev.id)
    supporting = set()
    for ch in prop.changes:
        old = events.get(ch.from_claim)
        for s in ch.supported_by:
            supporting.add(s)
            new = events.get(s)
            if old is not None and new is not None and not old.seq < new.seq:
                rec.fail("H2", R.TEMPORAL_ORDER, f"change of {ch.field!r}: old value from {old.id} (seq {old.seq}) "
                         f"is not before its support {new.id} (seq {new.seq})", event=new.id)
    for c in prop.claims:
        ev = events.get(c.claim_id)
        by = index.superseded_by.get(ev.id) if ev is not None else None
        # Support must be current; an old value may have been replaced, but not after the proposal was made.
        if ev is not None and by is not None and (c.claim_id in supporting or index.seq_of[by] > prop.as_of_seq):
            rec.cite(by)
            rec.fail("H2", R.SUPERSEDED_EVIDENCE, f"claim {c.claim_id} cites {ev.id}, superseded by {by}",
                     event=ev.id, by=by)
    if not any(r.rule == "H2" for r in rec.reasons):
        rec.ok("H2")


def _scope(prop: Proposal, events: dict[str, Event], rec: Recorder) -> None:
    """H3: cited event entity = claim entity = proposal entity."""
    for c in prop.claims:
        ev = events.get(c.claim_id)
        mismatch = c.entity != prop.entity or (ev is not None and not entity_is(getattr(ev, "entity", None),
                                                                               c.entity))
        if mismatch:
            rec.fail("H3", R.ENTITY_MISMATCH, f"claim {c.claim_id} is about {c.entity!r}, the proposal about "
                     f"{prop.entity!r}" + (f", event {ev.id} about {getattr(ev, 'entity', None)!r}" if ev else ""),
                     event=ev.id if ev else None)
        else:
            rec.ok("H3", event=ev.id if ev else None)


def value_text(value: Any) -> str:
    """How a claimed value must appear in its quote: strings and numbers as written, others as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return canonical_json(value)


def _values(prop: Proposal, rec: Recorder) -> None:
    """H4: values occur in their quotes; each change runs from its from_claim's value to a supported value."""
    claims: dict[str, Claim] = {c.claim_id: c for c in prop.claims}
    failed = False
    for c in prop.claims:
        if value_text(c.value) not in c.quote:
            failed = True
            rec.fail("H4", R.UNSUPPORTED_VALUE, f"claim {c.claim_id}: value {value_text(c.value)!r} does not occur "
                     f"in its quote {c.quote!r}", event=c.event_id)
    for ch in prop.changes:
        old = claims[ch.from_claim]
        if old.field != ch.field or not same_value(old.value, ch.from_):
            failed = True
            rec.fail("H4", R.UNSUPPORTED_VALUE, f"change of {ch.field!r}: from {ch.from_!r} is not claim "
                     f"{old.claim_id}'s {old.field} value {old.value!r}", event=old.event_id)
        support = [claims[s] for s in ch.supported_by]
        if not any(s.field == ch.field and same_value(s.value, ch.to) for s in support):
            failed = True
            rec.fail("H4", R.UNSUPPORTED_VALUE, f"change of {ch.field!r}: to {ch.to!r} is not the value of any "
                     f"supporting claim ({', '.join(ch.supported_by)})")
    if not failed:
        rec.ok("H4")
