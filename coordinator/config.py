"""taskkernel.toml: reading it, its errors and their messages (docs/config.md).

Every table and key the code reads is declared in the file's model (config_tables.py, the one pydantic module of
the file, re-exported here); anything else is an error, never silently ignored. A file that is not TOML, or does
not fit the model, is one ``ConfigError`` whose message names the file, the table, the key and the line, and
suggests the near miss (``taskkernel.toml, line 5: [rols.PM] is not a table taskkernel knows; did you mean
[roles.PM]?``). Nothing here loads pydantic until a file is validated: a file whose exact bytes this code
validated before is read from the workspace's cache as plain values (``CheckedConfig``; workspace.py).

What is checked here depends on the file alone, so every command checks it the same way, whoever runs it. What
depends on the machine and the team (a runner's binary on PATH, its OS user, its working folder, a role the team
has) is checked by `up` before it starts and by `doctor` (taskkernel.coordinator.runners.config).
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum, StrEnum
from functools import cache
from pathlib import Path
from types import UnionType
from typing import TYPE_CHECKING, Annotated, Any, Union, get_args, get_origin

if TYPE_CHECKING:  # re-exported below (__getattr__)
    from pydantic import BaseModel

    from taskkernel.coordinator.config_tables import (
        DEFAULT_EXCLUDES as DEFAULT_EXCLUDES,
    )
    from taskkernel.coordinator.config_tables import (
        TABLES as TABLES,
    )
    from taskkernel.coordinator.config_tables import (
        FoldersTable as FoldersTable,
    )
    from taskkernel.coordinator.config_tables import (
        GateTable as GateTable,
    )
    from taskkernel.coordinator.config_tables import (
        KernelTable as KernelTable,
    )
    from taskkernel.coordinator.config_tables import (
        McpTable as McpTable,
    )
    from taskkernel.coordinator.config_tables import (
        RunnerSpec as RunnerSpec,
    )
    from taskkernel.coordinator.config_tables import (
        SchedulerTable as SchedulerTable,
    )
    from taskkernel.coordinator.config_tables import (
        ServeTable as ServeTable,
    )
    from taskkernel.coordinator.config_tables import (
        Table as Table,
    )
    from taskkernel.coordinator.config_tables import (
        TaskkernelConfig as TaskkernelConfig,
    )
    from taskkernel.coordinator.config_tables import (
        TeamTable as TeamTable,
    )
    from taskkernel.coordinator.config_tables import (
        WorktreesTable as WorktreesTable,
    )

    NOT_TEAM: frozenset[str]

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
MAX_ROLE_LEN = 32  # the kernel's role codes (kernel/model/commands.py)
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


class KeyProblem(ValueError):
    """A model-level check that can name the key it is about (so the message points at that key's line)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


def near(word: str, candidates: Sequence[str]) -> str | None:
    """The candidate ``word`` is most likely a misspelling of (case-insensitive), if any is close enough."""
    import difflib

    lowered = {c.lower(): c for c in candidates}
    found = difflib.get_close_matches(word.lower(), list(lowered), n=1, cutoff=0.6)
    return lowered[found[0]] if found else None


@cache
def not_team() -> frozenset[str]:
    """The human owner, the system and a broadcast: no team roles (``NOT_TEAM``)."""
    from taskkernel.coordinator.fcop.filenames import BROADCAST, RESERVED_ROLES

    return RESERVED_ROLES | {BROADCAST}


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


HOST_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"  # [hosts.NAME], `up --host NAME` (docs/hosts.md)


class OnApprove(StrEnum):
    MERGE = "merge"  # merge the task branch into the base when the task is approved
    KEEP = "keep"  # leave the branch for a person to merge


# -- loading -----------------------------------------------------------------------------------------

# The models live in config_tables.py (the file's one pydantic module), loaded on first use: re-exported here.
_MODELS = ("DEFAULT_EXCLUDES", "TABLES", "FoldersTable", "GateTable", "HostTable", "KernelTable", "McpTable",
           "RunnerSpec", "SchedulerTable", "ServeTable", "Table", "TaskkernelConfig", "TeamTable", "WorktreesTable")
__all__ = [*_MODELS, "CONFIG_NAME", "CheckedConfig", "ConfigError", "KeyProblem", "NOT_TEAM", "Problem",
           "WorkspaceNotFound", "load_config", "parse_config", "read_bytes", "validate_bytes"]


def __getattr__(name: str) -> Any:
    """The models (and ``NOT_TEAM``), loaded on first use (PEP 562): reading a validated file needs neither."""
    if name in _MODELS:
        from taskkernel.coordinator import config_tables

        return getattr(config_tables, name)
    if name == "NOT_TEAM":
        return not_team()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class CheckedConfig:
    """A validated taskkernel.toml: its values as plain data (``setting``: what start-up reads, without pydantic)
    and its models (``config``). Kept as plain data by the workspace's cache (``plain``/``from_plain``); from
    there the models are rebuilt on first use with ``model_construct``: nothing validated twice, no schema built.
    Only ever made from a ``TaskkernelConfig`` that validated, or from the plain data of one."""

    def __init__(self, values: dict[str, Any], given: dict[str, Any], lines: list[list[Any]],
                 config: TaskkernelConfig | None = None, source: tuple[bytes, Path] | None = None) -> None:
        self.values = values  # model_dump(mode="json"): every table, defaults included
        self.given = given  # the fields the file set, at every level (model_fields_set)
        self.lines = lines  # [table, key, line] (TaskkernelConfig.line_of)
        self._config = config
        self.source = source  # the file's bytes and path, to validate in full if the plain data will not build

    @classmethod
    def of(cls, config: TaskkernelConfig) -> CheckedConfig:
        return cls(config.model_dump(mode="json"), _given(config), [[t, k, n] for (t, k), n in config._lines.items()],
                   config)

    @classmethod
    def from_plain(cls, data: Any, source: tuple[bytes, Path] | None = None) -> CheckedConfig:
        """From ``plain()``'s data; raises ValueError when it is not shaped so (a damaged or foreign cache)."""
        if not (isinstance(data, dict) and isinstance(data.get("values"), dict) and isinstance(data.get("given"), dict)
                and isinstance(data.get("lines"), list)
                and all(isinstance(data["values"].get(t), dict) for t in ("kernel", "gate"))):
            raise ValueError("not a validated configuration")
        return cls(data["values"], data["given"], data["lines"], source=source)

    def plain(self) -> dict[str, Any]:
        return {"values": self.values, "given": self.given, "lines": self.lines}

    def setting(self, table: str, key: str) -> Any:
        """One validated value of a table, e.g. ``setting("kernel", "database")``."""
        return self.values[table][key]

    @property
    def config(self) -> TaskkernelConfig:
        """The models: the validated ones, or rebuilt from the values without validating them again."""
        if self._config is None:
            from taskkernel.coordinator.config_tables import TaskkernelConfig

            try:
                config = _construct(TaskkernelConfig, self.values, self.given)
            except (KeyError, ValueError, TypeError, AttributeError):
                if self.source is None:
                    raise
                # plain data that no longer fits the models (code changed under a running process): validate
                rebuilt = CheckedConfig.of(validate_bytes(*self.source))
                self.values, self.given, self.lines = rebuilt.values, rebuilt.given, rebuilt.lines
                self._config = rebuilt._config
                return rebuilt.config
            config._lines = {(t, k): n for t, k, n in self.lines}
            for spec in config.roles.values():  # as _profile_problems links them
                spec._profile = config.profiles.get(spec.runner) if spec.is_preset else None
            self._config = config
        return self._config


def _given(value: Any) -> Any:
    """Which fields the file set in a model and the models inside it (their ``model_fields_set``), or None."""
    from pydantic import BaseModel

    if isinstance(value, BaseModel):
        inner = {name: t for name in type(value).model_fields if (t := _given(getattr(value, name))) is not None}
        return {"set": sorted(value.model_fields_set), "in": inner}
    if isinstance(value, dict):
        return {k: t for k, v in value.items() if (t := _given(v)) is not None} or None
    return None


def _construct(model: type[BaseModel], values: Mapping[str, Any], given: Mapping[str, Any]) -> Any:
    """``model`` from the values it validated to (``model_dump(mode="json")``), by its fields' types: nested models
    and enums restored, and the fields the file set."""
    fields = {name: _restore(info.annotation, values[name], given.get("in", {}).get(name))
              for name, info in model.model_fields.items()}
    return model.model_construct(_fields_set=set(given.get("set", ())), **fields)


def _restore(kind: Any, value: Any, given: Any) -> Any:
    """One field's value as its type holds it: through ``Annotated``, ``X | None``, dicts and lists, to a model or
    an enum (a union of several types holds plain values only; tests/test_config_cache.py checks every key)."""
    from pydantic import BaseModel

    origin = get_origin(kind)
    if value is None:
        return None
    if origin is Annotated:
        return _restore(get_args(kind)[0], value, given)
    if origin in (Union, UnionType):
        options = [a for a in get_args(kind) if a is not type(None)]
        return _restore(options[0], value, given) if len(options) == 1 else value
    if origin is dict:
        return {k: _restore(get_args(kind)[1], v, (given or {}).get(k)) for k, v in value.items()}
    if origin is list:
        return [_restore(get_args(kind)[0], v, None) for v in value]
    if isinstance(kind, type) and issubclass(kind, BaseModel):
        return _construct(kind, value, given or {})
    if isinstance(kind, type) and issubclass(kind, Enum):
        return kind(value)
    return value



def load_config(path: Path) -> TaskkernelConfig:
    """Read and validate ``path``; raises ``ConfigError`` (never tomllib's or pydantic's errors)."""
    return validate_bytes(read_bytes(path), path)


def read_bytes(path: Path) -> bytes:
    """The file's exact bytes (what is validated, and what a cached validation is keyed on)."""
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}", code=CONFIG_UNREADABLE, path=path) from None


