"""What an occurrence does, and the patrol guards around it.

- ``create_task`` submits through ``TaskCommandKernel.submit`` with
  ``idempotency_key = "schedule:<schedule id>:<dedup key>"``: a re-run after a crash replays the
  original result instead of creating a second task.
- ``accept_input`` appends to a session log with the same key as ``input_id`` (idempotent too).
- ``call`` runs a Python callable registered by name (role modules); idempotent only if declared.

Every action acts as the schedule's principal (``authority.acting_principal``): its owner role,
never above the principal that created it; a fire whose definition breaks that rule fails
``role_not_authorized`` before anything runs.

Patrol guards (the CodeFlowMu loops of codeflowmu-kernel.md §4): a schedule with ``watch`` compares
a digest of the watched state with the baseline taken right after its previous fire. The baseline
is taken *after* the action, so the patrol's own synchronous writes never look like a change.
``only_if_changed`` skips occurrences that find no change; otherwise each such occurrence counts
towards the no-progress fuse, which pauses the schedule at ``fuse`` (default 3).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from taskkernel.kernel.canonical import digest
from taskkernel.kernel.model.principal import Principal
from taskkernel.scheduler.authority import SYSTEM_SCHEDULER, acting_principal, is_owner
from taskkernel.scheduler.ledger import Claim, Outcome
from taskkernel.scheduler.models import ActionType, MissReason, OccurrenceState, ScheduleError, SchedulerException, zone
from taskkernel.scheduler.triggers import iso_z


class Submit(Protocol):
    """``TaskCommandKernel.submit``: returns an object with status, reason, message, task_id."""

    def __call__(self, command: dict[str, Any], principal: Principal) -> Any: ...


class SessionSink(Protocol):
    """``taskkernel.kernel.sessionlog.SessionLog``: ``accept(session, {"input_id", "kind", "payload"}, …)``; with
    ``writer`` it applies the session's write rules and records the writer as ``accepted_by``."""

    def accept(self, session: str, inp: Mapping[str, Any], *, accepted_by: str | None = None,
               writer: Principal | None = None) -> Any: ...


