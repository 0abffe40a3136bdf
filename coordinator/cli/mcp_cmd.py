"""`taskkernel mcp`: the kernel as an MCP server for agent hosts (docs/mcp.md). The SDK is imported only here,
only when the command runs."""

from __future__ import annotations

from enum import StrEnum

import typer

from taskkernel.coordinator.cli.common import Exit, emit, fail, get_ctx, say, warn

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
    It answers the host at once and opens the kernel after: a refusal is then every call's answer and the exit
    status when stdin ends.

    http: every request must carry Authorization: Bearer <token>, else 401.

    The credential is checked again at every call. Logs go to stderr (over stdio, stdout is the protocol).
    """
    c = get_ctx(ctx)
    if transport is Transport.STDIO:  # initialize answered first, the kernel opened after (coordinator/mcp/startup.py)
        from taskkernel.coordinator.mcp.startup import serve_stdio_command

        serve_stdio_command(c)
        return
    from taskkernel.coordinator.serving import is_loopback

    remote = not is_loopback(host)
    if remote and not allow_remote:
        fail(Exit.USAGE, f"--host {host} is not loopback: other machines could reach the server; pass "
                         "--allow-remote to mean it (and put a TLS proxy in front: bearer tokens travel in clear "
                         "text over plain HTTP)", error="usage")
    db = c.current_database()  # schema_behind / schema_ahead refused
    ws = c.optional_workspace()
    kernel = c.kernel()
    import anyio

    from taskkernel.coordinator.mcp.server import build_server, http_who, serve_http
    from taskkernel.coordinator.mcp.tools import TaskTools
    from taskkernel.coordinator.serving import listen, url_of

    budget = ws.config.mcp.output_budget if ws is not None else 16384
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

