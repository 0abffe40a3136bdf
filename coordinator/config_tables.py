"""The model of taskkernel.toml (docs/config.md): every table of the file as a strict pydantic model, unknown keys
forbidden, the agent profiles' and the roles' tables included, and ``TaskkernelConfig``, the whole file.

The only module of the file that imports pydantic: ``taskkernel.coordinator.config`` reads the file, validates it
with these models when its bytes are new and re-exports them; a command that finds the file validated before (the
cache, docs/config.md) reads its values without loading pydantic. Every model defers its schema until it first
validates (``defer_build``): a cache hit rebuilds the models with ``model_construct`` and never builds one."""

from __future__ import annotations

import json
import re
import string
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from taskkernel.coordinator.agent_profiles import McpFormat, OutputKind, builtin_profiles
from taskkernel.coordinator.config import (
    PROMPT_FIELDS,
    RESERVED_ENV_PREFIX,
    Isolation,
    KeyProblem,
    OnApprove,
    Problem,
    RunnerKind,
    argv_fields,
    line_in,
    near,
    placeholder_problem,
)

RISK_LEVELS = ("low", "medium", "high")  # irreversible tasks protect every operation: nothing to configure


class Table(BaseModel):
    """A table of taskkernel.toml: unknown keys are errors, values taken strictly (no "600" for 600)."""

    model_config = ConfigDict(extra="forbid", strict=True, defer_build=True)


class KernelTable(Table):
    """``[kernel]``: where the store is and how it behaves."""

    durability: Literal["full", "process"] = "full"
    # Absent: a workspace written before the setting existed keeps the old meaning (no token = the local owner).
    require_token: bool = False
    database: str | None = Field(default=None, min_length=1)
    max_runs: int = Field(default=4, ge=1, le=256)  # agent runs at once in this coordinator, all roles together
    # Seconds `up` waits after the first SIGINT/SIGTERM for running agents to finish before stopping them.
    shutdown_grace: float = Field(default=30.0, ge=0, le=86400, allow_inf_nan=False)

    @field_validator("database")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None:
            from sqlalchemy.engine import make_url  # only when a URL is configured
            from sqlalchemy.exc import ArgumentError

            try:
                make_url(value)
            except ArgumentError:
                raise ValueError("not a database URL (sqlite:///path/to/file.db or "
                                 "postgresql+psycopg://user@host/db)") from None
        return value


class TeamTable(Table):
    """``[team]``: used when the FCoP folder has no fcop.json (which takes precedence)."""

    name: str = Field(default="custom", min_length=1)
    leader: str
    roles: list[str] = Field(min_length=1)


