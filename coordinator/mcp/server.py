"""The MCP server on the official SDK's low-level server (mcp 2.x): tools, resources, stdio and streamable HTTP.

Identity: over stdio the server acts as the credential it was started with (``TASKKERNEL_TOKEN``), or as the
local owner where the workspace allows it; over HTTP every request carries ``Authorization: Bearer <token>``
(else 401, before the request reaches the protocol). Either way the credential is authenticated again at each
call, so a credential revoked while the server runs stops working at once.

A refusal is a tool result (``isError: true``) whose structured content says why; protocol errors are for calls
that are malformed (an unknown tool, arguments that do not fit the tool's input schema). An infrastructure fault
is a refusal with the CLI's fault code (``database_unreachable``, …); its traceback goes to the CLI log, never to
the client. Tool code runs in worker threads: a slow database never blocks the transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import stat
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, NamedTuple

import anyio
import anyio.to_thread
import mcp_types as types
import pydantic_core
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, PARSE_ERROR
from pydantic import ValidationError

from taskkernel import __version__
from taskkernel.coordinator.mcp import resources
from taskkernel.coordinator.mcp.results import Outcome, refusal
from taskkernel.coordinator.mcp.schemas import input_schema, output_schema
from taskkernel.coordinator.mcp.tools import TOOLS, TaskTools
from taskkernel.coordinator.runners.ledger import authenticate_agent
from taskkernel.coordinator.serving import MAX_REQUEST_BYTES, is_loopback, serve
from taskkernel.kernel.logging import get_logger
from taskkernel.kernel.model.principal import Principal
from taskkernel.kernel.reasons import KernelError, ReasonCode

log = get_logger(__name__)
RESOURCE_NOT_FOUND = -32002  # the MCP specification's code for a resource that does not exist
HTTP_PATH = "/mcp"
# The most one JSON-RPC message may take: a line over stdio (answered -32600 beyond), a request body over HTTP
# (answered 413): the one limit of every server here (serving.py).
MAX_MESSAGE_BYTES = MAX_REQUEST_BYTES
PRINCIPAL_KEY = "taskkernel.principal"  # where the bearer gate leaves the request's principal (ASGI scope)
INSTRUCTIONS = (
    "taskkernel coordinates a team of agents through tasks. whoami says who you are. Work: list_tasks "
    "(assigned_to_me, waiting_for_my_review), get_task, then claim_task, report (status done and a body), "
    "submit_task; reviewers approve_task or reject_task. Every change is judged by the kernel: a refusal is an "
    "error result with a stable reason code and the task's current revision and round. Before a protected "
    "action, check_action; perform does it through the execution gate. add_progress records a checkpoint; after "
    "a context compaction, resume says where to continue and which instructions came after.")

Who = Callable[[ServerRequestContext[Any, Any]], Callable[[], Principal]]


def build_server(tools: TaskTools, who: Who) -> Server[Any]:
    """The low-level server with every tool and both resources; ``who(ctx)`` is the call's principal, read
    when the call runs."""
    listed = [types.Tool(name=t.name, title=t.title, description=t.description, input_schema=input_schema(t.args),
                         output_schema=output_schema(t.result),
                         annotations=types.ToolAnnotations(title=t.title, read_only_hint=t.read_only,
                                                           destructive_hint=t.destructive,
                                                           idempotent_hint=not t.read_only, open_world_hint=False))
              for t in TOOLS]
    by_name = {t.name: t for t in TOOLS}

    async def list_tools(ctx: ServerRequestContext[Any, Any], params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=listed)

    async def call_tool(ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
                        ) -> types.CallToolResult:
        tool = by_name.get(params.name)
        if tool is None:
            raise MCPError(INVALID_PARAMS, f"unknown tool {params.name!r}; the tools are {', '.join(by_name)}")
        try:
            args = tool.args.model_validate(params.arguments or {})
        except ValidationError as exc:
            raise MCPError(INVALID_PARAMS, f"{tool.name}: {_describe(exc)}") from None
        caller = who(ctx)
        try:
            outcome = await anyio.to_thread.run_sync(tools.run, tool.name, caller, args)
        except Exception as exc:  # noqa: BLE001 - an infrastructure fault is a value for the client too
            outcome = fault(exc, tools)
        return types.CallToolResult(content=[types.TextContent(text=outcome.summary)],
                                    structured_content=outcome.structured, is_error=outcome.error)

    async def list_templates(ctx: ServerRequestContext[Any, Any], params: Any) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(resource_templates=[
            types.ResourceTemplate(name="task", title="A task's TASK file", uri_template="task://{task_id}",
                                   mime_type="text/markdown", description="The task's FCoP TASK file (front "
                                   "matter with its transitions, then the body), rendered when it has none."),
            types.ResourceTemplate(name="todo", title="A role's queue", uri_template="todo://{role}",
                                   mime_type="text/markdown", description="What is waiting for a role: the tasks "
                                   "it drives (inbox, active) and the tasks in review it decides.")])

    async def list_resources(ctx: ServerRequestContext[Any, Any], params: Any) -> types.ListResourcesResult:
        principal = await _principal(who(ctx), tools)
        return types.ListResourcesResult(resources=[types.Resource(
            name=f"todo-{principal.role}", title=f"{principal.role}'s queue", uri=f"todo://{principal.role}",
            mime_type="text/markdown", description="What is waiting for your role.")])

    async def read_resource(ctx: ServerRequestContext[Any, Any], params: types.ReadResourceRequestParams
                            ) -> types.ReadResourceResult:
        await _principal(who(ctx), tools)  # a live credential reads, as for every tool
        try:
            return await _read(str(params.uri))
        except MCPError:
            raise
        except Exception as exc:  # noqa: BLE001 - a fault: its code to the client, its traceback to the CLI log
            raise fault_error(exc, tools) from None

    async def _read(uri: str) -> types.ReadResourceResult:
        if uri.startswith(resources.TASK_SCHEME):
            task_id = uri.removeprefix(resources.TASK_SCHEME).strip("/")
            text = await anyio.to_thread.run_sync(resources.task_markdown, tools.db, tools.workspace, task_id,
                                                  tools.files)
            if text is None:
                raise MCPError(RESOURCE_NOT_FOUND, f"task_not_found: {task_id} does not exist",
                               {"uri": uri, "reason": ReasonCode.TASK_NOT_FOUND.value})
        elif uri.startswith(resources.TODO_SCHEME):
            role = uri.removeprefix(resources.TODO_SCHEME).strip("/").upper()
            if not role:
                raise MCPError(INVALID_PARAMS, "todo:// names a role, e.g. todo://DEV", {"uri": uri})
            text = await anyio.to_thread.run_sync(resources.todo_markdown, tools.db, role)
        else:
            raise MCPError(RESOURCE_NOT_FOUND, f"no resource {uri!r}: task://TASK-ID or todo://ROLE", {"uri": uri})
        return types.ReadResourceResult(contents=[types.TextResourceContents(uri=uri, mime_type="text/markdown",
                                                                             text=text)])

    server: Server[Any] = Server("taskkernel", version=__version__, title="taskkernel", instructions=INSTRUCTIONS,
                                 on_list_tools=list_tools, on_call_tool=call_tool,
                                 on_list_resources=list_resources, on_list_resource_templates=list_templates,
                                 on_read_resource=read_resource)
    server.middleware.clear()  # the SDK's OpenTelemetry span per message: no exporter here, only its cost
    return server


async def _principal(caller: Callable[[], Principal], tools: TaskTools) -> Principal:
    try:
        return await anyio.to_thread.run_sync(caller)
    except KernelError as exc:
        raise MCPError(INVALID_REQUEST, f"{exc.reason.value}: {exc.message}", {"reason": exc.reason.value}) from None
    except Exception as exc:  # noqa: BLE001 - the credential could not be read: a fault, not a refusal
        raise fault_error(exc, tools) from None


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False)[:5]:
        where = ".".join(str(x) for x in err["loc"]) or "arguments"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


def fault(exc: BaseException, tools: TaskTools) -> Outcome:
    """An unexpected failure as a refusal with the CLI's fault code; the traceback to the CLI log."""
    from taskkernel.coordinator.cli.faults import classify, write_traceback

    code, message, _ = classify(exc)
    path = write_traceback(exc, str(tools.workspace.root) if tools.workspace else None, "mcp")
    if path is not None:
        message = f"{message} (details in {path})"
    log.error("mcp.fault", code=code, message=message)
    return refusal(code, message)


