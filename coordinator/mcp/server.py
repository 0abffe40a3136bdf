"""The MCP server on the official SDK's low-level server (mcp 2.x): tools, resources, stdio and streamable HTTP.

Identity: over stdio the server acts as the credential it was started with (``TASKKERNEL_TOKEN``), or as the
local owner where the workspace allows it; over HTTP every request carries ``Authorization: Bearer <token>``
(else 401, before the request reaches the protocol). Either way the credential is authenticated again at each
call, so a credential revoked while the server runs stops working at once.

A tool result's text content is its structured document as compact JSON (results.py). A refusal is a tool
result (``isError: true``) whose structured content says why; protocol errors are for calls that are malformed
(an unknown tool, arguments that do not fit the tool's input schema). An infrastructure fault is a refusal with
the CLI's fault code (``database_unreachable``, …); its traceback goes to the CLI log, never to the client. Tool
code runs in worker threads: a slow database never blocks the transport.

Start-up: nothing of the kernel is imported or opened to answer ``initialize``, ``tools/list`` and the resource
templates. Over stdio the kernel (the database, its schema, the credential) is opened by a ``Warmup``: at the
first call that needs it, or ahead of need once the tools were listed and the session went quiet (startup.py),
so a host that starts the server and lists its tools at once is answered about as fast as by a minimal server on
the same SDK (bench/mcp_startup.py).
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST
from pydantic import ValidationError

from taskkernel import __version__
from taskkernel.coordinator.mcp.results import Outcome, refusal
from taskkernel.coordinator.mcp.wire import MAX_MESSAGE_BYTES, Activity, stdio_streams
from taskkernel.coordinator.serving import is_loopback, serve
from taskkernel.kernel.logging import get_logger
from taskkernel.kernel.model.principal import Principal
from taskkernel.kernel.reasons import KernelError, ReasonCode

if TYPE_CHECKING:
    from taskkernel.coordinator.mcp.catalog import Tool
    from taskkernel.coordinator.mcp.tools import TaskTools

log = get_logger(__name__)
RESOURCE_NOT_FOUND = -32002  # the MCP specification's code for a resource that does not exist
HTTP_PATH = "/mcp"
PRINCIPAL_KEY = "taskkernel.principal"  # where the bearer gate leaves the request's principal (ASGI scope)
TASK_SCHEME, TODO_SCHEME = "task://", "todo://"  # resources.py's schemes (imported when a resource is read)
INSTRUCTIONS = (
    "taskkernel coordinates a team of agents through tasks. whoami says who you are. Work: list_tasks "
    "(assigned_to_me, waiting_for_my_review), get_task, then claim_task, report (status done and a body), "
    "submit_task; reviewers approve_task or reject_task. Every change is judged by the kernel: a refusal is an "
    "error result with a stable reason code and the task's current revision and round. Before a protected "
    "action, check_action; perform does it through the execution gate. add_progress records a checkpoint; after "
    "a context compaction, resume says where to continue and which instructions came after.")

Who = Callable[[ServerRequestContext[Any, Any]], Callable[[], Principal]]


class StartFailure(Exception):
    """The kernel could not be opened (a credential that is not live, a schema behind, a database that cannot be
    reached, a taskkernel.toml that cannot be used): its reason or fault code, message and exit status."""

    def __init__(self, reason: str, message: str, status: int) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason, self.message, self.status = reason, message, status

    def outcome(self) -> Outcome:
        return refusal(self.reason, self.message)

    def error(self) -> MCPError:
        """As a protocol error (a resource read): -32600 for a refusal (exit 2), else the internal error."""
        return MCPError(INVALID_REQUEST if self.status == 2 else INTERNAL_ERROR, str(self), {"reason": self.reason})


class Warmup:
    """The kernel side of the server, opened once: ``open_()`` (in a worker thread) returns the tools or raises
    StartFailure. It is opened by the first call that needs it, or ahead of need (serve_stdio, once the tools were
    listed: ``expect``); a failure is that call's answer, and the next call tries again. ``status``: 0, or the exit
    status of the latest failure."""

    def __init__(self, open_: Callable[[], TaskTools] | None = None, tools: TaskTools | None = None) -> None:
        self._open = open_
        self.tools = tools
        self.status = 0
        self.tried = tools is not None
        self._lock: anyio.Lock | None = None  # made in the event loop, when first needed
        self._listed: anyio.Event | None = None

    def expect(self) -> None:
        """The tools were listed: calls will follow."""
        self.listed().set()

    def listed(self) -> anyio.Event:
        if self._listed is None:
            self._listed = anyio.Event()
        return self._listed

    async def get(self) -> TaskTools:
        """The tools, opened now if they are not yet (StartFailure if they cannot be)."""
        tools = await self._opened(again=True)
        assert tools is not None
        return tools

    async def settle(self) -> None:
        """Opened, or tried at least once (a failure is reported where it happens); an attempt under way is waited
        for."""
        with contextlib.suppress(StartFailure):
            await self._opened(again=False)

    async def _opened(self, again: bool) -> TaskTools | None:
        if self.tools is not None:
            return self.tools
        if self._lock is None:
            self._lock = anyio.Lock()
        async with self._lock:
            if self.tools is None and (again or not self.tried):
                assert self._open is not None
                self.tried = True
                try:
                    self.tools = await anyio.to_thread.run_sync(self._open)
                except StartFailure as exc:
                    self.status = exc.status
                    raise
                self.status = 0
        return self.tools


class Catalog:
    """The tools as the server lists them, built at the first ``tools/list`` or call (the models and their JSON
    Schemas are not needed to answer ``initialize``)."""

    def __init__(self) -> None:
        self._listed: list[types.Tool] | None = None
        self._by_name: dict[str, Tool] = {}

    def listed(self) -> list[types.Tool]:
        if self._listed is None:
            from taskkernel.coordinator.mcp.catalog import TOOLS
            from taskkernel.coordinator.mcp.schemas import input_schema, output_schema

            self._listed = [types.Tool(
                name=t.name, title=t.title, description=t.description, input_schema=input_schema(t.args),
                output_schema=output_schema(t.result),
                annotations=types.ToolAnnotations(title=t.title, read_only_hint=t.read_only,
                                                  destructive_hint=t.destructive, idempotent_hint=not t.read_only,
                                                  open_world_hint=False)) for t in TOOLS]
            self._by_name = {t.name: t for t in TOOLS}
        return self._listed

    def tool(self, name: str) -> Tool:
        self.listed()
        found = self._by_name.get(name)
        if found is None:
            raise MCPError(INVALID_PARAMS, f"unknown tool {name!r}; the tools are {', '.join(self._by_name)}")
        return found


def build_server(tools: TaskTools | Warmup, who: Who) -> Server[Any]:
    """The low-level server with every tool and both resources; ``who(ctx)`` is the call's principal, read
    when the call runs. ``tools``: the tools, or the Warmup that opens them when a call first needs them."""
    warm = tools if isinstance(tools, Warmup) else Warmup(tools=tools)
    catalog = Catalog()

    async def list_tools(ctx: ServerRequestContext[Any, Any], params: Any) -> types.ListToolsResult:
        warm.expect()
        return types.ListToolsResult(tools=catalog.listed())

    async def call_tool(ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
                        ) -> types.CallToolResult:
        tool = catalog.tool(params.name)
        try:
            args = tool.args.model_validate(params.arguments or {})
        except ValidationError as exc:
            raise MCPError(INVALID_PARAMS, f"{tool.name}: {_describe(exc)}") from None
        caller = who(ctx)
        tools_: TaskTools | None = None
        try:
            tools_ = await warm.get()
            outcome = await anyio.to_thread.run_sync(tools_.run, tool.name, caller, args)
        except StartFailure as exc:
            outcome = exc.outcome()
        except Exception as exc:  # noqa: BLE001 - an infrastructure fault is a value for the client too
            outcome = fault(exc, tools_)
        # the text is the document itself (hosts that show the model only text show it all), as compact JSON
        return types.CallToolResult(content=[types.TextContent(text=outcome.text)],
                                    structured_content=outcome.structured, is_error=outcome.error)

    async def list_templates(ctx: ServerRequestContext[Any, Any], params: Any) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(resource_templates=[
            types.ResourceTemplate(name="task", title="A task's TASK file", uri_template="task://{task_id}",
                                   mime_type="text/markdown", description="The task's FCoP TASK file (front "
                                   "matter with its transitions, then the body), rendered when it has none."),
            types.ResourceTemplate(name="todo", title="A role's queue", uri_template="todo://{role}",
                                   mime_type="text/markdown", description="What is waiting for a role: the tasks "
                                   "it drives (inbox, active) and the tasks in review it decides.")])

    async def opened() -> TaskTools:
        try:
            return await warm.get()
        except StartFailure as exc:
            raise exc.error() from None

    async def list_resources(ctx: ServerRequestContext[Any, Any], params: Any) -> types.ListResourcesResult:
        caller = who(ctx)
        principal = await _principal(caller, await opened())
        return types.ListResourcesResult(resources=[types.Resource(
            name=f"todo-{principal.role}", title=f"{principal.role}'s queue", uri=f"todo://{principal.role}",
            mime_type="text/markdown", description="What is waiting for your role.")])

    async def read_resource(ctx: ServerRequestContext[Any, Any], params: types.ReadResourceRequestParams
                            ) -> types.ReadResourceResult:
        caller = who(ctx)
        tools_ = await opened()
        await _principal(caller, tools_)  # a live credential reads, as for every tool
        try:
            return await _read(tools_, str(params.uri))
        except MCPError:
            raise
        except Exception as exc:  # noqa: BLE001 - a fault: its code to the client, its traceback to the CLI log
            raise fault_error(exc, tools_) from None

    async def _read(tools_: TaskTools, uri: str) -> types.ReadResourceResult:
        from taskkernel.coordinator.mcp import resources

        if uri.startswith(TASK_SCHEME):
            task_id = uri.removeprefix(TASK_SCHEME).strip("/")
            text = await anyio.to_thread.run_sync(resources.task_markdown, tools_.db, tools_.workspace, task_id,
                                                  tools_.files)
            if text is None:
                raise MCPError(RESOURCE_NOT_FOUND, f"task_not_found: {task_id} does not exist",
                               {"uri": uri, "reason": ReasonCode.TASK_NOT_FOUND.value})
        elif uri.startswith(TODO_SCHEME):
            role = uri.removeprefix(TODO_SCHEME).strip("/").upper()
            if not role:
                raise MCPError(INVALID_PARAMS, "todo:// names a role, e.g. todo://DEV", {"uri": uri})
            text = await anyio.to_thread.run_sync(resources.todo_markdown, tools_.db, role)
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


def fault(exc: BaseException, tools: TaskTools | None) -> Outcome:
    """An unexpected failure as a refusal with the CLI's fault code; the traceback to the CLI log."""
    from taskkernel.coordinator.cli.faults import classify, write_traceback

    code, message, _ = classify(exc)
    workspace = tools.workspace if tools is not None else None
    path = write_traceback(exc, str(workspace.root) if workspace else None, "mcp")
    if path is not None:
        message = f"{message} (details in {path})"
    log.error("mcp.fault", code=code, message=message)
    return refusal(code, message)


