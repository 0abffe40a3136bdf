"""The MCP server over streamable HTTP (issue 12): `taskkernel mcp --transport http` runs as its own process on a
free port; every request must carry Authorization: Bearer <token> (else 401, before the protocol), and the same
flow as over stdio holds through the official SDK's streamable HTTP client."""

from __future__ import annotations

import json
import queue
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tests.cli_support import CLI, cli_env, new_workspace, run, stop_server
from tests.test_mcp import Client, Owner, check_schemas, issue

PROTOCOL = "2025-11-25"


def start(ws: Path, *options: str) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """`taskkernel mcp --transport http --port 0 OPTIONS` (no credential at all) and its listening document."""
    proc = subprocess.Popen([*CLI, "mcp", "--transport", "http", "--port", "0", *options], cwd=ws, env=cli_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout or ()], daemon=True).start()
    try:
        listening = json.loads(lines.get(timeout=60))
    except queue.Empty:
        proc.kill()
        raise AssertionError(f"the server did not listen: {proc.stderr.read() if proc.stderr else ''}") from None
    assert listening["status"] == "listening" and listening["url"].endswith("/mcp"), listening
    return proc, listening


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str, dict[str, str]]]:
    """A workspace, its HTTP server's URL (the server started with no credential at all) and agents' tokens."""
    ws = new_workspace(tmp_path_factory.mktemp("mcp-http"))
    tokens = dict(zip(("dev", "other"), issue(ws, ("DEV", "dev-http"), ("DEV", "dev-gone")), strict=True))
    proc, listening = start(ws)
    try:
        yield ws, listening["url"], tokens
    finally:
        stop_server(proc)


def post(url: str, message: dict[str, Any], token: str | None = None, host: str | None = None) -> tuple[int, Any]:
    """One JSON-RPC request as a plain HTTP POST: (status, JSON body or text)."""
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream",
               "mcp-protocol-version": PROTOCOL, **({"host": host} if host else {})}
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=json.dumps(message).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as exc:
        body = exc.read()
        try:
            return exc.code, json.loads(body or b"null")
        except ValueError:
            return exc.code, body.decode(errors="replace")


@asynccontextmanager
async def http_session(url: str, token: str) -> AsyncIterator[Client]:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http, \
            streamable_http_client(url, http_client=http) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield Client(session)


WHOAMI = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "whoami", "arguments": {}}}


def test_a_request_without_a_live_bearer_token_is_401(served: tuple[Path, str, dict[str, str]]) -> None:
    _, url, tokens = served
    for token in (None, "", "tk_" + "x" * 40, "not-a-token"):
        status, body = post(url, WHOAMI, token)
        assert status == 401 and body["reason"] == "actor_unverified", (token, status, body)
    status, body = post(url, WHOAMI, tokens["dev"])
    assert status == 200 and body["result"]["structuredContent"]["principal"]["id"] == "DEV:dev-http", body


def fetch(url: str, token: str | None = None, message: dict[str, Any] | None = None
          ) -> tuple[int, dict[str, str], Any]:
    """A GET (or, with ``message``, a JSON-RPC POST): (status, headers with lower-case names, JSON body)."""
    headers = {"accept": "application/json, text/event-stream", "mcp-protocol-version": PROTOCOL,
               **({"authorization": f"Bearer {token}"} if token is not None else {})}
    data = None
    if message is not None:
        data, headers["content-type"] = json.dumps(message).encode(), "application/json"
    request = urllib.request.Request(url, data=data, headers=headers, method="POST" if data else "GET")
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, {k.lower(): v for k, v in answer.headers.items()}, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, json.loads(exc.read())


OAUTH_DISCOVERY = ("/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp",
                   "/.well-known/oauth-authorization-server", "/.well-known/oauth-authorization-server/mcp",
                   "/.well-known/openid-configuration", "/.well-known/openid-configuration/mcp",
                   "/mcp/.well-known/openid-configuration")


def test_oauth_discovery_is_404_and_a_401_says_why(served: tuple[Path, str, dict[str, str]]) -> None:
    """An OAuth-capable host (Gemini CLI, the MCP Inspector) refused 401 looks for the OAuth documents: they
    are 404, with or without a credential, so it shows the refusal instead of starting an OAuth sign-in. The 401
    itself carries the challenge HTTP requires (no error without a credential, invalid_token with the reason for
    one that is not live) and the refusal document; the board (`serve`) answers the same 404."""
    from tests.web_support import board

    ws, url, tokens = served
    base = url.removesuffix("/mcp")
    for path in OAUTH_DISCOVERY:
        for token in (None, tokens["dev"]):
            status, headers, body = fetch(base + path, token)
            assert (status, body["status"], body["reason"]) == (404, "rejected", "not_found"), (path, status, body)
            assert "Authorization: Bearer" in body["message"] and "www-authenticate" not in headers, body
            assert headers["x-content-type-options"] == "nosniff" and "frame-ancestors 'none'" in headers[
                "content-security-policy"]
    status, headers, body = fetch(url, None, WHOAMI)
    assert (status, body["reason"]) == (401, "actor_unverified") and "Bearer <token>" in body["message"], body
    assert headers["www-authenticate"] == 'Bearer realm="taskkernel"'
    status, headers, body = fetch(url, "tk_" + "x" * 40, WHOAMI)
    assert (status, body["reason"]) == (401, "actor_unverified"), body
    assert headers["www-authenticate"] == ('Bearer realm="taskkernel", error="invalid_token", '
                                           f'error_description="actor_unverified: {body["message"]}"'), headers
    with board(ws) as board_url:
        for path in ("/.well-known/oauth-protected-resource", "/.well-known/oauth-authorization-server"):
            status, _, body = fetch(board_url.rstrip("/") + path)
            assert (status, body["reason"]) == (404, "not_found"), (path, status, body)


