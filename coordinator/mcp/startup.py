"""`taskkernel mcp` over stdio: ``initialize`` answered before the kernel is opened (docs/mcp.md, "Start-up").

An agent host starts the server and sends ``initialize`` and ``tools/list`` at once; some (Codex) do not wait long
for the answers, and an agent's first turn then runs without its tools. So nothing here opens the workspace, the
database or the kernel before the session starts: a ``Warmup`` opens them in a worker thread once the tools were
listed and the session is quiet, or when a call needs them first (server.py). What `taskkernel submit` would refuse
at start (a credential that is not live, no credential where the workspace requires one, a schema behind or
ahead, a database that cannot be reached, a taskkernel.toml that cannot be used) is then written to stderr as the
CLI writes it (the envelope, then a line for people) and answers every call with its reason code, opening being
tried again at each call; when stdin ends the server exits with its usual status (2 for a refusal). Only the
stdio transport starts this way: `--transport http` opens everything before it listens.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import typer

from taskkernel.coordinator.cli.common import CliContext, reject, warn

if TYPE_CHECKING:
    from taskkernel.coordinator.mcp.tools import TaskTools
    from taskkernel.coordinator.workspace import Workspace
    from taskkernel.kernel.model.principal import Principal


class Identity:
    """Whom the stdio server acts as, known once the kernel is open: the token (authenticated again at each call)
    or, without one, the fixed principal (the local owner)."""

    token: str | None = None
    fixed: Principal | None = None


def serve_stdio_command(c: CliContext) -> None:
    """The stdio server of ``c`` (the command's global options) until stdin ends; then exit with the status of
    opening the kernel (0 once it opened)."""
    import anyio

    from taskkernel.coordinator.mcp.server import Warmup, build_server, serve_stdio

    identity = Identity()
    warmup = Warmup(lambda: open_tools(c, identity))

    def caller() -> Principal:  # run only once the warmup opened the kernel
        from taskkernel.coordinator.runners.ledger import authenticate_agent

        if identity.token is None:
            assert identity.fixed is not None
            return identity.fixed
        assert warmup.tools is not None
        return authenticate_agent(warmup.tools.db, identity.token)  # a run's token: a heartbeat too

    anyio.run(serve_stdio, build_server(warmup, lambda ctx: caller), warmup)
    if warmup.status:
        raise typer.Exit(warmup.status)


def open_tools(c: CliContext, identity: Identity) -> TaskTools:
    """The workspace, the database (its schema current), the credential and the kernel, checked as `taskkernel
    submit` checks them, and the tools over them; else StartFailure (the CLI's refusal or fault, on stderr)."""
    from taskkernel.coordinator.mcp.results import DEFAULT_BUDGET
    from taskkernel.coordinator.mcp.tools import TaskTools

    with cli_refusals():
        db = c.current_database()  # schema_behind / schema_ahead refused; a token given must be live
        ws = c.optional_workspace()
        identity.token, principal = stdio_identity(c, ws)
        if identity.token is None:
            identity.fixed = principal
        tools = TaskTools(db, c.kernel(), ws, transport="stdio",
                          budget=ws.config.mcp.output_budget if ws is not None else DEFAULT_BUDGET)
        warn(f"taskkernel mcp: serving {principal.id} over stdio")
    return tools


def stdio_identity(c: CliContext, ws: Workspace | None) -> tuple[str | None, Principal]:
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


@contextlib.contextmanager
def cli_refusals() -> Iterator[None]:
    """The CLI's refusals and faults inside (written as the CLI writes them, then ``typer.Exit``) as StartFailure:
    what was written goes to stderr in its order (stdout is the wire), and the envelope's reason (or fault code)
    and message become each call's answer."""
    from taskkernel.coordinator.mcp.server import StartFailure

    written = io.StringIO()
    try:
        with contextlib.redirect_stdout(written), contextlib.redirect_stderr(written):
            try:
                yield
            except (typer.Exit, SystemExit, KeyboardInterrupt):
                raise
            except Exception as exc:  # noqa: BLE001 - a fault: reported as the CLI reports it
                from taskkernel.coordinator.cli.faults import report_fault

                raise typer.Exit(report_fault(exc)) from None
    except (typer.Exit, SystemExit) as exc:
        status = exc.exit_code if isinstance(exc, typer.Exit) else exc.code if isinstance(exc.code, int) else 1
        reason, message = envelope(written.getvalue())
        raise StartFailure(reason, message, status or 1) from None
    finally:
        sys.stderr.write(written.getvalue())
        sys.stderr.flush()


def envelope(written: str) -> tuple[str, str]:
    """The reason (or error code) and message of the last JSON envelope in what the CLI wrote."""
    for line in reversed(written.splitlines()):
        with contextlib.suppress(ValueError):
            doc: Any = json.loads(line)
            if isinstance(doc, dict) and isinstance(doc.get("message"), str) and (doc.get("reason") or doc.get("code")):
                return str(doc.get("reason") or doc.get("code")), doc["message"]
    return "internal_error", written.strip().splitlines()[-1] if written.strip() else "the kernel could not be opened"
