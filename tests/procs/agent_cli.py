"""A stand-in for Claude Code, Codex and Gemini CLI at their headless interface (docs/agents.md), installed as
`claude`, `codex` and `gemini` first on PATH by tests/test_agents.py.

Like the real CLI it checks the flags the preset relies on, reads the prompt from stdin, finds the MCP server
where that CLI is told of it (Claude Code: the --mcp-config file; Codex: the -c mcp_servers.taskkernel.*
overrides; Gemini CLI: .gemini/settings.json under GEMINI_CLI_HOME), talks to it with the official
MCP SDK client, edits files in its working folder and prints the CLI's documented JSON output (Claude Code's
as one result object or, with stream-json, as its events).

What it does is read from the task's body, one instruction per line:
  write <path> <text>   write <text> (and a newline) to <path> in the working folder
  stamp <path>          write "round <n>" (the round its prompt names) to <path>
  latin1 <path>         write bytes that are not UTF-8 to <path>
  delete <path>         remove <path> from the working folder
  after-report write <path> <text>   the same write, after the report and the submit
  crash-once            the first time for this task: write `crash.txt`, then exit 1 without a report
  fail-json             exit 0, but the JSON output reports an error (Claude Code: is_error true)
  no-tool-call          print a success result and exit 0 without any tool call (the model answered in text)
  no-tool-call-once     the same, the first time for this task only
A review run (TASKKERNEL_PURPOSE=review) follows `review approve|reject|silent` (default silent: it reads the task
and exits 0 without deciding, as a reviewer whose tools failed it would).
Every start is recorded (argv, cwd, environment, prompt, MCP server, start time) as JSON under $STANDIN_RECORDS,
which the wrapper script sets (nothing of the test's environment reaches the agent through the coordinator), and a
finished run's end time beside it.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
import tomllib
import uuid
from pathlib import Path
from typing import Any

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

USAGE = {"input_tokens": 100, "cache_creation_input_tokens": 20, "cache_read_input_tokens": 30, "output_tokens": 7}


def fail(message: str, code: int = 2) -> None:
    sys.stderr.write(f"stand-in: {message}\n")
    sys.exit(code)


def value_after(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def server_of(cli: str, argv: list[str]) -> dict[str, Any] | None:
    """The `taskkernel` MCP server entry the way this CLI is told of it."""
    if cli == "claude":
        path = value_after(argv, "--mcp-config")
        return json.loads(Path(path).read_text())["mcpServers"]["taskkernel"] if path else None
    if cli == "codex":
        found: dict[str, Any] = {}
        for i, word in enumerate(argv):
            if word == "-c" and argv[i + 1].startswith("mcp_servers.taskkernel."):
                key, value = argv[i + 1][len("mcp_servers.taskkernel."):].split("=", 1)
                found[key] = tomllib.loads(f"v = {value}")["v"]
        return found or None
    home = os.environ.get("GEMINI_CLI_HOME")
    settings = Path(home) / ".gemini" / "settings.json" if home else None
    return json.loads(settings.read_text())["mcpServers"]["taskkernel"] if settings and settings.exists() else None


def check_flags(cli: str, argv: list[str]) -> None:
    """The flags each preset must pass (docs/agents.md); a real CLI would otherwise not run headless."""
    wanted = {"claude": ["-p", "--output-format", "--permission-mode", "acceptEdits"],
              "codex": ["exec", "--json", "--sandbox", "workspace-write", "--cd"],
              "gemini": ["--output-format", "json", "--approval-mode", "auto_edit", "--skip-trust"]}[cli]
    missing = [w for w in wanted if w not in argv]
    if missing:
        fail(f"{cli}: missing {missing} in {argv}")
    if cli == "claude" and value_after(argv, "--output-format") not in ("json", "stream-json"):
        fail(f"claude: --output-format json or stream-json, not {argv}")
    if cli == "claude" and streams(argv) and "--verbose" not in argv:  # as the real CLI refuses it
        fail("Error: When using --print, --output-format=stream-json requires --verbose")
    if cli == "codex":
        os.chdir(value_after(argv, "--cd") or ".")


def follow(line: str, round_: str) -> None:
    words = line.split(" ", 2)
    if words[0] == "write" and len(words) == 3:  # `\n` in the text is a line break
        target = Path(words[1])
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(words[2].replace("\\n", "\n") + "\n", encoding="utf-8")
    elif words[0] == "git":  # the agent's own git, in its worktree (e.g. committing what it planted)
        subprocess.run(["git", "-c", "user.name=agent", "-c", "user.email=agent@example.invalid",
                        *line.split(" ")[1:]], check=True, capture_output=True, env={**os.environ, "AGENT_GIT": "1"})
    elif words[0] == "stamp" and len(words) == 2:
        Path(words[1]).write_text(f"round {round_}\n", encoding="utf-8")
    elif words[0] == "latin1" and len(words) == 2:
        Path(words[1]).write_bytes(b"caf\xe9 cr\xe8me\n")
    elif words[0] == "delete" and len(words) == 2:
        Path(words[1]).unlink()


def answered_in_text(body: str, records: Path, task_id: str) -> bool:
    """`no-tool-call`, or `no-tool-call-once` the first time: the model answered without calling any tool."""
    lines = body.splitlines()
    if "no-tool-call" in lines:
        return True
    marker = records / f"{task_id}.answered"
    if "no-tool-call-once" in lines and not marker.exists():
        marker.write_text("answered in text\n")
        return True
    return False


async def review(session: ClientSession, task_id: str, body: str) -> str:
    verdict = next((line.split(" ", 1)[1] for line in body.splitlines() if line.startswith("review ")), "silent")
    if verdict == "approve":
        decided = await session.call_tool("approve_task", {"task_id": task_id})
    elif verdict == "reject":
        decided = await session.call_tool("reject_task", {"task_id": task_id, "reason": "not good enough"})
    else:
        return "ok"
    if decided.is_error:
        fail(f"{verdict} refused: {decided.content}", 3)
    return "ok"


async def work(server: dict[str, Any], task_id: str, round_: str, crashed_before: bool, marker: Path) -> str:
    params = StdioServerParameters(command=server["command"], args=server["args"], env=server.get("env"))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        got = await session.call_tool("get_task", {"task_id": task_id})
        doc = got.structured_content or {}
        body = (doc.get("task") or doc).get("body", "")
        if os.environ.get("TASKKERNEL_PURPOSE") == "review":
            return await review(session, task_id, body)
        for line in body.splitlines():
            if line == "crash-once" and not crashed_before:
                Path("crash.txt").write_text("left by a crashed attempt\n", encoding="utf-8")
                marker.write_text("crashed\n")
                os._exit(1)
            follow(line, round_)
        report = await session.call_tool("report", {"task_id": task_id, "status": "done",
                                                    "body": f"done by the {sys.argv[1]} stand-in"})
        if report.is_error:
            fail(f"report refused: {report.content}", 3)
        submitted = await session.call_tool("submit_task", {"task_id": task_id})
        if submitted.is_error:
            fail(f"submit refused: {submitted.content}", 3)
        for line in body.splitlines():
            if line.startswith("after-report "):
                follow(line[len("after-report "):], round_)
        return "fail-json" if "fail-json" in body.split() else "ok"


TEXT_ANSWER = "I would add the greeting to hello.txt: shall I go ahead?"


def streams(argv: list[str]) -> bool:
    """Claude Code told to print its events as they happen (``--output-format stream-json``)."""
    return value_after(argv, "--output-format") == "stream-json"


def output(cli: str, outcome: str, argv: list[str]) -> None:
    if cli == "claude":
        if streams(argv):  # the events before the result, in Claude Code's shapes (tests/fixtures/run-streams)
            answer = TEXT_ANSWER if outcome == "text" else "DONE"
            for event in ({"type": "system", "subtype": "init", "model": "claude-sonnet-4-5",
                           "mcp_servers": [{"name": "taskkernel", "status": "connected"}]},
                          {"type": "assistant", "message": {"content": [{"type": "text", "text": answer}]}}):
                print(json.dumps(event))
        print(json.dumps({"type": "result", "subtype": "success", "is_error": outcome == "fail-json",
                          "duration_ms": 132, "duration_api_ms": 27, "num_turns": 3,
                          "result": TEXT_ANSWER if outcome == "text" else "DONE",
                          "stop_reason": "end_turn", "session_id": str(uuid.uuid4()), "total_cost_usd": 0.0123,
                          "usage": {**USAGE, "service_tier": "standard"}, "permission_denials": [],
                          "terminal_reason": "completed"}))
    elif cli == "codex":
        for event in ({"type": "thread.started", "thread_id": str(uuid.uuid4())}, {"type": "turn.started"},
                      {"type": "item.completed", "item": {"id": "item_0", "type": "agent_message", "text": "DONE"}},
                      {"type": "turn.completed", "usage": {"input_tokens": 300, "cached_input_tokens": 90,
                                                           "cache_write_input_tokens": 0, "output_tokens": 21,
                                                           "reasoning_output_tokens": 6}},
                      {"type": "turn.started"},
                      {"type": "turn.completed", "usage": {"input_tokens": 200, "cached_input_tokens": 0,
                                                           "output_tokens": 9}}):
            print(json.dumps(event))
    else:
        print(json.dumps({"session_id": str(uuid.uuid4()), "response": "DONE", "stats": {
            "models": {"gemini-2.5-pro": {"api": {"totalRequests": 2, "totalErrors": 0, "totalLatencyMs": 5053},
                                          "tokens": {"prompt": 24939, "candidates": 20, "total": 25113,
                                                     "cached": 21263, "thoughts": 154, "tool": 0}}},
            "tools": {"totalCalls": 1, "totalSuccess": 1, "totalFail": 0, "totalDurationMs": 1881},
            "files": {"totalLinesAdded": 1, "totalLinesRemoved": 0}}}, indent=2))


def resumed_session(cli: str, argv: list[str]) -> str | None:
    """The conversation this start continues, as each CLI is told (Claude Code and Gemini `--resume ID`, Codex
    `exec … resume ID`)."""
    if cli == "codex":
        return argv[argv.index("resume") + 1] if "resume" in argv else None
    return value_after(argv, "--resume")


def main() -> None:
    cli, argv = sys.argv[1], sys.argv[2:]
    records = Path(os.environ.pop("STANDIN_RECORDS"))
    prompt = sys.stdin.read()
    check_flags(cli, argv)
    match = re.search(r"task (TASK-\d{8}-\d{3}) \(round (\d+)\)", prompt)
    if match is None:
        fail("no task id and round in the prompt")
        return
    task_id, round_ = match.group(1), match.group(2)
    server = server_of(cli, argv)
    marker = records / f"{task_id}.crashed"
    crashed_before = marker.exists()
    record = {"cli": cli, "argv": argv, "cwd": os.getcwd(), "env": dict(os.environ), "prompt": prompt,
              "server": server, "started": time.time()}
    name = records / f"{task_id}-{uuid.uuid4().hex[:8]}"
    name.with_suffix(".json").write_text(json.dumps(record))
    if server is None:
        fail("no taskkernel MCP server was configured")
    body = prompt.split("\n## Where this task sits", 1)[0]  # the task's body as the prompt gives it
    if resumed_session(cli, argv) is not None:  # the conversation holds the first prompt: its body still counts
        first = min((json.loads(p.read_text()) for p in records.glob(f"{task_id}-*.json")),
                    key=lambda r: r["started"])
        body = first["prompt"].split("\n## Where this task sits", 1)[0]
    if os.environ.get("TASKKERNEL_PURPOSE") != "review" and answered_in_text(body, records, task_id):
        output(cli, "text", argv)
        name.with_suffix(".end").write_text(str(time.time()))
        return
    outcome = asyncio.run(work(server, task_id, round_, crashed_before, marker))
    output(cli, outcome, argv)
    name.with_suffix(".end").write_text(str(time.time()))


if __name__ == "__main__":
    main()
