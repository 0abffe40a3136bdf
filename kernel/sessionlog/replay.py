"""Pure replay: records in any storage order -> ``known`` (ordered inputs, reduced state) or ``unknown``.

Rules (docs/sessionlog.md, "Replay rules"):

* Only accepted records take part; the others are listed in ``excluded``.
* Acceptance order: sequenced records are placed in slot ``seq`` of a list sized by the highest
  sequence the log proves to exist (the highest ``accept_seq`` or ``log_last_seq``). That is O(n),
  no sort, and every gap or second claim on a slot is found on the way: the verdict is then
  ``unknown``, never a best guess.
* Legacy: a log whose accepted records *all* lack a sequence replays in record order
  (``legacy: true``). In a mixed log, records marked ``legacy: true`` replay first, in record order;
  any other unsequenced record makes the log ``unknown`` / ``missing_sequence``.
* As-of N: only sequences <= N are used (legacy records count as before sequence 1; in an
  all-legacy log record positions stand in for sequences). Damage after N does not matter.
* Record order (``--order record``) is the naive reading: storage order, sequences ignored, always
  ``known``; it exists to show what a recording-order reader would conclude.
* Rollback markers rewind the context to the state as of their boundary; the markers and the
  dropped inputs stay in ``order`` (history is never rewritten) but not in the reduced context.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from operator import itemgetter
from typing import Any

from taskkernel.kernel.sessionlog.models import InputKind, Rec, SessionReason
from taskkernel.kernel.sessionlog.reducers import Reducer, get_reducer

_ROLLBACK = InputKind.ROLLBACK.value
_SEQ, _ID, _KIND, _DECLARED = (itemgetter(i) for i in (0, 1, 2, 6))


class Order(StrEnum):
    ACCEPTANCE = "acceptance"
    RECORD = "record"


@dataclass(frozen=True, slots=True)
class ReplayResult:
    status: str  # "known" | "unknown"
    reason: SessionReason | None
    order: list[str]
    excluded: list[str]
    legacy: bool
    as_of: int | None
    state: Any  # the reducer's raw state; None when unknown
    reducer: Reducer
    detail: str = ""  # human explanation of an unknown verdict (stderr, never part of the JSON contract)

    @property
    def known(self) -> bool:
        return self.status == "known"

    def to_json(self) -> dict[str, Any]:
        """The CLI contract: exactly these keys."""
        return {
            "status": self.status,
            "reason": self.reason.value if self.reason else None,
            "order": self.order,
            "excluded": self.excluded,
            "legacy": self.legacy,
            "as_of": self.as_of,
            "state": None if self.state is None else self.reducer.to_json(self.state),
        }


class RollbackOutOfWindow(Exception):
    """A rollback boundary lies before the first record that was read (bounded reads only)."""


def replay(
    records: Sequence[Rec],
    *,
    order: Order | str = Order.ACCEPTANCE,
    as_of: int | None = None,
    reducer: Reducer | str = "inputs",
) -> ReplayResult:
    """Replay one session's records (any storage order)."""
    red = get_reducer(reducer) if isinstance(reducer, str) else reducer
    if as_of is not None and as_of < 0:
        raise ValueError("as_of must be >= 0")
    order = Order(order)
    if order is Order.ACCEPTANCE and as_of is None:
        placed = _place_complete(records)
        if placed is not None:  # the common case: every record accepted, sequences exactly 1..n
            ordered, declared = placed
            if declared > len(ordered):
                detail = f"sequence {len(ordered) + 1} is missing (log reaches {declared})"
                return ReplayResult("unknown", SessionReason.MISSING_SEQUENCE, [], [], False, None, None, red, detail)
            return _known(ordered, [], [], False, None, red)

    excluded: list[str] = []
    legacy_recs: list[Rec] = []
    loose: list[Rec] = []  # unsequenced, not marked legacy
    sequenced, declared = _classify(records, excluded, legacy_recs, loose)
    # A declared length > 0 proves sequenced records existed, so loose records are not legacy.
    all_legacy = not sequenced and not legacy_recs and bool(loose) and declared == 0
    if all_legacy:
        legacy_recs, loose = loose, []
    is_legacy = bool(legacy_recs) and not loose

    if order is Order.RECORD:
        return _replay_record_order(records, as_of, red, excluded, is_legacy, all_legacy)

    def unknown(reason: SessionReason, detail: str) -> ReplayResult:
        return ReplayResult("unknown", reason, [], excluded, is_legacy, as_of, None, red, detail)

    if loose:
        return unknown(
            SessionReason.MISSING_SEQUENCE,
            f"{len(loose)} accepted record(s) without accept_seq among sequenced ones "
            f"(first: {loose[0][1]!r}); storage position cannot prove when they were accepted",
        )
    if all_legacy and as_of is not None:
        legacy_recs = legacy_recs[:as_of]

    by_seq = dict(zip(map(_SEQ, sequenced), sequenced, strict=True))
    top = max(declared, max(by_seq, default=0))
    limit = top if as_of is None else min(as_of, top)
    if len(by_seq) != len(sequenced):
        claims: dict[int, str] = {}
        for r in sequenced:
            s: int = r[0]  # type: ignore[assignment]  # sequenced records always carry one
            if s <= limit:
                if s in claims:
                    return unknown(
                        SessionReason.DUPLICATE_SEQUENCE, f"sequence {s} is claimed by {claims[s]!r} and {r[1]!r}"
                    )
                claims[s] = r[1]
    try:
        ordered = list(map(by_seq.__getitem__, range(1, limit + 1)))
    except KeyError as gap:
        return unknown(SessionReason.MISSING_SEQUENCE, f"sequence {gap.args[0]} is missing (log reaches {top})")
    return _known(ordered, legacy_recs, excluded, is_legacy, as_of, red)