def fault_error(exc: BaseException, tools: TaskTools) -> MCPError:
    """A fault outside a tool call (a resource read, the credential check) as the protocol's internal error: the
    summary and the stable code (``data.reason``), never the exception's own text or a traceback."""
    out = fault(exc, tools)
    return MCPError(INTERNAL_ERROR, out.summary, {"reason": out.structured["reason"]})


# -- stdio ------------------------------------------------------------------------------------------------------

READ_CHUNK = 64 * 1024  # bytes read from the wire at a time
ID_HEAD_BYTES = 4096  # what is kept of a line over MAX_MESSAGE_BYTES, to find the id its answer carries


def stdio_who(tools: TaskTools, token: str | None, fixed: Principal) -> Who:
    """The server's own credential, authenticated again at each call (``fixed``: the local owner, no token)."""
    def principal() -> Principal:
        return fixed if token is None else authenticate_agent(tools.db, token)  # a run's token: a heartbeat too

    return lambda ctx: principal


async def serve_stdio(server: Server[Any]) -> None:
    sys.stdout.flush()  # nothing of ours may be left to write once stdout is the wire
    async with stdio_streams() as (read, write):
        await server.run(read, write, server.create_initialization_options())


@asynccontextmanager
async def stdio_streams() -> AsyncIterator[tuple[MemoryObjectReceiveStream[Any], MemoryObjectSendStream[Any]]]:
    """The session's streams over stdin and stdout, one JSON-RPC message a line. Unlike the SDK's stdio_server
    (which drops them), every line that is not a message is answered here (``decode``) and the session serves
    on; no line is held whole beyond MAX_MESSAGE_BYTES (``frames``). As the SDK's does, it serves the wire from
    private copies of fds 0 and 1 and points them at /dev/null and stderr meanwhile, so nothing else in the
    process (a stray print, a child process) can write into the protocol; both are restored at the end."""
    wire = Wire()
    saved = (os.dup(0), os.dup(1))
    try:
        await wire.open()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.dup2(2, 1)
        incoming_send, incoming = anyio.create_memory_object_stream[Any](0)
        outgoing, outgoing_receive = anyio.create_memory_object_stream[Any](0)
        answers = outgoing.clone()  # the transport's answers to malformed lines, written in turn with the session's

        async def read_messages() -> None:
            async with incoming_send, answers:
                async for frame in frames(wire.read):
                    message = decode(frame)
                    try:
                        if isinstance(message, SessionMessage):
                            await incoming_send.send(message)
                        elif message is not None:
                            log.warning("mcp.malformed_message", code=message.error.code, id=message.id,
                                        message=message.error.message)
                            await answers.send(SessionMessage(message))
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError):  # the session is over
                        return

        async def write_messages() -> None:
            async with outgoing_receive:
                async for message in outgoing_receive:
                    line = message.message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n"
                    try:
                        await wire.write(line)
                    except (BrokenPipeError, ConnectionResetError):  # the host went away: nobody reads answers
                        return

        async with anyio.create_task_group() as group:
            group.start_soon(read_messages)
            group.start_soon(write_messages)
            try:
                yield incoming, outgoing
            finally:
                group.cancel_scope.cancel()
    finally:
        wire.close()
        os.dup2(saved[0], 0)
        os.dup2(saved[1], 1)
        for fd in saved:
            with contextlib.suppress(OSError):
                os.close(fd)


