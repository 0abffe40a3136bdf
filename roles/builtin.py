"""Built-in roles: ADMIN (the human), a team leader, and workers."""

from __future__ import annotations

from taskkernel.kernel.model.commands import CommandType
from taskkernel.roles.protocol import ALL_COMMANDS, DRIVER_COMMANDS, AssignScope, RoleSpec

WORKER_COMMANDS = DRIVER_COMMANDS | {CommandType.CREATE_TASK}


def admin() -> RoleSpec:
    return RoleSpec("ADMIN", ALL_COMMANDS, AssignScope.ANYONE, "the human owner: every power")


def leader(code: str) -> RoleSpec:
    return RoleSpec(code, ALL_COMMANDS, AssignScope.ANYONE, "team leader: splits work, accepts branches")


def worker(code: str, description: str = "worker") -> RoleSpec:
    return RoleSpec(code, WORKER_COMMANDS, AssignScope.LEADER, description)


WORKER_DESCRIPTIONS = {
    "DEV": "developer: builds what a task asks for",
    "QA": "quality: checks artifacts and reports findings",
    "OPS": "operations: deploys and watches",
    "ME": "solo operator",
}
