"""A stand-in agent for the people-in-the-loop tests (tests/test_steering.py), run by the generic `command` runner:
`python steered_agent.py PROMPT_FILE MCP_CONFIG`.

It talks to the kernel's real MCP server (the one the run's MCP configuration names, acting on the run's token)
with the official SDK client, as an agent CLI would, and does what its task's body says, one instruction per line:
  calls N            make N `get_task` calls (default 4), PAUSE seconds apart
  pause S            seconds between calls (default 0.2)
  progress-at K      after call K, record a checkpoint (add_progress, completed_tool_calls=K)
  crash-once-after K the first run only: exit 1 after call K, without a report
  hold               after the calls, keep calling `get_task` until $STANDIN_RECORDS/<task>.go exists
  checkpoint-after-hold   then record a checkpoint ("handled what I was told", every call made so far)
  crash-once-after-hold   then, the first run only, exit 1 without a report
  print-token        print the run's token on stdout (the live output must never show it)
Whenever a result carries `pending_inputs` it calls `read_inputs` and obeys each instruction; it obeys the prompt's
"New instructions" too, and nothing of its "History". Obeying appends `<seq> <via> <text>` to
$STANDIN_RECORDS/<task>.obeyed, and an instruction `repeat this sentence: X` appends X to <task>.said (seed 002's
canary). It reports done and submits; a submit refused `inputs_pending` makes it read, obey and submit again.
Every start saves its prompt as <task>.prompt-<n>; SIGTERM is recorded in <task>.terminated.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

RECORDS = Path(os.environ["STANDIN_RECORDS"])
TASK = os.environ["TASKKERNEL_TASK_ID"]
_NEW = re.compile(r"^\d+\. \((?:[a-z]+|answer to \S+) #(\d+)(?:, from [^)]*)?\) (.*)$")


def record(suffix: str, line: str) -> None:
    with open(RECORDS / f"{TASK}.{suffix}", "a", encoding="utf-8") as fh:
        fh.write(line + "\n")


def obey(seq: Any, via: str, text: str) -> None:
    record("obeyed", f"{seq} {via} {text}")
    if text.startswith("repeat this sentence: "):
        record("said", text.removeprefix("repeat this sentence: "))


def new_instructions(prompt: str) -> list[tuple[str, str]]:
    """(seq, text) of the prompt's "New instructions" section, and nothing else of it."""
    found, inside = [], False
    for line in prompt.splitlines():
        if line.startswith("## "):
            inside = line.startswith("## New instructions")
        elif inside and (m := _NEW.match(line)):
            found.append((m.group(1), m.group(2)))
    return found


def options(body: str) -> dict[str, str]:
    return {parts[0]: (parts[1] if len(parts) > 1 else "") for line in body.splitlines()
            if (parts := line.strip().split(maxsplit=1))}


class Agent:
    def __init__(self, session: ClientSession) -> None:
        self.session = session

    async def call(self, tool: str, **args: Any) -> dict[str, Any]:
        result = await self.session.call_tool(tool, args)
        doc = result.structured_content or json.loads(result.content[0].text)  # type: ignore[union-attr]
        if doc.get("pending_inputs") and tool != "read_inputs":
            await self.read()
        return dict(doc)

    async def read(self) -> None:
        doc = await self.call("read_inputs")
        for item in doc["inputs"]:
            obey(item["accept_seq"], "tool", item["text"])


async def main(prompt_file: str, mcp_config: str) -> int:
    prompt = Path(prompt_file).read_text(encoding="utf-8")
    starts = len(list(RECORDS.glob(f"{TASK}.prompt-*")))
    (RECORDS / f"{TASK}.prompt-{starts + 1}").write_text(prompt, encoding="utf-8")
    for seq, text in new_instructions(prompt):
        obey(seq, "prompt", text)
    server = json.loads(Path(mcp_config).read_text())["mcpServers"]["taskkernel"]
    params = StdioServerParameters(command=server["command"], args=server["args"], env=dict(os.environ))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        agent = Agent(session)
        doc = await agent.call("get_task", task_id=TASK)
        opts = options(doc["task"]["body"] or "")
        if "print-token" in opts:
            print(f"my token is {os.environ['TASKKERNEL_TOKEN']}", flush=True)
        pause = float(opts.get("pause", "0.2"))
        crash_after = int(opts["crash-once-after"]) if "crash-once-after" in opts else None
        marker = RECORDS / f"{TASK}.crashed"
        for n in range(1, int(opts.get("calls", "4")) + 1):
            print(json.dumps({"call": n, "tool": "get_task"}), flush=True)
            await agent.call("get_task", task_id=TASK)
            if opts.get("progress-at") == str(n):
                await agent.call("add_progress", text=f"made {n} calls", completed_tool_calls=n)
            if crash_after == n and not marker.exists():
                marker.write_text("crashed")
                return 1
            time.sleep(pause)
        calls = n
        if "hold" in opts:
            while not (RECORDS / f"{TASK}.go").exists():
                await agent.call("get_task", task_id=TASK)
                calls += 1
                time.sleep(pause)
        if "checkpoint-after-hold" in opts:
            await agent.call("add_progress", text="handled what I was told", completed_tool_calls=calls)
        if "crash-once-after-hold" in opts and not marker.exists():
            marker.write_text("crashed")
            return 1
        await agent.call("report", task_id=TASK, status="done", body="did what I was told")
        for _ in range(5):
            submitted = await agent.call("submit_task", task_id=TASK)
            record("submits", f"{submitted['status']} {submitted.get('reason')}")
            if submitted.get("reason") != "inputs_pending":
                break
            await agent.read()
    return 0


def _terminated(signum: int, _: Any) -> None:
    record("terminated", str(signum))
    sys.exit(128 + signum)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _terminated)
    sys.exit(asyncio.run(main(sys.argv[1], sys.argv[2])))
