"""What a schedule's action will submit, checked when the schedule is created (``Schedules.add``), so a typo is
refused once, at the door, instead of failing at every fire (docs/scheduler.md, "Inputs checked at add").

- ``create_task``: the template is a ``create_task`` payload the kernel will take (its fields, their types) and
  every role it names (``recipient``, ``driver``, ``done_authority``, ``archive_authority``), like the schedule's
  owner role, is a role of the team (``unknown_role``), given the team's roles, and hands the task's powers only
  within the owner role's reach (``role_not_authorized``, kernel/delegation.py);
- ``accept_input``: the kind is a session input kind and the payload fits it; an ``allow``/``revoke`` follows the
  grant grammar (``invalid_grant``, kernel/sessionlog/grants.py).

Placeholders (``{schedule}``, ``{dedup_key}``, …) are plain text here: they stand in strings only.
"""

from __future__ import annotations

import difflib
from typing import Any, Protocol

from pydantic import ValidationError

from taskkernel.kernel.delegation import decider_refusal, refusal
from taskkernel.kernel.model.commands import CreateTaskPayload
from taskkernel.kernel.model.principal import ADMIN
from taskkernel.kernel.sessionlog.grants import check_grant
from taskkernel.kernel.sessionlog.models import InputKind, SessionLogError, validate_payload
from taskkernel.scheduler.models import ActionType, ScheduleError, SchedulerException, ScheduleSpec, first_error

ROLE_FIELDS = ("recipient", "driver", "done_authority", "archive_authority")


class _Scoped(Protocol):
    @property
    def assign_scope(self) -> str: ...

    def may_issue(self, command: Any) -> bool: ...


class KnownRoles(Protocol):
    """The team's roles as the kernel knows them (taskkernel.roles.registry.RoleRegistry)."""

    @property
    def leader(self) -> str: ...

    def known(self, code: str) -> bool: ...

    def codes(self) -> list[str]: ...

    def get(self, code: str) -> _Scoped: ...


def _unknown(what: str, role: str, roles: KnownRoles) -> SchedulerException:
    codes = roles.codes()
    guess = difflib.get_close_matches(role, codes, n=1, cutoff=0.6)
    return SchedulerException(ScheduleError.UNKNOWN_ROLE, f"{what} {role} is not a role of the team "
                              f"({', '.join(codes)})" + (f"; did you mean {guess[0]}?" if guess else ""))


def check_inputs(spec: ScheduleSpec, roles: KnownRoles | None) -> None:
    """Raise what the schedule's fires would be refused for; ``roles`` None: roles are not checked."""
    if roles is not None and not roles.known(spec.owner_role):
        raise _unknown("owner", spec.owner_role, roles)
    act = spec.action
    if act is None:
        return
    if act.type is ActionType.CREATE_TASK and act.template is not None:
        try:
            payload = CreateTaskPayload.model_validate({"body": "", **act.template, "sender": spec.owner_role})
        except ValidationError as exc:
            raise SchedulerException(ScheduleError.INVALID_TEMPLATE, f"template: {first_error(exc)}") from None
        if roles is not None:
            for field in ROLE_FIELDS:
                role = getattr(payload, field)
                if role is not None and not roles.known(role):
                    raise _unknown(f"template {field}", role, roles)
            # the kernel would refuse every fire of a task handing powers beyond the owner's reach (ADMIN's own), or
            # one whose done authority could never decide it (ADMIN's too)
            refused = refusal(payload, str(roles.get(spec.owner_role).assign_scope), roles.leader) \
                if spec.owner_role != ADMIN else None
            if (refused := refused or decider_refusal(payload, roles)) is not None:
                raise SchedulerException(ScheduleError.ROLE_NOT_AUTHORIZED, f"template: {refused.message}")
    elif act.type is ActionType.ACCEPT_INPUT:
        try:
            kind = InputKind(act.kind)
        except ValueError:
            raise SchedulerException(ScheduleError.INVALID_ACTION, f"--kind: {act.kind!r} is not a session input "
                                     f"kind ({', '.join(k.value for k in InputKind)})") from None
        try:
            validate_payload(kind, act.payload or {})
            check_grant(kind, act.payload or {})
        except SessionLogError as exc:
            code = ScheduleError.INVALID_GRANT if exc.reason.value == "invalid_grant" else ScheduleError.INVALID_ACTION
            raise SchedulerException(code, f"--payload: {exc.message}") from None
