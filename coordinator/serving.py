"""Serving HTTP for `taskkernel mcp --transport http` and `taskkernel serve`: which addresses are this machine only,
the listening socket, what every response carries and the most a request may send (``Hardened``), and uvicorn run
to a graceful exit 0 on SIGINT/SIGTERM. uvicorn is imported only to serve."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import socket
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from typing import Any

from taskkernel.kernel.reasons import ReasonCode

# The most a request may send: the largest action (a report's 512 KiB body, kernel/model/limits.py, JSON-escaped at
# up to 6 bytes a byte, and its other fields) fits. The MCP SDK's own limit for streamable HTTP is the same 4 MiB.
MAX_REQUEST_BYTES = 4 * 2**20
# On every response: no page of either server may be framed (clickjacking: a frame on another port of 127.0.0.1 is
# the same site, so it would get the SameSite=Strict cookie), scripts and styles come only from the server itself,
# nothing is sniffed into another type, and no address goes to another site in a Referer. A response that sets one
# of these itself keeps its own (the board's /api/docs, whose Swagger UI comes from a CDN).
CSP_DIRECTIVES = {"default-src": "'self'", "script-src": "'self'", "style-src": "'self'", "img-src": "'self' data:",
                  "connect-src": "'self'", "base-uri": "'none'", "form-action": "'self'", "object-src": "'none'",
                  "frame-ancestors": "'none'"}


def content_security_policy(more: dict[str, str] | None = None) -> str:
    """The policy, with ``more`` sources added to the directives it names (``{"script-src": "https://…"}``)."""
    more = more or {}
    return "; ".join(f"{name} {sources}{' ' + more[name] if name in more else ''}"
                     for name, sources in CSP_DIRECTIVES.items())


SECURITY_HEADERS = ((b"content-security-policy", content_security_policy().encode()),
                    (b"x-frame-options", b"DENY"),
                    (b"x-content-type-options", b"nosniff"),
                    (b"referrer-policy", b"same-origin"))  # not no-referrer: a POST would say Origin: null

# OAuth discovery (RFC 9728, RFC 8414, OpenID Connect), as MCP hosts look for it, the MCP path before or after it:
# neither server is an OAuth resource, so these answer 404 whatever the credential, before any other check. A 401
# there would start a host's interactive OAuth sign-in instead of showing the reason its requests are refused.
OAUTH_DISCOVERY = ("/.well-known/oauth-", "/.well-known/openid-configuration")
NO_OAUTH = ("taskkernel does not use OAuth: send Authorization: Bearer <token> (taskkernel token issue ROLE prints "
            "one)")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine only (127.0.0.0/8, ::1, localhost): where a server listens without being
    told it may be reached from elsewhere."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def listen(host: str, port: int) -> socket.socket:
    """The listening socket (port 0: one the system picks); OSError if the address cannot be had."""
    host = host.strip("[]")  # an IPv6 address as a URL writes it
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named: asyncio sets TCP_NODELAY on accepted connections only for a socket that says it is TCP;
    # without it a response's body waited ~40 ms for the client's delayed ACK of its headers (bench/serve.py)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def url_of(host: str, sock: socket.socket, path: str = "") -> str:
    return f"http://{host if ':' not in host else f'[{host}]'}:{sock.getsockname()[1]}{path}"


async def serve(app: Any, sock: socket.socket, graceful_seconds: int | None = None,
                on_stop: Callable[[], None] | None = None) -> None:
    """Run ``app`` on ``sock`` until SIGINT/SIGTERM, then return (exit 0), not re-raise the signal as uvicorn does
    (exit 143 / 130). ``graceful_seconds``: how long open connections may take to finish; ``on_stop`` is called as
    the stop begins, to end the streams that would otherwise never finish (server-sent events)."""
    import uvicorn

    config = uvicorn.Config(Hardened(app), log_level="warning", access_log=False, lifespan="on",
                            timeout_graceful_shutdown=graceful_seconds)

    class GracefulServer(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            with super().capture_signals():
                try:
                    yield
                finally:
                    self._captured_signals.clear()

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            if on_stop is not None:
                on_stop()
            await super().shutdown(sockets)

    await GracefulServer(config).serve(sockets=[sock])


class Hardened:
    """ASGI middleware around everything ``serve`` serves: the security headers on every response (its own 413
    and 404 included), a request body of at most ``limit`` bytes, and 404 ``not_found`` for OAuth discovery
    (``OAUTH_DISCOVERY``).

    A ``Content-Length`` over the limit is answered 413 ``payload_too_large`` before the application sees the
    request; a body without one (chunked) is counted as the application reads it, and the chunk that passes the
    limit is answered 413 at once and read as a disconnect by the application, so no more of it is taken. Nothing
    here reads a body on its own: an application that refuses a request without reading its body (a change
    without a credential, 401) does not read it at all. A response that starts before its request's body was read
    whole says ``Connection: close``: the server drops the connection instead of draining what the client still
    sends."""

    def __init__(self, app: ASGIApp, limit: int = MAX_REQUEST_BYTES) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        exchange = Exchange(self.limit, receive, send, *body_framing(scope))
        if any(part in scope.get("path", "") for part in OAUTH_DISCOVERY):
            await exchange.no_oauth()
            return
        if exchange.declared is not None and exchange.declared > self.limit:
            await exchange.too_large()
            return
        await self.app(scope, exchange.receive, exchange.send)


class Exchange:
    """One request and its response as ``Hardened`` sees them: the body's bytes read so far, whether the response
    started, whether this middleware answered it (413) itself."""

    def __init__(self, limit: int, receive: Receive, send: Send, declared: int | None, chunked: bool) -> None:
        self.limit, self._receive, self._send = limit, receive, send
        self.declared = declared
        self.read = 0
        self.body_done = not chunked and not declared
        self.started = self.cut = self.answered = False

    async def send(self, message: Message) -> None:
        if self.answered:
            return  # answered 413 here: the application's own answer goes nowhere
        if message["type"] == "http.response.start":
            self.started = True
            headers = list(message.get("headers", ()))
            present = {name.lower() for name, _ in headers}
            headers += [(name, value) for name, value in SECURITY_HEADERS if name not in present]
            if not self.body_done and b"connection" not in present:
                headers.append((b"connection", b"close"))
            message = {**message, "headers": headers}
        await self._send(message)

    async def receive(self) -> Message:
        if self.cut:
            return {"type": "http.disconnect"}
        message = await self._receive()
        if message["type"] == "http.request":
            self.read += len(message.get("body", b""))
            self.body_done = not message.get("more_body", False)
            if self.read > self.limit:
                self.cut = True
                if not self.started:
                    await self.too_large()
                return {"type": "http.disconnect"}
        return message

    async def too_large(self) -> None:
        body = json.dumps({"status": "rejected", "reason": ReasonCode.PAYLOAD_TOO_LARGE.value,
                           "message": f"a request body may be at most {self.limit} bytes"}).encode()
        await self.send({"type": "http.response.start", "status": 413, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await self.send({"type": "http.response.body", "body": body})
        self.answered = True

    async def no_oauth(self) -> None:
        """404 ``not_found`` for an OAuth discovery path (OAUTH_DISCOVERY), answered here."""
        body = json.dumps({"status": "rejected", "reason": "not_found", "message": NO_OAUTH}).encode()
        await self.send({"type": "http.response.start", "status": 404, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await self.send({"type": "http.response.body", "body": body})
        self.answered = True


def body_framing(scope: Scope) -> tuple[int | None, bool]:
    """The request body's declared length (None without a valid one) and whether it is chunked."""
    declared, chunked = None, False
    for name, value in scope.get("headers", ()):
        name = name.lower()
        if name == b"content-length":
            with contextlib.suppress(ValueError):
                declared = int(value)
        elif name == b"transfer-encoding":
            chunked = b"chunked" in value.lower()
    return declared, chunked
