"""Runner configuration per role, from `[roles.<ROLE>]` tables in taskkernel.toml.

Everything that widens what an agent holds (extra variables, another OS user) is explicit here and
checked when the configuration loads, so a coordinator that could not honour it never starts.
"""

from __future__ import annotations

import os
import pwd
import re
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
RESERVED_PREFIX = "TASKKERNEL_"  # the runner's own variables: the run's token and task, never the database URL


class RunnerKind(StrEnum):
    COMMAND = "command"
    SCRIPTED = "scripted"


class RunnerSpec(BaseModel):
    """How one role's agent is run. Placeholders in argv: {task_file} {task_id} {round} {workspace} {role}."""

    model_config = ConfigDict(extra="forbid")

    runner: RunnerKind
    argv: list[str] = Field(default_factory=list)
    cwd: str | None = None  # relative to the workspace root
    env: dict[str, str] = Field(default_factory=dict)  # explicit values added to the agent's environment
    pass_env: list[str] = Field(default_factory=list)  # coordinator variables the owner deliberately forwards
    run_as: str | None = None  # OS user the command agent runs as (the coordinator must be root or that user)
    timeout: float = Field(default=600.0, gt=0)
    lease: float | None = Field(default=None, gt=0)  # seconds without renewal before a takeover; default timeout+60
    max_attempts: int = Field(default=3, ge=1, le=20)
    backoff: float = Field(default=2.0, ge=0)  # seconds before attempt n+1: backoff * 2**(n-1)
    agent: str | None = None  # agent name recorded as `by`; default: <role>-agent

    def model_post_init(self, _ctx: Any) -> None:
        if self.runner is RunnerKind.COMMAND and not self.argv:
            raise ValueError("a command runner needs a non-empty argv")
        for name in [*self.env, *self.pass_env]:
            if not _ENV_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not an environment variable name")
            if name.upper().startswith(RESERVED_PREFIX):
                raise ValueError(f"{name} is set by the runner (the run's token and task; never the database URL)")
        if self.run_as is not None:
            if self.runner is not RunnerKind.COMMAND:
                raise ValueError("run_as applies to command runners only (scripted agents run in the coordinator)")
            check_switchable(self.run_as)

    @property
    def lease_seconds(self) -> float:
        """A run's lease outlives its timeout unless the owner sets it: the coordinator renews it while the
        agent runs, and a lease that lapses means another coordinator terminates the agent and re-runs."""
        return self.lease if self.lease is not None else self.timeout + 60.0


def os_user(name: str) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        raise ValueError(f"run_as = {name!r}: no such OS user") from None


def check_switchable(name: str) -> pwd.struct_passwd:
    """The user's entry if this process can start agents as it: only root can switch to another user."""
    user, euid = os_user(name), os.geteuid()
    if euid not in (0, user.pw_uid):
        raise ValueError(f"run_as = {name!r}: the coordinator runs as uid {euid} and cannot switch to uid "
                         f"{user.pw_uid}; run it as root or as {name}")
    return user


def runner_specs(config: dict[str, Any]) -> dict[str, RunnerSpec]:
    """`{"roles": {"DEV": {...}}}` -> validated specs; a bad table raises with the role named."""
    specs: dict[str, RunnerSpec] = {}
    for role, table in (config.get("roles") or {}).items():
        try:
            specs[role.upper()] = RunnerSpec.model_validate(table)
        except ValueError as exc:
            raise ValueError(f"[roles.{role}] in taskkernel.toml: {exc}") from exc
    return specs