def validate_bytes(raw: bytes, path: Path) -> TaskkernelConfig:
    """The model of a file's bytes, read by ``read_bytes``; raises ``ConfigError``."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{CONFIG_NAME} is not UTF-8 text (byte {exc.start}); TOML files are UTF-8",
                          path=path) from None
    return parse_config(text, path)


def parse_config(source: str | Mapping[str, Any], path: Path | None = None) -> TaskkernelConfig:
    """Validate TOML text (or an already parsed document) into the model; raises ``ConfigError``."""
    import tomllib

    from pydantic import ValidationError

    from taskkernel.coordinator.config_tables import TaskkernelConfig

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
    return out + _host_problems(config)


def _host_problems(config: TaskkernelConfig) -> list[Problem]:
    """[hosts.NAME]: a host name, roles that have a runner here ([roles.X]), slots only for those roles."""
    out: list[Problem] = []
    for name, host in config.hosts.items():
        table = f"hosts.{name}"
        if not re.fullmatch(HOST_NAME, name):
            out.append(config.problem(table, None, f"{json.dumps(name)} is not a host name (letters, digits, "
                                      "'.', '_' and '-', at most 63)"))
        for role in host.roles:
            if role not in config.roles:
                guess = near(role, list(config.roles))
                out.append(config.problem(table, "roles", f"roles: {role} has no [roles.{role}] table, so no agent "
                                          "of it could run anywhere" + (f"; did you mean {guess}?" if guess else ""),
                                          guess))
        if len(set(host.roles)) != len(host.roles):
            out.append(config.problem(table, "roles", "roles: a role is listed twice"))
        for role in host.slots:
            if role not in host.roles:
                out.append(config.problem(table, "slots", f"slots: {role} is not one of this host's roles "
                                          f"{host.roles}"))
    return out


def _profile_problems(config: TaskkernelConfig) -> list[Problem]:
    """Profile names, and each role's runner, variant and allowed_tools against the profile it names (whose own
    table the model checked); a role of the file's own profile gets it here."""
    from taskkernel.coordinator.agent_profiles import PROFILE_NAME, builtin_profiles

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
    from taskkernel.coordinator.fcop.filenames import is_role_code

    if code in not_team():
        return f"is not a team role ({', '.join(sorted(not_team()))} are reserved: the owner, the system, a broadcast)"
    if not is_role_code(code) or len(code) > MAX_ROLE_LEN:
        return (f"is not a role code (upper-case letters, digits, _ and inner hyphens, at most {MAX_ROLE_LEN} "
                "characters)")
    return None


