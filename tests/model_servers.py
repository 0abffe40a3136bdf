"""Scripted stand-ins for the model providers' HTTP APIs, on 127.0.0.1, for driving the REAL agent CLIs
(tests/test_real_clis.py). What the CLI does (its argv, MCP start-up, tool naming, what reaches the model, its
output JSON) is real; only what "the model" answers is scripted here.

One server per wire protocol:

- ``AnthropicServer``: Anthropic Messages (Claude Code): ``POST /v1/messages`` streaming SSE (``message_start``,
  ``content_block_start/delta/stop`` with ``text_delta`` and ``input_json_delta``, ``message_delta`` with usage,
  ``message_stop``) or one JSON message when ``stream`` is false; ``POST /v1/messages/count_tokens``;
  ``GET /api/hello``.
- ``ResponsesServer``: OpenAI Responses (Codex): ``POST /v1/responses`` SSE (``response.created``,
  ``response.output_item.added/done``, ``response.output_text.delta``, ``response.completed`` with usage). Tool
  calls take the form the request offers: a ``custom_tool_call`` of the freeform ``exec`` tool (Codex's "code
  mode", whose JavaScript calls ``tools.<name>(…)``) or a ``function_call`` of a function tool.
- ``GeminiServer``: Gemini API (Gemini CLI): ``:streamGenerateContent?alt=sse``, ``:generateContent``,
  ``:countTokens``, ``usageMetadata``; the CLI's JSON side calls (its model router, its next-speaker check,
  ``responseMimeType: application/json``) are answered without consuming the script.
- ``ChatServer``: OpenAI Chat Completions (Qwen Code, OpenCode, Copilot CLI and Droid, each pointed at a provider
  of the user's own): ``POST /v1/chat/completions`` SSE chunks (``tool_calls`` deltas, a final usage chunk,
  ``[DONE]``); a request without tools (a title) or with a CLI's own side prompt (Qwen Code's memory extraction)
  is a side call.

A SCRIPT is a list of protocol-neutral steps, consumed one model turn at a time:

- ``{"tool": "<logical name>", "args": {...}}``: the model calls a tool. ``write_file`` (args ``path``,
  ``content``: an absolute path) maps to the CLI's own file-writing tool; ``kernel:<tool>`` to the taskkernel MCP
  server's tool as this CLI names it (``mcp__taskkernel__<tool>``, ``mcp_taskkernel_<tool>``,
  ``taskkernel_<tool>``, ``taskkernel-<tool>``, …), found in the request's tool list. For Claude Code and Droid,
  whose MCP tools are deferred behind ``ToolSearch``, a ``select:`` search is emitted first when the tool is not
  loaded yet (one extra turn, the step is not consumed); Qwen Code's deferred tools are called through its
  ``tool_call`` tool.
- ``{"text": "..."}``: the model's final answer, no tool call.
- ``{"status": 500|429|400, "body": {...}}``: the HTTP error (``body`` defaults to the provider's error shape).
- ``"times": n`` on any step: it is played n times before the next (a CLI retries an error: a persistent one is
  ``{"status": 400, "times": 9}``).
- ``{"delay": seconds}``: wait, then go on with the next step in the same request.

A step may carry ``"usage": {"in": N, "out": M}`` (default ``DEFAULT_USAGE``). A turn when the script is spent
answers ``{"text": "script exhausted"}`` and counts in ``exhausted``; a step the CLI's request cannot take (its
tool is not offered) is recorded in ``problems`` and answered with a final text, so the run ends at once (an
HTTP error would be retried for minutes).

Every request is recorded (``requests``: method, path, headers, JSON body, and ``kind``: ``turn``, ``side`` or
``other``), so a test can assert what the model saw: ``tool_results()`` gives the text of every tool result the
CLI sent back, in order. ``reported`` sums the usage the server answered, for turns and side calls apart.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DEFAULT_USAGE = {"in": 1000, "out": 50}
KERNEL = "kernel:"
MCP_SERVER = "taskkernel"


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    kind: str = "other"  # turn (consumed the script) | side (an auxiliary call the CLI makes) | other
    step: dict[str, Any] | None = None  # what the server answered a turn with
    at: float = field(default_factory=time.monotonic)


@dataclass
class Reply:
    """What a turn answers: an HTTP error, a tool call (the CLI's own name and arguments), or text."""

    status: int = 200
    error_body: Any = None
    tool: str | None = None
    args: Any = None
    text: str | None = None
    usage: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_USAGE))


class ScriptError(AssertionError):
    """The script cannot be played against what the CLI offered (e.g. the tool is not in its list)."""


