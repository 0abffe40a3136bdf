"""Agent CLI runners: how a profile's CLI (coordinator/agents.toml, or a `[profiles.<name>]` table) runs headless,
and the generic `command` runner (docs/agents.md).

A runner knows, for its CLI: the command line that takes the prompt and answers in JSON, how the run's MCP
configuration reaches it (the kernel's own server, `taskkernel mcp`, acting as the run's task-scoped token,
which it reads from a file so no command line holds it), which of the coordinator's variables it may receive,
and how usage, cost and a failure read from its output (stdout, and stderr for CLIs that write errors there).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from taskkernel.coordinator.agent_profiles import McpFormat, OutputKind
from taskkernel.coordinator.config import RunnerKind, RunnerSpec
from taskkernel.coordinator.config_tables import AgentProfile, Variant
from taskkernel.kernel.logging import get_logger

log = get_logger(__name__)

MCP_SERVER_NAME = "taskkernel"
USAGE_LIMIT = 1e12  # anything larger (or negative, NaN, infinite) is not a usage figure
_SCAN_LINES = 2000  # a CLI's JSON is near the end of its output: look no further back than this


ARGV_PROMPT_LIMIT = 100 << 10  # one argument may hold 128 KiB on Linux: a prompt on argv stays well below


class PromptUnfit(ValueError):
    """The prompt cannot be given the way the CLI takes it (too long for an argument, a NUL byte)."""


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
    """What a run hands its agent: the folder it works in, its prompt, its MCP configuration (None: off) and,
    for a CLI that reads its configuration from a home of its own, that per-run folder."""

    workdir: Path
    prompt_file: Path
    mcp_config: Path | None
    server: McpServer | None
    config_home: Path | None = None
    usage_file: Path | None = None  # where a CLI that writes its token counts to a file is told to write them
    resume_session: str | None = None  # the CLI's own conversation this run continues (its profile's resume_argv)


@dataclass
class AgentResult:
    """What the agent's output says: usage (tokens_in, tokens_out, cost_usd) and, when the CLI reported a
    failure in its own JSON (even with exit code 0), why."""

    usage: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    session: str | None = None  # the CLI's own conversation id, where it printed one (a follow-up resumes it)


class Preset:
    """The generic `command` runner: argv is the owner's; a JSON object line with token/cost fields (top level
    or under "usage") is read as usage; the MCP configuration, in the common `mcpServers` JSON, is at
    {mcp_config}."""

    name = RunnerKind.COMMAND.value
    program = ""
    prompt_on_stdin = False
    config_home: tuple[str, str] | None = None  # (variable, file in it) for a CLI configured through its home

    def credentials(self, source: Mapping[str, str]) -> tuple[str, ...]:
        """The variables of ``source`` this CLI may receive (none for an owner's command: pass_env says)."""
        return ()

    def argv(self, spec: RunnerSpec, files: RunFiles, source: Mapping[str, str]) -> list[str]:
        return list(spec.argv)

    def mcp_config(self, server: McpServer, env: Mapping[str, str]) -> bytes:
        """The run's MCP configuration in this CLI's format (``env``: the agent's environment)."""
        return _json({"mcpServers": {MCP_SERVER_NAME: server.entry()}})

    def defaults(self) -> dict[str, str]:
        """Variables every run of this CLI gets unless the role's ``env`` says otherwise."""
        return {}

    def env(self, files: RunFiles) -> dict[str, str]:
        """Variables naming the run's files (its MCP configuration, its configuration home)."""
        return {}

    def unusable(self, env: Mapping[str, str]) -> str | None:
        """Why the CLI would refuse to run with the configuration a run gives it in ``env`` (None: it would not)."""
        return None

    def read(self, stdout: str, stderr: str = "", usage_text: str = "") -> AgentResult:
        """Usage and a reported failure from the agent's stdout, the end of its stderr and its usage file."""
        return _usage_json(stdout, stderr, usage_text)

    def resumes(self) -> bool:
        """Whether a run can continue the CLI's own conversation (an owner's command cannot be told how)."""
        return False


def read_safely(preset: Preset, stdout: str, stderr: str, usage_text: str) -> AgentResult:
    """``preset.read``, never raising: output no parser foresaw is read as saying nothing (and logged), so a run is
    judged by its exit code and its task, never failed by its own output."""
    try:
        said = preset.read(stdout, stderr, usage_text)
        said.session = said.session or cli_session(stdout)
        return said
    except Exception:  # noqa: BLE001 - a parser defect must not turn a finished run into internal_error
        log.exception("agent_output_unreadable", runner=preset.name)
        return AgentResult()


_SESSION_KEYS = ("session_id", "sessionId", "sessionID", "thread_id")
_SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{7,127}")  # what is ever put back on a command line


def cli_session(stdout: str) -> str | None:
    """The conversation id the CLI printed (Claude Code, Qwen Code, Gemini CLI, Droid: ``session_id``; Codex's
    ``thread.started``: ``thread_id``; Copilot: ``sessionId``), the last one it named; None when it named none or
    one that is no plain id (it goes on a later run's command line)."""
    for obj in reversed(_json_lines(stdout)):
        holders = [obj, *(v for v in obj.values() if isinstance(v, dict))]
        for holder in holders:
            for key in _SESSION_KEYS:
                value = holder.get(key)
                if isinstance(value, str) and _SESSION_ID.fullmatch(value):
                    return value
    return None


class ProfileRunner(Preset):
    """A profile's CLI: the command line assembled from its templates, its variables, its output parser."""

    def __init__(self, name: str, profile: AgentProfile) -> None:
        self.name, self.profile = name, profile
        self.program = profile.program
        self.prompt_on_stdin = profile.prompt == "stdin"
        self.config_home = (profile.config_home, profile.mcp_file) if profile.config_home and profile.mcp_file \
            else None
        self._parse = _PARSERS[profile.output]

    def credentials(self, source: Mapping[str, str]) -> tuple[str, ...]:
        """Its provider's variables, and a cloud's credentials only when the variable that selects that cloud
        is set."""
        switched = [n for switch, names in self.profile.switched_vars.items() if source.get(switch) for n in names]
        return tuple(n for n in dict.fromkeys((*self.profile.credential_vars, *switched)) if n in source)

    def argv(self, spec: RunnerSpec, files: RunFiles, source: Mapping[str, str]) -> list[str]:
        p, variant = self.profile, self.variant(spec)
        fill = {"workdir": str(files.workdir), "prompt_file": str(files.prompt_file),
                "mcp_config": str(files.mcp_config or ""), "config_home": str(files.config_home or ""),
                "usage_file": str(files.usage_file or "")}
        if p.prompt == "argv":
            fill["prompt"] = prompt = files.prompt_file.read_text("utf-8")
            if len(prompt.encode()) > ARGV_PROMPT_LIMIT or "\0" in prompt:
                raise PromptUnfit(f"{p.program} takes its prompt as an argument, which holds at most "
                                  f"{ARGV_PROMPT_LIMIT // 1024} KiB and no NUL byte: this task's prompt is "
                                  f"{len(prompt.encode()) // 1024} KiB; shorten the task's body or use another CLI")
        argv = [p.program, *(a.format(**fill) for a in p.argv)]
        sandbox = variant.sandbox or p.sandbox
        if sandbox:
            argv += _filled(p.sandbox_argv, sandbox=sandbox)
        if files.server is not None:
            argv += _filled(p.mcp_argv, **fill, server=MCP_SERVER_NAME, command_json=json.dumps(files.server.command),
                            args_json=json.dumps(files.server.args))
        tools = ([p.kernel_tools] if p.kernel_tools and files.server is not None else []) + spec.allowed_tools
        if tools:
            argv += _filled(p.tools_argv, tools=",".join(tools))
        if model := spec.model or variant.model:
            argv += _filled(p.model_argv, model=model)
        if variant.reasoning:
            argv += _filled(p.reasoning_argv, reasoning=variant.reasoning)
        for name, args in p.when_set.items():
            if value := source.get(name):
                argv += _filled(args, value=value, value_json=json.dumps(value))
        if files.resume_session and p.resume_argv:
            argv += _filled(p.resume_argv, session_id=files.resume_session)
        return [*argv, *variant.args, *spec.args]

    def resumes(self) -> bool:
        """Whether a run can continue this CLI's own conversation: it names how (``resume_argv``) and keeps its
        conversations in the agent's home, not in a per-run configuration home that the next run does not get."""
        return bool(self.profile.resume_argv) and self.config_home is None

    def variant(self, spec: RunnerSpec) -> Variant:
        return self.profile.variants[spec.variant] if spec.variant else Variant()

    def mcp_config(self, server: McpServer, env: Mapping[str, str]) -> bytes:
        fmt = self.profile.mcp_format
        if fmt is McpFormat.GEMINI_SETTINGS:
            settings: dict[str, Any] = {"mcpServers": {MCP_SERVER_NAME: {**server.entry(), "trust": True}}}
            auth = _gemini_auth(env)
            if auth is not None:  # the run's own home has no login: say which credential the run uses
                settings["security"] = {"auth": {"selectedType": auth}}
            return _json(settings)
        if fmt is McpFormat.COPILOT:
            return _json({"mcpServers": {MCP_SERVER_NAME: {"type": "local", **server.entry(), "tools": ["*"]}}})
        if fmt is McpFormat.SERVERS:
            return _json({MCP_SERVER_NAME: server.entry()})
        if fmt is McpFormat.DROID_SETTINGS:  # merged over the user's own settings for this process only
            return _json({"blockOnMcpLoad": True, "mcp": {"mcpServers": {MCP_SERVER_NAME: server.entry()}}})
        if fmt is McpFormat.OPENCODE:
            return _json({"$schema": "https://opencode.ai/config.json", "mcp": {MCP_SERVER_NAME: {
                "type": "local", "command": [server.command, *server.args], "enabled": True}}})
        return super().mcp_config(server, env)

    def defaults(self) -> dict[str, str]:
        return dict(self.profile.env)

    def env(self, files: RunFiles) -> dict[str, str]:
        out = {}
        if files.mcp_config is not None and self.profile.mcp_env:
            out[self.profile.mcp_env] = str(files.mcp_config)
        if files.config_home is not None and self.profile.config_home:
            out[self.profile.config_home] = str(files.config_home)
        return out

    def unusable(self, env: Mapping[str, str]) -> str | None:
        if self.profile.mcp_format is McpFormat.GEMINI_SETTINGS and _gemini_auth(env) is None:
            return (f"{self.program} runs with a configuration home of its own ({self.profile.config_home}), where "
                    "no login is: set GEMINI_API_KEY (or GOOGLE_GENAI_USE_VERTEXAI with its project), or it exits "
                    "41 \"Invalid auth method selected\"")
        return None

    def read(self, stdout: str, stderr: str = "", usage_text: str = "") -> AgentResult:
        return self._parse(stdout, stderr, usage_text)


def _filled(templates: list[str], **values: str) -> list[str]:
    return [t.format(**values) for t in templates]


# -- output parsers (one per OutputKind) --------------------------------------------------------------


def _usage_json(stdout: str, stderr: str, usage_text: str) -> AgentResult:
    for obj in reversed(_json_lines(stdout)):
        found = obj.get("usage") if isinstance(obj.get("usage"), dict) else obj
        picked = {k: float(found[k]) for k in ("tokens_in", "tokens_out", "cost_usd") if _plausible(found.get(k))}
        if picked:
            return AgentResult(picked)
    return AgentResult()


def _claude_result(stdout: str, stderr: str, usage_text: str) -> AgentResult:
    """Claude Code's result object (the last of a stream-json run): ``total_cost_usd`` (the CLI's own estimate)
    and ``usage`` (input, cache creation, cache read and output tokens); ``is_error`` true is a failure whatever
    ``subtype`` says (an API error can come with subtype "success"). Qwen Code and Droid print the same object,
    Qwen Code as the last element of one JSON array."""
    for obj in reversed(_json_lines(stdout) + _array_objects(stdout)):
        if obj.get("type") != "result":
            continue
        usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else {}
        tokens_in = _sum(usage, "input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
        out = AgentResult(_figures(tokens_in, _sum(usage, "output_tokens"), obj.get("total_cost_usd")))
        if obj.get("is_error") is True:
            err = obj.get("error")
            said = err.get("message") if isinstance(err, dict) and err.get("message") else obj.get("result")
            out.error = f"the CLI reported an error ({obj.get('subtype', '?')}): {_short(said)}"
        return out
    return AgentResult()


def _codex_events(stdout: str, stderr: str, usage_text: str) -> AgentResult:
    """Codex's events: ``turn.completed`` carries ``usage``, summed over the run. A failure is ``turn.failed``,
    or an ``error`` no later ``turn.completed`` followed: Codex prints error lines for transient retries
    ("Reconnecting... n/5") and then completes normally."""
    tokens_in = tokens_out = 0.0
    error = None
    for obj in _json_lines(stdout):
        kind = obj.get("type")
        if kind == "turn.completed":
            error = None
            if isinstance(obj.get("usage"), dict):
                tokens_in += _sum(obj["usage"], "input_tokens")
                tokens_out += _sum(obj["usage"], "output_tokens")
        elif kind == "turn.failed":
            err = obj.get("error")
            error = f"codex turn failed: {_short(err.get('message') if isinstance(err, dict) else err)}"
        elif kind == "error":
            error = f"codex error: {_short(obj.get('message'))}"
    return AgentResult(_figures(tokens_in, tokens_out, None), error)


def _gemini_json(stdout: str, stderr: str, usage_text: str) -> AgentResult:
    """Gemini CLI's object: ``stats.models.<model>.tokens`` (prompt, candidates, thoughts, …), an ``error``;
    a failed run writes its ``{"error": {…}}`` to stderr instead."""
    obj = _last_object(stdout) or {}
    stats = obj.get("stats")
    models = stats.get("models") if isinstance(stats, dict) else None
    tokens_in = tokens_out = 0.0
    for model in models.values() if isinstance(models, dict) else ():
        tokens = model.get("tokens") if isinstance(model, dict) else None
        if isinstance(tokens, dict):
            tokens_in += _sum(tokens, "prompt")
            tokens_out += _sum(tokens, "candidates", "thoughts")
    # a retried error on stderr is the reason only when no result came (the run was stopped while retrying)
    err = obj.get("error") or (_last_object(stderr) or {}).get("error") or (None if obj else _gemini_retrying(stderr))
    error = f"gemini error: {_short(err.get('message') if isinstance(err, dict) else err)}" if err else None
    return AgentResult(_figures(tokens_in, tokens_out, None), error)


def _gemini_retrying(stderr: str) -> dict[str, Any] | None:
    """The API error Gemini CLI was retrying when it was stopped: its last "Attempt N failed with status S.
    Retrying with backoff... _ApiError: {…}" line, as ``{"message": "S STATUS: message"}``."""
    for line in reversed(stderr.splitlines()):
        _, marker, body = line.partition("_ApiError: ")
        if not marker:
            continue
        try:
            err = json.loads(body).get("error")
        except (json.JSONDecodeError, AttributeError):
            continue
        if isinstance(err, dict):
            return {"message": f"{err.get('code', '?')} {err.get('status', '')}: {err.get('message', '')}"}
    return None


def _opencode_events(stdout: str, stderr: str, usage_text: str) -> AgentResult:
    """OpenCode's ``--format json`` events: each ``step_finish`` part carries ``tokens`` (input, output,
    reasoning, cache) and ``cost``, summed; an ``error`` event is a failure."""
    tokens_in = tokens_out = cost = 0.0
    error = None
    for obj in _json_lines(stdout):
        part: dict[str, Any] = obj["part"] if isinstance(obj.get("part"), dict) else {}
        if obj.get("type") == "step_finish":
            tokens: dict[str, Any] = part["tokens"] if isinstance(part.get("tokens"), dict) else {}
            cache: dict[str, Any] = tokens["cache"] if isinstance(tokens.get("cache"), dict) else {}
            tokens_in += _sum(tokens, "input") + _sum(cache, "read", "write")
            tokens_out += _sum(tokens, "output", "reasoning")
            cost += _sum(part, "cost")
        elif obj.get("type") == "error":
            err = obj.get("error")
            data = err.get("data") if isinstance(err, dict) else None
            message = data.get("message") if isinstance(data, dict) else err
            error = f"opencode error: {_short(message)}"
    return AgentResult(_figures(tokens_in, tokens_out, cost if cost else None), error)


def _copilot_events(stdout: str, stderr: str, usage_text: str) -> AgentResult:
    """Copilot CLI's events: a ``session.error`` is a failure unless a later turn ended it; the token counts are in
    its usage file, ``modelMetrics.<model>.usage`` (input, cache read and write; output)."""
    error = None
    for obj in _json_lines(stdout):
        data: dict[str, Any] = obj["data"] if isinstance(obj.get("data"), dict) else {}
        if obj.get("type") == "session.error":
            error = f"copilot error ({data.get('errorType', '?')}): {_short(data.get('message'))}"
        elif obj.get("type") == "assistant.turn_end":
            error = None
    tokens_in = tokens_out = 0.0
    metrics = (_last_object(usage_text) or {}).get("modelMetrics")
    for model in metrics.values() if isinstance(metrics, dict) else ():
        counts = model.get("usage") if isinstance(model, dict) else None
        if isinstance(counts, dict):
            tokens_in += _sum(counts, "inputTokens", "cacheReadTokens", "cacheWriteTokens")
            tokens_out += _sum(counts, "outputTokens")
    return AgentResult(_figures(tokens_in, tokens_out, None), error)


def _droid_events(stdout: str, stderr: str, usage_text: str) -> AgentResult:
    """Droid's ``exec -o stream-json`` events: ``completion`` carries the run's ``usage`` (input, cache read and
    creation; output). An ``error`` event is a failure: the loop's own (``source`` "agent_loop", the provider's
    message) says why; the CLI's closing one says only "Exec failed"."""
    tokens_in = tokens_out = 0.0
    errors: list[dict[str, Any]] = []
    for obj in _json_lines(stdout):
        if obj.get("type") == "completion" and isinstance(obj.get("usage"), dict):
            tokens_in += _sum(obj["usage"], "input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
            tokens_out += _sum(obj["usage"], "output_tokens")
        elif obj.get("type") == "error":
            errors.append(obj)
    said = next((e for e in errors if e.get("source") != "cli"), errors[0] if errors else None)
    error = f"droid error: {_short(said.get('message'))}" if said is not None else None
    return AgentResult(_figures(tokens_in, tokens_out, None), error)


_PARSERS: dict[OutputKind, Callable[[str, str, str], AgentResult]] = {
    OutputKind.USAGE_JSON: _usage_json, OutputKind.CLAUDE_RESULT: _claude_result,
    OutputKind.STREAM_JSON: _claude_result, OutputKind.CODEX_EVENTS: _codex_events,
    OutputKind.GEMINI_JSON: _gemini_json, OutputKind.OPENCODE_EVENTS: _opencode_events,
    OutputKind.COPILOT_EVENTS: _copilot_events, OutputKind.DROID_EVENTS: _droid_events}
COMMAND = Preset()


def _gemini_auth(env: Mapping[str, str]) -> str | None:
    """The auth method a headless Gemini CLI needs named when its home has none: from the credential set."""
    if env.get("GOOGLE_GENAI_USE_VERTEXAI", "").lower() in ("1", "true"):
        return "vertex-ai"
    if env.get("GEMINI_API_KEY"):
        return "gemini-api-key"
    return None


def preset_of(spec: RunnerSpec) -> Preset:
    """The runner of a spawning role: its profile's CLI, or the generic command runner."""
    profile = spec.profile
    return COMMAND if profile is None else ProfileRunner(spec.runner, profile)


def program_of(spec: RunnerSpec) -> str:
    """The program a spawning runner starts: argv[0] when the owner gave argv, else the profile's CLI."""
    if spec.argv:
        return spec.argv[0]
    profile = spec.profile
    return profile.program if profile is not None else ""


def _json(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2) + "\n").encode("utf-8")


# What reading a CLI's JSON may raise besides a syntax error: a number of over 4,300 digits (ValueError), nesting
# deeper than the interpreter's stack (RecursionError). The line is then not read, like any line that is no JSON.
_UNREADABLE = (ValueError, RecursionError)


def _json_lines(stdout: str) -> list[dict[str, Any]]:
    """The JSON objects among the last lines of the output, one per line, in order."""
    found = []
    for line in stdout.strip().splitlines()[-_SCAN_LINES:]:
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                obj = json.loads(line)
            except _UNREADABLE:
                continue
            if isinstance(obj, dict):
                found.append(obj)
    return found


def _array_objects(stdout: str) -> list[dict[str, Any]]:
    """The objects of a JSON array the output ends with (from its last line that starts one), else none."""
    text = stdout.strip()
    if not text.endswith("]"):
        return []
    start = text.rfind("\n[") + 1
    try:
        found = json.loads(text[start:])
    except _UNREADABLE:
        return []
    return [o for o in found if isinstance(o, dict)] if isinstance(found, list) else []


def _last_object(stdout: str) -> dict[str, Any] | None:
    """The JSON object the output ends with, pretty-printed over many lines or on one."""
    text = stdout.strip()
    for begin in dict.fromkeys((0, text.rfind("\n{") + 1)):  # all of it, else from its last top-level "{"
        try:
            obj = json.loads(text[begin:])
        except _UNREADABLE:
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
