"""`taskkernel mcp`: the kernel as an MCP server for agent hosts (docs/mcp.md). The SDK is imported only here,
only when the command runs."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from enum import StrEnum
from typing import TYPE_CHECKING

import typer

from taskkernel.coordinator.cli.common import CliContext, Exit, emit, fail, get_ctx, reject, say, warn

if TYPE_CHECKING:
    from taskkernel.coordinator.workspace import Workspace
    from taskkernel.kernel.model.principal import Principal

DEFAULT_PORT = 8765


class Transport(StrEnum):
    STDIO = "stdio"
    HTTP = "http"


def mcp(ctx: typer.Context,
        transport: Transport = typer.Option(Transport.STDIO, "--transport", case_sensitive=False,
                                            help="stdio (the host starts the server; it acts as TASKKERNEL_TOKEN) "
                                                 "or http (streamable HTTP; every request carries its own "
                                                 "Authorization: Bearer token)."),
        host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (http)."),
        port: int = typer.Option(DEFAULT_PORT, "--port", min=0, max=65535,
                                 help="Port to listen on (http; 0: any free port, printed when listening)."),
        allow_remote: bool = typer.Option(False, "--allow-remote",
                                          help="Allow a --host other than loopback (http): tokens then travel in "
                                               "clear text unless a TLS proxy is in front.")) -> None:
    """Serve tasks to agent hosts over MCP: task verbs, reads, progress and resume, the execution gate, usage.

    stdio: acts as TASKKERNEL_TOKEN (or --token); without one only where require_token = false (docs/mcp.md).

    http: every request must carry Authorization: Bearer <token>, else 401.

    The credential is checked again at every call. Logs go to stderr (over stdio, stdout is the protocol).
    """
    c = get_ctx(ctx)
    from taskkernel.coordinator.serving import is_loopback

    remote = transport is Transport.HTTP and not is_loopback(host)
    if remote and not allow_remote:
        fail(Exit.USAGE, f"--host {host} is not loopback: other machines could reach the server; pass "
                         "--allow-remote to mean it (and put a TLS proxy in front: bearer tokens travel in clear "
                         "text over plain HTTP)", error="usage")
    with _off_the_wire(transport is Transport.STDIO):
        db = c.current_database()  # schema_behind / schema_ahead refused; a token given must be live
        ws = c.optional_workspace()
        identity = _stdio_identity(c, ws) if transport is Transport.STDIO else None  # refused before the SDK
        kernel = c.kernel()
    import anyio

    from taskkernel.coordinator.mcp.server import build_server, http_who, serve_http, serve_stdio, stdio_who
    from taskkernel.coordinator.mcp.tools import TaskTools
    from taskkernel.coordinator.serving import listen, url_of

    budget = ws.config.mcp.output_budget if ws is not None else 16384
    if identity is not None:
        token, principal = identity
        tools = TaskTools(db, kernel, ws, transport="stdio", budget=budget)
        warn(f"taskkernel mcp: serving {principal.id} over stdio")
        anyio.run(serve_stdio, build_server(tools, stdio_who(tools, token, principal)))
        return
    try:
        sock = listen(host, port)
    except OSError as exc:
        fail(Exit.USAGE, f"cannot listen on {host}:{port}: {exc.strerror or exc}", error="address_unavailable")
    bound = sock.getsockname()[1]
    if remote:
        warn(f"taskkernel mcp: warning: listening on {host}:{bound}, beyond this machine; bearer tokens travel in "
             "clear text unless a TLS proxy is in front, and requests must name this Host (DNS-rebinding checks)")
    url = url_of(host, sock, "/mcp")
    tools = TaskTools(db, kernel, ws, transport="http", budget=budget)
    emit({"status": "listening", "transport": "http", "url": url}, generic=False)
    say(f"taskkernel mcp: listening on {url} (Authorization: Bearer <token> on every request)")
    anyio.run(serve_http, build_server(tools, http_who), tools, sock, host)


@contextlib.contextmanager
def _off_the_wire(stdio: bool) -> Iterator[None]:
    """Over stdio, stdout is the protocol channel from the first byte: a refusal or fault at start-up (no
    token, a dead one, a database that cannot be used) goes to stderr only, the exit status unchanged."""
    if not stdio:
        yield
        return
    with contextlib.redirect_stdout(sys.stderr):
        try:
            yield
        except (typer.Exit, SystemExit, KeyboardInterrupt):
            raise
        except Exception as exc:  # noqa: BLE001 - reported here, while stdout still points at stderr
            from taskkernel.coordinator.cli.faults import report_fault

            raise typer.Exit(report_fault(exc)) from None


def _stdio_identity(c: CliContext, ws: Workspace | None) -> tuple[str | None, Principal]:
    """The token the server acts as (None: the local owner, where the workspace allows it) and its principal
    now. Unlike other commands, no token never means the owner's credential file: an agent host starts this
    server, and it must not become the workspace owner by leaving its variable out."""
    from taskkernel.kernel.model.principal import LOCAL_OWNER
    from taskkernel.kernel.reasons import KernelError

    if c.token is not None or "TASKKERNEL_TOKEN" in os.environ:
        found = c.try_principal()
        if isinstance(found, KernelError):
            reject(found.reason.value, found.message)
        return c.used_token, found
    if ws is not None and ws.require_token:
        reject("actor_unverified", "no credential: set TASKKERNEL_TOKEN (or --token) to the token the server "
                                   "acts as; `taskkernel token issue ROLE` prints one")
    return None, LOCAL_OWNER