async def test_the_agent_run_over_http(served: tuple[Path, str, dict[str, str]]) -> None:
    ws, url, tokens = served
    owner = Owner(ws)
    try:
        tid = owner.create()
    finally:
        owner.close()
    async with http_session(url, tokens["dev"]) as dev:
        check_schemas(await dev.list_tools())
        me = await dev.ok("whoami")
        assert (me["principal"]["id"], me["transport"]) == ("DEV:dev-http", "http")
        assert (await dev.ok("claim_task", task_id=tid))["revision"] == 2
        report = {"task_id": tid, "status": "done", "body": "done over HTTP", "artifacts": ["out.txt"]}
        first, again = await dev.ok("report", **report), await dev.ok("report", **report)
        assert (first["status"], again["status"], again["revision"]) == ("accepted", "replayed", 3)
        stale = await dev.refused("submit_task", "stale_task_revision", task_id=tid, expect_rev=2)
        assert (stale["revision"], stale["round"]) == (3, 1)
        assert (await dev.ok("submit_task", task_id=tid))["message"].startswith("submit accepted")
        await dev.refused("approve_task", "role_not_authorized", task_id=tid)
        with pytest.raises(MCPError):
            await dev.session.call_tool("report", {"task_id": tid})  # status is required: a malformed call
        task_file = (await dev.session.read_resource(f"task://{tid}")).contents[0].text
        assert "done over HTTP" not in task_file and "transitions:" in task_file  # the TASK file, not the report


async def test_a_token_revoked_while_the_server_runs_stops_working(served: tuple[Path, str, dict[str, str]]) -> None:
    ws, url, tokens = served
    async with http_session(url, tokens["other"]) as gone:
        assert (await gone.ok("whoami"))["principal"]["agent"] == "dev-gone"
        assert run("token", "revoke", tokens["other"], cwd=ws).code == 0
        with anyio.fail_after(60), pytest.raises(MCPError):  # the SDK client's view of the 401
            await gone.session.call_tool("whoami", {})
    status, body = post(url, WHOAMI, tokens["other"])
    assert (status, body["reason"], body["message"]) == (401, "actor_unverified", "revoked credential")
    assert post(url, WHOAMI, tokens["dev"])[0] == 200  # another credential still acts


async def test_a_database_fault_is_its_code_never_sql_nor_a_traceback(served: tuple[Path, str, dict[str, str]]) -> None:
    """The database failing mid-session (here: tables gone from under the server): a resource read is the
    protocol's internal error with the fault code, the bearer step answers 503 with it; no SQL, no traceback (the
    fixture's teardown checks stderr). Run last: the tables are put back at the end."""
    import sqlalchemy as sa

    ws, url, tokens = served
    owner = Owner(ws)
    engine = owner.context.database().engine

    def rename(old: str, new: str) -> None:
        with engine.begin() as conn:
            conn.execute(sa.text(f"ALTER TABLE {old} RENAME TO {new}"))

    try:
        async with http_session(url, tokens["dev"]) as dev:
            rename("tasks", "tasks_gone")
            try:
                with pytest.raises(MCPError) as raised:
                    await dev.session.read_resource("todo://DEV")
                error = raised.value.error
                assert error.code == -32603 and error.data == {"reason": "database_error"}, error
                assert "SELECT" not in error.message and "[SQL" not in error.message, error.message
            finally:
                rename("tasks_gone", "tasks")
        rename("credentials", "credentials_gone")
        try:
            status, body = post(url, WHOAMI, tokens["dev"])
        finally:
            rename("credentials_gone", "credentials")
        assert (status, body["status"], body["reason"]) == (503, "rejected", "database_error"), (status, body)
        assert "SELECT" not in body["message"], body
        assert post(url, WHOAMI, tokens["dev"])[0] == 200
    finally:
        owner.close()


def test_a_host_beyond_loopback_needs_allow_remote_and_keeps_the_host_checks(
        served: tuple[Path, str, dict[str, str]]) -> None:
    """--host other than loopback: a usage error without --allow-remote; with it, a warning on stderr and the
    SDK's Host checks on, allowing exactly the address given."""
    ws, _, tokens = served
    refused = run("mcp", "--transport", "http", "--host", "0.0.0.0", "--port", "0", cwd=ws)
    assert refused.code == 64 and "--allow-remote" in refused.err and "Traceback" not in refused.err, refused
    proc, listening = start(ws, "--host", "0.0.0.0", "--allow-remote")
    try:
        port = int(listening["url"].rsplit(":", 1)[1].split("/")[0])
        url = f"http://127.0.0.1:{port}/mcp"
        assert post(url, WHOAMI, tokens["dev"], host=f"0.0.0.0:{port}")[0] == 200
        assert post(url, WHOAMI, tokens["dev"], host=f"evil.example:{port}")[0] in (400, 403, 421)
        assert post(url, WHOAMI, tokens["dev"])[0] in (400, 403, 421)  # 127.0.0.1 is not the address given
    finally:
        errors = stop_server(proc)
    assert "clear text" in errors, errors
