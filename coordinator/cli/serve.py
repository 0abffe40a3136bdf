"""`taskkernel serve`: the web board (docs/web.md). FastAPI and uvicorn are imported only here, only when it runs."""

from __future__ import annotations

import typer

from taskkernel.coordinator.cli.common import Exit, emit, fail, get_ctx, say, warn

DEFAULT_PORT = 8765


def serve(ctx: typer.Context,
          host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on; beyond loopback only with "
                                   "\\[serve] require_login = true."),
          port: int = typer.Option(DEFAULT_PORT, "--port", min=0, max=65535,
                                   help="Port to listen on (0: any free port, printed when listening).")) -> None:
    """Serve the web board: tasks by stage, each task's story, runs, schedules, usage and what needs you, live.

    Without a sign-in the board is read-only; signing in with a token (ADMIN's or a role's) gives the buttons that
    role may use, each the kernel command the CLI submits. Prints {"status": "listening", "url"} once it listens;
    SIGINT/SIGTERM stop it (exit 0)."""
    from taskkernel.coordinator.serving import is_loopback

    c = get_ctx(ctx)
    db = c.current_database()  # schema_behind / schema_ahead refused before anything listens
    ws = c.optional_workspace()
    require_login = ws.config.serve.require_login if ws is not None else False
    if not is_loopback(host) and not require_login:
        fail(Exit.USAGE, f"--host {host} is not loopback: other machines could read the board; set [serve] "
                         "require_login = true in taskkernel.toml first (and put a TLS proxy in front: tokens and "
                         "cookies travel in clear text over plain HTTP)", error="login_required")
    kernel = c.kernel()
    import anyio

    from taskkernel.coordinator.serving import listen, url_of
    from taskkernel.coordinator.serving import serve as serve_app
    from taskkernel.coordinator.web.app import create_app
    from taskkernel.coordinator.web.state import Board

    try:
        sock = listen(host, port)
    except OSError as exc:
        fail(Exit.USAGE, f"cannot listen on {host}:{port}: {exc.strerror or exc}", error="address_unavailable")
    url = url_of(host, sock, "/")
    if not is_loopback(host):
        warn(f"taskkernel serve: warning: listening on {url}, beyond this machine; sign-in is required")
    # On loopback, only this machine's names: a web page whose DNS name was rebound to 127.0.0.1 is refused
    # (400) instead of reading the board. Beyond loopback the sign-in guards every page.
    named = list(ws.config.serve.hosts) if ws is not None else []
    hosts = [host.strip("[]"), "127.0.0.1", "localhost", "::1", "[::1]", *named] if is_loopback(host) else ["*"]
    board = Board(db, ws, kernel, require_login=require_login, hosts=hosts)
    app = create_app(board)
    emit({"status": "listening", "url": url, "require_login": require_login}, generic=False)
    say(f"taskkernel serve: board at {url} ("
        f"{'sign-in required for every page' if require_login else 'read-only until you sign in; loopback only'})")
    anyio.run(serve_app, app, sock, 2, board.hub.close_clients)
