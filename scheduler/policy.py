"""Pure decisions: which nominal occurrences after the watermark are claimed and which are missed.

No I/O here, so the misfire and overlap rules are testable on their own and every coordinator,
the simulator and the benchmark apply exactly the same code.

Rules (docs/scheduler.md, "Policies"):
- an occurrence is *due* when its due time (nominal + deterministic jitter) is <= now;
- lateness = now - due; up to ``grace`` it is on time and is claimed under every misfire policy;
- later than that it is a misfire: ``skip`` records it missed; ``latest_once`` claims the newest one
  no later than ``catchup_window`` when nothing on time is claimed, the rest are missed; ``all`` claims
  the oldest ones within ``catchup_window``, at most ``catchup_max``;
- a second nominal instant with an already used dedup key (DST fall-back) is a ``duplicate``;
- overlap: when an earlier occurrence is still running (or waiting), ``skip`` records new claims missed,
  ``buffer_one`` keeps one waiting and misses the rest, ``allow`` claims them all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from taskkernel.scheduler.models import Misfire, MissReason, Overlap, ScheduleSpec
from taskkernel.scheduler.triggers import Trigger

CLAIM = "claim"  # run now by the claiming coordinator
WAIT = "wait"  # reserved; starts when the running occurrence finishes (buffer_one)
MISS = "miss"


@dataclass(frozen=True)
class Decision:
    nominal: datetime
    key: str
    due: datetime
    verdict: str  # CLAIM | WAIT | MISS
    reason: MissReason | None = None


@dataclass
class Plan:
    decisions: list[Decision] = field(default_factory=list)
    watermark: datetime | None = None  # new watermark (last nominal decided); None = unchanged
    next_due: datetime | None = None  # due time of the first undecided nominal; None = exhausted
    more: bool = False  # chunk limit reached with more out-of-window occurrences still due


def plan(
    trigger: Trigger,
    spec: ScheduleSpec,
    *,
    watermark: datetime,
    now: datetime,
    paused: bool = False,
    running: int = 0,
    waiting: int = 0,
    chunk: int = 5000,
) -> Plan:
    """Decide every occurrence in ``(watermark, now]`` that is due.

    Occurrences older than both the grace and the catch-up window are missed under every policy,
    so after a long downtime they are decided in chunks of ``chunk`` (``more=True``); the final
    chunk holds everything within the window and applies the policy."""
    horizon = timedelta(seconds=max(spec.grace, spec.catchup_window if spec.misfire is not Misfire.SKIP else 0))
    due_items: list[tuple[datetime, str, datetime]] = []
    out_of_window = True
    n = trigger.next_after(watermark)
    while n is not None:
        key = trigger.key(n)
        due = trigger.due(n, key)
        if due > now:
            break
        if now - due <= horizon:
            out_of_window = False
        elif out_of_window and len(due_items) >= chunk:
            break
        due_items.append((n, key, due))
        n = trigger.next_after(n)
    result = Plan()
    if n is not None:
        result.next_due = trigger.due(n)
        result.more = result.next_due <= now
    if not due_items:
        return result
    result.watermark = due_items[-1][0]
    result.decisions = _decide(spec, due_items, now=now, paused=paused, running=running, waiting=waiting)
    return result


def _decide(
    spec: ScheduleSpec,
    items: list[tuple[datetime, str, datetime]],
    *,
    now: datetime,
    paused: bool,
    running: int,
    waiting: int,
) -> list[Decision]:
    grace = timedelta(seconds=spec.grace)
    window = timedelta(seconds=spec.catchup_window)
    verdicts: dict[int, tuple[str, MissReason | None]] = {}
    on_time: list[int] = []
    late: list[int] = []
    seen: set[str] = set()
    for i, (_, key, due) in enumerate(items):
        if key in seen:
            verdicts[i] = (MISS, MissReason.DUPLICATE)
            continue
        seen.add(key)
        lateness = now - due
        if paused:
            verdicts[i] = (MISS, MissReason.PAUSED)
        elif lateness <= grace:
            on_time.append(i)
        elif lateness <= window and spec.misfire is not Misfire.SKIP:
            late.append(i)
        else:
            verdicts[i] = (MISS, MissReason.MISFIRE)

    if spec.misfire is Misfire.LATEST_ONCE:
        caught_up = late[-1:] if not on_time else []
    elif spec.misfire is Misfire.ALL:
        caught_up = late[: spec.catchup_max]
    else:
        caught_up = []
    chosen = set(caught_up)
    for i in late:
        if i not in chosen:
            verdicts[i] = (MISS, MissReason.MISFIRE)

    busy = running > 0 or waiting > 0
    for i in sorted(caught_up + on_time):
        if not busy or spec.overlap is Overlap.ALLOW:
            verdicts[i] = (CLAIM, None)
        elif spec.overlap is Overlap.BUFFER_ONE and waiting == 0:
            verdicts[i] = (WAIT, None)
            waiting = 1
        else:
            verdicts[i] = (MISS, MissReason.OVERLAP)
    return [Decision(n, key, due, *verdicts[i]) for i, (n, key, due) in enumerate(items)]
