"""Agent CLI profiles as data (docs/agents.md, "Profiles"): how one coding-agent CLI runs headless.

A profile says, for its CLI: the program and the command line that takes the prompt and answers in JSON, how the
prompt reaches it, how the run's MCP configuration reaches it (a file named by a flag or a variable, or a file
in a per-run configuration home), which of the coordinator's variables it may receive, which output parser reads
its usage and failures, and named variants (model, reasoning effort, sandbox). The built-in profiles are
coordinator/agents.toml; a `[profiles.<name>]` table of taskkernel.toml adds one, validated by this same
model when the file loads. Nothing here runs anything: taskkernel.coordinator.runners.presets does.
"""

from __future__ import annotations

import json
import re
import string
import tomllib
from enum import StrEnum
from functools import cache
from importlib import resources
from pathlib import PurePosixPath
from typing import Literal

from pydantic import Field, ValidationError, model_validator

from taskkernel.coordinator.config_tables import KeyProblem, Table

PROFILE_NAME = re.compile(r"[a-z][a-z0-9-]{0,39}")
_VAR = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# What a profile's command-line templates may name; each list of the profile says which of these it fills.
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


class McpFormat(StrEnum):
    """The shape of the MCP configuration file a CLI reads."""

    MCP_SERVERS = "mcpServers"  # {"mcpServers": {"taskkernel": {"command", "args"}}} (Claude Code, most CLIs)
    GEMINI_SETTINGS = "gemini-settings"  # a settings.json: mcpServers with trust, and the auth method
    OPENCODE = "opencode"  # opencode.json: {"mcp": {"taskkernel": {"type": "local", "command": [...]}}}
    COPILOT = "copilot"  # mcpServers whose entry says "type": "local" and offers every tool
    SERVERS = "servers"  # the bare map {"taskkernel": {"command", "args"}} (Amp's --mcp-config)
    DROID_SETTINGS = "droid-settings"  # Droid's runtime settings overlay: {"mcp": {"mcpServers": …}}, blockOnMcpLoad
    NONE = "none"  # no file: the command line carries the server (mcp_argv)


class OutputKind(StrEnum):
    """Which parser reads usage, cost and a reported failure from the CLI's output (runners/presets.py)."""

    USAGE_JSON = "usage-json"  # any JSON line with tokens_in/tokens_out/cost_usd (the generic command runner)
    CLAUDE_RESULT = "claude-result"  # Claude Code's one result object
    CODEX_EVENTS = "codex-events"  # Codex's JSON-lines event stream
    GEMINI_JSON = "gemini-json"  # Gemini CLI's one JSON object (its forks' too); errors as JSON on stderr
    OPENCODE_EVENTS = "opencode-events"  # OpenCode's JSON-lines events (step_finish with tokens and cost)
    STREAM_JSON = "stream-json"  # Claude Code-style stream-json events ending in a result object
    COPILOT_EVENTS = "copilot-events"  # Copilot CLI's JSON-lines events; token counts in its usage file
    DROID_EVENTS = "droid-events"  # Droid's stream-json events: usage in `completion`, the reason in `error`


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
        if self.prompt == "argv" and not any({"prompt", "prompt_file"} & _names(a) for a in self.argv):
            raise KeyProblem("prompt", 'prompt = "argv": name {prompt} or {prompt_file} in argv')
        if self.mcp_file is not None and (PurePosixPath(self.mcp_file).is_absolute()
                                          or ".." in PurePosixPath(self.mcp_file).parts):
            raise KeyProblem("mcp_file", f"mcp_file {json.dumps(self.mcp_file)}: a path inside the run's "
                             "configuration home (relative, no ..)")
        if (self.mcp_file is None) != (self.config_home is None):
            raise KeyProblem("mcp_file", "config_home and mcp_file go together: the folder's variable and the "
                             "file in it")
        if self.mcp_format is not McpFormat.NONE and not (
                self.mcp_env or self.mcp_file or any("mcp_config" in _names(a) for a in self.mcp_argv)):
            raise ValueError("the MCP configuration must reach the CLI: name {mcp_config} in mcp_argv, or set "
                             "mcp_env, or config_home with mcp_file")
        if self.sandbox_argv and self.sandbox is None:
            raise KeyProblem("sandbox_argv", "sandbox_argv needs a default sandbox")
        return self


def _names(arg: str) -> set[str]:
    return {f for _, f, _, _ in string.Formatter().parse(arg) if f}


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


@cache
def builtin_profiles() -> dict[str, AgentProfile]:
    """The profiles taskkernel ships (coordinator/agents.toml), validated as a user's would be."""
    text = resources.files("taskkernel.coordinator").joinpath("agents.toml").read_text("utf-8")
    data = tomllib.loads(text)["profiles"]
    try:
        return {name: AgentProfile.model_validate(table) for name, table in data.items()}
    except ValidationError as exc:  # a packaging defect, never a user's: say which
        raise RuntimeError(f"the built-in agent profiles are invalid: {exc}") from None
