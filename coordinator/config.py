"""taskkernel.toml as one validated model (docs/config.md).

Every table and key the code reads is declared here (the roles' tables) or in config_tables.py (the others, each
needing nothing of this module); anything else is an error, never silently ignored. A file
that is not TOML, or does not fit the model, is one ``ConfigError`` whose message names the file, the table, the
key and the line, and suggests the near miss (``taskkernel.toml, line 5: [rols.PM] is not a table taskkernel
knows; did you mean [roles.PM]?``).

What is checked here depends on the file alone, so every command checks it the same way, whoever runs it. What
depends on the machine and the team (a runner's binary on PATH, its OS user, its working folder, a role the team
has) is checked by `up` before it starts and by `doctor` (taskkernel.coordinator.runners.config).
"""

from __future__ import annotations

import json
import re
import string
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, Field, PrivateAttr, ValidationError, model_validator

from taskkernel.coordinator.agent_profiles import PROFILE_NAME, AgentProfile, Variant, builtin_profiles
from taskkernel.coordinator.config_tables import (  # noqa: F401 - re-exported: the file's tables, one import away
    DEFAULT_EXCLUDES,
    FoldersTable,
    GateTable,
    KernelTable,
    KeyProblem,
    McpTable,
    SchedulerTable,
    ServeTable,
    Table,
    TeamTable,
    WorktreesTable,
    near,
)
from taskkernel.coordinator.fcop.filenames import BROADCAST, RESERVED_ROLES, is_role_code

CONFIG_NAME = "taskkernel.toml"
CONFIG_INVALID = "config_invalid"  # the file is not TOML, or does not fit the model
CONFIG_UNREADABLE = "config_unreadable"  # the file cannot be read at all
RUNNER_UNAVAILABLE = "runner_unavailable"  # a runner this machine cannot start (binary, OS user, folder)
# What a runner's argv may name: the task, the run, and the files a run is given (the prompt, the MCP
# configuration naming the coordinator's workspace and the run's token file, the folder the agent works in).
PLACEHOLDERS = ("task_file", "task_id", "round", "workspace", "role", "purpose", "prompt_file", "mcp_config",
                "workdir")
# What a role's prompt template may name (taskkernel.coordinator.runners.prompt builds each part).
PROMPT_FIELDS = ("task_id", "subject", "body", "round", "role", "purpose", "parents", "acceptance", "rework", "resume",
                 "how_to_report", "workdir", "review")
NOT_TEAM = RESERVED_ROLES | {BROADCAST}  # the human owner, the system and a broadcast are no team roles
MAX_ROLE_LEN = 32  # the kernel's role codes (kernel/model/commands.py)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
RESERVED_ENV_PREFIX = "TASKKERNEL_"  # the runner's own variables: the run's token and task, never the database URL


class WorkspaceNotFound(Exception):
    """No usable workspace here: no taskkernel.toml (or, as ``ConfigError``, one that cannot be used)."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the file: where (table, key, line) and what, with the near miss if there is one."""

    table: str | None  # "roles.DEV"; None: the top level
    key: str | None
    text: str
    line: int | None = None
    suggestion: str | None = None

    def render(self, file: str = CONFIG_NAME) -> str:
        where = f"{file}, line {self.line}" if self.line else file
        return f"[{self.table}] in {where}: {self.text}" if self.table else f"{where}: {self.text}"

    def as_json(self) -> dict[str, Any]:
        return {"table": self.table, "key": self.key, "line": self.line, "message": self.render(),
                **({"suggestion": self.suggestion} if self.suggestion else {})}


