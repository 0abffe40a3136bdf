"""fcop-mcp 4.0.5's canonical server as a real client drives it: its own venv (it pins an older `mcp`), stdio,
the official `mcp` client, one session per `with` block (a loop thread keeps it open between calls)."""

from __future__ import annotations

import asyncio
import os
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

REPO = Path(__file__).resolve().parent.parent


def fcop_mcp_program() -> Path:
    """``make fcop-mcp`` installs it in .venv-fcop-mcp; missing: a skip, or a failure under CI's requirement."""
    path = Path(os.environ.get("TASKKERNEL_FCOP_MCP", REPO / ".venv-fcop-mcp" / "bin" / "fcop-mcp"))
    if not path.is_file():
        message = f"fcop-mcp 4.0.5 is not installed at {path}: run `make fcop-mcp`"
        if os.environ.get("TASKKERNEL_REQUIRE_FCOP_MCP") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path


class FcopMcp:
    """``with FcopMcp(project) as fcop: fcop.call("create_task", ...)`` -> the tool's structured content (an error
    result raises ``ToolError`` with fcop's code). One task on a loop thread owns the session from start to end
    (anyio's scopes must close in the task that opened them); calls reach it through a queue."""

    def __init__(self, project: Path) -> None:
        self.params = StdioServerParameters(command=str(fcop_mcp_program()), args=["--root", str(project)],
                                            env={"PATH": os.environ["PATH"], "HOME": str(project)})
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.calls: asyncio.Queue[tuple[str, dict[str, Any], Future[Any]] | None] | None = None
        self.served: Future[None] | None = None

    async def _serve(self, ready: Future[None]) -> None:
        self.calls = asyncio.Queue()
        try:
            async with stdio_client(self.params) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                ready.set_result(None)
                while (item := await self.calls.get()) is not None:
                    tool, args, answer = item
                    try:
                        answer.set_result(await session.call_tool(tool, args))
                    except Exception as exc:  # noqa: BLE001 - handed to the caller
                        answer.set_exception(exc)
        except Exception as exc:  # noqa: BLE001
            if not ready.done():
                ready.set_exception(exc)
            raise

    def __enter__(self) -> FcopMcp:
        self.thread.start()
        ready: Future[None] = Future()
        self.served = asyncio.run_coroutine_threadsafe(self._serve(ready), self.loop)
        ready.result(timeout=60)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.calls is not None and self.served is not None
        self.loop.call_soon_threadsafe(self.calls.put_nowait, None)
        self.served.result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)

    def call(self, tool: str, **args: Any) -> dict[str, Any]:
        assert self.calls is not None
        answer: Future[Any] = Future()
        self.loop.call_soon_threadsafe(self.calls.put_nowait, (tool, args, answer))
        result = answer.result(timeout=60)
        content = result.structured_content or {}
        if result.is_error:
            raise ToolError(str(content.get("code") or getattr(result.content[0], "text", "")), content)
        return content  # type: ignore[no-any-return]


class ToolError(Exception):
    def __init__(self, code: str, content: dict[str, Any]) -> None:
        super().__init__(code)
        self.code = code
        self.content = content
