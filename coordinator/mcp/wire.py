"""MCP over stdio, one JSON-RPC message a line (server.py serves the session): the streams over stdin and stdout,
a line too long or not JSON answered on the wire with its own error (-32600, -32700) and the session going on, and
``Activity``, when the session last read or wrote a line."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import stat
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, NamedTuple

import anyio
import mcp_types as types
import pydantic_core
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.message import SessionMessage
from mcp_types import INVALID_REQUEST, PARSE_ERROR
from pydantic import ValidationError

from taskkernel.coordinator.serving import MAX_REQUEST_BYTES
from taskkernel.kernel.logging import get_logger
from taskkernel.kernel.reasons import ReasonCode

log = get_logger(__name__)

READ_CHUNK = 64 * 1024  # bytes read from the wire at a time
ID_HEAD_BYTES = 4096  # what is kept of a line over MAX_MESSAGE_BYTES, to find the id its answer carries
QUIET_SECONDS = 0.05  # no line read or written for this long: the session is quiet
# The most one JSON-RPC message may take: a line over stdio (answered -32600 beyond), a request body over HTTP
# (answered 413): the one limit of every server here (serving.py).
MAX_MESSAGE_BYTES = MAX_REQUEST_BYTES
class Activity:
    """When the stdio session last read or wrote a line: ``quiet()`` returns once it has done neither for
    QUIET_SECONDS."""

    def __init__(self) -> None:
        self.last = time.monotonic()

    def touch(self) -> None:
        self.last = time.monotonic()

    async def quiet(self) -> None:
        while (idle := time.monotonic() - self.last) < QUIET_SECONDS:
            await anyio.sleep(QUIET_SECONDS - idle)


@asynccontextmanager
async def stdio_streams(activity: Activity | None = None
                        ) -> AsyncIterator[tuple[MemoryObjectReceiveStream[Any], MemoryObjectSendStream[Any]]]:
    """The session's streams over stdin and stdout, one JSON-RPC message a line. Unlike the SDK's stdio_server
    (which drops them), every line that is not a message is answered here (``decode``) and the session serves
    on; no line is held whole beyond MAX_MESSAGE_BYTES (``frames``). As the SDK's does, it serves the wire from
    private copies of fds 0 and 1 and points them at /dev/null and stderr meanwhile, so nothing else in the
    process (a stray print, a child process) can write into the protocol; both are restored at the end. Every
    line read or written touches ``activity``."""
    activity = activity or Activity()
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
                    activity.touch()
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
                    activity.touch()

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


