"""Runner configuration per role, from `[roles.<ROLE>]` tables in taskkernel.toml."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class RunnerKind(StrEnum):
    COMMAND = "command"
    SCRIPTED = "scripted"


class RunnerSpec(BaseModel):
    """How one role's agent is run. Placeholders in argv: {task_file} {task_id} {round} {workspace} {role}."""

    model_config = ConfigDict(extra="forbid")

    runner: RunnerKind
    argv: list[str] = Field(default_factory=list)
    cwd: str | None = None  # relative to the workspace root
    env: dict[str, str] = Field(default_factory=dict)
    timeout: float = Field(default=600.0, gt=0)
    max_attempts: int = Field(default=3, ge=1, le=20)
    backoff: float = Field(default=2.0, ge=0)  # seconds before attempt n+1: backoff * 2**(n-1)
    agent: str | None = None  # agent name recorded as `by`; default: <role>-agent

    def model_post_init(self, _ctx: Any) -> None:
        if self.runner is RunnerKind.COMMAND and not self.argv:
            raise ValueError("a command runner needs a non-empty argv")


def runner_specs(config: dict[str, Any]) -> dict[str, RunnerSpec]:
    """`{"roles": {"DEV": {...}}}` -> validated specs; a bad table raises with the role named."""
    specs: dict[str, RunnerSpec] = {}
    for role, table in (config.get("roles") or {}).items():
        try:
            specs[role.upper()] = RunnerSpec.model_validate(table)
        except ValueError as exc:
            raise ValueError(f"[roles.{role}] in taskkernel.toml: {exc}") from exc
    return specs
