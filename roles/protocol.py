"""The role protocol: a declaration of powers, imported by the kernel only through the registry."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from taskkernel.kernel.model.commands import COORDINATOR_ONLY, CommandType

ALL_COMMANDS = frozenset(CommandType) - COORDINATOR_ONLY  # the coordinator's own records are no role's power
DRIVER_COMMANDS = frozenset({CommandType.CLAIM, CommandType.SUBMIT, CommandType.SUBMIT_REPORT, CommandType.PERFORM})


class AssignScope(StrEnum):
    """To whom a role may address new tasks, and so hand their powers (kernel/delegation.py): the recipient and
    the driver are such roles; the done and archive authority are the creator itself or such a role; never is the
    driver also the done authority. ADMIN's own credential is bound by none of it."""

    ANYONE = "anyone"
    LEADER = "leader"  # workers report upwards only (FCoP Rule 4)
    NOBODY = "nobody"


@dataclass(frozen=True)
class RoleSpec:
    code: str
    commands: frozenset[CommandType] = DRIVER_COMMANDS
    assign_scope: AssignScope = AssignScope.NOBODY
    description: str = ""
    # Invoked by the coordinator when a task is dispatched to this role (None: runner config decides).
    handler: Callable[..., Any] | None = field(default=None, compare=False)

    def may_issue(self, command: CommandType) -> bool:
        """``retry`` comes with ``approve``: a role that decides a task may ask for another run of it (a role
        package written before retry existed keeps that power)."""
        return command in self.commands or (command is CommandType.RETRY and CommandType.APPROVE in self.commands)


def least_privilege(code: str) -> RoleSpec:
    """An unknown role may only drive tasks explicitly addressed to it."""
    return RoleSpec(code=code, commands=DRIVER_COMMANDS, assign_scope=AssignScope.NOBODY,
                    description="unknown role: least privilege")
