"""`taskkernel mcp` over stdio facing lines that are not messages: a host waiting on a call must get an answer, and
the server must serve on. The real server process is driven a line at a time, as a host's client drives it (the
SDK's own client never writes a malformed line): what is not JSON is answered -32700, JSON that is not a request
-32600 (with its id when it has one), a line over the limit -32600 without the server ever holding it whole."""

from __future__ import annotations

import json
import os
import select
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from taskkernel.coordinator.mcp.wire import ID_HEAD_BYTES, MAX_MESSAGE_BYTES, Oversized, frames, leading_id
from tests.cli_support import CLI, cli_env, new_workspace

INITIALIZE = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}
INITIALIZED = b'{"jsonrpc": "2.0", "method": "notifications/initialized"}'
MALFORMED_EVENT = "mcp.malformed_message"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace whose local owner may act without a token: these tests are about the wire, not identity."""
    ws = new_workspace(tmp_path_factory.mktemp("mcp-stdio"))
    config = ws / "taskkernel.toml"
    config.write_text(config.read_text().replace("require_token = true", "require_token = false"))
    return ws


def request(request_id: int | str, method: str, params: dict[str, Any] | None = None) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method,
                       **({"params": params} if params is not None else {})}).encode()


class LineClient:
    """One `taskkernel mcp` process, written to and read from a line at a time."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.received = b""

    def send(self, line: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + b"\n")

    def answer(self, timeout: float = 60) -> dict[str, Any]:
        """The next message the server writes (every answer is one line)."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.received:
            ready, _, _ = select.select([fd], [], [], timeout)
            assert ready, f"no answer within {timeout} s"
            chunk = os.read(fd, 1 << 16)
            assert chunk, "the server closed stdout"
            self.received += chunk
        line, self.received = self.received.split(b"\n", 1)
        answer: dict[str, Any] = json.loads(line)
        return answer

    def call(self, request_id: int, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self.send(request(request_id, method, params))
        answer = self.answer()
        assert answer["id"] == request_id and "result" in answer, answer
        result: dict[str, Any] = answer["result"]
        return result

    def refused(self, line: bytes, code: int, request_id: int | str | None) -> dict[str, Any]:
        """Sends a line that is no message: its answer is the JSON-RPC error ``code`` for ``request_id``."""
        self.send(line)
        answer = self.answer()
        assert answer == {"jsonrpc": "2.0", "id": request_id, "error": answer.get("error")}, answer
        error: dict[str, Any] = answer["error"]
        assert error["code"] == code, (line[:80], answer)
        return error

    def reset_peak_memory(self) -> None:
        Path(f"/proc/{self.proc.pid}/clear_refs").write_text("5")  # VmHWM := VmRSS (Linux 4.0)

    def memory_kib(self, field: str) -> int:
        """The server's VmRSS (now) or VmHWM (peak since reset_peak_memory) from /proc."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
        raise AssertionError(f"no {field} for {self.proc.pid}")


@contextmanager
def serving(ws: Path, malformed: int) -> Iterator[LineClient]:
    """`taskkernel mcp` started over pipes and initialized. On leaving, the session ends cleanly (exit 0) with
    ``malformed`` log lines, one per malformed line, and no traceback."""
    with tempfile.TemporaryFile() as errlog:
        proc = subprocess.Popen([*CLI, "mcp"], cwd=ws, env=cli_env(), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=errlog, bufsize=0)
        try:
            client = LineClient(proc)
            assert client.call(0, "initialize", INITIALIZE)["serverInfo"]["name"] == "taskkernel"
            client.send(INITIALIZED)
            yield client
            assert proc.stdin is not None
            proc.stdin.close()
            assert proc.wait(60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        errlog.seek(0)
        logged = errlog.read().decode()
    assert "Traceback" not in logged, logged
    assert logged.count(MALFORMED_EVENT) == malformed, logged


def test_a_line_that_is_not_json_gets_a_parse_error_and_the_next_call_is_answered(workspace: Path) -> None:
    """Not JSON, or not UTF-8 (even inside a well-formed request): -32700 with id null, and the session goes on."""
    with serving(workspace, malformed=2) as client:
        error = client.refused(b"{not json", -32700, None)
        assert error["message"].startswith("Parse error"), error
        client.refused(b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"x": "\xff"}}', -32700, None)
        client.send(b"  ")  # a blank line is no message: nothing answers it
        assert {t["name"] for t in client.call(2, "tools/list")["tools"]} >= {"whoami", "claim_task"}
        whoami = client.call(3, "tools/call", {"name": "whoami", "arguments": {}})
        assert whoami["structuredContent"]["principal"]["id"] == "ADMIN:local-owner"


