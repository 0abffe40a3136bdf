"""An agent CLI's streamed stdout, one line at a time, as typed run events (docs/live-output.md).

Each CLI prints its own JSON-lines shape while it works; a person following a run wants one vocabulary: what the
model said (``text``), which tool it called with what (``tool_call``), what came back (``tool_result``), what it
cost (``usage``), what went wrong (``error``), and for a program that prints plain lines, the line (``output``).
One parser per ``OutputKind`` reads its CLI's shapes, as the real CLIs printed them (tests/fixtures/run-streams);
a shape it does not know says nothing, and a parser defect loses that line, never the run.

Nothing here is trusted: an event's text is cut to a bound, every secret the run was handed and every well-known
key shape is replaced by ``[redacted]``, and control characters are escaped by the terminal rule (kernel/text.py)
before it is stored, so what a follower reads can neither leak a key nor drive a terminal. Pure: no database.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from taskkernel.coordinator.agent_profiles import OutputKind
from taskkernel.coordinator.runners.command import HEARTBEAT_LINE
from taskkernel.kernel.logging import get_logger
from taskkernel.kernel.text import terminal_text

log = get_logger(__name__)

EVENT_KINDS = ("text", "tool_call", "tool_result", "usage", "error", "output")
TEXT_CHARS = 2000  # assistant text, errors, plain output lines
SUMMARY_CHARS = 300  # a tool call (name and arguments), a tool result
MIN_SECRET_CHARS = 8  # a shorter value (a flag, "1", a region) would redact ordinary words
REDACTED = "[redacted]"
_REMEMBERED_CALLS = 1000  # tool call ids kept to name their results
_PIECES_CHARS = 4 * TEXT_CHARS  # a streamed text kept before it is redacted and cut (past any secret at the cut)

# Key shapes redacted wherever they appear, whoever's they are. Our own tokens: tk_ and 20-128 URL-safe characters
# (kernel/credentials.py issue_token: token_urlsafe(32), 43 characters).
_KEY_SHAPES = re.compile(
    r"(?<![A-Za-z0-9_-])(?:"
    r"sk-[A-Za-z0-9_-]{20,}"  # OpenAI, Anthropic (sk-ant-…), and the many OpenAI-compatible providers
    r"|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,}"  # GitHub
    r"|xox[abposr]-[A-Za-z0-9-]{10,}"  # Slack
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}"  # AWS access key ids
    r"|AIza[0-9A-Za-z_-]{35}"  # Google API keys
    r"|tk_[A-Za-z0-9_-]{20,128}"  # taskkernel tokens
    r")")
_BEARER = re.compile(r"\b(Bearer\s+)[A-Za-z0-9._~+/=-]{8,}", re.IGNORECASE)


@dataclass(frozen=True)
class RunEvent:
    """One thing an agent did or said. ``tool``: the tool's name for a call or its result."""

    kind: str
    text: str
    tool: str | None = None


def redact(text: str, secrets: Sequence[str]) -> str:
    """``text`` safe to store and show: each secret value of at least 8 characters and each well-known key shape
    (``sk-…``, ``ghp_…``, ``github_pat_…``, ``xoxb-…``, ``AKIA…``, ``AIza…``, ``Bearer <token>``, taskkernel's
    ``tk_…``) replaced by ``[redacted]``, then control characters escaped by the terminal rule (newlines and tabs
    kept)."""
    pattern = _secrets_pattern(tuple(sorted({s for s in secrets if len(s) >= MIN_SECRET_CHARS},
                                            key=lambda s: (-len(s), s))))
    if pattern is not None:
        text = pattern.sub(REDACTED, text)
    text = _BEARER.sub(lambda m: m.group(1) + REDACTED, _KEY_SHAPES.sub(REDACTED, text))
    return terminal_text(text, lines=True)


@lru_cache(maxsize=64)
def _secrets_pattern(secrets: tuple[str, ...]) -> re.Pattern[str] | None:
    """One pattern for a run's secrets, longest first (a secret that holds another is redacted whole)."""
    return re.compile("|".join(map(re.escape, secrets))) if secrets else None