class GateTable(Table):
    """``[gate]``: the session grants are read from and which operations need a grant (docs/gate.md)."""

    session: str = Field(default="admin", min_length=1, max_length=200)
    protected: dict[str, list[str]] = Field(default_factory=dict)  # risk level -> operations needing a grant
    roles: dict[str, list[str]] = Field(default_factory=dict)  # role -> operations protected for it too

    @field_validator("protected")
    @classmethod
    def _levels(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        for key in value:
            if key == "irreversible":
                raise ValueError("irreversible tasks protect every operation already: nothing to configure")
            if key not in RISK_LEVELS:
                guess = near(key, RISK_LEVELS)
                raise ValueError(f"{key} is not a risk level ({', '.join(RISK_LEVELS)})"
                                 + (f"; did you mean {guess}?" if guess else ""))
        return value

    @field_validator("protected", "roles")
    @classmethod
    def _operations(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        for key, ops in value.items():
            if any(not op.strip() or op != op.strip() for op in ops):
                raise ValueError(f"{key}: operations are non-empty names without surrounding spaces (\"*\": all)")
        return value


class FoldersTable(Table):
    """``[folders]``: the FCoP folder adapter."""

    enabled: bool = True
    submit_on_done_report: bool = True


class SchedulerTable(Table):
    """``[scheduler]``: the durable automations."""

    max_clock_skew: str | int | None = None  # a duration ("1d", "6h") or seconds; default one day

    @field_validator("max_clock_skew")
    @classmethod
    def _duration(cls, value: str | int | None) -> str | int | None:
        if value is not None:
            from taskkernel.scheduler.models import SchedulerException, parse_duration

            try:
                parse_duration(value)
            except SchedulerException as exc:
                raise ValueError(exc.message) from None
        return value

    def as_mapping(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


MIN_OUTPUT_BUDGET = 1024  # a refusal, a summary and a cursor must always fit
MAX_OUTPUT_BUDGET = 16 * 2**20


class McpTable(Table):
    """``[mcp]``: the MCP server (`taskkernel mcp`, docs/mcp.md)."""

    # Bytes of one tool result's structured content; past it lists are cut (truncated, next_cursor) and long
    # texts are cut with a pointer to get_task.
    output_budget: int = Field(default=16384, ge=MIN_OUTPUT_BUDGET, le=MAX_OUTPUT_BUDGET)


class ServeTable(Table):
    """``[serve]``: the web board (`taskkernel serve`, docs/web.md)."""

    # Every page and API route needs a signed-in credential (else 401 / the sign-in page). Required before the
    # board may listen beyond loopback (--host other than 127.0.0.1/::1/localhost).
    require_login: bool = False
    # Host names the board answers besides the address it listens on (and, on loopback, 127.0.0.1, localhost and
    # ::1): the public name a TLS proxy in front passes on. Any other Host is refused (DNS rebinding).
    hosts: list[Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9.:\[\]-]+$")]] = Field(
        default_factory=list)


class HostTable(Table):
    """``[hosts.NAME]``: one machine of a team whose coordinators share a PostgreSQL store (`taskkernel up --host
    NAME`, docs/hosts.md). A host runs agents only for the roles it lists; without a ``[hosts]`` table every
    coordinator runs every role."""

    roles: list[str] = Field(min_length=1)  # [roles.X] tables whose agents run on this host
    slots: dict[str, Annotated[int, Field(ge=1, le=256)]] = Field(default_factory=dict)  # per role; default its
    # concurrency
    max_runs: int | None = Field(default=None, ge=1, le=256)  # runs at once on this host; default [kernel] max_runs


# Untracked files a worktree never commits (gitignore syntax), on top of the repository's own ignore rules: the
# caches and environments tools write while an agent works (pytest, mypy, ruff, tox, pip, npm), which no
# repository means to track. A tracked file stays tracked: ignore rules only apply to untracked files.
DEFAULT_EXCLUDES = (
    "__pycache__/", "*.py[cod]", "*$py.class", ".venv/", "venv/", ".tox/", ".nox/", ".pytest_cache/",
    ".mypy_cache/", ".ruff_cache/", ".pytype/", ".hypothesis/", ".ipynb_checkpoints/", ".coverage", ".coverage.*",
    "htmlcov/", "*.egg-info/", ".eggs/", "node_modules/", ".parcel-cache/", ".eslintcache", ".gradle/",
    ".DS_Store", "Thumbs.db",
)
_PATTERN_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class WorktreesTable(Table):
    """``[worktrees]``: what a task's worktree never commits (docs/agents.md#what-a-worktree-commits)."""

    exclude: list[str] = Field(default_factory=list)  # gitignore patterns added to DEFAULT_EXCLUDES
    drop_defaults: list[str] = Field(default_factory=list)  # entries of DEFAULT_EXCLUDES this workspace commits

    @field_validator("exclude")
    @classmethod
    def _patterns(cls, value: list[str]) -> list[str]:
        for pattern in value:
            if not pattern.strip() or pattern != pattern.strip():
                raise ValueError(f"{pattern!r}: a pattern is not empty and has no surrounding spaces")
            if _PATTERN_CONTROL.search(pattern):
                raise ValueError(f"{pattern!r}: a pattern holds no line break or control character")
            if pattern.startswith("#"):
                raise ValueError(f"{pattern!r} would be a comment in an ignore file; write \\# for a leading #")
        return value

    @field_validator("drop_defaults")
    @classmethod
    def _defaults(cls, value: list[str]) -> list[str]:
        for pattern in value:
            if pattern not in DEFAULT_EXCLUDES:
                guess = near(pattern, DEFAULT_EXCLUDES)
                raise ValueError(f"{pattern!r} is not one of the default excludes"
                                 + (f"; did you mean {guess!r}?" if guess else f" ({', '.join(DEFAULT_EXCLUDES)})"))
        return value

    def patterns(self) -> list[str]:
        """The patterns a worktree's ``git add`` and ``git status`` ignore: the defaults this workspace keeps,
        then its own (later lines win, so a ``!pattern`` of its own can re-include what a default hid)."""
        return [p for p in DEFAULT_EXCLUDES if p not in self.drop_defaults] + self.exclude


# -- agent CLI profiles ([profiles.<name>]: docs/agents.md, "Profiles") ------------------------------------

_VAR = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# What an agent profile's command-line templates may name; each list of the profile says which of these it fills.
ARGV_FIELDS = ("workdir", "prompt_file", "prompt", "mcp_config", "config_home", "usage_file")
_FIELDS = {
    "argv": ARGV_FIELDS,
    "model_argv": ("model",),
    "reasoning_argv": ("reasoning",),
    "sandbox_argv": ("sandbox",),
    "tools_argv": ("tools",),
    "mcp_argv": ("mcp_config", "server", "command_json", "args_json", "config_home"),
    "resume_argv": ("session_id",),
}


class Variant(Table):
    """``[profiles.<name>.variants.<variant>]``: a named way to run the CLI, picked by a role's ``variant``."""

    model: str | None = Field(default=None, min_length=1)
    reasoning: str | None = Field(default=None, min_length=1)  # reasoning effort, where the CLI has one
    sandbox: str | None = Field(default=None, min_length=1)  # the CLI's own sandbox or permission mode
    args: list[str] = Field(default_factory=list)  # appended to the command line


class AgentProfile(Table):
    """One agent CLI, as data. Every list of command-line templates is added only when what it names is known
    (``model_argv`` when a model is chosen, ``mcp_argv`` when the run has the kernel's MCP server, …)."""

    program: str = Field(min_length=1)
    package: str | None = Field(default=None, min_length=1)  # where it is installed from (npm), for docs/doctor
    argv: list[str] = Field(default_factory=list)  # after the program
    prompt: Literal["stdin", "argv"] = "stdin"  # argv: a template names {prompt} or {prompt_file}
    model_argv: list[str] = Field(default_factory=list)
    reasoning_argv: list[str] = Field(default_factory=list)
    sandbox: str | None = Field(default=None, min_length=1)  # the default sandbox or permission mode
    sandbox_argv: list[str] = Field(default_factory=list)
    tools_argv: list[str] = Field(default_factory=list)  # {tools}: the role's allowed_tools, with kernel_tools
    kernel_tools: str | None = Field(default=None, min_length=1)  # the allowlist entry naming the kernel's tools
    mcp_format: McpFormat = Field(default=McpFormat.MCP_SERVERS, strict=False)
    mcp_argv: list[str] = Field(default_factory=list)
    mcp_env: str | None = None  # a variable naming the configuration file
    config_home: str | None = None  # a variable naming a per-run configuration folder the CLI reads …
    mcp_file: str | None = Field(default=None, min_length=1)  # … and the file within it the configuration goes to
    credential_vars: list[str] = Field(default_factory=list)  # the provider's variables, passed when set
    switched_vars: dict[str, list[str]] = Field(default_factory=dict)  # passed only when the key variable is set
    when_set: dict[str, list[str]] = Field(default_factory=dict)  # argv added when the variable is set ({value})
    env: dict[str, str] = Field(default_factory=dict)  # fixed variables (no telemetry, no update check)
    output: OutputKind = Field(default=OutputKind.USAGE_JSON, strict=False)
    resume_argv: list[str] = Field(default_factory=list)  # how a session is resumed, where the CLI can
    variants: dict[str, Variant] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self) -> AgentProfile:
        for key, known in _FIELDS.items():
            for arg in getattr(self, key):
                if problem := _template_problem(arg, known):
                    raise KeyProblem(key, f"{key}: {problem}")
        for arg in (a for args in self.when_set.values() for a in args):
            if problem := _template_problem(arg, ("value", "value_json")):
                raise KeyProblem("when_set", f"when_set: {problem}")
        for key, names in (("credential_vars", self.credential_vars), ("switched_vars", list(self.switched_vars)),
                           ("when_set", list(self.when_set)), ("env", list(self.env)),
                           ("mcp_env", [self.mcp_env] if self.mcp_env else []),
                           ("config_home", [self.config_home] if self.config_home else [])):
            for name in names:
                if not _VAR.fullmatch(name) or name.upper().startswith("TASKKERNEL_"):
                    raise KeyProblem(key, f"{key}: {name!r} is not a variable a profile may name")
        if self.prompt == "argv" and not any({"prompt", "prompt_file"} & argv_fields(a) for a in self.argv):
            raise KeyProblem("prompt", 'prompt = "argv": name {prompt} or {prompt_file} in argv')
        if self.mcp_file is not None and (PurePosixPath(self.mcp_file).is_absolute()
                                          or ".." in PurePosixPath(self.mcp_file).parts):
            raise KeyProblem("mcp_file", f"mcp_file {json.dumps(self.mcp_file)}: a path inside the run's "
                             "configuration home (relative, no ..)")
        if (self.mcp_file is None) != (self.config_home is None):
            raise KeyProblem("mcp_file", "config_home and mcp_file go together: the folder's variable and the "
                             "file in it")
        if self.mcp_format is not McpFormat.NONE and not (
                self.mcp_env or self.mcp_file or any("mcp_config" in argv_fields(a) for a in self.mcp_argv)):
            raise ValueError("the MCP configuration must reach the CLI: name {mcp_config} in mcp_argv, or set "
                             "mcp_env, or config_home with mcp_file")
        if self.sandbox_argv and self.sandbox is None:
            raise KeyProblem("sandbox_argv", "sandbox_argv needs a default sandbox")
        return self


def _template_problem(arg: str, known: tuple[str, ...]) -> str | None:
    try:
        fields = [(f, spec, conv) for _, f, spec, conv in string.Formatter().parse(arg) if f is not None]
    except ValueError as exc:
        return f"{json.dumps(arg)} is not a valid template ({exc}); write {{{{ and }}}} for literal braces"
    if any(spec or conv for _, spec, conv in fields):
        return f"{json.dumps(arg)}: placeholders take no conversion or format spec ({{name}} only)"
    names = {f for f, _, _ in fields}
    unknown = sorted(names - set(known))
    if unknown:
        return (f"{{{unknown[0]}}} in {json.dumps(arg)} is not filled here (known: "
                + " ".join(f"{{{k}}}" for k in known) + ")")
    return None


# -- the roles' tables and the whole file ----------------------------------------------------------------------

_SPAWN_ONLY = ("argv", "cwd", "env", "pass_env", "run_as", "kill_grace", "heartbeat_timeout",
               "non_retryable_exit_codes", "isolation", "base_branch", "on_approve", "prompt", "mcp", "args")
_PRESET_ONLY = ("model", "allowed_tools", "args", "variant", "resume_conversation")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


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
    hosts: dict[str, HostTable] = Field(default_factory=dict)  # the team's machines on one shared store
    _lines: dict[tuple[str, str | None], int] = PrivateAttr(default_factory=dict)

    def line_of(self, table: str | None, key: str | None = None) -> int | None:
        """The line a table (or a key in it) is on in the file this came from, when it can be told."""
        return line_in(self._lines, table, key)

    def problem(self, table: str | None, key: str | None, text: str, suggestion: str | None = None) -> Problem:
        return Problem(table, key, text, self.line_of(table, key), suggestion)


TABLES: dict[str, type[BaseModel]] = {
    "kernel": KernelTable, "team": TeamTable, "roles": RunnerSpec, "profiles": AgentProfile, "gate": GateTable,
    "folders": FoldersTable, "scheduler": SchedulerTable, "mcp": McpTable, "serve": ServeTable,
    "worktrees": WorktreesTable, "hosts": HostTable}
