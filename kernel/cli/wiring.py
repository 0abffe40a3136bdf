"""Composition root for CLI commands: builds the kernel exactly as the coordinator does."""

from __future__ import annotations

from kernel.cli.common import CliContext, Exit, fail
from kernel.commands import TaskCommandKernel
from kernel.coordinator import build_kernel as build_workspace_kernel
from kernel.model.principal import Principal


def build_kernel(ctx: CliContext) -> TaskCommandKernel:
    try:
        return build_workspace_kernel(ctx.database(), ctx.optional_workspace())
    except ValueError as exc:  # a bad team ([team] or fcop.json): a usage error, never a traceback
        fail(Exit.USAGE, str(exc))


def principal_of(ctx: CliContext) -> Principal:
    """The caller's principal; an unverified credential ends the command with its refusal."""
    return ctx.principal()