class ModelServer:
    """A scripted provider on 127.0.0.1 (a random port), serving in a thread until ``stop()``."""

    protocol = ""
    model = "stand-in-model"

    def __init__(self, script: list[dict[str, Any]] | None = None) -> None:
        self.script: list[dict[str, Any]] = list(script or [])
        self.position = 0
        self._served: dict[int, int] = {}  # how often each step was played (``times``)
        self.requests: list[Recorded] = []
        self.reported = {"turn": {"in": 0, "out": 0}, "side": {"in": 0, "out": 0}}
        self.exhausted = 0
        self.problems: list[str] = []  # what the script could not do (read by tests after the run)
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- life ------------------------------------------------------------------------------------------------

    def start(self) -> ModelServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                server._handle(self, "GET")

            def do_POST(self) -> None:  # noqa: N802
                server._handle(self, "POST")

            def do_HEAD(self) -> None:  # noqa: N802
                server._handle(self, "HEAD")

        self._httpd = _Quiet(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name=f"{self.protocol}-model",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> ModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._httpd is not None, "not started"
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def load(self, script: list[dict[str, Any]]) -> None:
        """Replace the script (and start it from its first step)."""
        with self._lock:
            self.script, self.position, self._served = list(script), 0, {}

    # -- what was seen ---------------------------------------------------------------------------------------

    def turns(self) -> list[Recorded]:
        return [r for r in self.requests if r.kind == "turn"]

    def tool_results(self) -> list[str]:
        """The text of every tool result the CLI sent back to the model, in the order they first appeared."""
        seen: list[str] = []
        for req in self.turns():
            for text in self._results_in(req.body):
                if text not in seen:
                    seen.append(text)
        return seen

    def tool_names(self, req: Recorded) -> list[str]:
        """The tool names a request offered the model."""
        return self._tool_names(req.body)

    # -- the protocol's parts (overridden) -------------------------------------------------------------------

    def _route(self, method: str, path: str, body: Any) -> str:
        """turn | side | other"""
        raise NotImplementedError

    def _answer_other(self, handler: BaseHTTPRequestHandler, method: str, path: str, body: Any) -> None:
        self._send_json(handler, 404, {"error": {"message": f"no such endpoint {path}"}})

    def _answer_side(self, handler: BaseHTTPRequestHandler, path: str, body: Any) -> None:
        raise NotImplementedError

    def _tool_names(self, body: Any) -> list[str]:
        raise NotImplementedError

    def _resolve(self, body: Any, step: dict[str, Any]) -> Reply | None:
        """The CLI's own form of a tool step, or None when an extra turn comes first (Claude's ToolSearch)."""
        raise NotImplementedError

    def _send_reply(self, handler: BaseHTTPRequestHandler, path: str, body: Any, reply: Reply) -> None:
        raise NotImplementedError

    def _error_body(self, status: int) -> Any:
        return {"error": {"code": status, "message": f"stand-in error {status}"}}

    def _results_in(self, body: Any) -> Iterator[str]:
        raise NotImplementedError

    # -- plumbing --------------------------------------------------------------------------------------------

    def _handle(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        length = int(handler.headers.get("content-length") or 0)
        raw = handler.rfile.read(length) if length else b""
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        kind = self._route(method, handler.path, body)
        rec = Recorded(method, handler.path, {k.lower(): v for k, v in handler.headers.items()}, body, kind)
        with self._lock:
            self.requests.append(rec)
        try:
            if kind == "side":
                self._answer_side(handler, handler.path, body)
            elif kind == "turn":
                self._turn(handler, handler.path, body, rec)
            else:
                self._answer_other(handler, method, handler.path, body)
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as exc:  # a bug in the stand-in: say so to the test, answer 500
            self.problems.append(f"{type(exc).__name__}: {exc}")
            with contextlib.suppress(OSError):
                self._send_json(handler, 500, {"error": {"message": f"stand-in failed: {exc}"}})

    def _turn(self, handler: BaseHTTPRequestHandler, path: str, body: Any, rec: Recorded) -> None:
        step, reply = self._next(body)
        usage = step.get("usage") or DEFAULT_USAGE
        reply.usage = {"in": int(usage["in"]), "out": int(usage["out"])}
        rec.step = {**step, "answered": reply.tool or ("text" if reply.text is not None else reply.status)}
        if reply.status != 200:
            body_out = reply.error_body if reply.error_body is not None else self._error_body(reply.status)
            self._send_json(handler, reply.status, body_out)
            return
        with self._lock:
            self.reported["turn"]["in"] += reply.usage["in"]
            self.reported["turn"]["out"] += reply.usage["out"]
        self._send_reply(handler, path, body, reply)

    def _next(self, body: Any) -> tuple[dict[str, Any], Reply]:
        """The step this turn plays (delays slept on the way) and its reply in the CLI's terms."""
        while True:
            with self._lock:
                if self.position >= len(self.script):
                    self.exhausted += 1
                    return {"text": "script exhausted"}, Reply(text="script exhausted")
                step = self.script[self.position]
                if "delay" in step:
                    self.position += 1
                    delay = float(step["delay"])
                else:
                    if "status" in step:
                        reply = Reply(status=int(step["status"]), error_body=step.get("body"))
                    elif "text" in step:
                        reply = Reply(text=str(step["text"]))
                    elif "tool" in step:
                        try:
                            reply = self._resolve(body, step) or Reply(text="unresolved")
                        except ScriptError as exc:  # end the run quickly (an HTTP error would be retried)
                            self.problems.append(str(exc))
                            self.position = len(self.script)
                            return step, Reply(text=f"stand-in model: cannot play the script: {exc}")
                    else:
                        raise ScriptError(f"unknown step {step}")
                    served = self._served.get(self.position, 0) + 1
                    self._served[self.position] = served
                    if not isinstance(reply, _Extra) and served >= int(step.get("times", 1)):
                        self.position += 1
                    return step, reply
            time.sleep(delay)

    def _count_side(self, usage: dict[str, int]) -> None:
        with self._lock:
            self.reported["side"]["in"] += usage["in"]
            self.reported["side"]["out"] += usage["out"]

    def next_id(self, prefix: str) -> str:
        return f"{prefix}_{next(self._ids):04d}"

    @staticmethod
    def _send_json(handler: BaseHTTPRequestHandler, status: int, obj: Any, headers: dict[str, str] | None = None
                   ) -> None:
        data = json.dumps(obj).encode("utf-8")
        handler.send_response(status)
        handler.send_header("content-type", "application/json")
        handler.send_header("content-length", str(len(data)))
        for k, v in (headers or {}).items():
            handler.send_header(k, v)
        handler.end_headers()
        handler.wfile.write(data)

    @staticmethod
    def _sse(handler: BaseHTTPRequestHandler, events: list[tuple[str | None, Any]]) -> None:
        """Server-sent events, each ``event:`` (when named) and ``data:`` (JSON, or a raw string)."""
        handler.send_response(200)
        handler.send_header("content-type", "text/event-stream")
        handler.send_header("cache-control", "no-cache")
        handler.send_header("connection", "close")
        handler.end_headers()
        handler.close_connection = True
        for name, data in events:
            chunk = (f"event: {name}\n" if name else "") + "data: " + (
                data if isinstance(data, str) else json.dumps(data)) + "\n\n"
            handler.wfile.write(chunk.encode("utf-8"))
            handler.wfile.flush()


class _Quiet(ThreadingHTTPServer):
    """No traceback on stderr when a CLI drops its connection (it does, on a retry or when it exits)."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass


class _Extra(Reply):
    """A turn that does not consume the step (it prepares it, e.g. Claude's ToolSearch)."""

    extra_turn = True


# ---------------------------------------------------------------------------------------------------------------
# Anthropic Messages (Claude Code)
# ---------------------------------------------------------------------------------------------------------------


class AnthropicServer(ModelServer):
    protocol = "anthropic"
    model = "claude-sonnet-4-5"
    file_tool = "Write"
    search_tool = "ToolSearch"

    def _route(self, method: str, path: str, body: Any) -> str:
        if method == "POST" and path.split("?")[0] == "/v1/messages" and isinstance(body, dict):
            return "turn" if self._is_agent_turn(body) else "side"
        return "other"

    def _is_agent_turn(self, body: dict[str, Any]) -> bool:
        """The agent loop's requests offer tools; Claude Code's side calls (a quota probe, a title) offer none."""
        return bool(body.get("tools"))

    def _answer_other(self, handler: BaseHTTPRequestHandler, method: str, path: str, body: Any) -> None:
        bare = path.split("?")[0]
        if bare == "/v1/messages/count_tokens":
            self._send_json(handler, 200, {"input_tokens": DEFAULT_USAGE["in"]})
        elif bare == "/api/hello":
            if method == "HEAD":
                handler.send_response(200)
                handler.send_header("content-length", "0")
                handler.end_headers()
            else:
                self._send_json(handler, 200, {"message": "hello"})
        else:
            super()._answer_other(handler, method, path, body)

    def _answer_side(self, handler: BaseHTTPRequestHandler, path: str, body: Any) -> None:
        usage = {"in": 10, "out": 1}
        self._count_side(usage)
        reply = Reply(text="ok", usage=usage)
        self._send_reply(handler, path, body, reply)

    def _tool_names(self, body: Any) -> list[str]:
        return [t.get("name", "") for t in (body or {}).get("tools") or [] if isinstance(t, dict)]

    def _resolve(self, body: Any, step: dict[str, Any]) -> Reply | None:
        name, args = step["tool"], dict(step.get("args") or {})
        offered = self._tool_names(body)
        if name == "write_file":
            return Reply(tool=self.file_tool, args={"file_path": args["path"], "content": args["content"]})
        if name.startswith(KERNEL):
            full = f"mcp__{MCP_SERVER}__{name[len(KERNEL):]}"
            if full in offered:
                return Reply(tool=full, args=args)
            if self.search_tool in offered and full in json.dumps(body):  # deferred: load it first
                wanted = [full, *(f"mcp__{MCP_SERVER}__{s['tool'][len(KERNEL):]}" for s in self.script
                                  if str(s.get("tool", "")).startswith(KERNEL))]  # every one the script needs
                names = ",".join(dict.fromkeys(wanted))
                return _Extra(tool=self.search_tool, args={"query": f"select:{names}", "max_results": 20})
            raise ScriptError(f"{full} is not offered (tools: {offered})")
        if name in offered:
            return Reply(tool=name, args=args)
        raise ScriptError(f"{name} is not offered (tools: {offered})")

    def _send_reply(self, handler: BaseHTTPRequestHandler, path: str, body: Any, reply: Reply) -> None:
        msg_id = self.next_id("msg")
        model = (body or {}).get("model") or self.model
        usage_in = reply.usage["in"]
        blocks: list[dict[str, Any]] = []
        if reply.tool is not None:
            blocks.append({"type": "tool_use", "id": self.next_id("toolu"), "name": reply.tool, "input": reply.args})
            stop = "tool_use"
        else:
            blocks.append({"type": "text", "text": reply.text or ""})
            stop = "end_turn"
        usage = {"input_tokens": usage_in, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                 "output_tokens": reply.usage["out"]}
        if not (body or {}).get("stream"):
            self._send_json(handler, 200, {"id": msg_id, "type": "message", "role": "assistant", "model": model,
                                           "content": blocks, "stop_reason": stop, "stop_sequence": None,
                                           "usage": usage})
            return
        events: list[tuple[str | None, Any]] = [("message_start", {"type": "message_start", "message": {
            "id": msg_id, "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": {**usage, "output_tokens": 1}}})]
        for index, block in enumerate(blocks):
            if block["type"] == "text":
                events.append(("content_block_start", {"type": "content_block_start", "index": index,
                                                       "content_block": {"type": "text", "text": ""}}))
                events.append(("content_block_delta", {"type": "content_block_delta", "index": index,
                                                       "delta": {"type": "text_delta", "text": block["text"]}}))
            else:
                events.append(("content_block_start", {"type": "content_block_start", "index": index,
                                                       "content_block": {**block, "input": {}}}))
                text = json.dumps(block["input"])
                half = len(text) // 2  # two deltas: the CLI must join them
                for part in (text[:half], text[half:]):
                    events.append(("content_block_delta", {"type": "content_block_delta", "index": index,
                                                           "delta": {"type": "input_json_delta",
                                                                     "partial_json": part}}))
            events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        events.append(("message_delta", {"type": "message_delta",
                                         "delta": {"stop_reason": stop, "stop_sequence": None},
                                         "usage": {"output_tokens": reply.usage["out"]}}))
        events.append(("message_stop", {"type": "message_stop"}))
        self._sse(handler, events)

    def _error_body(self, status: int) -> Any:
        kinds = {400: "invalid_request_error", 401: "authentication_error", 429: "rate_limit_error",
                 500: "api_error", 529: "overloaded_error"}
        return {"type": "error", "error": {"type": kinds.get(status, "api_error"),
                                           "message": f"stand-in error {status}"}}

    def _results_in(self, body: Any) -> Iterator[str]:
        for message in (body or {}).get("messages") or []:
            content = message.get("content")
            for block in content if isinstance(content, list) else []:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    inner = block.get("content")
                    if isinstance(inner, str):
                        yield inner
                    elif texts := [str(c["text"]) for c in inner or [] if isinstance(c, dict) and "text" in c]:
                        yield "\n".join(texts)  # (a ToolSearch result holds tool references, no text)


# ---------------------------------------------------------------------------------------------------------------
# OpenAI Responses (Codex)
# ---------------------------------------------------------------------------------------------------------------


class ResponsesServer(ModelServer):
    protocol = "responses"
    model = "gpt-5-codex"

    def _route(self, method: str, path: str, body: Any) -> str:
        if method == "POST" and path.split("?")[0].endswith("/responses") and isinstance(body, dict):
            return "turn"
        return "other"

    def _answer_other(self, handler: BaseHTTPRequestHandler, method: str, path: str, body: Any) -> None:
        if method == "GET" and path.split("?")[0].endswith("/models"):
            self._send_json(handler, 200, {"object": "list", "data": [], "models": []})
        else:
            super()._answer_other(handler, method, path, body)

    @staticmethod
    def _all_tools(body: Any) -> list[dict[str, Any]]:
        """The top-level tools and those of an ``additional_tools`` input item, namespaces flattened."""
        found = [t for t in (body or {}).get("tools") or [] if isinstance(t, dict)]
        for item in (body or {}).get("input") or []:
            if isinstance(item, dict) and isinstance(item.get("tools"), list):
                found += [t for t in item["tools"] if isinstance(t, dict)]
        flat: list[dict[str, Any]] = []
        while found:
            tool = found.pop(0)
            if tool.get("type") == "namespace" and isinstance(tool.get("tools"), list):
                found = [t for t in tool["tools"] if isinstance(t, dict)] + found
            else:
                flat.append(tool)
        return flat

    def _tool_names(self, body: Any) -> list[str]:
        return [str(t.get("name") or t.get("type")) for t in self._all_tools(body)]

    def code_mode(self, body: Any) -> bool:
        return any(t.get("type") == "custom" and t.get("name") == "exec" for t in self._all_tools(body))

    def _resolve(self, body: Any, step: dict[str, Any]) -> Reply | None:
        name, args = step["tool"], dict(step.get("args") or {})
        if name.startswith(KERNEL):
            target = f"mcp__{MCP_SERVER}__{name[len(KERNEL):]}"
        elif name == "write_file":
            target = "write_file"
        else:
            target = name
        if self.code_mode(body):
            return Reply(tool="exec", args=_exec_source(target, args))
        offered = self._tool_names(body)
        if target == "write_file":
            raise ScriptError(f"write_file without code mode is not scripted (tools: {offered})")
        if target not in offered:
            raise ScriptError(f"{target} is not offered (tools: {offered})")
        return Reply(tool=target, args=args)

    def _send_reply(self, handler: BaseHTTPRequestHandler, path: str, body: Any, reply: Reply) -> None:
        resp_id = self.next_id("resp")
        model = (body or {}).get("model") or self.model
        if reply.tool is not None and self.code_mode(body) and reply.tool == "exec":
            item: dict[str, Any] = {"type": "custom_tool_call", "id": self.next_id("ctc"), "status": "completed",
                                    "call_id": self.next_id("call"), "name": "exec", "input": reply.args}
        elif reply.tool is not None:
            item = {"type": "function_call", "id": self.next_id("fc"), "status": "completed",
                    "call_id": self.next_id("call"), "name": reply.tool, "arguments": json.dumps(reply.args)}
        else:
            item = {"type": "message", "id": self.next_id("msg"), "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": reply.text or "", "annotations": []}]}
        base = {"id": resp_id, "object": "response", "created_at": int(time.time()), "model": model}
        usage = {"input_tokens": reply.usage["in"], "input_tokens_details": {"cached_tokens": 0},
                 "output_tokens": reply.usage["out"], "output_tokens_details": {"reasoning_tokens": 0},
                 "total_tokens": reply.usage["in"] + reply.usage["out"]}
        seq = itertools.count()
        events: list[tuple[str | None, Any]] = [
            ("response.created", {"type": "response.created", "sequence_number": next(seq),
                                  "response": {**base, "status": "in_progress", "output": []}})]
        if item["type"] == "message":
            events.append(("response.output_item.added", {
                "type": "response.output_item.added", "sequence_number": next(seq), "output_index": 0,
                "item": {**item, "status": "in_progress", "content": []}}))
            events.append(("response.output_text.delta", {
                "type": "response.output_text.delta", "sequence_number": next(seq), "item_id": item["id"],
                "output_index": 0, "content_index": 0, "delta": reply.text or ""}))
        else:
            events.append(("response.output_item.added", {"type": "response.output_item.added",
                                                           "sequence_number": next(seq), "output_index": 0,
                                                           "item": item}))
        events.append(("response.output_item.done", {"type": "response.output_item.done",
                                                      "sequence_number": next(seq), "output_index": 0, "item": item}))
        events.append(("response.completed", {"type": "response.completed", "sequence_number": next(seq),
                                              "response": {**base, "status": "completed", "output": [item],
                                                           "usage": usage}}))
        self._sse(handler, events)

    def _error_body(self, status: int) -> Any:
        kinds = {400: "invalid_request_error", 429: "rate_limit_exceeded", 500: "server_error"}
        return {"error": {"type": kinds.get(status, "server_error"), "code": kinds.get(status, "server_error"),
                          "message": f"stand-in error {status}", "param": None}}

    def _results_in(self, body: Any) -> Iterator[str]:
        for item in (body or {}).get("input") or []:
            if isinstance(item, dict) and item.get("type") in ("function_call_output", "custom_tool_call_output"):
                out = item.get("output")
                if isinstance(out, str):
                    yield out
                elif isinstance(out, list):
                    yield "\n".join(str(c.get("text", "")) for c in out if isinstance(c, dict))
                elif isinstance(out, dict):
                    yield str(out.get("content") or json.dumps(out))


def _exec_source(target: str, args: dict[str, Any]) -> str:
    """The JavaScript a model writes for Codex's code-mode ``exec`` tool: one call, its result printed."""
    if target == "write_file":
        return (f"await tools.apply_patch({json.dumps(_add_file_patch(args['path'], args['content']))});\n"
                f"text({json.dumps('wrote ' + args['path'])});\n")
    # what a model prints of an MCP result: its text content (a host that forwards only text sees the same)
    return (f"const r = await tools.{target}({json.dumps(args)});\n"
            "text((r.content || []).map((c) => c.text || '').join('\\n'));\n")


def _add_file_patch(path: str, content: str) -> str:
    lines = content.splitlines() or [""]
    return "*** Begin Patch\n*** Add File: " + path + "\n" + "".join(f"+{line}\n" for line in lines) + \
        "*** End Patch\n"


# ---------------------------------------------------------------------------------------------------------------
# Gemini API (Gemini CLI)
# ---------------------------------------------------------------------------------------------------------------


class GeminiServer(ModelServer):
    protocol = "gemini"
    model = "gemini-2.5-pro"
    file_tool = "write_file"

    def _route(self, method: str, path: str, body: Any) -> str:
        bare = path.split("?")[0]
        if method != "POST" or not isinstance(body, dict):
            return "other"
        if bare.endswith(":streamGenerateContent") or bare.endswith(":generateContent"):
            config = body.get("generationConfig") or body.get("config") or {}
            if config.get("responseMimeType") == "application/json" or config.get("responseJsonSchema") \
                    or config.get("responseSchema"):
                return "side"
            return "turn"
        return "other"

    def _answer_other(self, handler: BaseHTTPRequestHandler, method: str, path: str, body: Any) -> None:
        if path.split("?")[0].endswith(":countTokens"):
            self._send_json(handler, 200, {"totalTokens": DEFAULT_USAGE["in"]})
        else:
            super()._answer_other(handler, method, path, body)

    # the answers of the CLI's JSON side calls, by the property its schema asks for
    SIDE_VALUES: dict[str, Any] = {"next_speaker": "user", "model_choice": "flash", "complexity_score": 10,
                                   "complexity_reasoning": "a simple, explicit task",
                                   "reasoning": "the model finished its turn"}

    def side_answer(self, body: Any) -> Any:
        """What a JSON side call wants (the model router, the next-speaker check): a value of its schema."""
        config = (body or {}).get("generationConfig") or {}
        schema = config.get("responseJsonSchema") or config.get("responseSchema") or {}
        return self._from_schema(schema, "")

    def _from_schema(self, schema: Any, name: str) -> Any:
        if name in self.SIDE_VALUES:
            return self.SIDE_VALUES[name]
        schema = schema if isinstance(schema, dict) else {}
        kind = str(schema.get("type") or "object").lower()
        if schema.get("enum"):
            return schema["enum"][0]
        if kind == "object":
            props = schema.get("properties") or {}
            return {k: self._from_schema(v, k) for k, v in props.items()}
        if kind == "array":
            return []
        if kind in ("integer", "number"):
            return 1
        if kind == "boolean":
            return False
        return "ok"

    def _answer_side(self, handler: BaseHTTPRequestHandler, path: str, body: Any) -> None:
        usage = {"in": 10, "out": 1}
        self._count_side(usage)
        self._send_reply(handler, path, body, Reply(text=json.dumps(self.side_answer(body)), usage=usage))

    def _tool_names(self, body: Any) -> list[str]:
        names = []
        for group in (body or {}).get("tools") or []:
            for decl in (group or {}).get("functionDeclarations") or []:
                names.append(decl.get("name", ""))
        return names

    def _resolve(self, body: Any, step: dict[str, Any]) -> Reply | None:
        name, args = step["tool"], dict(step.get("args") or {})
        offered = self._tool_names(body)
        if name == "write_file":
            return Reply(tool=self.file_tool, args={"file_path": args["path"], "content": args["content"]})
        if name.startswith(KERNEL):
            tool = name[len(KERNEL):]
            for candidate in (f"mcp_{MCP_SERVER}_{tool}", f"{MCP_SERVER}__{tool}", tool):
                if candidate in offered:
                    return Reply(tool=candidate, args=args)
            raise ScriptError(f"{name} is not offered (tools: {offered})")
        if name in offered:
            return Reply(tool=name, args=args)
        raise ScriptError(f"{name} is not offered (tools: {offered})")

    def _send_reply(self, handler: BaseHTTPRequestHandler, path: str, body: Any, reply: Reply) -> None:
        if reply.tool is not None:
            parts: list[dict[str, Any]] = [{"functionCall": {"name": reply.tool, "args": reply.args}}]
        else:
            parts = [{"text": reply.text or ""}]
        model = path.split("/models/")[-1].split(":")[0] if "/models/" in path else self.model
        chunk = {"candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}],
                 "usageMetadata": {"promptTokenCount": reply.usage["in"],
                                   "candidatesTokenCount": reply.usage["out"],
                                   "totalTokenCount": reply.usage["in"] + reply.usage["out"]},
                 "modelVersion": model, "responseId": self.next_id("gem")}
        if ":streamGenerateContent" in path:
            handler.send_response(200)
            handler.send_header("content-type", "text/event-stream")
            handler.send_header("connection", "close")
            handler.end_headers()
            handler.close_connection = True
            handler.wfile.write(("data: " + json.dumps(chunk) + "\r\n\r\n").encode("utf-8"))
            handler.wfile.flush()
        else:
            self._send_json(handler, 200, chunk)

    def _error_body(self, status: int) -> Any:
        states = {400: "INVALID_ARGUMENT", 403: "PERMISSION_DENIED", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL",
                  503: "UNAVAILABLE"}
        return {"error": {"code": status, "message": f"stand-in error {status}",
                          "status": states.get(status, "INTERNAL")}}

    def _results_in(self, body: Any) -> Iterator[str]:
        for content in (body or {}).get("contents") or []:
            for part in (content or {}).get("parts") or []:
                response = (part or {}).get("functionResponse")
                if isinstance(response, dict):
                    inner = response.get("response")
                    if isinstance(inner, dict) and isinstance(inner.get("output"), str):
                        yield inner["output"]
                    else:
                        yield json.dumps(inner)


# ---------------------------------------------------------------------------------------------------------------
# OpenAI Chat Completions (for the CLIs that speak it)
# ---------------------------------------------------------------------------------------------------------------


class ChatServer(ModelServer):
    """OpenAI Chat Completions, as Qwen Code, OpenCode, Copilot CLI and Droid speak it (each to a provider of the
    user's own). How each CLI offers a kernel tool differs, and ``_resolve`` follows what the request offers:
    the tool itself (OpenCode ``taskkernel_<tool>``, Copilot ``taskkernel-<tool>``); Qwen Code's ``tool_call``
    wrapper (``{"name": "mcp__taskkernel__<tool>", "arguments": {…}}``, the deferred tool listed in a reminder);
    Droid's ``ToolSearch`` (``select:taskkernel___<tool>`` first, one extra turn, then ``taskkernel___<tool>``).
    A CLI's own write tool is found by name and its parameters by its schema (``file_path``, ``filePath`` or
    ``path``; ``content`` or ``file_text``)."""

    protocol = "chat"
    model = "gpt-4.1"
    file_tools = ("write_file", "write", "Write", "create", "Create")
    search_tool = "ToolSearch"
    wrapper_tool = "tool_call"
    # requests a CLI makes on its own that offer tools but are not its agent's turn: answered "ok", not scripted
    SIDE_PROMPTS = ("managed memory extraction subagent",)  # Qwen Code's memory extraction after a turn

    def _route(self, method: str, path: str, body: Any) -> str:
        if method == "POST" and path.split("?")[0].endswith("/chat/completions") and isinstance(body, dict):
            if not body.get("tools"):
                return "side"
            system = " ".join(_text_of(m.get("content")) for m in body.get("messages") or []
                              if isinstance(m, dict) and m.get("role") == "system")
            return "side" if any(marker in system for marker in self.SIDE_PROMPTS) else "turn"
        return "other"

    def _answer_other(self, handler: BaseHTTPRequestHandler, method: str, path: str, body: Any) -> None:
        if method == "GET" and path.split("?")[0].endswith("/models"):
            self._send_json(handler, 200, {"object": "list", "data": [{"id": self.model, "object": "model"}]})
        else:
            super()._answer_other(handler, method, path, body)

    def _answer_side(self, handler: BaseHTTPRequestHandler, path: str, body: Any) -> None:
        usage = {"in": 10, "out": 1}
        self._count_side(usage)
        self._send_reply(handler, path, body, Reply(text="ok", usage=usage))

    @staticmethod
    def _tools(body: Any) -> dict[str, dict[str, Any]]:
        """Offered tool name -> its function declaration."""
        out = {}
        for tool in (body or {}).get("tools") or []:
            function = (tool or {}).get("function") or {}
            out[str(function.get("name"))] = function
        return out

    def _tool_names(self, body: Any) -> list[str]:
        return list(self._tools(body))

    def _resolve(self, body: Any, step: dict[str, Any]) -> Reply | None:
        name, args = step["tool"], dict(step.get("args") or {})
        tools = self._tools(body)
        offered = list(tools)
        if name == "write_file":
            for candidate in self.file_tools:
                if candidate in tools:
                    params = set((tools[candidate].get("parameters") or {}).get("properties") or {})
                    path_key = next((k for k in ("file_path", "filePath", "path") if k in params), None)
                    text_key = next((k for k in ("content", "file_text") if k in params), None)
                    if path_key is None or text_key is None:
                        raise ScriptError(f"{candidate} takes {sorted(params)}: no path and content parameter")
                    return Reply(tool=candidate, args={path_key: args["path"], text_key: args["content"]})
            raise ScriptError(f"no file-writing tool offered (tools: {offered})")
        if name.startswith(KERNEL):
            tool = name[len(KERNEL):]
            for candidate in (f"mcp__{MCP_SERVER}__{tool}", f"{MCP_SERVER}_{tool}", f"mcp_{MCP_SERVER}_{tool}",
                              f"{MCP_SERVER}-{tool}", f"{MCP_SERVER}___{tool}", tool):
                if candidate in tools:
                    return Reply(tool=candidate, args=args)
            said = json.dumps(body)
            wrapped = f"mcp__{MCP_SERVER}__{tool}"
            if self.wrapper_tool in tools and wrapped in said:  # Qwen Code: deferred, called through tool_call
                return Reply(tool=self.wrapper_tool, args={"name": wrapped, "arguments": args})
            deferred = f"{MCP_SERVER}___{tool}"
            if self.search_tool in tools and deferred in said:  # Droid: deferred, loaded by a select: search
                wanted = [deferred, *(f"{MCP_SERVER}___{s['tool'][len(KERNEL):]}" for s in self.script
                                      if str(s.get("tool", "")).startswith(KERNEL))]
                return _Extra(tool=self.search_tool, args={"query": "select:" + ",".join(dict.fromkeys(wanted))})
            raise ScriptError(f"{name} is not offered (tools: {offered})")
        if name in tools:
            return Reply(tool=name, args=args)
        raise ScriptError(f"{name} is not offered (tools: {offered})")

    def _send_reply(self, handler: BaseHTTPRequestHandler, path: str, body: Any, reply: Reply) -> None:
        chunk_id, created = self.next_id("chatcmpl"), int(time.time())
        model = (body or {}).get("model") or self.model
        usage = {"prompt_tokens": reply.usage["in"], "completion_tokens": reply.usage["out"],
                 "total_tokens": reply.usage["in"] + reply.usage["out"]}
        if reply.tool is not None:
            call_id = self.next_id("call")
            text = json.dumps(reply.args)
            deltas: list[dict[str, Any]] = [
                {"role": "assistant", "content": None, "tool_calls": [
                    {"index": 0, "id": call_id, "type": "function",
                     "function": {"name": reply.tool, "arguments": ""}}]},
                {"tool_calls": [{"index": 0, "function": {"arguments": text[:len(text) // 2]}}]},
                {"tool_calls": [{"index": 0, "function": {"arguments": text[len(text) // 2:]}}]}]
            finish = "tool_calls"
            message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": reply.tool, "arguments": text}}]}
        else:
            deltas = [{"role": "assistant", "content": ""}, {"content": reply.text or ""}]
            finish = "stop"
            message = {"role": "assistant", "content": reply.text or ""}
        if not (body or {}).get("stream"):
            self._send_json(handler, 200, {"id": chunk_id, "object": "chat.completion", "created": created,
                                           "model": model, "choices": [{"index": 0, "message": message,
                                                                        "finish_reason": finish}],
                                           "usage": usage})
            return
        base = {"id": chunk_id, "object": "chat.completion.chunk", "created": created, "model": model}
        events: list[tuple[str | None, Any]] = [
            (None, {**base, "choices": [{"index": 0, "delta": d, "finish_reason": None}]}) for d in deltas]
        events.append((None, {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}))
        events.append((None, {**base, "choices": [], "usage": usage}))
        events.append((None, "[DONE]"))
        self._sse(handler, events)

    def _error_body(self, status: int) -> Any:
        """OpenAI's error shape. (What a CLI retries may hang on its words: OpenCode retries any error whose body
        says "server_error" or a 5xx/429 code, so a 400 says "invalid_request_error", as OpenAI's does.)"""
        kinds = {400: "invalid_request_error", 401: "invalid_request_error", 429: "requests", 500: "server_error"}
        codes = {401: "invalid_api_key", 429: "rate_limit_exceeded"}
        return {"error": {"message": f"stand-in error {status}", "type": kinds.get(status, "server_error"),
                          "param": None, "code": codes.get(status)}}

    def _results_in(self, body: Any) -> Iterator[str]:
        called: dict[str, str] = {}  # tool call id -> the tool's name
        for message in (body or {}).get("messages") or []:
            if not isinstance(message, dict):
                continue
            for call in message.get("tool_calls") or []:
                if isinstance(call, dict):
                    called[str(call.get("id"))] = str((call.get("function") or {}).get("name"))
            if message.get("role") == "tool" and called.get(str(message.get("tool_call_id"))) != self.search_tool:
                yield _text_of(message.get("content"))  # (what Droid's ToolSearch loaded is no tool's result)


def _text_of(content: Any) -> str:
    """A chat message's content as text: a string, or the text of its parts (Qwen Code sends a list)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(c.get("text", "")) for c in content if isinstance(c, dict))
    return json.dumps(content)


SERVERS: dict[str, Callable[[list[dict[str, Any]] | None], ModelServer]] = {
    "anthropic": AnthropicServer, "responses": ResponsesServer, "gemini": GeminiServer, "chat": ChatServer}