class Wire:
    """Private copies of fds 0 and 1. A pipe or socket is read and written on the event loop's own readers and
    writers (the SDK's stdio_server hands every line to a worker thread: three thread hops per call); anything
    else (a terminal, a regular file) in a worker thread."""

    def __init__(self) -> None:
        self.fd_in, self.fd_out = os.dup(0), os.dup(1)
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.pipes: list[asyncio.BaseTransport] = []

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        with contextlib.suppress(OSError, ValueError, NotImplementedError):  # no pipe support: a worker thread
            if _is_pipe(self.fd_in):
                reader = asyncio.StreamReader(limit=READ_CHUNK)
                pipe, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                                       os.fdopen(self.fd_in, "rb", buffering=0, closefd=False))
                self.pipes.append(pipe)
                self.reader = reader
        with contextlib.suppress(OSError, ValueError, NotImplementedError):
            if _is_pipe(self.fd_out):
                out, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin,
                                                              os.fdopen(self.fd_out, "wb", buffering=0, closefd=False))
                self.pipes.append(out)
                self.writer = asyncio.StreamWriter(out, protocol, None, loop)

    async def read(self, size: int) -> bytes:
        """Up to ``size`` bytes, as soon as any have come; b"" at the end of the stream."""
        if self.reader is not None:
            return await self.reader.read(size)
        return await anyio.to_thread.run_sync(os.read, self.fd_in, size, abandon_on_cancel=True)

    async def write(self, data: bytes) -> None:
        if self.writer is not None:
            self.writer.write(data)
            await self.writer.drain()
            return
        view = memoryview(data)
        while view:
            view = view[await anyio.to_thread.run_sync(os.write, self.fd_out, view):]

    def close(self) -> None:
        for pipe in self.pipes:
            pipe.close()
        # a worker thread may still be blocked reading fd_in: it is left to the end of the process, never
        # closed (and its number reused) under that thread
        for fd in (self.fd_in, self.fd_out) if self.reader is not None else (self.fd_out,):
            with contextlib.suppress(OSError):
                os.close(fd)


