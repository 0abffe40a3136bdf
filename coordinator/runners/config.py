"""Runners as this machine can run them: the `[roles.<ROLE>]` tables of taskkernel.toml (the model is in
taskkernel.coordinator.config) checked against the team, the OS users and the files here.

Everything that widens what an agent holds (extra variables, another OS user) is explicit in the file; what
the file alone cannot tell — the program is installed, the user exists and this process can become it, the
working folder exists, the role is one the team has — is checked here, so a coordinator that could not honour
its configuration never starts (`up` refuses, exit 64) and `doctor` names every such problem.
"""

from __future__ import annotations

import os
import pwd
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from taskkernel.coordinator.config import (
    CONFIG_INVALID,
    RESERVED_ENV_PREFIX,
    RUNNER_UNAVAILABLE,
    ConfigError,
    Isolation,
    OnApprove,
    Problem,
    RunnerKind,
    RunnerSpec,
    TaskkernelConfig,
    argv_fields,
    near,
    parse_config,
)
from taskkernel.coordinator.runners.presets import program_of
from taskkernel.coordinator.worktrees.git import toplevel

RESERVED_PREFIX = RESERVED_ENV_PREFIX
_LOAD_TIME = frozenset({"workspace", "role"})  # placeholders known before any task: argv[0] may use them

__all__ = ["RESERVED_PREFIX", "RunnerKind", "RunnerSpec", "binary_of", "check_switchable", "os_user",
           "RoleNames", "runner_problems", "runner_specs", "unknown_roles"]


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


def binary_of(spec: RunnerSpec, role: str, root: Path) -> tuple[str | None, str | None]:
    """(the program argv[0] (or the preset's CLI) starts, why it cannot be started). Resolved as the agent's start
    resolves it: a name on the agent's PATH (``env.PATH``, else the coordinator's), a path with a ``/`` relative to
    ``cwd``.
    (None, None): argv[0] names a placeholder only a task fills, so it is checked when the task runs."""
    first = program_of(spec)
    if argv_fields(first) - _LOAD_TIME:
        return None, None
    program = first.format(workspace=str(root), role=role)
    if "/" in program:
        path = Path(program) if os.path.isabs(program) else (root / spec.cwd if spec.cwd else root) / program
        if not path.exists():
            return str(path), f"argv[0] {program!r} does not exist ({path})"
        if not path.is_file() or not os.access(path, os.X_OK):
            return str(path), f"argv[0] {program!r} is not an executable file ({path})"
        return str(path), None
    search = spec.env.get("PATH", os.environ.get("PATH", os.defpath))
    found = shutil.which(program, path=search)
    if found is None:
        if not spec.argv:  # a preset's CLI
            return None, (f"{program!r} (the {spec.runner} CLI) is not on the agent's PATH; install it, or "
                          "give its full path as argv (docs/agents.md)")
        return None, f"argv[0] {program!r} is not on the agent's PATH; install it or give its full path"
    return found, None


def runner_problems(config: TaskkernelConfig, root: Path) -> dict[str, list[Problem]]:
    """Per role table: what keeps this machine from running it (program, working folder, OS user)."""
    out: dict[str, list[Problem]] = {}
    for name, spec in config.roles.items():
        table, found = f"roles.{name}", []
        if spec.spawns:
            _, missing = binary_of(spec, name.upper(), root)
            if missing:
                found.append(config.problem(table, "argv", missing))
            if spec.cwd and not (root / spec.cwd).is_dir():
                found.append(config.problem(table, "cwd", f"cwd {spec.cwd!r} is not a folder in the workspace "
                                            f"({root / spec.cwd})"))
            if spec.run_as is not None:
                try:
                    check_switchable(spec.run_as)
                except ValueError as exc:
                    found.append(config.problem(table, "run_as", str(exc)))
            found += _isolation_problems(config, table, spec, root)
        if found:
            out[name] = found
    return out


def _isolation_problems(config: TaskkernelConfig, table: str, spec: RunnerSpec, root: Path) -> list[Problem]:
    """A worktree per task, asked for explicitly, or a merge on approval, needs the workspace in a git
    repository (the default isolation falls back to shared outside one)."""
    wants = spec.isolation is Isolation.WORKTREE or spec.on_approve is OnApprove.MERGE
    if not wants or toplevel(root) is not None:
        return []
    key = "isolation" if spec.isolation is Isolation.WORKTREE else "on_approve"
    return [config.problem(table, key, f'{key} = "{getattr(spec, key).value}" needs the workspace inside a git '
                           f"repository, and {root} is not in one (git init, or isolation = \"shared\")")]


def unknown_roles(config: TaskkernelConfig, known: Callable[[str], bool], codes: list[str]) -> list[Problem]:
    """Role names the file uses that the team (and the installed role packages) does not have: a runner or a
    gate rule for them would never apply."""
    team = [c for c in codes if c != "ADMIN"]
    out = []
    for name in config.roles:
        if not known(name.upper()):
            guess = near(name, team)
            out.append(config.problem(f"roles.{name}", None, f"{name.upper()} is not a role of the team "
                                      f"({', '.join(team)})" + (f"; did you mean [roles.{guess}]?" if guess else ""),
                                      f"[roles.{guess}]" if guess else None))
    for name in config.gate.roles:
        if not known(name):
            guess = near(name, team)
            out.append(config.problem("gate", "roles", f"roles: {name} is not a role of the team ({', '.join(team)})"
                                      + (f"; did you mean {guess}?" if guess else ""), guess))
    return out


class RoleNames(Protocol):
    """What runner_specs needs of the role registry (taskkernel.roles.registry.RoleRegistry)."""

    def known(self, code: str) -> bool: ...

    def codes(self) -> list[str]: ...


def runner_specs(config: TaskkernelConfig | Mapping[str, Any], *, root: Path | None = None,
                 roles: RoleNames | None = None) -> dict[str, RunnerSpec]:
    """The runner of each role, by role code. A bad table raises ``ConfigError`` with the role named; given
    ``roles`` (the registry), a table for a role the team lacks too; given ``root``, a program, folder or OS
    user this machine cannot use (``runner_unavailable``). The OS user is always checked."""
    cfg = config if isinstance(config, TaskkernelConfig) else parse_config(config)
    if roles is not None and (problems := unknown_roles(cfg, roles.known, roles.codes())):
        raise ConfigError.of(problems, code=CONFIG_INVALID)
    if root is not None:
        found = [p for ps in runner_problems(cfg, root).values() for p in ps]
        if found:
            raise ConfigError.of(found, code=RUNNER_UNAVAILABLE)
    for name, spec in cfg.roles.items():
        if spec.run_as is not None:
            try:
                check_switchable(spec.run_as)
            except ValueError as exc:
                raise ConfigError.of([cfg.problem(f"roles.{name}", "run_as", str(exc))],
                                     code=RUNNER_UNAVAILABLE) from None
    return {name.upper(): spec for name, spec in cfg.roles.items()}