# -- messages ----------------------------------------------------------------------------------------

# Compiled on first use (re caches them): a command that finds the file validated never needs them.
_HEADER = (r"""^\[\[?\s*((?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*'))*)"""
           r"""\s*\]\]?\s*(?:#.*)?$""")
_KEY = r"""^((?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*'))*)\s*="""


def _dotted(path: str) -> list[str]:
    return [p.strip().strip("\"'") for p in re.findall(r"""[A-Za-z0-9_-]+|"[^"]*"|'[^']*'""", path)]


def _index(text: str) -> dict[tuple[str, str | None], int]:
    """Where each table header and each key is, by (table, key): enough to point at a line, never a parser."""
    found: dict[tuple[str, str | None], int] = {}
    table = ""
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if header := re.match(_HEADER, line):
            table = ".".join(_dotted(header.group(1)))
            found.setdefault((table, None), number)
        elif key := re.match(_KEY, line):
            parts = _dotted(key.group(1))
            owner = ".".join([p for p in (table,) if p] + parts[:-1])
            found.setdefault((owner, parts[-1]), number)
            if len(parts) > 1:
                found.setdefault((owner, None), number)
    return found


def line_in(lines: Mapping[tuple[str, str | None], int], table: str | None, key: str | None) -> int | None:
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
        return Problem(table, ctx["error"].key, str(ctx["error"]), line_in(lines, table, ctx["error"].key))
    subject = ".".join([key, *(str(r) for r in rest)]) if key else ""
    value = err.get("input")
    if kind in ("dict_type", "model_type") and len(loc) == 2 and loc[0] == "roles":
        return Problem("roles", str(loc[1]), f"{loc[1]} = {_shown(value)} is not a role's table: each role is a "
                       "[roles.<ROLE>] table (e.g. [roles.DEV] with runner = \"scripted\")",
                       line_in(lines, "roles", str(loc[1])))
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
    return Problem(table, key, text, line_in(lines, table, key))


