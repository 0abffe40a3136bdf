"""Agent CLI profiles as data (docs/agents.md, "Profiles"): how one coding-agent CLI runs headless.

A profile says, for its CLI: the program and the command line that takes the prompt and answers in JSON, how the
prompt reaches it, how the run's MCP configuration reaches it (a file named by a flag or a variable, or a file
in a per-run configuration home), which of the coordinator's variables it may receive, which output parser reads
its usage and failures, and named variants (model, reasoning effort, sandbox). The built-in profiles are
coordinator/agents.toml; a `[profiles.<name>]` table of taskkernel.toml adds one, validated by the same
model (``AgentProfile``, in taskkernel.coordinator.config_tables with the file's other tables) when the file
loads. Nothing here runs anything: taskkernel.coordinator.runners.presets does.
"""

from __future__ import annotations

import re
import tomllib
from enum import StrEnum
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from taskkernel.coordinator.config_tables import AgentProfile

__all__ = ["PROFILE_NAME", "McpFormat", "OutputKind", "builtin_profiles"]
PROFILE_NAME = re.compile(r"[a-z][a-z0-9-]{0,39}")


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


@cache
def builtin_profiles() -> dict[str, AgentProfile]:
    """The profiles taskkernel ships (coordinator/agents.toml), validated as a user's would be."""
    from pydantic import ValidationError

    from taskkernel.coordinator.config_tables import AgentProfile

    text = resources.files("taskkernel.coordinator").joinpath("agents.toml").read_text("utf-8")
    data = tomllib.loads(text)["profiles"]
    try:
        return {name: AgentProfile.model_validate(table) for name, table in data.items()}
    except ValidationError as exc:  # a packaging defect, never a user's: say which
        raise RuntimeError(f"the built-in agent profiles are invalid: {exc}") from None
