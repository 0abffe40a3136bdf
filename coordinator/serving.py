"""Serving HTTP for `taskkernel mcp --transport http` and `taskkernel serve`: which addresses are this machine only,
the listening socket, and uvicorn run to a graceful exit 0 on SIGINT/SIGTERM. uvicorn is imported only to serve."""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import Callable, Iterator
from typing import Any


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

    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
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