def _is_pipe(fd: int) -> bool:
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


class Oversized(NamedTuple):
    """A line over MAX_MESSAGE_BYTES, read past and dropped; only its head is kept."""
    head: bytes


async def frames(read: Callable[[int], Awaitable[bytes]], limit: int = MAX_MESSAGE_BYTES
                 ) -> AsyncIterator[bytes | Oversized]:
    """The lines of a byte stream without their newline (the last one may lack it). A line over ``limit`` bytes
    is never held whole: past the limit the rest of it is read and dropped up to its newline, so whatever a peer
    sends the buffer stays within ``limit`` plus one chunk, and the next line is read as usual. Of such a line
    only its first bytes are kept (its head, never past its end)."""
    head = min(ID_HEAD_BYTES, limit)
    buf = bytearray()
    searched = 0  # the bytes of buf known to hold no newline
    while True:
        end = buf.find(b"\n", searched)
        if end >= 0:
            yield bytes(buf[:end]) if end <= limit else Oversized(bytes(buf[:head]))
            del buf[:end + 1]
            searched = 0
        elif len(buf) > limit:
            cut = Oversized(bytes(buf[:head]))
            buf.clear()
            rest = await _skip_line(read)
            yield cut
            if rest is None:
                return
            buf += rest
            searched = 0
        else:
            searched = len(buf)
            chunk = await read(READ_CHUNK)
            if not chunk:
                if buf:
                    yield bytes(buf)
                return
            buf += chunk