@dataclass(frozen=True)
class ActionContext:
    claim: Claim

    @property
    def idempotency_key(self) -> str:
        return f"schedule:{self.claim.schedule_id}:{self.claim.key}"

    @property
    def principal(self) -> Principal:
        return acting_principal(self.claim.spec, self.claim.name)

    def render(self, value: Any) -> Any:
        """Fill ``{schedule}``, ``{dedup_key}``, ``{nominal}``, ``{local}``, ``{attempt}`` in strings."""
        if isinstance(value, str):
            c = self.claim
            for name, sub in (("schedule", c.name), ("dedup_key", c.key), ("nominal", iso_z(c.nominal)),
                              ("local", c.nominal.astimezone(zone(c.spec.tz)).isoformat()),
                              ("attempt", str(c.attempt))):
                value = value.replace("{" + name + "}", sub)
            return value
        if isinstance(value, dict):
            return {k: self.render(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.render(v) for v in value]
        return value


@dataclass(frozen=True)
class ActionResult:
    run_ref: str | None = None
    progress: bool | None = None  # call actions may report it; False counts towards the fuse


CallFn = Callable[[ActionContext], ActionResult | Mapping[str, Any] | None]
ProbeFn = Callable[[], Any]


class ActionRegistry:
    """The actions a coordinator can run. Kernel and session log are injected (protocols), so the
    simulator and unit tests run without them."""

    def __init__(self, *, submit: Submit | None = None, session_log: SessionSink | None = None) -> None:
        self.submit = submit
        self.session_log = session_log
        self._callables: dict[str, CallFn] = {}
        self._probes: dict[str, ProbeFn] = {}

    def register_callable(self, name: str, fn: CallFn) -> None:
        self._callables[name] = fn

    def register_probe(self, name: str, fn: ProbeFn) -> None:
        self._probes[name] = fn

    def probe_digest(self, name: str) -> str:
        fn = self._probes.get(name)
        if fn is None:
            raise SchedulerException(ScheduleError.UNKNOWN_PROBE, f"no probe registered as {name!r}")
        return digest(fn())

    def run(self, ctx: ActionContext) -> ActionResult:
        act = ctx.claim.spec.action
        if act is None:
            raise SchedulerException(ScheduleError.INVALID_ACTION, f"schedule {ctx.claim.name!r} has no action")
        principal = ctx.principal  # refuses a definition that would act above its creator, before any action
        if act.type is ActionType.CREATE_TASK:
            return self._create_task(ctx, principal)
        if act.type is ActionType.ACCEPT_INPUT:
            return self._accept_input(ctx, principal)
        fn = self._callables.get(act.callable or "")
        if fn is None:
            raise SchedulerException(ScheduleError.UNKNOWN_CALLABLE, f"no callable registered as {act.callable!r}")
        out = fn(ctx)
        if out is None or isinstance(out, ActionResult):
            return out or ActionResult()
        return ActionResult(run_ref=out.get("run_ref"), progress=out.get("progress"))

    def _create_task(self, ctx: ActionContext, principal: Principal) -> ActionResult:
        if self.submit is None:
            raise SchedulerException(ScheduleError.INVALID_ACTION, "create_task needs the task kernel")
        act = ctx.claim.spec.action
        assert act is not None and act.template is not None
        payload = {"body": "", **ctx.render(act.template), "sender": principal.role}
        command = {"type": "create_task", "idempotency_key": ctx.idempotency_key, "payload": payload}
        result = self.submit(command, principal)
        if getattr(result, "status", None) not in ("accepted", "replayed"):
            raise SchedulerException(ScheduleError.ACTION_REJECTED,
                                     f"{getattr(result, 'reason', None)}: {getattr(result, 'message', '')}")
        return ActionResult(run_ref=getattr(result, "task_id", None))

    def _accept_input(self, ctx: ActionContext, principal: Principal) -> ActionResult:
        if self.session_log is None:
            raise SchedulerException(ScheduleError.INVALID_ACTION, "accept_input needs the session log")
        act = ctx.claim.spec.action
        assert act is not None and act.session is not None
        inp = {"input_id": ctx.idempotency_key, "kind": act.kind, "payload": ctx.render(act.payload or {})}
        try:
            # The owner's automations speak as the system; anyone else's write under the session rules as
            # themselves, so an agent's schedule never gains the system's (or a human's) trust.
            res = (self.session_log.accept(act.session, inp, accepted_by=SYSTEM_SCHEDULER) if is_owner(principal)
                   else self.session_log.accept(act.session, inp, writer=principal))
        except SchedulerException:
            raise
        except Exception as exc:  # the session log's own error values (e.g. invalid_input)
            raise SchedulerException(ScheduleError.ACTION_REJECTED, str(exc)) from exc
        return ActionResult(run_ref=f"{act.session}#{getattr(res, 'accept_seq', None)}")


def execute(claim: Claim, registry: ActionRegistry) -> Outcome:
    """Run one claimed occurrence with its patrol guards; never raises (errors become outcomes)."""
    act = claim.spec.action
    no_progress = claim.no_progress
    try:
        if act is not None and act.watch:
            before = registry.probe_digest(act.watch)
            if claim.last_digest is not None and before == claim.last_digest:
                if act.only_if_changed:
                    return Outcome(claim, OccurrenceState.MISSED, MissReason.UNCHANGED)
                no_progress += 1
                if act.fuse and no_progress >= act.fuse:
                    return Outcome(claim, OccurrenceState.MISSED, MissReason.NO_PROGRESS,
                                   no_progress=no_progress, pause=True)
            else:
                no_progress = 0
        result = registry.run(ActionContext(claim))
    except SchedulerException as exc:
        return _failed(claim, f"{exc.code.value}: {exc.message}", no_progress)
    except Exception as exc:  # an action's own failure is an outcome, not a coordinator crash
        return _failed(claim, f"{ScheduleError.ACTION_FAILED.value}: {type(exc).__name__}: {exc}", no_progress)
    after = None
    if act is not None and act.watch:
        try:
            after = registry.probe_digest(act.watch)
        except Exception as exc:  # noqa: BLE001 - the action ran; keep its outcome, report the probe
            return Outcome(claim, OccurrenceState.DONE, run_ref=result.run_ref, no_progress=no_progress,
                           detail=f"probe after fire failed: {exc}")
    else:
        no_progress = no_progress + 1 if result.progress is False else 0
    fuse = act.fuse if act is not None else 0
    return Outcome(claim, OccurrenceState.DONE, run_ref=result.run_ref, digest=after,
                   no_progress=no_progress if no_progress != claim.no_progress else None,
                   pause=bool(fuse) and no_progress >= fuse)


def _failed(claim: Claim, detail: str, no_progress: int) -> Outcome:
    act = claim.spec.action
    if act is not None and not act.watch:
        no_progress += 1  # without a watched state, a failed fire is a fire that changed nothing
        fuse = act.fuse
        return Outcome(claim, OccurrenceState.FAILED, detail=detail, no_progress=no_progress,
                       pause=bool(fuse) and no_progress >= fuse)
    return Outcome(claim, OccurrenceState.FAILED, detail=detail)

