"""The board's buttons, each the command the CLI submits for it, judged by the same code with the same reason codes.

A task verb is ``TaskVerbs.act`` (`taskkernel task approve|reject|archive|…`), a grant is the session-log input the
refusal's hint names (`taskkernel session accept admin --kind allow …`), a schedule is paused or resumed through
``Schedules`` (`taskkernel schedule pause|resume`) and a goal cancelled under ``goal_refusal`` (`taskkernel goal
cancel`); an instruction to a task's agent is ``RunInputs.say`` (`taskkernel task say`) and a stop
``RunInputs.interrupt`` (`taskkernel task interrupt`). Every answer is ``(http status, document)``: 200 when the
change was accepted (or replayed), 404 when what it names does not exist, 409 for any other refusal; the document
says why with the stable reason code.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from taskkernel.coordinator.runners.inputs import RunInputs
from taskkernel.coordinator.web.models import SayBody
from taskkernel.kernel.commands import TaskCommandKernel
from taskkernel.kernel.goals import GoalService, goal_refusal
from taskkernel.kernel.model.commands import CommandType
from taskkernel.kernel.model.principal import Principal
from taskkernel.kernel.permissions import DEFAULT_SESSION, permission_scope
from taskkernel.kernel.reasons import KernelError, ReasonCode
from taskkernel.kernel.sessionlog import SessionLog, SessionLogError
from taskkernel.kernel.sessionlog.models import InputKind
from taskkernel.kernel.verbs import VERB_COMMANDS, TaskVerbs
from taskkernel.scheduler.admin import Schedules
from taskkernel.scheduler.ledger import Ledger
from taskkernel.scheduler.models import ScheduleError, SchedulerException
from taskkernel.scheduler.tables import install as install_schedules

CONTROL_FIELDS = ("expect_rev", "round", "key")  # a verb's body fields that steer the call, not its payload
NOT_FOUND = {ReasonCode.TASK_NOT_FOUND.value, ScheduleError.SCHEDULE_NOT_FOUND.value, "unknown_goal"}
GRANTABLE = tuple(c.value for c in (CommandType.APPROVE, CommandType.REOPEN, CommandType.FORCE_ARCHIVE))
SCHEDULE_VERBS = {"pause": "paused", "resume": "resumed"}
SAY_FIELDS = tuple(SayBody.model_fields)  # `task say`'s argument and options
Answer = tuple[int, dict[str, Any]]


def status_of(doc: dict[str, Any]) -> int:
    if doc["status"] != "rejected":
        return 200
    return 404 if doc.get("reason") in NOT_FOUND else 409


def refused(reason: str, message: str, **detail: Any) -> Answer:
    doc = {"status": "rejected", "reason": reason, "message": message, **({"detail": detail} if detail else {})}
    return status_of(doc), doc


def judged(act: Callable[[], dict[str, Any]]) -> Answer:
    """``act``'s document, or the refusal it raised (KernelError, SessionLogError) with its reason code."""
    try:
        return 200, act()
    except (KernelError, SessionLogError) as exc:
        return refused(exc.reason.value, exc.message)


