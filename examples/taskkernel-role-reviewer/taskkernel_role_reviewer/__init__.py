"""An installable role package: the registry finds `role` through the `taskkernel.roles` entry point."""

from __future__ import annotations

from typing import Any

from taskkernel.kernel.model.commands import CommandType
from taskkernel.roles.protocol import AssignScope, RoleSpec


def review(ctx: Any) -> str:
    """Scripted behaviour when a task is dispatched to REVIEWER: record a finding and submit."""
    ctx.submit("submit_report", status="done", body=f"REVIEWER read {ctx.task['subject']}: no findings")
    ctx.submit("submit")
    return "reviewed"


def role() -> RoleSpec:
    return RoleSpec(
        code="REVIEWER",
        commands=frozenset({CommandType.CLAIM, CommandType.SUBMIT, CommandType.SUBMIT_REPORT}),
        assign_scope=AssignScope.NOBODY,
        description="reads a task's material and reports findings; never assigns work",
        handler=review,
    )
