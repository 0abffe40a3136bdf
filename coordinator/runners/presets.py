"""Agent CLI presets: how Claude Code, Codex and Gemini CLI run headless (docs/agents.md).

A preset knows, for its CLI: the command line that takes the prompt and answers in JSON, how the run's MCP
configuration reaches it (the kernel's own server, `taskkernel mcp`, acting as the run's task-scoped token,
which it reads from a file so no command line holds it), which flags keep it to its working folder, which
credential variables of its provider it may receive, and how usage, cost and a failure read from its output.
Each CLI's flags and fields were checked against its documentation; the versions are in docs/agents.md.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from taskkernel.coordinator.config import RunnerKind, RunnerSpec

MCP_SERVER_NAME = "taskkernel"
USAGE_LIMIT = 1e12  # anything larger (or negative, NaN, infinite) is not a usage figure
_SCAN_LINES = 2000  # a CLI's JSON is near the end of its output: look no further back than this


@dataclass(frozen=True)
class McpServer:
    """The stdio server an agent CLI starts for the run: the coordinator's own interpreter running
    `taskkernel --workspace W --token-file F mcp` (the workspace named, never found from the working folder)."""

    command: str
    args: list[str]

    def entry(self) -> dict[str, Any]:
        return {"command": self.command, "args": list(self.args)}


@dataclass(frozen=True)
class RunFiles:
    """What a run hands its agent: the folder it works in, its prompt, and its MCP configuration (None: off)."""

    workdir: Path
    prompt_file: Path
    mcp_config: Path | None
    server: McpServer | None


@dataclass
class AgentResult:
    """What the agent's output says: usage (tokens_in, tokens_out, cost_usd) and, when the CLI reported a
    failure in its own JSON (even with exit code 0), why."""

    usage: dict[str, float] = field(default_factory=dict)
    error: str | None = None


class Preset:
    """The generic `command` runner: argv is the owner's; a JSON object line with token/cost fields (top level
    or under "usage") is read as usage; the MCP configuration, in the common `mcpServers` JSON, is at
    {mcp_config}."""

    kind = RunnerKind.COMMAND
    program = ""
    prompt_on_stdin = False
    credential_vars: tuple[str, ...] = ()  # the provider's variables, passed when the coordinator has them
    # (switch, variables): passed only when the switch variable is set (a cloud provider's own credentials)
    switched_vars: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def credentials(self, source: Mapping[str, str]) -> tuple[str, ...]:
        """The variables of ``source`` this CLI may receive: its provider key, and a cloud's credentials only
        when the variable that selects that cloud is set."""
        switched = [name for switch, names in self.switched_vars if source.get(switch) for name in names]
        return tuple(n for n in (*self.credential_vars, *switched) if n in source)

    def argv(self, spec: RunnerSpec, files: RunFiles) -> list[str]:
        return list(spec.argv)

    def mcp_config(self, server: McpServer, env: Mapping[str, str]) -> bytes:
        """The run's MCP configuration in this CLI's format (``env``: the agent's environment)."""
        return _json({"mcpServers": {MCP_SERVER_NAME: server.entry()}})

    def env(self, files: RunFiles) -> dict[str, str]:
        return {}

    def read(self, stdout: str) -> AgentResult:
        for obj in reversed(_json_lines(stdout)):
            found = obj.get("usage") if isinstance(obj.get("usage"), dict) else obj
            picked = {k: float(found[k]) for k in ("tokens_in", "tokens_out", "cost_usd") if _plausible(found.get(k))}
            if picked:
                return AgentResult(picked)
        return AgentResult()


class ClaudeCode(Preset):
    """`claude -p --output-format json`: the prompt on stdin, one result object on stdout with
    ``total_cost_usd`` (the CLI's own estimate) and ``usage`` (input, cache creation, cache read and output
    tokens); ``is_error`` true is a failure whatever ``subtype`` says. ``--permission-mode acceptEdits`` lets it
    edit without a person, only inside its working folder (no ``--add-dir``); it does not approve MCP tools, so
    the kernel's are allowlisted as ``mcp__taskkernel``. ``--strict-mcp-config``: no server of the user's own
    configuration joins the run."""

    kind = RunnerKind.CLAUDE_CODE
    program = "claude"
    prompt_on_stdin = True
    credential_vars = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN", "ANTHROPIC_BASE_URL",
                       "CLAUDE_CONFIG_DIR", "HTTPS_PROXY", "NO_PROXY")
    switched_vars = (("CLAUDE_CODE_USE_BEDROCK", ("CLAUDE_CODE_USE_BEDROCK", "AWS_REGION", "AWS_PROFILE",
                                                  "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                                                  "AWS_BEARER_TOKEN_BEDROCK")),
                     ("CLAUDE_CODE_USE_VERTEX", ("CLAUDE_CODE_USE_VERTEX", "ANTHROPIC_VERTEX_PROJECT_ID",
                                                 "CLOUD_ML_REGION", "GOOGLE_APPLICATION_CREDENTIALS")))

    def argv(self, spec: RunnerSpec, files: RunFiles) -> list[str]:
        argv = [self.program, "-p", "--output-format", "json", "--permission-mode", "acceptEdits"]
        if files.mcp_config is not None:
            argv += ["--mcp-config", str(files.mcp_config), "--strict-mcp-config"]
        tools = ([f"mcp__{MCP_SERVER_NAME}"] if files.mcp_config is not None else []) + spec.allowed_tools
        if tools:
            argv += ["--allowedTools", ",".join(tools)]
        if spec.model:
            argv += ["--model", spec.model]
        return argv + spec.args

    def read(self, stdout: str) -> AgentResult:
        for obj in reversed(_json_lines(stdout)):
            if obj.get("type") != "result":
                continue
            usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else {}
            tokens_in = _sum(usage, "input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
            out = AgentResult(_figures(tokens_in, _sum(usage, "output_tokens"), obj.get("total_cost_usd")))
            if obj.get("is_error") is True:  # an API error can come with subtype "success": is_error decides
                out.error = f"claude reported an error ({obj.get('subtype', '?')}): {_short(obj.get('result'))}"
            return out
        return AgentResult()


class Codex(Preset):
    """`codex exec --json -`: the prompt on stdin, a JSON-lines event stream on stdout; each ``turn.completed``
    carries ``usage`` (input, cached input, output tokens), summed over the run; ``turn.failed`` or ``error`` is a
    failure. ``--sandbox workspace-write`` lets its commands write only in its working folder (``--cd``) and
    temporary folders, without network; the MCP server is added with ``-c mcp_servers.taskkernel.*`` overrides
    (TOML values), its tools approved (``exec`` runs with approval "never"). Codex reports no cost."""

    kind = RunnerKind.CODEX
    program = "codex"
    prompt_on_stdin = True
    credential_vars = ("CODEX_API_KEY", "OPENAI_API_KEY", "CODEX_HOME", "HTTPS_PROXY", "NO_PROXY")

    def argv(self, spec: RunnerSpec, files: RunFiles) -> list[str]:
        argv = [self.program, "exec", "--json", "--sandbox", "workspace-write", "--skip-git-repo-check",
                "--cd", str(files.workdir)]
        if files.server is not None:  # `exec` never asks: the kernel's tools are approved in the configuration
            base = f"mcp_servers.{MCP_SERVER_NAME}"
            argv += ["-c", f"{base}.command={json.dumps(files.server.command)}",
                     "-c", f"{base}.args={json.dumps(files.server.args)}",
                     "-c", f'{base}.default_tools_approval_mode="approve"']
        if spec.model:
            argv += ["--model", spec.model]
        return [*argv, *spec.args, "-"]

    def read(self, stdout: str) -> AgentResult:
        tokens_in = tokens_out = 0.0
        error = None
        for obj in _json_lines(stdout):
            kind = obj.get("type")
            if kind == "turn.completed" and isinstance(obj.get("usage"), dict):
                tokens_in += _sum(obj["usage"], "input_tokens")
                tokens_out += _sum(obj["usage"], "output_tokens")
            elif kind == "turn.failed":
                error = f"codex turn failed: {_short((obj.get('error') or {}).get('message'))}"
            elif kind == "error":
                error = f"codex error: {_short(obj.get('message'))}"
        return AgentResult(_figures(tokens_in, tokens_out, None), error)


class GeminiCli(Preset):
    """`gemini --output-format json`: the prompt on stdin, one JSON object on stdout with ``response``,
    ``stats.models.<model>.tokens`` (prompt, candidates, thoughts, …); a failure exits non-zero (its error
    JSON goes to stderr). ``--approval-mode auto_edit`` lets it edit without a person, only inside its working
    folder (no ``--include-directories``); ``--skip-trust``, or a headless run in a folder not yet trusted exits
    55. The MCP server is in a per-run system settings file named by GEMINI_CLI_SYSTEM_SETTINGS_PATH (it takes
    precedence over the user's and the project's settings), with the auth method when the environment says
    which; Gemini CLI reports no cost."""

    kind = RunnerKind.GEMINI_CLI
    program = "gemini"
    prompt_on_stdin = True
    credential_vars = ("GEMINI_API_KEY", "GOOGLE_API_KEY", "HTTPS_PROXY", "NO_PROXY")
    switched_vars = (("GOOGLE_GENAI_USE_VERTEXAI", ("GOOGLE_GENAI_USE_VERTEXAI", "GOOGLE_CLOUD_PROJECT",
                                                    "GOOGLE_CLOUD_LOCATION", "GOOGLE_APPLICATION_CREDENTIALS")),)

    def argv(self, spec: RunnerSpec, files: RunFiles) -> list[str]:
        argv = [self.program, "--output-format", "json", "--approval-mode", "auto_edit", "--skip-trust"]
        if files.mcp_config is not None:
            argv += ["--allowed-mcp-server-names", MCP_SERVER_NAME]
        if spec.allowed_tools:
            argv += ["--allowed-tools", ",".join(spec.allowed_tools)]
        if spec.model:
            argv += ["--model", spec.model]
        return argv + spec.args

    def mcp_config(self, server: McpServer, env: Mapping[str, str]) -> bytes:
        settings: dict[str, Any] = {"mcpServers": {MCP_SERVER_NAME: {**server.entry(), "trust": True}}}
        auth = _gemini_auth(env)
        if auth is not None:  # system settings replace the user's: say which credential the run uses
            settings["security"] = {"auth": {"selectedType": auth}}
        return _json(settings)

    def env(self, files: RunFiles) -> dict[str, str]:
        return {} if files.mcp_config is None else {"GEMINI_CLI_SYSTEM_SETTINGS_PATH": str(files.mcp_config)}

    def read(self, stdout: str) -> AgentResult:
        obj = _last_object(stdout)
        if obj is None:
            return AgentResult()
        stats = obj.get("stats")
        models = stats.get("models") if isinstance(stats, dict) else None
        tokens_in = tokens_out = 0.0
        for model in models.values() if isinstance(models, dict) else ():
            tokens = model.get("tokens") if isinstance(model, dict) else None
            if isinstance(tokens, dict):
                tokens_in += _sum(tokens, "prompt")
                tokens_out += _sum(tokens, "candidates", "thoughts")
        err = obj.get("error")
        error = f"gemini error: {_short(err.get('message') if isinstance(err, dict) else err)}" if err else None
        return AgentResult(_figures(tokens_in, tokens_out, None), error)


PRESETS: Mapping[RunnerKind, Preset] = {p.kind: p for p in (Preset(), ClaudeCode(), Codex(), GeminiCli())}


def _gemini_auth(env: Mapping[str, str]) -> str | None:
    """The auth method a headless Gemini CLI needs named when its home has none: from the credential set."""
    if env.get("GOOGLE_GENAI_USE_VERTEXAI", "").lower() in ("1", "true"):
        return "vertex-ai"
    if env.get("GEMINI_API_KEY"):
        return "gemini-api-key"
    return None


def preset_of(spec: RunnerSpec) -> Preset:
    return PRESETS[spec.runner]


def program_of(spec: RunnerSpec) -> str:
    """The program a spawning runner starts: argv[0] when the owner gave argv, else the preset's CLI."""
    return spec.argv[0] if spec.argv else preset_of(spec).program


def _json(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2) + "\n").encode("utf-8")


def _json_lines(stdout: str) -> list[dict[str, Any]]:
    """The JSON objects among the last lines of the output, one per line, in order."""
    found = []
    for line in stdout.strip().splitlines()[-_SCAN_LINES:]:
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                found.append(obj)
    return found


def _last_object(stdout: str) -> dict[str, Any] | None:
    """The JSON object the output ends with, pretty-printed over many lines or on one."""
    text = stdout.strip()
    for begin in dict.fromkeys((0, text.rfind("\n{") + 1)):  # all of it, else from its last top-level "{"
        try:
            obj = json.loads(text[begin:])
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            return obj
    lines = _json_lines(stdout)
    return lines[-1] if lines else None


def _plausible(value: Any) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
            and 0 <= value <= USAGE_LIMIT)


def _sum(obj: Mapping[str, Any], *keys: str) -> float:
    return float(sum(obj[k] for k in keys if _plausible(obj.get(k))))


def _figures(tokens_in: float, tokens_out: float, cost: Any) -> dict[str, float]:
    out = {"tokens_in": tokens_in, "tokens_out": tokens_out}
    if _plausible(cost):
        out["cost_usd"] = float(cost)
    return {k: v for k, v in out.items() if v or k == "cost_usd"}


def _short(text: Any) -> str:
    line = " ".join(str(text or "").split())
    return line[:200] or "no message"