async def _skip_line(read: Callable[[int], Awaitable[bytes]]) -> bytes | None:
    """Reads past the rest of a line, chunk by chunk: what came after its newline (None: the stream ended)."""
    while chunk := await read(READ_CHUNK):
        end = chunk.find(b"\n")
        if end >= 0:
            return chunk[end + 1:]
    return None


def decode(frame: bytes | Oversized) -> SessionMessage | types.JSONRPCError | None:
    """A line as the session's message, or the JSON-RPC error that answers it: -32700 for a line that is not
    JSON in UTF-8, -32600 for JSON that is not a JSON-RPC message and for a line over MAX_MESSAGE_BYTES
    (``data.reason``: ``payload_too_large``). None for a blank line: nothing to answer."""
    if isinstance(frame, Oversized):
        return _wire_error(leading_id(frame.head), INVALID_REQUEST,
                           f"Invalid Request: the message is over the limit of {MAX_MESSAGE_BYTES} bytes",
                           {"reason": ReasonCode.PAYLOAD_TOO_LARGE.value, "limit": MAX_MESSAGE_BYTES})
    if not frame.strip():
        return None
    try:
        message = types.jsonrpc_message_adapter.validate_json(frame, by_name=False)
    except ValidationError as exc:
        unparsed = [e["msg"] for e in exc.errors(include_url=False) if e["type"] == "json_invalid"]
        if unparsed:
            return _wire_error(None, PARSE_ERROR, f"Parse error: {unparsed[0]} (a message is one line of UTF-8 JSON)")
        return _invalid_request(pydantic_core.from_json(frame))  # the same parser: it parses
    # a notification with an "id" that is none (null, true, 1.5) is a request no answer could be matched to
    if isinstance(message, types.JSONRPCNotification) and b'"id"' in frame:  # (a cheap look before parsing again)
        parsed = pydantic_core.from_json(frame)
        if "id" in parsed:
            return _invalid_request(parsed)
    return SessionMessage(message)


def _invalid_request(parsed: Any) -> types.JSONRPCError:
    """-32600 for JSON that is not a JSON-RPC message, with its id when it has one a client can wait on."""
    if not isinstance(parsed, dict):
        kind = {list: "an array (no batches)", str: "a string", bool: "a boolean", type(None): "null"}
        return _wire_error(None, INVALID_REQUEST, "Invalid Request: a message is a JSON object, not "
                                                  f"{kind.get(type(parsed), 'a number')}")
    # a malformed reply's id names a request of the server's, not one the client waits on
    replies = "method" not in parsed and ("result" in parsed or "error" in parsed)
    return _wire_error(None if replies else _request_id(parsed.get("id")), INVALID_REQUEST,
                       "Invalid Request: not a JSON-RPC 2.0 message (a request is an object with jsonrpc 2.0, an "
                       "integer or string id, a string method and object params)")


def leading_id(head: bytes) -> types.RequestId | None:
    """The id of a line cut short, when it comes before the long part, as the SDKs write a request (jsonrpc,
    id, method, params): the top-level members are read in order until the id, or until one is cut."""
    text = head.decode("utf-8", "replace")
    decoder = json.JSONDecoder()
    pos = _space(text, 0)
    if not text.startswith("{", pos):
        return None
    pos += 1
    try:
        while True:
            key, pos = decoder.raw_decode(text, _space(text, pos))
            pos = _space(text, pos)
            if not isinstance(key, str) or text[pos] != ":":
                return None
            value, pos = decoder.raw_decode(text, _space(text, pos + 1))
            pos = _space(text, pos)
            if text[pos] not in ",}":  # IndexError for a value at the very end: a number there may be cut
                return None
            if key == "id":
                return _request_id(value)
            if text[pos] != ",":
                return None
            pos += 1
    except (ValueError, IndexError):  # cut (or not JSON) before the id
        return None


def _space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\n\r":
        pos += 1
    return pos


def _request_id(value: Any) -> types.RequestId | None:
    return value if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)) else None