class Actions:
    def __init__(self, kernel: TaskCommandKernel, log: SessionLog, inputs: RunInputs) -> None:
        self.kernel = kernel
        self.db = kernel.db
        self.verbs = TaskVerbs(kernel, grant_session=DEFAULT_SESSION)
        self.log = log
        self.inputs = inputs

    def task_verb(self, principal: Principal, task_id: str, verb: str, body: dict[str, Any]) -> Answer:
        """``POST /api/tasks/{id}/{verb}``: the body is the verb's fields (a reject's ``reason``, a report's
        ``status`` and ``body``…) plus, optionally, ``expect_rev``, ``round`` and ``key`` as the CLI's flags."""
        if verb not in VERB_COMMANDS:
            return refused(ReasonCode.INVALID_COMMAND.value, f"{verb!r} is not a task verb; the verbs are "
                           f"{', '.join(VERB_COMMANDS)}")
        payload = {k: v for k, v in body.items() if k not in CONTROL_FIELDS}
        if verb == "archive":
            payload.setdefault("reason", "archived")  # as `taskkernel task archive` without --reason
        control = {k: body.get(k) for k in CONTROL_FIELDS}
        for name in ("expect_rev", "round"):
            value = control[name]
            if value is not None and (type(value) is not int or value < 0):
                return refused(ReasonCode.INVALID_COMMAND.value, f"{name} must be a whole number")
        if control["key"] is not None and not isinstance(control["key"], str):
            return refused(ReasonCode.INVALID_COMMAND.value, "key must be a string")
        outcome = self.verbs.act(principal, verb, task_id, payload, expect_rev=control["expect_rev"],
                                 round_=control["round"], key=control["key"])
        doc = outcome.wire()
        return status_of(doc), doc

    def grant(self, principal: Principal, task_id: str, permission: str, session: str = DEFAULT_SESSION) -> Answer:
        """``POST /api/tasks/{id}/grant``: an ``allow`` of ``permission`` scoped to the task, accepted into the
        grant session from the caller (ADMIN's alone: the session log refuses anyone else), exactly the input the
        refusal's hint names, so granting twice replays."""
        if permission not in GRANTABLE:
            return refused(ReasonCode.INVALID_COMMAND.value, f"{permission!r} is not a permission a grant lifts; "
                           f"choose one of {', '.join(GRANTABLE)}")
        if self.kernel.task(task_id) is None:
            return refused(ReasonCode.TASK_NOT_FOUND.value, f"{task_id} does not exist")
        input_id = f"grant-{permission}-{task_id}"
        try:
            res = self.log.accept(session, {"input_id": input_id, "kind": InputKind.ALLOW,
                                            "payload": {"permission": permission, "scope": permission_scope(task_id)}},
                                  writer=principal)
        except SessionLogError as exc:
            return refused(exc.reason.value, exc.message)
        if res.status == "refused":
            return refused("input_refused", f"{input_id!r} was refused earlier: {res.reason}")
        return 200, {"status": res.status, "reason": None, "message": f"{permission} granted for {task_id} in "
                     f"session {session!r} at sequence {res.accept_seq}",
                     "detail": {"session": session, "input_id": input_id, "accept_seq": res.accept_seq}}

    def schedule(self, principal: Principal, name: str, verb: str) -> Answer:
        """``POST /api/schedules/{name}/pause|resume`` (its creator or ADMIN, as `taskkernel schedule`)."""
        if verb not in SCHEDULE_VERBS:
            return refused(ReasonCode.INVALID_COMMAND.value, f"{verb!r}: a schedule is paused or resumed here")
        install_schedules(self.db)
        schedules = Schedules(Ledger(self.db))
        try:
            row = getattr(schedules, verb)(name, datetime.now(UTC), by=principal)
        except SchedulerException as exc:
            return refused(exc.code.value, exc.message)
        return 200, {"status": "ok", "reason": None, "message": f"{name} {SCHEDULE_VERBS[verb]}",
                     "detail": schedules.view(row)}

    def cancel_goal(self, principal: Principal, goal_id: str) -> Answer:
        """``POST /api/goals/{id}/cancel`` (the root task's authority, as `taskkernel goal cancel`)."""
        service = GoalService(self.db, self.kernel.store)
        goal = service.show(goal_id)
        root = self.kernel.task(goal["root_task"]) if goal else None
        if goal is None or root is None:
            return refused("unknown_goal", f"no goal {goal_id}")
        refusal = goal_refusal(principal, root, "cancel")
        if refusal is not None:
            return refused(refusal.reason.value, refusal.message)
        if not service.cancel(goal_id):
            return refused("goal_not_active", f"goal {goal_id} is not active")
        return 200, {"status": "ok", "reason": None, "message": f"goal {goal_id} cancelled",
                     "detail": {"goal_id": goal_id, "state": "cancelled"}}

    def say(self, principal: Principal, task_id: str, body: dict[str, Any]) -> Answer:
        """``POST /api/tasks/{id}/say``: ``{text, mode, question_id, input_id, anchor}`` as `taskkernel task say`'s
        argument and options (``mode`` message, steer, queue or answer; default message; ``anchor`` ``PATH:LINE``
        as ``--at``), its document back."""
        fields = {name: body.get(name) for name in SAY_FIELDS}
        if (unknown := set(body) - set(SAY_FIELDS)) or any(
                value is not None and not isinstance(value, str) for value in fields.values()):
            return refused(ReasonCode.INVALID_COMMAND.value, f"say takes the strings {', '.join(SAY_FIELDS)}"
                           + (f" (not {', '.join(sorted(unknown))})" if unknown else ""))
        return judged(lambda: self.inputs.say(principal, task_id, fields["text"] or "", fields["mode"] or "message",
                                              question_id=fields["question_id"], input_id=fields["input_id"],
                                              anchor=fields["anchor"]))

    def interrupt(self, principal: Principal, task_id: str, body: dict[str, Any]) -> Answer:
        """``POST /api/tasks/{id}/interrupt``: ``{message}`` (optional) as `taskkernel task interrupt --message`."""
        message = body.get("message")
        if set(body) - {"message"} or (message is not None and not isinstance(message, str)):
            return refused(ReasonCode.INVALID_COMMAND.value, "interrupt takes one optional string, message")
        return judged(lambda: self.inputs.interrupt(principal, task_id, message or None))