def finished(event: RunEvent, secrets: Sequence[str]) -> RunEvent:
    """The event as it is stored: redacted (before it is cut, so no part of a secret survives at the cut) and cut
    to its kind's bound."""
    limit = SUMMARY_CHARS if event.kind in ("tool_call", "tool_result") else TEXT_CHARS
    return replace(event, text=cut(redact(event.text, secrets), limit),
                   tool=None if event.tool is None else cut(redact(event.tool, secrets), 200))


def cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


class LineParser:
    """One run's reader of its CLI's stdout lines. It remembers tool call ids (a bounded number) so that a result
    which names only its call is shown with the tool's name, and joins the pieces of a text the CLI streams
    (Gemini CLI's ``delta`` messages) into one event, given when the next line is not a piece or at ``finish``:
    one event per answer, and a secret split over two pieces is redacted whole. ``parse`` never raises."""

    def __init__(self, kind: OutputKind | None) -> None:
        self.kind = kind or OutputKind.USAGE_JSON
        self._read = _READERS[self.kind]
        self._calls: dict[str, str] = {}
        self._pieces: list[str] = []
        self._pieces_chars = 0
        self._failed = False

    def parse(self, line: str) -> list[RunEvent]:
        """The events one line says (no newline in ``line``): none for a blank line, a shape the parser does not
        know, or a line that made the parser fail (logged once per run)."""
        try:
            line = line.strip()
            if not line or line == HEARTBEAT_LINE:
                return []
            obj = _json_object(line)
            if self.kind is OutputKind.USAGE_JSON:
                return _generic(line, obj)
            pieces = len(self._pieces)
            events = [e for e in self._read(obj, self) if e.text or e.tool] if obj is not None else []
            return events if len(self._pieces) > pieces else [*self.finish(), *events]
        except Exception:  # noqa: BLE001 - a parser defect must never break a run: the line is lost, not the run
            if not self._failed:
                self._failed = True
                log.exception("run_output_line_unreadable", output=self.kind.value)
            return []

    def piece(self, text: str) -> None:
        """A piece of the model's streamed text (beyond a few bounds' worth, the rest is only counted as cut)."""
        if text:
            self._pieces.append(text[:max(0, _PIECES_CHARS - self._pieces_chars)])
            self._pieces_chars += len(text)

    def finish(self) -> list[RunEvent]:
        """The streamed text not given yet (the output ended, or the next line was something else)."""
        text, self._pieces, self._pieces_chars = "".join(self._pieces), [], 0
        return [RunEvent("text", text)] if text else []

    def named(self, call_id: Any, name: Any) -> str | None:
        """Remember a tool call's name by its id; the name (None when there is none)."""
        if not isinstance(name, str) or not name:
            return None
        if isinstance(call_id, str) and call_id:
            if len(self._calls) >= _REMEMBERED_CALLS:
                self._calls.pop(next(iter(self._calls)))
            self._calls[call_id] = name
        return name

    def name_of(self, call_id: Any) -> str | None:
        return self._calls.get(call_id) if isinstance(call_id, str) else None


Reader = Callable[[dict[str, Any], LineParser], Iterable[RunEvent]]


def _json_object(line: str) -> dict[str, Any] | None:
    if not (line.startswith("{") and line.endswith("}")):
        return None
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):  # not JSON; a number of over 4,300 digits; nesting past the stack
        return None
    return obj if isinstance(obj, dict) else None


