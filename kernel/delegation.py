"""Delegation: whom the creator of a task may hand its powers to (docs/roles.md, "Who may name whom").

A new task gives out three powers: the **driver** does the work (claim, report, submit), the **done authority**
judges it (approve, reject, reopen, amend), the **archive authority** closes it. A creator other than ADMIN (an
unscoped owner credential, which may set anything) is held to two rules, read from what its role module declares
(``assign_scope``: anyone, leader — the team's leader or ADMIN —, nobody):

1. **reach**: work goes only where the role may address a task — the recipient and the driver are roles it may
   address; the done and archive authority are the creator itself (it asked for the work) or such a role;
2. **separation of duties**: the driver is never also the done authority — nobody judges its own work.

They apply to the authority as resolved (``authority_of``), so an omitted field's default obeys them too: a
leader sending a task to itself must name another done authority. The refusal is ``role_not_authorized``, with
the roles the creator may name. ``adopt_task`` (imported history) is ADMIN's and never judged here.

Whoever creates it (ADMIN included), a new task's done authority must be a role that can decide it: one whose role
module may issue ``approve`` (``decider_refusal``). A task judged by a role that may not approve would sit in review
for ever, its review runs refused; it is refused at the door instead, naming the roles that may.
"""

from __future__ import annotations

from typing import Any, Protocol

from taskkernel.kernel.model.commands import CommandType, CreateTaskPayload
from taskkernel.kernel.model.principal import ADMIN
from taskkernel.kernel.model.task import authority_of
from taskkernel.kernel.reasons import KernelError, ReasonCode

# AssignScope values (roles/protocol.py): the core imports no role package.
ANYONE, LEADER = "anyone", "leader"
JUDGED_FIELDS = ("done_authority", "archive_authority")  # powers over the result: the creator may keep them


def may_address(scope: str, leader: str, role: str) -> bool:
    """Whether a role with this ``assign_scope`` may give work to ``role``."""
    return scope == ANYONE or (scope == LEADER and role in (leader, ADMIN))


def refusal(payload: CreateTaskPayload, scope: str, leader: str) -> KernelError | None:
    """Why ``payload.sender`` (the creator, already matched to the credential) may not create this task as it
    names (or defaults) its powers; None when it may. ``scope`` is the creator's role's ``assign_scope``."""
    creator = payload.sender

    def named(role: str, *, keep: bool = False) -> bool:
        return (keep and role == creator) or may_address(scope, leader, role)

    def reach(*, keep: bool = False, but: str | None = None) -> str:
        if scope == ANYONE:
            return "any role of the team" + (f" but {but}" if but else "")
        roles = [r for r in dict.fromkeys(([creator] if keep else []) + ([leader, ADMIN] if scope == LEADER else []))
                 if r != but]
        return _listed(roles) or "no role"

    if not named(payload.recipient):
        return _refuse(f"role {creator} may not assign tasks to {payload.recipient}; it may address {reach()}")
    authority = authority_of(payload)
    if not named(authority["driver"]):
        return _refuse(f"role {creator} may not name {authority['driver']} as driver (the driver does the work); "
                       f"it may give work to {reach()}")
    for field in JUDGED_FIELDS:
        if not named(authority[field], keep=True):
            return _refuse(f"role {creator} may not name {authority[field]} as {field}; it may name "
                           f"{reach(keep=True)}")
    driver, judge = authority["driver"], authority["done_authority"]
    if judge == driver:
        default = "" if payload.done_authority else " (by default, the sender)"
        return _refuse(f"done_authority {judge}{default} is also the driver: nobody judges its own work; "
                       f"name another done_authority: {reach(keep=True, but=driver)}")
    return None


class Roles(Protocol):
    """What ``decider_refusal`` reads of the role registry (the kernel's RolePolicy)."""

    def get(self, code: str) -> Any: ...

    def codes(self) -> list[str]: ...


def may_decide(roles: Roles, role: str) -> bool:
    """Whether ``role``'s module may approve a task (ADMIN's always may)."""
    return role == ADMIN or bool(roles.get(role).may_issue(CommandType.APPROVE))


def decider_refusal(payload: CreateTaskPayload, roles: Roles) -> KernelError | None:
    """Why the task's done authority (as resolved, the default included) could never decide it; None when it can."""
    authority = authority_of(payload)
    judge = authority["done_authority"]
    if may_decide(roles, judge):
        return None
    deciders = [code for code in roles.codes() if may_decide(roles, code) and code != authority["driver"]]
    default = "" if payload.done_authority else " (by default, the sender)"
    return _refuse(f"done_authority {judge}{default} may not approve (its role module does not issue approve): "
                   f"nobody could decide the task; name a done_authority that may: {_listed(deciders)}")


def _listed(roles: list[str]) -> str:
    """``A, B or C``."""
    return " or ".join([", ".join(roles[:-1]), roles[-1]]) if len(roles) > 1 else "".join(roles)


def _refuse(message: str) -> KernelError:
    return KernelError(ReasonCode.ROLE_NOT_AUTHORIZED, message)