class ConfigError(WorkspaceNotFound, ValueError):
    """taskkernel.toml cannot be used. ``code`` is stable (docs/reason-codes.md): ``config_invalid``,
    ``config_unreadable``, ``runner_unavailable``. A ``WorkspaceNotFound`` (every command that opens the
    workspace reports it as a usage error, exit 64) and a ``ValueError`` (so do `up` and the kernel's wiring)."""

    def __init__(self, message: str, *, code: str = CONFIG_INVALID, path: Path | None = None,
                 problems: Sequence[Problem] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.path = path
        self.problems = list(problems)

    @classmethod
    def of(cls, problems: Sequence[Problem], *, code: str = CONFIG_INVALID, path: Path | None = None) -> ConfigError:
        more = f" (and {len(problems) - 1} more: run `taskkernel doctor`)" if len(problems) > 1 else ""
        return cls(problems[0].render() + more, code=code, path=path, problems=problems)

    def as_json(self) -> dict[str, Any]:
        first = self.problems[0] if self.problems else None
        return {"code": self.code, "message": self.message, "file": str(self.path) if self.path else None,
                "table": first.table if first else None, "key": first.key if first else None,
                "line": first.line if first else None, "problems": [p.as_json() for p in self.problems]}


def placeholder_problem(arg: str, known: Sequence[str] = PLACEHOLDERS) -> str | None:
    """Why ``arg`` (one element of a runner's argv, or a prompt template) is not a valid template, or None."""
    try:
        fields = [(f, spec, conv) for _, f, spec, conv in string.Formatter().parse(arg) if f is not None]
    except ValueError as exc:
        return f"{json.dumps(arg)} is not a valid template ({exc}); write {{{{ and }}}} for literal braces"
    for name, spec, conv in fields:
        if name not in known:
            guess = near(name.split(".")[0].split("[")[0], known) if name else None
            hint = f"; did you mean {{{guess}}}?" if guess else ""
            shown = json.dumps(arg) if len(arg) <= 80 else "the template"
            return (f"{{{name}}} in {shown} is not a placeholder taskkernel fills{hint} (known: "
                    + " ".join(f"{{{p}}}" for p in known) + "; write {{ and }} for literal braces)")
        if spec or conv:
            return f"{json.dumps(arg)}: placeholders take no conversion or format spec ({{{name}}} only)"
    return None


def argv_fields(arg: str) -> set[str]:
    """The placeholders one (valid) argv element names."""
    return {f for _, f, _, _ in string.Formatter().parse(arg) if f}


class RunnerKind(StrEnum):
    """The runners that are not an agent CLI's profile: any other ``runner`` names a profile (the built-in ones in
    coordinator/agents.toml, or a ``[profiles.<name>]`` table of the file)."""

    COMMAND = "command"
    SCRIPTED = "scripted"


class Isolation(StrEnum):
    WORKTREE = "worktree"  # one git worktree and branch per task (docs/agents.md)
    SHARED = "shared"  # every run works in the workspace (or cwd)


class OnApprove(StrEnum):
    MERGE = "merge"  # merge the task branch into the base when the task is approved
    KEEP = "keep"  # leave the branch for a person to merge


_SPAWN_ONLY = ("argv", "cwd", "env", "pass_env", "run_as", "kill_grace", "heartbeat_timeout",
               "non_retryable_exit_codes", "isolation", "base_branch", "on_approve", "prompt", "mcp", "args")
_PRESET_ONLY = ("model", "allowed_tools", "args", "variant", "resume_conversation")


class RunnerSpec(Table):
    """``[roles.<ROLE>]``: how one role's agent is run (docs/roles.md). Placeholders in argv: see PLACEHOLDERS."""

    runner: str = Field(pattern=r"^[a-z][a-z0-9-]{0,39}$")  # "command", "scripted", or a profile's name
    argv: list[str] = Field(default_factory=list)
    cwd: str | None = Field(default=None, min_length=1)  # relative to the workspace root
    env: dict[str, str] = Field(default_factory=dict)  # explicit values added to the agent's environment
    pass_env: list[str] = Field(default_factory=list)  # coordinator variables the owner deliberately forwards
    run_as: str | None = Field(default=None, min_length=1)  # OS user the command agent runs as
    timeout: float = Field(default=600.0, gt=0, allow_inf_nan=False)
    lease: float | None = Field(default=None, gt=0, allow_inf_nan=False)  # default: timeout + 60
    max_attempts: int = Field(default=3, ge=1, le=20)
    backoff: float = Field(default=2.0, ge=0, allow_inf_nan=False)  # seconds before attempt n+1: backoff*2**(n-1)
    agent: str | None = Field(default=None, min_length=1)  # agent name recorded as `by`; default: <role>-agent
    concurrency: int = Field(default=1, ge=1, le=256)  # this role's runs at once (within [kernel] max_runs)
    kill_grace: float = Field(default=10.0, ge=0, le=3600, allow_inf_nan=False)  # SIGTERM -> SIGKILL, seconds
    # Seconds an agent may go without a heartbeat (a stdout line, a CLI verb or MCP call with its token) before
    # it is stopped as hung, long before `timeout`. None: no heartbeat is expected.
    heartbeat_timeout: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    non_retryable_exit_codes: list[Annotated[int, Field(ge=1, le=255)]] = Field(default_factory=list)  # block at once
    # Preset options (docs/agents.md); `argv` replaces the preset's whole command line.
    model: str | None = Field(default=None, min_length=1)
    variant: str | None = Field(default=None, min_length=1)  # one of the profile's named variants
    args: list[str] = Field(default_factory=list)  # appended to the preset's command line
    allowed_tools: list[str] = Field(default_factory=list)  # the CLI's own tool names, on top of the kernel's
    # A re-run of the task continues the CLI's own conversation where its profile can (docs/people-in-the-loop.md)
    resume_conversation: bool = True
    # None: a worktree per task for a preset when the workspace is in a git repository, else shared
    isolation: Isolation | None = Field(default=None, strict=False)
    base_branch: str | None = Field(default=None, min_length=1)  # default: the branch checked out at the workspace
    on_approve: OnApprove = Field(default=OnApprove.KEEP, strict=False)
    prompt: str | None = Field(default=None, min_length=1)  # template with PROMPT_FIELDS; default: runners/prompt.py
    mcp: bool = True  # give the agent the kernel's MCP server (False: it reports with the CLI verbs)
    _profile: AgentProfile | None = PrivateAttr(default=None)  # a user's [profiles.<name>], set when the file loads

    @property
    def spawns(self) -> bool:
        """An agent process the coordinator starts (every runner but the in-process scripted one)."""
        return self.runner != RunnerKind.SCRIPTED

    @property
    def is_preset(self) -> bool:
        """The runner is an agent CLI's profile (not the owner's command, not the scripted agent)."""
        return self.runner not in (RunnerKind.COMMAND, RunnerKind.SCRIPTED)

    @property
    def profile(self) -> AgentProfile | None:
        """The profile ``runner`` names: the file's own, else the built-in one (None: command, scripted, or a name
        no profile has, which the file's check reports)."""
        if self._profile is not None or not self.is_preset:
            return self._profile
        return builtin_profiles().get(self.runner)

    @model_validator(mode="after")
    def _consistent(self) -> RunnerSpec:
        if self.runner == RunnerKind.COMMAND and (not self.argv or not self.argv[0]):
            raise KeyProblem("argv", "a command runner needs argv = [\"program\", …] (its first element: the "
                             "program)")
        if self.spawns:
            if "argv" in self.model_fields_set and (not self.argv or not self.argv[0]):
                raise KeyProblem("argv", "argv replaces the preset's command line: give the program first")
            for arg in self.argv:
                if problem := placeholder_problem(arg):
                    raise KeyProblem("argv", f"argv: {problem}")
            if self.prompt is not None and (problem := placeholder_problem(self.prompt, PROMPT_FIELDS)):
                raise KeyProblem("prompt", f"prompt: {problem}")
            if self.on_approve is OnApprove.MERGE and self.isolation_in(repository=True) is Isolation.SHARED:
                raise KeyProblem("on_approve", "on_approve = \"merge\" merges a task's branch: it needs "
                                 "isolation = \"worktree\"")
            if self.isolation is Isolation.WORKTREE and self.run_as is not None:
                raise KeyProblem("isolation", "isolation = \"worktree\" with run_as is not supported: the "
                                 "worktree and its branch belong to the coordinator's OS user")
        else:
            given = [k for k in _SPAWN_ONLY if k in self.model_fields_set]
            if given:
                raise KeyProblem(given[0], f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} to "
                                 "runners that start a program only (a scripted agent runs inside the coordinator)")
        if not self.is_preset:
            given = [k for k in _PRESET_ONLY if k in self.model_fields_set]
            if given:
                raise KeyProblem(given[0], f"{given[0]} is an agent CLI's option (a profile's, e.g. claude-code), "
                                 f"not one of a {self.runner} runner")
        for key, names in (("env", list(self.env)), ("pass_env", self.pass_env)):
            for name in names:
                if not _ENV_NAME.fullmatch(name):
                    raise KeyProblem(key, f"{key}: {name!r} is not an environment variable name")
                if name.upper().startswith(RESERVED_ENV_PREFIX):
                    raise KeyProblem(key, f"{key}: {name} is set by the runner (the run's token and task; never "
                                     "the database URL)")
        return self

    def isolation_in(self, repository: bool) -> Isolation:
        """The role's isolation: as set, else a worktree per task for a preset when the workspace is in a git
        ``repository`` (not with run_as, whose agent could not write the coordinator's worktree), else shared."""
        if self.isolation is not None:
            return self.isolation
        if self.is_preset and repository and self.run_as is None:
            return Isolation.WORKTREE
        return Isolation.SHARED

    @property
    def lease_seconds(self) -> float:
        """A run's lease outlives its timeout unless the owner sets it: the coordinator renews it while the
        agent runs, and a lease that lapses means another coordinator terminates the agent and re-runs."""
        return self.lease if self.lease is not None else self.timeout + 60.0