def test_json_that_is_not_a_request_gets_invalid_request_with_the_id_it_carries(workspace: Path) -> None:
    """-32600 for every shape that is no JSON-RPC message; the id when a client could be waiting on it."""
    cases: list[tuple[bytes, int | str | None]] = [
        (b"[1, 2]", None),  # a batch: not in MCP
        (b"42", None),
        (b'"ping"', None),
        (b'{"id": 7}', 7),  # an object without a method
        (b'{"jsonrpc": "2.0", "id": "req-8", "params": {}}', "req-8"),
        (b'{"jsonrpc": "1.0", "id": 9, "method": "ping"}', 9),
        (b'{"jsonrpc": "2.0", "id": 10, "method": "ping", "params": [1]}', 10),
        (b'{"jsonrpc": "2.0", "id": true, "method": "ping"}', None),  # not an id a client can wait on
        (b'{"jsonrpc": "2.0", "id": null, "method": "ping"}', None),
        (b'{"jsonrpc": "2.0", "id": 11, "result": 5}', None),  # a malformed reply: its id is not the client's
    ]
    with serving(workspace, malformed=len(cases)) as client:
        for line, request_id in cases:
            assert client.refused(line, -32600, request_id)["message"].startswith("Invalid Request"), line
        assert client.call(12, "ping") == {}


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the server's memory from /proc")
def test_an_oversized_line_is_dropped_as_it_streams_and_the_next_call_is_answered(workspace: Path) -> None:
    """70 MB of one line: refused with the limit named, the server's peak memory growing by a few MiB at most
    (the line is never held whole), and nothing of it done: the create_task inside never ran."""
    body = "a" * 70_000_000
    huge = request(20, "tools/call", {"name": "create_task", "arguments": {
        "recipient": "DEV", "subject": "huge", "body": body}})
    limit = {"reason": "payload_too_large", "limit": MAX_MESSAGE_BYTES}
    with serving(workspace, malformed=3) as client:
        client.reset_peak_memory()
        before = client.memory_kib("VmRSS")
        error = client.refused(huge, -32600, 20)
        assert (error["data"], str(MAX_MESSAGE_BYTES) in error["message"]) == (limit, True), error
        assert (client.memory_kib("VmHWM") - before) * 1024 < 4 * MAX_MESSAGE_BYTES
        listed = client.call(21, "tools/call", {"name": "list_tasks", "arguments": {}})
        assert listed["structuredContent"]["count"] == 0

        at_limit = request(22, "ping", {"pad": ""})
        at_limit = at_limit.replace(b'"pad": ""', b'"pad": "' + b"x" * (MAX_MESSAGE_BYTES - len(at_limit)) + b'"')
        assert len(at_limit) == MAX_MESSAGE_BYTES
        client.send(at_limit)
        assert client.answer() == {"jsonrpc": "2.0", "id": 22, "result": {}}
        client.refused(at_limit.replace(b'"pad": "', b'"pad": "x'), -32600, 22)
        id_last = b'{"params": {"pad": "' + b"x" * MAX_MESSAGE_BYTES + b'"}, "jsonrpc": "2.0", "id": 23}'
        assert client.refused(id_last, -32600, None)["data"] == limit  # the id came after the part cut
        assert client.call(24, "ping") == {}


