"""Who may create and change a schedule, and whom its action acts as (docs/scheduler.md, "Authority").

A schedule keeps acting long after the command that created it, so it must never carry more
authority than its creator had: it records the creator's principal, acts as its owner role (the
creator's own role unless an ADMIN delegated it to a lower one), and the kernel judges every fire
like any other command from that role. A task-scoped credential (a run's token) may not create one
at all: the schedule would outlive the run the credential was scoped to.

The rules are checked where the change is written (``Schedules``), and again when a schedule fires,
so a definition that slipped past them (written by an older release or by hand) still cannot act
above its creator.
"""

from __future__ import annotations

from taskkernel.kernel.model.principal import ADMIN, Principal
from taskkernel.scheduler.models import ActionType, Creator, ScheduleError, SchedulerException, ScheduleSpec

SYSTEM_SCHEDULER = "SYSTEM:scheduler"  # who the owner's (ADMIN's) automations accept session inputs as
GRANT_KINDS = frozenset({"allow", "revoke"})  # session inputs that carry or withdraw a human's permission


def _refuse(message: str) -> SchedulerException:
    return SchedulerException(ScheduleError.ROLE_NOT_AUTHORIZED, message)


def is_owner(principal: Principal) -> bool:
    """An unscoped ADMIN credential: the workspace owner."""
    return principal.is_admin  # unscoped by definition: a run's token is never ADMIN


def creator_of(principal: Principal) -> Creator:
    return Creator(role=principal.role, agent=principal.agent, task_id=principal.task_id, round=principal.round)


def creator_role(spec: ScheduleSpec) -> str:
    """The creator's role; a schedule created before creators were recorded stands for its owner role."""
    return spec.created_by.role if spec.created_by is not None else spec.owner_role


def check_definition(spec: ScheduleSpec) -> None:
    """What a schedule may do given who created it (checked at ``add`` and at every fire)."""
    creator = spec.created_by
    if creator is not None and creator.task_id is not None:
        raise _refuse(f"a task-scoped credential (task {creator.task_id}) may not create schedules: "
                      "a schedule outlives the run")
    if creator is not None and creator.role != ADMIN and spec.owner_role != creator.role:
        raise _refuse(f"{creator.role} may create schedules only as its own role, not as {spec.owner_role} "
                      "(only ADMIN may name another --owner)")
    act = spec.action
    if act is not None and act.type is ActionType.ACCEPT_INPUT and act.kind in GRANT_KINDS \
            and spec.owner_role != ADMIN:
        raise _refuse(f"only ADMIN's schedules may accept {act.kind!r} inputs (permissions are ADMIN's to give)")


def check_create(principal: Principal, spec: ScheduleSpec) -> ScheduleSpec:
    """The spec stamped with its creator, or ``role_not_authorized``."""
    stamped = spec.model_copy(update={"created_by": creator_of(principal)})
    check_definition(stamped)
    return stamped


def check_manage(principal: Principal, spec: ScheduleSpec, verb: str) -> None:
    """pause, resume, remove, backfill: the owner (unscoped ADMIN), or the creator's role for its own."""
    if principal.task_id is not None:
        raise _refuse(f"a task-scoped credential may not {verb} schedules")
    if not is_owner(principal) and principal.role != creator_role(spec):
        raise _refuse(f"{principal.id} may not {verb} schedule {spec.name!r}: it was created by "
                      f"{creator_role(spec)} (only ADMIN or the creator's role may change it)")


def acting_principal(spec: ScheduleSpec, name: str) -> Principal:
    """Whom a fire acts as: its owner role, never above its creator (else ``role_not_authorized``)."""
    check_definition(spec)
    return Principal(role=spec.owner_role, agent=f"scheduler:{name}")