def fault_error(exc: BaseException, tools: TaskTools | None) -> MCPError:
    """A fault outside a tool call (a resource read, the credential check) as the protocol's internal error: the
    code and message (``data.reason``: the stable code), never the exception's own text or a traceback."""
    out = fault(exc, tools).structured
    return MCPError(INTERNAL_ERROR, f"{out['reason']}: {out['message']}", {"reason": out["reason"]})


# -- stdio ------------------------------------------------------------------------------------------------------



async def serve_stdio(server: Server[Any], warmup: Warmup | None = None) -> None:
    """Serve one session over stdin and stdout until stdin ends. ``warmup`` (the kernel, not opened yet) is
    opened ahead of need once the tools were listed and the session is quiet (a host lists them to give them to
    its model, whose first call comes later), and at the end at the latest, so its ``status`` says whether the
    kernel could be opened at all."""
    sys.stdout.flush()  # nothing of ours may be left to write once stdout is the wire
    activity = Activity()
    async with anyio.create_task_group() as group, stdio_streams(activity) as (read, write):
        if warmup is not None:
            group.start_soon(_ahead, warmup, activity)
        await server.run(read, write, server.create_initialization_options())
        if warmup is not None:
            await warmup.settle()
        group.cancel_scope.cancel()


async def _ahead(warmup: Warmup, activity: Activity) -> None:
    await warmup.listed().wait()
    await activity.quiet()
    await warmup.settle()


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
    refusal document (``actor_unverified`` / ``stale_lease``); the principal rides in the request's scope. (The
    OAuth discovery paths, ``/.well-known/oauth-*``, never get here: serving.Hardened answers them 404.)"""

    def __init__(self, app: ASGIApp, tools: TaskTools) -> None:
        self.app = app
        self.tools = tools

    async def __call__(self, scope: dict[str, Any], receive: Callable[[], Awaitable[Any]],
                       send: Callable[[Any], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        from taskkernel.coordinator.runners.ledger import authenticate_agent

        token = bearer(scope)
        if token is None:
            await unauthorized(send, "actor_unverified", "send Authorization: Bearer <token> (taskkernel token issue "
                                                         "ROLE prints one)", given=False)
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


async def unauthorized(send: Callable[[Any], Awaitable[None]], reason: str, message: str, given: bool = True
                       ) -> None:
    """401 with the refusal document, and the challenge HTTP requires (RFC 6750): no error for a request without
    a credential, ``invalid_token`` and the reason for one that is not live."""
    await answer(send, 401, {"status": "rejected", "reason": reason, "message": message},
                 [(b"www-authenticate", challenge(f"{reason}: {message}" if given else None))])


def challenge(description: str | None) -> bytes:
    """``Bearer realm="taskkernel"``, with ``error="invalid_token"`` and ``error_description`` (printable ASCII
    without quotes or backslashes, as RFC 6750 allows it) for a credential that was given."""
    if description is None:
        return b'Bearer realm="taskkernel"'
    text = "".join(c if " " <= c <= "~" and c not in '"\\' else " " for c in description)[:300]
    return f'Bearer realm="taskkernel", error="invalid_token", error_description="{text}"'.encode("ascii")


async def answer(send: Callable[[Any], Awaitable[None]], status: int, document: dict[str, Any],
                 headers: list[tuple[bytes, bytes]]) -> None:
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