class TaskkernelConfig(Table):
    """The whole file. Every table is optional; an empty file is a valid (all defaults) configuration."""

    kernel: KernelTable = Field(default_factory=KernelTable)
    team: TeamTable | None = None
    roles: dict[str, RunnerSpec] = Field(default_factory=dict)
    profiles: dict[str, AgentProfile] = Field(default_factory=dict)  # agent CLIs besides the built-in ones
    gate: GateTable = Field(default_factory=GateTable)
    folders: FoldersTable = Field(default_factory=FoldersTable)
    scheduler: SchedulerTable = Field(default_factory=SchedulerTable)
    mcp: McpTable = Field(default_factory=McpTable)
    serve: ServeTable = Field(default_factory=ServeTable)
    worktrees: WorktreesTable = Field(default_factory=WorktreesTable)
    _lines: dict[tuple[str, str | None], int] = PrivateAttr(default_factory=dict)

    def line_of(self, table: str | None, key: str | None = None) -> int | None:
        """The line a table (or a key in it) is on in the file this came from, when it can be told."""
        return _line(self._lines, table, key)

    def problem(self, table: str | None, key: str | None, text: str, suggestion: str | None = None) -> Problem:
        return Problem(table, key, text, self.line_of(table, key), suggestion)


TABLES: dict[str, type[BaseModel]] = {
    "kernel": KernelTable, "team": TeamTable, "roles": RunnerSpec, "profiles": AgentProfile, "gate": GateTable,
    "folders": FoldersTable, "scheduler": SchedulerTable, "mcp": McpTable, "serve": ServeTable,
    "worktrees": WorktreesTable}