def _wire_error(request_id: types.RequestId | None, code: int, message: str,
                data: dict[str, Any] | None = None) -> types.JSONRPCError:
    error = types.ErrorData(code=code, message=message, **({"data": data} if data is not None else {}))
    return types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error)


# -- streamable HTTP --------------------------------------------------------------------------------------------

def http_who(ctx: ServerRequestContext[Any, Any]) -> Callable[[], Principal]:
    """The principal the bearer gate authenticated for this very request."""
    request = ctx.request
    principal = request.scope.get(PRINCIPAL_KEY) if request is not None else None

    def found() -> Principal:
        if not isinstance(principal, Principal):
            raise KernelError(ReasonCode.ACTOR_UNVERIFIED, "no credential on this request")
        return principal

    return found


ASGIApp = Callable[[dict[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]


class BearerGate:
    """ASGI middleware: every HTTP request must carry ``Authorization: Bearer <live token>``, else 401 with the
    refusal document (``actor_unverified`` / ``stale_lease``); the principal rides in the request's scope."""

    def __init__(self, app: ASGIApp, tools: TaskTools) -> None:
        self.app = app
        self.tools = tools

    async def __call__(self, scope: dict[str, Any], receive: Callable[[], Awaitable[Any]],
                       send: Callable[[Any], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        token = bearer(scope)
        if token is None:
            await unauthorized(send, "actor_unverified", "send Authorization: Bearer <token> (taskkernel token issue "
                                                         "ROLE prints one)")
            return
        try:
            principal = await anyio.to_thread.run_sync(authenticate_agent, self.tools.db, token)
        except KernelError as exc:
            await unauthorized(send, exc.reason.value, exc.message)
            return
        except Exception as exc:  # noqa: BLE001 - the credential could not be checked: 503 with the fault code
            out = fault(exc, self.tools)
            await answer(send, 503, {k: out.structured[k] for k in ("status", "reason", "message")},
                         [(b"retry-after", b"5")])
            return
        await self.app({**scope, PRINCIPAL_KEY: principal}, receive, send)


def bearer(scope: dict[str, Any]) -> str | None:
    for name, value in scope.get("headers", ()):
        if name.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").strip().partition(" ")
            return token.strip() if scheme.lower() == "bearer" and token.strip() else None
    return None


async def unauthorized(send: Callable[[Any], Awaitable[None]], reason: str, message: str) -> None:
    await answer(send, 401, {"status": "rejected", "reason": reason, "message": message},
                 [(b"www-authenticate", b'Bearer realm="taskkernel", error="invalid_token"')])


async def answer(send: Callable[[Any], Awaitable[None]], status: int, document: dict[str, Any],
                 headers: list[tuple[bytes, bytes]]) -> None:
    import json

    body = json.dumps(document).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body})


def transport_security(host: str, port: int) -> Any:
    """The SDK's Host/Origin checks (DNS rebinding): the loopback names, plus the address given, at its port."""
    from mcp.server.transport_security import TransportSecuritySettings

    given = f"[{host}]" if ":" in host else host
    names = [given] + (["127.0.0.1", "localhost", "[::1]"] if is_loopback(host) else [])
    names = list(dict.fromkeys(names))
    return TransportSecuritySettings(enable_dns_rebinding_protection=True,
                                     allowed_hosts=[f"{n}:{port}" for n in names],
                                     allowed_origins=[f"{scheme}://{n}:{port}" for n in names
                                                      for scheme in ("http", "https")])


async def serve_http(server: Server[Any], tools: TaskTools, sock: socket.socket, host: str) -> None:
    port = sock.getsockname()[1]
    app = server.streamable_http_app(streamable_http_path=HTTP_PATH, json_response=True, stateless_http=True,
                                     host=host, transport_security=transport_security(host, port),
                                     max_request_body_size=MAX_MESSAGE_BYTES)
    await serve(BearerGate(app, tools), sock)