# -- shared pieces ---------------------------------------------------------------------------------------------


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _compact(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def _call(name: str, args: Any) -> RunEvent:
    """A tool call: ``name(arguments as compact JSON)``."""
    return RunEvent("tool_call", f"{name}({'' if args is None else _compact(args)})", name)


def _result(name: str | None, text: str, *, failed: bool = False) -> RunEvent:
    return RunEvent("tool_result", f"error: {text}" if failed else text, name)


def _content_text(content: Any) -> str:
    """A tool result's or message's content as text: a string as it is, a list of blocks by their text (another
    block, such as Claude Code's ``tool_reference``, by its compact JSON)."""
    if isinstance(content, str):
        return content
    parts = []
    for block in _list(content):
        block = _dict(block)
        text = block.get("text")
        parts.append(text if isinstance(text, str) else _compact(block))
    return "\n".join(parts)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _usage(tokens_in: Any, tokens_out: Any, cost: Any = None) -> RunEvent:
    """``tokens in N, out M, cost $C``: only the figures the CLI printed."""
    parts = [f"{label} {int(n)}" for label, n in (("in", _number(tokens_in)), ("out", _number(tokens_out)))
             if n is not None]
    text = f"tokens {', '.join(parts)}" if parts else ""
    if (c := _number(cost)) is not None:
        text += f"{', ' if text else ''}cost ${c:.4f}"
    return RunEvent("usage", text)


def _started(model: Any, servers: Any) -> RunEvent:
    """A session's start: the model and how its MCP servers came up (a failed kernel server explains a run that
    then reports nothing)."""
    named = [f"{s.get('name')} {s.get('status')}" for s in map(_dict, _list(servers)) if s.get("name")]
    return RunEvent("output", "started" + (f": model {model}" if isinstance(model, str) and model else "")
                    + (f"; MCP servers: {', '.join(named)}" if named else ""))


def _thinking(text: Any) -> RunEvent:
    return RunEvent("text", f"(thinking) {_str(text)}" if _str(text) else "")


# -- one reader per OutputKind ---------------------------------------------------------------------------------


def _generic(line: str, obj: dict[str, Any] | None) -> list[RunEvent]:
    """The generic command runner: a JSON line with token or cost figures (top level or under ``usage``) is usage,
    any other line is output."""
    if obj is not None:
        found = _dict(obj.get("usage")) or obj
        if any(_number(found.get(k)) is not None for k in ("tokens_in", "tokens_out", "cost_usd")):
            return [_usage(found.get("tokens_in"), found.get("tokens_out"), found.get("cost_usd"))]
    return [RunEvent("output", line)]


def _claude(obj: dict[str, Any], run: LineParser) -> Iterable[RunEvent]:
    """Claude Code ``--output-format stream-json --verbose`` (and Qwen Code's and Amp's, the same shapes):
    ``system``/``init``, ``assistant`` messages (text, thinking, tool_use blocks), ``user`` messages carrying
    ``tool_result`` blocks, and the closing ``result`` (usage, cost, ``is_error``)."""
    kind = obj.get("type")
    if kind == "system" and obj.get("subtype") == "init":
        yield _started(obj.get("model"), obj.get("mcp_servers"))
        return
    if kind == "result":
        usage = _dict(obj.get("usage"))
        tokens_in = sum(_number(usage.get(k)) or 0 for k in ("input_tokens", "cache_creation_input_tokens",
                                                              "cache_read_input_tokens"))
        yield _usage(tokens_in, usage.get("output_tokens"), obj.get("total_cost_usd"))
        if obj.get("is_error") is True:
            err = _dict(obj.get("error"))
            yield RunEvent("error", _str(err.get("message")) or _compact(obj.get("result")))
        return
    for block in map(_dict, _list(_dict(obj.get("message")).get("content"))):
        part = block.get("type")
        if kind == "assistant" and part == "text":  # an API error comes as the assistant's text, flagged
            yield RunEvent("error" if obj.get("is_api_error_message") is True else "text", _str(block.get("text")))
        elif kind == "assistant" and part == "thinking":
            yield _thinking(block.get("thinking"))
        elif kind == "assistant" and part == "tool_use":
            name, args = _str(block.get("name")), block.get("input")
            inner = _dict(args)
            if name == "tool_call" and isinstance(inner.get("name"), str):  # Qwen Code's call of a deferred tool
                name, args = inner["name"], inner.get("arguments")
            if run.named(block.get("id"), name):
                yield _call(name, args)
        elif kind == "user" and part == "tool_result":
            yield _result(run.name_of(block.get("tool_use_id")), _content_text(block.get("content")),
                          failed=block.get("is_error") is True)


def _codex(obj: dict[str, Any], run: LineParser) -> Iterable[RunEvent]:
    """Codex ``exec --json``: items as they start and complete (agent_message, reasoning, command_execution,
    mcp_tool_call, file_change, web_search, error), ``turn.completed`` with usage, ``turn.failed`` and ``error``
    (a transient one, "Reconnecting… n/5", is shown too: it is what the CLI said)."""
    kind = obj.get("type")
    item = _dict(obj.get("item"))
    what = item.get("type")
    if kind == "turn.completed":
        usage = _dict(obj.get("usage"))
        yield _usage(usage.get("input_tokens"), usage.get("output_tokens"))
    elif kind == "turn.failed":
        yield RunEvent("error", _str(_dict(obj.get("error")).get("message")) or _compact(obj.get("error")))
    elif kind == "error":
        yield RunEvent("error", _str(obj.get("message")))
    elif kind == "item.started":
        if what == "command_execution":
            yield _call("shell", item.get("command"))
        elif what == "mcp_tool_call":
            yield _call(_str(item.get("tool")), item.get("arguments"))
        elif what == "file_change":
            yield _call("file_change", _changes(item))
        elif what == "web_search":
            yield _call("web_search", item.get("query"))
    elif kind == "item.completed":
        if what == "agent_message":
            yield RunEvent("text", _str(item.get("text")))
        elif what == "reasoning":
            yield _thinking(item.get("text"))
        elif what == "command_execution":
            yield _result("shell", f"exit {item.get('exit_code')}: {_str(item.get('aggregated_output'))}",
                          failed=item.get("status") == "failed")
        elif what == "mcp_tool_call":
            error = _dict(item.get("error"))
            text = _str(error.get("message")) or _content_text(_dict(item.get("result")).get("content"))
            yield _result(_str(item.get("tool")), text, failed=bool(error) or item.get("status") == "failed")
        elif what == "file_change":
            yield _result("file_change", f"{item.get('status')}: {_changes(item)}",
                          failed=item.get("status") == "failed")
        elif what == "error":
            yield RunEvent("error", _str(item.get("message")))


def _changes(item: dict[str, Any]) -> str:
    return ", ".join(f"{c.get('kind')} {c.get('path')}" for c in map(_dict, _list(item.get("changes"))))


def _gemini(obj: dict[str, Any], run: LineParser) -> Iterable[RunEvent]:
    """Gemini CLI ``--output-format stream-json``: ``init``, ``message`` (the assistant's in streamed pieces,
    ``delta``; the user's prompt is not repeated), ``tool_use``, ``tool_result``, ``error``, ``result`` (usage in
    ``stats``). Its ``json`` format is one object printed over many lines at the end: nothing to follow live."""
    kind = obj.get("type")
    if kind == "init":
        yield _started(obj.get("model"), None)
    elif kind == "message" and obj.get("role") == "assistant":
        if obj.get("delta") is True:
            run.piece(_str(obj.get("content")))
        else:
            yield RunEvent("text", _str(obj.get("content")))
    elif kind == "tool_use":
        name = _str(obj.get("tool_name"))
        if run.named(obj.get("tool_id"), name):
            yield _call(name, obj.get("parameters"))
    elif kind == "tool_result":
        said = _str(_dict(obj.get("error")).get("message")) or _content_text(obj.get("output"))
        yield _result(run.name_of(obj.get("tool_id")), said or _str(obj.get("status")),  # a write says only that
                      failed=obj.get("status") == "error")
    elif kind == "error":
        yield RunEvent("error", _str(obj.get("message")))
    elif kind == "result":
        stats = _dict(obj.get("stats"))
        yield _usage(stats.get("input_tokens"), stats.get("output_tokens"))
        if obj.get("status") == "error":
            yield RunEvent("error", _str(_dict(obj.get("error")).get("message")) or "the run failed")


def _opencode(obj: dict[str, Any], run: LineParser) -> Iterable[RunEvent]:
    """OpenCode ``run --format json``: ``text`` and ``reasoning`` parts, ``tool_use`` (printed once the tool ended:
    its call and its result together), ``step_finish`` (tokens and cost of the step), ``error``."""
    kind = obj.get("type")
    part = _dict(obj.get("part"))
    if kind == "text":
        yield RunEvent("text", _str(part.get("text")))
    elif kind == "reasoning":
        yield _thinking(part.get("text"))
    elif kind == "tool_use":
        name, state = _str(part.get("tool")), _dict(part.get("state"))
        yield _call(name, state.get("input"))
        if state.get("status") in ("completed", "error"):
            yield _result(name, _str(state.get("error")) or _content_text(state.get("output")),
                          failed=state.get("status") == "error")
    elif kind == "step_finish":
        tokens = _dict(part.get("tokens"))
        cache = _dict(tokens.get("cache"))
        yield _usage(sum(_number(v) or 0 for v in (tokens.get("input"), cache.get("read"), cache.get("write"))),
                     sum(_number(v) or 0 for v in (tokens.get("output"), tokens.get("reasoning"))), part.get("cost"))
    elif kind == "error":
        error = _dict(obj.get("error"))
        yield RunEvent("error", _str(_dict(error.get("data")).get("message")) or _str(error.get("name"))
                       or _compact(obj.get("error")))


def _copilot(obj: dict[str, Any], run: LineParser) -> Iterable[RunEvent]:
    """Copilot CLI ``--output-format json``: ``assistant.message`` (its text; the calls it asks for follow as
    ``tool.execution_start``), ``tool.execution_complete`` (success, result or error), ``session.error``. Its
    token counts are only in its usage file, read when the run ends."""
    kind = obj.get("type")
    data = _dict(obj.get("data"))
    if kind == "assistant.message":
        yield RunEvent("text", _str(data.get("content")))
    elif kind == "tool.execution_start":
        name = _str(data.get("toolName"))
        if run.named(data.get("toolCallId"), name):
            yield _call(name, data.get("arguments"))
    elif kind == "tool.execution_complete":
        failed = data.get("success") is False
        said = _dict(data.get("error")).get("message") if failed else _dict(data.get("result")).get("content")
        yield _result(run.name_of(data.get("toolCallId")), _content_text(said), failed=failed)
    elif kind == "session.error":
        yield RunEvent("error", f"{data.get('errorType', '?')}: {_str(data.get('message'))}")


def _droid(obj: dict[str, Any], run: LineParser) -> Iterable[RunEvent]:
    """Droid ``exec --output-format stream-json``: ``system`` init, ``message`` (the assistant's text),
    ``tool_call`` and ``tool_result``, ``completion`` (usage), ``error``."""
    kind = obj.get("type")
    if kind == "system" and obj.get("subtype") == "init":
        yield _started(obj.get("model"), None)
    elif kind == "message" and obj.get("role") == "assistant":
        yield RunEvent("text", _str(obj.get("text")))
    elif kind == "tool_call":
        name = _str(obj.get("toolName"))
        if run.named(obj.get("id"), name):
            yield _call(name, obj.get("parameters"))
    elif kind == "tool_result":
        yield _result(run.name_of(obj.get("id")) or _str(obj.get("toolId")) or None,
                      _content_text(obj.get("value")), failed=obj.get("isError") is True)
    elif kind == "completion":
        usage = _dict(obj.get("usage"))
        tokens_in = sum(_number(usage.get(k)) or 0 for k in ("input_tokens", "cache_read_input_tokens",
                                                              "cache_creation_input_tokens"))
        yield _usage(tokens_in, usage.get("output_tokens"))
    elif kind == "error":
        yield RunEvent("error", _str(obj.get("message")))


_READERS: dict[OutputKind, Reader] = {
    OutputKind.USAGE_JSON: lambda obj, run: (), OutputKind.CLAUDE_RESULT: _claude, OutputKind.STREAM_JSON: _claude,
    OutputKind.CODEX_EVENTS: _codex, OutputKind.GEMINI_JSON: _gemini, OutputKind.OPENCODE_EVENTS: _opencode,
    OutputKind.COPILOT_EVENTS: _copilot, OutputKind.DROID_EVENTS: _droid}
