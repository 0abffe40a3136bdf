"""A stand-in agent that acts in gated steps, for tests/test_grants_running.py.

Started by `taskkernel up` as a `command` runner: `gated_agent.py MCP_CONFIG TASK_ID BARRIER_DIR`. It starts the
kernel's MCP server the way the run's MCP configuration (`{mcp_config}`) names it, with the run's task-scoped token,
and talks to it with the official MCP SDK client, as an agent host would. It writes `ready.json` (its `whoami`), then
for step 1, 2, … waits for the test's `go-<n>.json` (a barrier: the test changes grants first, then opens it), asks
`check_action` and `perform` about the action it names and writes both answers to `answer-<n>.json`. A `go` file
saying `{"finish": true}` ends the loop: the agent reports done, submits and exits 0.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

BARRIER_WAIT_S = 120.0  # the test opens each barrier within seconds; this only bounds a test that died


def write_atomically(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc), encoding="utf-8")
    os.replace(tmp, path)


async def barrier(path: Path) -> dict[str, Any]:
    deadline = time.monotonic() + BARRIER_WAIT_S
    while not path.exists():
        if time.monotonic() > deadline:
            sys.stderr.write(f"gated agent: nobody opened {path.name}\n")
            sys.exit(4)
        await asyncio.sleep(0.02)
    return dict(json.loads(path.read_text(encoding="utf-8")))


def answer(result: Any) -> dict[str, Any]:
    return {"is_error": bool(result.is_error), "structured": result.structured_content}


async def work(server: dict[str, Any], task_id: str, gates: Path) -> None:
    params = StdioServerParameters(command=server["command"], args=server["args"], env=server.get("env"))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        who = await session.call_tool("whoami", {})
        write_atomically(gates / "ready.json", answer(who))
        step = 0
        while True:
            step += 1
            order = await barrier(gates / f"go-{step}.json")
            if order.get("finish"):
                break
            action = {"task_id": task_id, **order["action"]}
            checked = await session.call_tool("check_action", action)
            performed = await session.call_tool("perform", action)
            write_atomically(gates / f"answer-{step}.json",
                             {"check_action": answer(checked), "perform": answer(performed)})
        for tool, args in (("report", {"task_id": task_id, "status": "done", "body": "gated steps done"}),
                           ("submit_task", {"task_id": task_id})):
            done = await session.call_tool(tool, args)
            if done.is_error:
                sys.stderr.write(f"gated agent: {tool} refused: {done.content}\n")
                sys.exit(3)


def main() -> None:
    mcp_config, task_id, gates = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    server = json.loads(Path(mcp_config).read_text(encoding="utf-8"))["mcpServers"]["taskkernel"]
    asyncio.run(work(server, task_id, gates))


if __name__ == "__main__":
    main()
