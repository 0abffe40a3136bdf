"""Composition root for CLI commands: builds the kernel with the workspace's team and roles."""

from __future__ import annotations

from kernel.cli.common import CliContext
from kernel.commands import TaskCommandKernel
from kernel.credentials import resolve_principal
from kernel.model.principal import Principal
from kernel.workspace import TEAM_PRESETS, Team
from roles.registry import RoleRegistry


def team_of(ctx: CliContext) -> Team:
    root = ctx.workspace_root()
    if root is None:
        return Team.from_fcop_json(TEAM_PRESETS["dev-team"])
    return ctx.workspace().team()


def build_kernel(ctx: CliContext) -> TaskCommandKernel:
    team = team_of(ctx)
    return TaskCommandKernel(ctx.database(), RoleRegistry.for_team(team.leader, team.roles))


def principal_of(ctx: CliContext) -> Principal | None:
    return resolve_principal(ctx.database(), ctx.token)