# -- loading -----------------------------------------------------------------------------------------


def load_config(path: Path) -> TaskkernelConfig:
    """Read and validate ``path``; raises ``ConfigError`` (never tomllib's or pydantic's errors)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}", code=CONFIG_UNREADABLE, path=path) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{CONFIG_NAME} is not UTF-8 text (byte {exc.start}); TOML files are UTF-8",
                          path=path) from None
    return parse_config(text, path)


def parse_config(source: str | Mapping[str, Any], path: Path | None = None) -> TaskkernelConfig:
    """Validate TOML text (or an already parsed document) into the model; raises ``ConfigError``."""
    text = source if isinstance(source, str) else ""
    if isinstance(source, str):
        try:
            data: Mapping[str, Any] = tomllib.loads(source)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{CONFIG_NAME} is not valid TOML: {exc}", path=path) from None
    else:
        data = source
    lines = _index(text)
    try:
        config = TaskkernelConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError.of([_problem(e, data, lines) for e in exc.errors(include_url=False)], path=path) from None
    config._lines = lines
    problems = file_problems(config)
    if problems:
        raise ConfigError.of(problems, path=path)
    return config


def file_problems(config: TaskkernelConfig) -> list[Problem]:
    """What the model's types cannot say: the team's roles and leader, role names of [roles.X] and [gate] roles."""
    out: list[Problem] = []
    team = config.team
    if team is not None:
        for role in team.roles:
            if why := _not_a_team_role(role):
                out.append(config.problem("team", "roles", f"roles: {json.dumps(role)} {why}"))
        if len(set(team.roles)) != len(team.roles):
            twice = sorted({r for r in team.roles if team.roles.count(r) > 1})
            out.append(config.problem("team", "roles", f"roles: {', '.join(twice)} listed twice"))
        if team.leader not in team.roles:
            guess = near(team.leader, team.roles)
            out.append(config.problem("team", "leader", f"leader must be one of its roles {team.roles}, not "
                                      f"{json.dumps(team.leader)}" + (f"; did you mean {guess}?" if guess else ""),
                                      guess))
    out += _profile_problems(config)
    seen: dict[str, str] = {}
    for name in config.roles:
        table = f"roles.{name}"
        if why := _not_a_team_role(name.upper()):
            out.append(config.problem(table, None, f"{name} {why}"))
        elif name.upper() in seen:
            out.append(config.problem(table, None, f"the same role as [roles.{seen[name.upper()]}]"))
        seen.setdefault(name.upper(), name)
    for name in config.gate.roles:
        if why := _not_a_team_role(name):
            out.append(config.problem("gate", "roles", f"roles: {name} {why}"))
    return out


def _profile_problems(config: TaskkernelConfig) -> list[Problem]:
    """Profile names, and each role's runner, variant and allowed_tools against the profile it names (whose own
    table the model checked); a role of the file's own profile gets it here."""
    out: list[Problem] = []
    for name in config.profiles:
        if not PROFILE_NAME.fullmatch(name) or name in {k.value for k in RunnerKind}:
            out.append(config.problem(f"profiles.{name}", None, f"{json.dumps(name)} is not a profile name (lower-"
                                      "case letters, digits and hyphens; not command or scripted)"))
    known = {**builtin_profiles(), **config.profiles}
    for role, spec in config.roles.items():
        table = f"roles.{role}"
        if not spec.is_preset:
            continue
        profile = known.get(spec.runner)
        if profile is None:
            names = [RunnerKind.COMMAND.value, RunnerKind.SCRIPTED.value, *known]
            guess = near(spec.runner, names)
            out.append(config.problem(table, "runner", f"runner = {json.dumps(spec.runner)} is not a runner "
                                      f"taskkernel knows ({', '.join(names)}; or a [profiles.<name>] table)"
                                      + (f"; did you mean {json.dumps(guess)}?" if guess else ""), guess))
            continue
        spec._profile = config.profiles.get(spec.runner)
        if spec.variant is not None and spec.variant not in profile.variants:
            guess = near(spec.variant, list(profile.variants))
            out.append(config.problem(table, "variant", f"variant = {json.dumps(spec.variant)} is not a variant of "
                                      f"{spec.runner} ({', '.join(profile.variants) or 'it has none'})"
                                      + (f"; did you mean {json.dumps(guess)}?" if guess else ""), guess))
        if spec.allowed_tools and not profile.tools_argv:
            out.append(config.problem(table, "allowed_tools", f"allowed_tools: {spec.runner} has no allowlist of "
                                      "tools (its sandbox decides what its commands may do; docs/agents.md)"))
    return out