def test_a_session_replayed_from_regular_files_gets_the_same_answers(workspace: Path, tmp_path: Path) -> None:
    """stdin and stdout that are regular files, not pipes, are served too (in worker threads), to the end of
    the file: a recorded session replayed gets its malformed lines answered as over pipes."""
    recorded = tmp_path / "session.jsonl"
    recorded.write_bytes(b"\n".join([request(0, "initialize", INITIALIZE), INITIALIZED, b"{not json",
                                     b'{"id": 7}', b"[]"]) + b"\n")
    answers = tmp_path / "answers.jsonl"
    with recorded.open("rb") as stdin, answers.open("wb") as stdout:
        done = subprocess.run([*CLI, "mcp"], cwd=workspace, env=cli_env(), stdin=stdin, stdout=stdout,
                              stderr=subprocess.PIPE, timeout=120)
    assert done.returncode == 0 and b"Traceback" not in done.stderr, done.stderr
    written = [json.loads(line) for line in answers.read_bytes().splitlines()]
    assert written[0]["id"] == 0 and "serverInfo" in written[0]["result"], written
    assert [(a["id"], a["error"]["code"]) for a in written[1:]] == [(None, -32700), (7, -32600), (None, -32600)]


# -- in process: the framing and the id of a line cut short ---------------------------------------------------

def read_in_pieces(data: bytes, sizes: list[int]) -> Any:
    """A reader that hands ``data`` out in pieces of the given sizes (then what is left), as a pipe does."""
    pieces = iter(sizes)
    position = 0

    async def read(size: int) -> bytes:
        nonlocal position
        step = min(size, next(pieces, size))
        chunk = data[position:position + step]
        position += len(chunk)
        return chunk

    return read


@given(lines=st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), max_size=12),
       newline_at_end=st.booleans(), sizes=st.lists(st.integers(1, 50), max_size=40))
def test_frames_split_any_stream_into_its_lines_and_drop_those_over_the_limit(
        lines: list[bytes], newline_at_end: bool, sizes: list[int]) -> None:
    """Whatever the pipe hands out at a time: every line as written, a line over the limit as Oversized with its
    head, and the line after it intact."""
    limit = 16
    data = b"\n".join(lines) + (b"\n" if newline_at_end and lines else b"")
    expected: list[bytes | Oversized] = [line if len(line) <= limit else Oversized(line[:min(limit, ID_HEAD_BYTES)])
                                         for line in lines]
    if lines and not newline_at_end and not lines[-1]:
        expected.pop()  # the stream ended with the newline before it

    async def collect() -> list[bytes | Oversized]:
        return [frame async for frame in frames(read_in_pieces(data, sizes), limit)]

    assert anyio.run(collect) == expected


@pytest.mark.parametrize(("head", "found"), [
    (b'{"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"arguments": {"body": "aaa', 5),
    (b' { "id" : "req-1" , "method": "ping", "params": {"x": "aaa', "req-1"),
    (b'{"jsonrpc": "2.0", "method": "ping", "params": {"x": "aaa', None),  # the id after the part cut
    (b'{"jsonrpc": "2.0", "id": 12', None),  # the head may end inside a number: 12 could be 123
    (b'{"jsonrpc": "2.0", "id": true, "method": "ping", "params": {"x": "aaa', None),
    (b'[{"id": 5, "method": "ping", "params": {"x": "aaa', None),
])
def test_a_cut_line_is_answered_with_its_id_only_when_it_is_certain(head: bytes, found: int | str | None) -> None:
    """A client waits on the id of the call it sent: an oversized line's answer carries it when the id comes
    before the long part (as the SDKs write a request), and never an id that may be wrong."""
    assert leading_id(head) == found