def _unknown(table: str | None, key: str | None, loc: Sequence[str | int], data: Mapping[str, Any],
             lines: Mapping[tuple[str, str | None], int]) -> Problem:
    """An unknown table or key, with the near miss."""
    from pydantic import BaseModel

    from taskkernel.coordinator.config_tables import TABLES, Variant

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
                           line_in(lines, shown, None) or line_in(lines, name, None), f"[{fixed}]" if fixed else None)
        owner = next((t for t, model in TABLES.items() if name in model.model_fields and t != "roles"), None)
        return Problem(None, name, f"{name} is outside any table"
                       + (f"; did you mean to put it under [{owner}]?" if owner else
                          f" and is not a key taskkernel knows (tables: {', '.join(TABLES)})"),
                       line_in(lines, "", name), f"[{owner}] {name}" if owner else None)
    model: type[BaseModel] = Variant if ".variants." in (table or "") else TABLES.get((table or "").split(".")[0],
                                                                                     BaseModel)
    known = list(model.model_fields)
    guess = near(str(key), known)
    where = f"{table}" if table else ""
    return Problem(where, key, f"{key} is not a key taskkernel knows"
                   + (f"; did you mean {guess}?" if guess else f" (keys: {', '.join(known)})"),
                   line_in(lines, table, key), guess)