def _not_a_team_role(code: str) -> str | None:
    if code in NOT_TEAM:
        return f"is not a team role ({', '.join(sorted(NOT_TEAM))} are reserved: the owner, the system, a broadcast)"
    if not is_role_code(code) or len(code) > MAX_ROLE_LEN:
        return (f"is not a role code (upper-case letters, digits, _ and inner hyphens, at most {MAX_ROLE_LEN} "
                "characters)")
    return None


# -- messages ----------------------------------------------------------------------------------------

_HEADER = re.compile(r"""^\[\[?\s*((?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*'))*)"""
                     r"""\s*\]\]?\s*(?:#.*)?$""")
_KEY = re.compile(r"""^((?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*'))*)\s*=""")


def _dotted(path: str) -> list[str]:
    return [p.strip().strip("\"'") for p in re.findall(r"""[A-Za-z0-9_-]+|"[^"]*"|'[^']*'""", path)]


def _index(text: str) -> dict[tuple[str, str | None], int]:
    """Where each table header and each key is, by (table, key): enough to point at a line, never a parser."""
    found: dict[tuple[str, str | None], int] = {}
    table = ""
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if header := _HEADER.match(line):
            table = ".".join(_dotted(header.group(1)))
            found.setdefault((table, None), number)
        elif key := _KEY.match(line):
            parts = _dotted(key.group(1))
            owner = ".".join([p for p in (table,) if p] + parts[:-1])
            found.setdefault((owner, parts[-1]), number)
            if len(parts) > 1:
                found.setdefault((owner, None), number)
    return found


