"""Reading, validating (P1) and indexing a trace once, so each verdict is a handful of dict lookups.

A malformed or unreadable trace never raises: the index carries the problem and every verdict on it is
INSUFFICIENT_EVIDENCE / TRACE_INVALID. Supersession is computed over the whole trace (docs/gate.md,
"Supersession"): "current" means the end of the trace, i.e. execution time.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from taskkernel.kernel.canonical import canonical_json, sha256_hex
from taskkernel.kernel.gate.match import entity_covered, names, same_value, triple_key
from taskkernel.kernel.gate.models import (
    EVENT_KINDS,
    GRANT_AUTHORS,
    INSTRUCTION_AUTHORS,
    POLICY_AUTHORS,
    Action,
    GateReason,
    Instruction,
    Observation,
    PermissionGrant,
    PermissionRevoke,
    Policy,
    TraceEvent,
)
from taskkernel.kernel.gate.verdict import Reason

Event = Instruction | Observation | PermissionGrant | PermissionRevoke | Policy | Action
_EVENT = TypeAdapter[Event](TraceEvent)


class _TraceError(Exception):
    def __init__(self, line: int, detail: str, event: str | None = None) -> None:
        super().__init__(detail)
        self.reason = Reason(code=GateReason.TRACE_INVALID, rule="P1", event=event, detail=f"line {line}: {detail}")


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Two parsers may keep different copies of a repeated key; refuse the ambiguity instead.
    out = dict(pairs)
    if len(out) != len(pairs):
        dup = next(k for k, n in Counter(k for k, _ in pairs).items() if n > 1)
        raise ValueError(f"duplicate key {dup!r}")
    return out


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _describe(exc: ValidationError, kind: str) -> str:
    parts = []
    for err in exc.errors(include_url=False)[:3]:
        path = err["loc"][1:] if err["loc"][:1] == (kind,) else err["loc"]  # drop the union tag
        loc = ".".join(str(p) for p in path) or "event"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)


def _validate(raw: Any, line: int) -> Event:
    if not isinstance(raw, dict):
        raise _TraceError(line, f"expected a JSON object, got {type(raw).__name__}")
    missing = [f for f in ("id", "seq", "kind") if f not in raw]
    event_id = raw.get("id") if isinstance(raw.get("id"), str) else None
    if missing:
        raise _TraceError(line, f"missing required field(s) {', '.join(missing)}", event_id)
    if raw["kind"] not in EVENT_KINDS:
        raise _TraceError(line, f"unknown kind {raw['kind']!r} (expected one of {', '.join(EVENT_KINDS)})", event_id)
    try:
        return _EVENT.validate_python(raw)
    except ValidationError as exc:
        raise _TraceError(line, f"{raw['kind']} event: {_describe(exc, raw['kind'])}", event_id) from None


@dataclass
class TraceIndex:
    """A validated trace plus everything a verdict needs, computed once."""

    sha256: str | None
    problem: Reason | None = None
    events: list[Event] = field(default_factory=list)
    by_id: dict[str, Event] = field(default_factory=dict)
    seq_of: dict[str, int] = field(default_factory=dict)
    superseded_by: dict[str, str] = field(default_factory=dict)
    state: dict[tuple[str, str], Observation] = field(default_factory=dict)
    policy: Policy | None = None
    last_action: Action | None = None
    # trusted revokes that name a scope, for the "revoked by scope" part of R12: keyed by (operation, entity)
    # for exact entities and by operation for globs, so a lookup stays small on a long trace ("*" = any op)
    scope_revokes: dict[tuple[str, str | None], list[PermissionRevoke]] = field(default_factory=dict)

    def revokes_covering(self, operation: str, entity: str) -> list[PermissionRevoke]:
        """Trusted scope revokes whose operation and entity scope cover ``operation`` on ``entity``."""
        found = []
        for op in (operation, "*"):
            found += self.scope_revokes.get((op, entity), [])
            found += [r for r in self.scope_revokes.get((op, None), []) if entity_covered(r.entity, entity)]
        return found

    @property
    def head_seq(self) -> int | None:
        return self.events[-1].seq if self.events else None

    # ---- construction -------------------------------------------------------------------------------

    @classmethod
    def from_file(cls, path: str | Path) -> TraceIndex:
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            reason = Reason(code=GateReason.TRACE_INVALID, rule="P1", detail=f"cannot read trace {path}: "
                            f"{exc.strerror or exc}")
            return cls(sha256=None, problem=reason)
        return cls.from_bytes(data)

    @classmethod
    def from_bytes(cls, data: bytes) -> TraceIndex:
        """Index JSONL bytes; ``sha256`` is the digest of exactly these bytes."""
        digest = sha256_hex(data)
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            return cls(sha256=digest, problem=Reason(code=GateReason.TRACE_INVALID, rule="P1",
                                                     detail=f"trace is not UTF-8: {exc.reason} at byte {exc.start}"))
        try:
            events = [_validate(_parse_line(text_line, n), n)
                      for n, text_line in enumerate(text.splitlines(), 1) if text_line.strip()]
        except _TraceError as exc:
            return cls(sha256=digest, problem=exc.reason)
        return cls._build(digest, events)

    @classmethod
    def from_events(cls, events: Iterable[Mapping[str, Any]]) -> TraceIndex:
        """Index event dicts (e.g. built from the kernel's own log). ``sha256`` is over their canonical JSONL
        form: one ``canonical_json`` line per event, each ending in a newline."""
        raws = [dict(e) for e in events]
        digest = sha256_hex("".join(canonical_json(r) + "\n" for r in raws))
        try:
            parsed = [_validate(raw, n) for n, raw in enumerate(raws, 1)]
        except _TraceError as exc:
            return cls(sha256=digest, problem=exc.reason)
        return cls._build(digest, parsed)

    @classmethod
    def _build(cls, digest: str, events: list[Event]) -> TraceIndex:
        index = cls(sha256=digest, events=events)
        try:
            index._link()
        except _TraceError as exc:
            return cls(sha256=digest, problem=exc.reason)
        index._supersede()
        return index

    def _link(self) -> None:
        """P1: ids unique, seq strictly increasing, supersedes/revokes point at earlier events."""
        prev: int | None = None
        for n, ev in enumerate(self.events, 1):
            if ev.id in self.by_id:
                raise _TraceError(n, f"duplicate id {ev.id!r}", ev.id)
            if prev is not None and ev.seq <= prev:
                raise _TraceError(n, f"seq {ev.seq} of {ev.id!r} is not greater than the previous seq {prev}", ev.id)
            refs = list(ev.supersedes or [])
            if isinstance(ev, PermissionRevoke) and ev.revokes:
                refs.append(ev.revokes)
            for ref in refs:
                if ref not in self.by_id:
                    raise _TraceError(n, f"{ev.id!r} refers to {ref!r}, which is not an earlier event", ev.id)
            self.by_id[ev.id] = ev
            self.seq_of[ev.id] = ev.seq
            prev = ev.seq
            if isinstance(ev, Action):
                self.last_action = ev

    # ---- supersession (rules 1-3 of the contract; expiry is checked at evaluation) --------------------

    def _mark(self, old: str, new: str) -> None:
        self.superseded_by.setdefault(old, new)  # the first superseder is the one cited

    def _supersede(self) -> None:
        pending_reads: dict[tuple[str, str], list[Observation]] = {}
        grant_by_triple: dict[tuple[Any, ...], str] = {}
        policies: list[Policy] = []
        for ev in self.events:
            self._explicit(ev)
            if isinstance(ev, Observation) and ev.trusted:
                self._observe(ev, pending_reads)
            elif isinstance(ev, PermissionGrant) and ev.trusted:
                key = triple_key(ev.principal, ev.entity, ev.operation)
                if key in grant_by_triple:
                    self._mark(grant_by_triple[key], ev.id)
                grant_by_triple[key] = ev.id
            elif isinstance(ev, PermissionRevoke) and ev.trusted:
                self._revoke(ev, grant_by_triple)
            elif isinstance(ev, Policy) and ev.trusted:
                policies.append(ev)
        self.policy = next((p for p in reversed(policies) if p.id not in self.superseded_by), None)

    def _explicit(self, ev: Event) -> None:
        """Explicit ``supersedes`` counts only if its author may supersede the target."""
        if not ev.supersedes or (isinstance(ev, Observation) and not ev.trusted):
            return  # a failed observation never changes state, its supersedes included
        source = ev.source
        for target_id in ev.supersedes:
            target = self.by_id[target_id]
            if isinstance(target, Observation):
                allowed = isinstance(ev, Observation)  # a trusted read, checked above
            elif isinstance(target, PermissionGrant | PermissionRevoke):
                allowed = source in GRANT_AUTHORS
            elif isinstance(target, Policy):
                allowed = source in POLICY_AUTHORS
            else:  # instructions (and actions): only the user or an operator may replace them
                allowed = source in INSTRUCTION_AUTHORS
            if allowed:
                self._mark(target_id, ev.id)

    def _observe(self, obs: Observation, pending: dict[tuple[str, str], list[Observation]]) -> None:
        """A trusted read with a different value supersedes the earlier reads of the key; an equal one confirms."""
        assert obs.entity is not None and obs.key is not None  # guaranteed for ok reads by the model
        key = (obs.entity, obs.key)
        run = pending.setdefault(key, [])
        if run and not same_value(run[-1].value, obs.value):
            for old in run:
                self._mark(old.id, obs.id)
            run.clear()
        run.append(obs)
        self.state[key] = obs

    def _revoke(self, rev: PermissionRevoke, grant_by_triple: dict[tuple[Any, ...], str]) -> None:
        if rev.revokes and isinstance(self.by_id[rev.revokes], PermissionGrant):
            self._mark(rev.revokes, rev.id)
        if rev.entity is None or rev.operation is None:
            return
        key = triple_key(rev.principal, rev.entity, rev.operation)
        if key in grant_by_triple:
            self._mark(grant_by_triple.pop(key), rev.id)
        for op in names(rev.operation):
            for pattern in names(rev.entity):
                key = (op, None) if any(c in pattern for c in "*?[") else (op, pattern)
                self.scope_revokes.setdefault(key, []).append(rev)


def _parse_line(text: str, line: int) -> Any:
    try:
        return json.loads(text, object_pairs_hook=_no_duplicate_keys, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise _TraceError(line, f"not valid JSON: {exc.msg} at column {exc.colno}") from None
    except ValueError as exc:
        raise _TraceError(line, f"not valid JSON: {exc}") from None