def _place_complete(records: Sequence[Rec]) -> tuple[list[Rec], int] | None:
    """One pass: slot every record at its sequence. None unless all are accepted and exactly 1..n.

    n records in n distinct slots of 1..n fill every slot, so no separate gap check is needed.
    """
    n = len(records)
    slots: list[Any] = [None] * (n + 1)
    for r in records:
        s = r[0]
        if s is None or s > n or not r[4] or slots[s] is not None:
            return None
        slots[s] = r
    ordered = slots[1:]
    return ordered, max(filter(None, map(_DECLARED, ordered)), default=0)


def _known(
    ordered: list[Rec], legacy_recs: list[Rec], excluded: list[str], is_legacy: bool, as_of: int | None,
    red: Reducer,
) -> ReplayResult:
    entries = legacy_recs + ordered if legacy_recs else ordered
    ids = list(map(_ID, entries))
    if len(set(ids)) != len(ids):
        seen: set[str] = set()
        dup = next(i for i in ids if i in seen or seen.add(i))  # type: ignore[func-returns-value]
        detail = f"input_id {dup!r} appears at two positions"
        return ReplayResult("unknown", SessionReason.DUPLICATE_INPUT, [], excluded, is_legacy, as_of, None, red, detail)
    effective = effective_context(legacy_recs, ordered) if _has_rollback(entries) else entries
    return ReplayResult("known", None, ids, excluded, is_legacy, as_of, red.fold(effective, entries), red)


def _classify(
    records: Sequence[Rec], excluded: list[str], legacy_recs: list[Rec], loose: list[Rec]
) -> tuple[list[Rec], int]:
    """Split by acceptance and sequence; returns the sequenced records and the declared log length."""
    sequenced: list[Rec] = []
    declared = 0
    for r in records:
        if not r[4]:
            excluded.append(r[1])
            continue
        if r[0] is None:
            (legacy_recs if r[5] else loose).append(r)
        else:
            sequenced.append(r)
        if r[6] is not None and r[6] > declared:
            declared = r[6]
    return sequenced, declared


def _replay_record_order(
    records: Sequence[Rec], as_of: int | None, red: Reducer, excluded: list[str], is_legacy: bool,
    all_legacy: bool,
) -> ReplayResult:
    accepted = [r for r in records if r[4]]
    if as_of is not None:
        if all_legacy:
            accepted = accepted[:as_of]
        else:  # the cutoff is by acceptance sequence whatever the order; unproven records stay out
            accepted = [r for r in accepted if (r[0] is not None and r[0] <= as_of) or (r[0] is None and r[5])]
    effective = effective_context(accepted, []) if _has_rollback(accepted) else accepted
    order = [r[1] for r in accepted]
    return ReplayResult("known", None, order, excluded, is_legacy, as_of, red.fold(effective, accepted), red)


def _has_rollback(entries: Sequence[Rec]) -> bool:
    return _ROLLBACK in map(_KIND, entries)


def effective_context(legacy: Sequence[Rec], sequenced: Sequence[Rec], base: int = 0) -> list[Rec]:
    """Apply rollback markers: the context after a marker equals the context as of its boundary.

    ``legacy`` records are addressed by their 1-based record position, ``sequenced`` records
    (contiguous, starting at ``base + 1``) by their sequence. A marker only addresses its own
    domain; the legacy prefix lies before sequence 1. A boundary at or after the marker itself
    rewinds nothing. The context is a persistent cons list so every snapshot costs O(1).
    """
    node: tuple[Rec, Any] | None = None
    legacy_snaps: dict[int, Any] = {0: None}
    for pos, r in enumerate(legacy, 1):
        node = _step(r, pos, node, legacy_snaps, 0)
        legacy_snaps[pos] = node
    seq_snaps: dict[int, Any] = {base: node}
    for r in sequenced:
        node = _step(r, r[0], node, seq_snaps, base)  # type: ignore[arg-type]
        seq_snaps[r[0]] = node  # type: ignore[index]
    out: list[Rec] = []
    while node is not None:
        out.append(node[0])
        node = node[1]
    out.reverse()
    return out


def _step(r: Rec, key: int, node: Any, snaps: dict[int, Any], base: int) -> Any:
    if r[2] != _ROLLBACK:
        return (r, node)
    bound = r[3]["to_seq"]
    if bound >= key:
        return node
    if bound < base:
        raise RollbackOutOfWindow(f"rollback {r[1]!r} rewinds to {bound}, before the first record read ({base + 1})")
    return snaps[bound]