def _line(lines: Mapping[tuple[str, str | None], int], table: str | None, key: str | None) -> int | None:
    table = table or ""
    if key is not None and (table, key) in lines:
        return lines[(table, key)]
    if (table, None) in lines:
        return lines[(table, None)]
    parent, _, last = table.rpartition(".")
    if last and (parent, last) in lines:  # an inline table: roles.DEV = { ... } or DEV = { ... } under [roles]
        return lines[(parent, last)]
    return None


def _where(loc: Sequence[str | int]) -> tuple[str | None, str | None, list[str | int]]:
    """(table, key, the rest of the path inside the key) of a pydantic error location."""
    if not loc:
        return None, None, []
    if loc[0] == "profiles" and len(loc) >= 4 and loc[2] == "variants":
        return f"profiles.{loc[1]}.variants.{loc[3]}", (str(loc[4]) if len(loc) > 4 else None), list(loc[5:])
    if loc[0] in ("roles", "profiles") and len(loc) >= 2:
        return f"{loc[0]}.{loc[1]}", (str(loc[2]) if len(loc) > 2 else None), list(loc[3:])
    if len(loc) == 1:
        return str(loc[0]), None, []
    return str(loc[0]), str(loc[1]), list(loc[2:])


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        text = json.dumps(value)
        return text if len(text) <= 60 else text[:57] + "…"
    if isinstance(value, dict):
        return "a table"
    return "a list" if isinstance(value, list) else type(value).__name__


_EXPECTED = {
    "bool_type": "true or false", "string_type": "a string", "int_type": "an integer", "float_type": "a number",
    "list_type": "a list", "dict_type": "a table", "model_type": "a table", "finite_number": "a finite number",
}


def _problem(err: Any, data: Mapping[str, Any], lines: Mapping[tuple[str, str | None], int]) -> Problem:
    loc = [p for p in err.get("loc", ()) if p != "[key]"]
    table, key, rest = _where(loc)
    kind, ctx = err.get("type"), err.get("ctx") or {}
    if kind == "extra_forbidden":
        return _unknown(table, key, loc, data, lines)
    if key is None and isinstance(ctx.get("error"), KeyProblem):  # its message names its key itself
        return Problem(table, ctx["error"].key, str(ctx["error"]), _line(lines, table, ctx["error"].key))
    subject = ".".join([key, *(str(r) for r in rest)]) if key else ""
    value = err.get("input")
    if kind in ("dict_type", "model_type") and len(loc) == 2 and loc[0] == "roles":
        return Problem("roles", str(loc[1]), f"{loc[1]} = {_shown(value)} is not a role's table: each role is a "
                       "[roles.<ROLE>] table (e.g. [roles.DEV] with runner = \"scripted\")",
                       _line(lines, "roles", str(loc[1])))
    if kind == "missing":
        text = f"{subject} is required"
    elif kind in ("literal_error", "enum"):
        text = f"{subject} must be {str(ctx.get('expected', '')).replace(chr(39), chr(34))} (got {_shown(value)})"
    elif kind in _EXPECTED:
        what = subject or f"[{table}]"
        text = f"{what} must be {_EXPECTED[kind]} (got {_shown(value)})"
    elif kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        bound = {"greater_than": "greater than", "greater_than_equal": "at least", "less_than": "less than",
                 "less_than_equal": "at most"}[kind]
        limit = next(iter(ctx.values()), "")
        text = f"{subject} must be {bound} {limit} (got {_shown(value)})"
    elif kind in ("too_short", "string_too_short"):
        text = f"{subject} must not be empty"
    elif kind == "string_too_long":
        text = f"{subject} is too long (at most {ctx.get('max_length')} characters)"
    else:
        msg = str(err.get("msg", "")).removeprefix("Value error, ")
        text = f"{subject}: {msg}" if subject else msg
    return Problem(table, key, text, _line(lines, table, key))


def _unknown(table: str | None, key: str | None, loc: Sequence[str | int], data: Mapping[str, Any],
             lines: Mapping[tuple[str, str | None], int]) -> Problem:
    """An unknown table or key, with the near miss."""
    if len(loc) == 1:  # a top-level name: a misspelled table, or a key outside any table
        name = str(loc[0])
        value = data.get(name)
        if isinstance(value, dict):
            guess = near(name, list(TABLES))
            subs = [k for k, v in value.items() if isinstance(v, dict)]
            shown = f"{name}.{subs[0]}" if subs and not set(value) - set(subs) else name
            fixed = f"{guess}{shown[len(name):]}" if guess else None
            return Problem(None, name, f"[{shown}] is not a table taskkernel knows"
                           + (f"; did you mean [{fixed}]?" if fixed else f" (tables: {', '.join(TABLES)})"),
                           _line(lines, shown, None) or _line(lines, name, None), f"[{fixed}]" if fixed else None)
        owner = next((t for t, model in TABLES.items() if name in model.model_fields and t != "roles"), None)
        return Problem(None, name, f"{name} is outside any table"
                       + (f"; did you mean to put it under [{owner}]?" if owner else
                          f" and is not a key taskkernel knows (tables: {', '.join(TABLES)})"),
                       _line(lines, "", name), f"[{owner}] {name}" if owner else None)
    model: type[BaseModel] = Variant if ".variants." in (table or "") else TABLES.get((table or "").split(".")[0],
                                                                                     BaseModel)
    known = list(model.model_fields)
    guess = near(str(key), known)
    where = f"{table}" if table else ""
    return Problem(where, key, f"{key} is not a key taskkernel knows"
                   + (f"; did you mean {guess}?" if guess else f" (keys: {', '.join(known)})"),
                   _line(lines, table, key), guess)
