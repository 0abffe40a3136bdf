"""MCP start-up benchmark (issue 26): how long an agent host waits for `taskkernel mcp` to answer.

    python bench/mcp_startup.py            # 15 starts of each server, median
    python bench/mcp_startup.py --quick    # 5 starts of each

Agent CLIs start their MCP servers without waiting for them (Codex): a server that answers late misses the first
turn, which then runs without its tools. In one fresh workspace (durability full), in the same run, alternating:

- **taskkernel**: `python -m taskkernel mcp` over stdio with an agent's token (``TASKKERNEL_TOKEN``), cwd the
  workspace, as a host starts it;
- **minimal**: a server of one tool on the same SDK (the low-level ``Server`` over the SDK's ``stdio_server``),
  the least any server on this SDK costs.

Each start is timed from the spawn, with ``initialize`` written at once (as hosts write it), to its answer
(``initialize_s``), and to the answer of ``tools/list`` sent after it (``tools_list_s``); then stdin is closed and
the process waited for, so no start runs beside another's work. Goal: ``ratio`` (taskkernel's median
``initialize_s`` over the minimal server's) <= 1.2 (issue 29 goal 4c, in ``targets``); the exit status is 1 when
it is missed. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
GOAL = 1.2  # taskkernel's initialize over the minimal server's
# The tree measured, whatever is installed; bytecode written (an installed package has it compiled)
CHILD_ENV = {**{k: v for k, v in os.environ.items() if k not in (
    "PYTHONDONTWRITEBYTECODE", "TASKKERNEL_TOKEN", "TASKKERNEL_DB", "TASKKERNEL_WORKSPACE")}, "PYTHONPATH": str(ROOT)}
MINIMAL = '''
import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

ECHO = types.Tool(name="echo", input_schema={"type": "object", "properties": {"text": {"type": "string"}}})


async def list_tools(ctx, params):
    return types.ListToolsResult(tools=[ECHO])


async def call_tool(ctx, params):
    return types.CallToolResult(content=[types.TextContent(text=str((params.arguments or {}).get("text", "")))])


async def main():
    server = Server("minimal", on_list_tools=list_tools, on_call_tool=call_tool)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


anyio.run(main)
'''
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}}
LIST = [{"jsonrpc": "2.0", "method": "notifications/initialized"}, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}]


def lines(*messages: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(m).encode() + b"\n" for m in messages)


def start(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """(initialize answered, tools/list answered), in seconds from the spawn."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(lines(INITIALIZE))
        proc.stdin.flush()
        first = proc.stdout.readline()
        t1 = time.perf_counter()
        proc.stdin.write(lines(*LIST))
        proc.stdin.flush()
        second = proc.stdout.readline()
        t2 = time.perf_counter()
        _, err = proc.communicate(timeout=60)  # closes stdin: the session ends
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    answers = [json.loads(line or b"null") for line in (first, second)]
    if proc.returncode != 0 or not all(isinstance(a, dict) and "result" in a for a in answers):
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}): {answers} {err.decode()[-500:]}")
    return t1 - t0, t2 - t0


def cli(*args: str, cwd: Path) -> str:
    done = subprocess.run([sys.executable, "-m", "taskkernel", *args], cwd=cwd, capture_output=True, text=True,
                          env=CHILD_ENV)
    if done.returncode != 0:
        raise SystemExit(f"taskkernel {' '.join(args)} failed: {done.stderr.strip()[-500:]}")
    return done.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="5 starts of each server instead of 15")
    parser.add_argument("--runs", type=int, default=None, help="starts of each server")
    args = parser.parse_args()
    runs = args.runs or (5 if args.quick else 15)
    with tempfile.TemporaryDirectory(prefix="bench-mcp-startup-") as tmp:
        ws = Path(tmp) / "ws"
        cli("init", str(ws), cwd=Path(tmp))
        token = cli("token", "issue", "DEV", "--agent", "bench", cwd=ws)
        minimal = Path(tmp) / "minimal_server.py"
        minimal.write_text(MINIMAL)
        servers = {"taskkernel": ([sys.executable, "-m", "taskkernel", "mcp"],
                                  {**CHILD_ENV, "TASKKERNEL_TOKEN": token}),
                   "minimal": ([sys.executable, str(minimal)], CHILD_ENV)}
        measured: dict[str, list[tuple[float, float]]] = {name: [] for name in servers}
        for i in range(runs + 1):  # the first round warms the page and bytecode caches
            for name in (list(servers) if i % 2 else list(reversed(servers))):
                argv, env = servers[name]
                took = start(argv, ws, env)
                if i:
                    measured[name].append(took)
    median = {name: (statistics.median(m[0] for m in runs_), statistics.median(m[1] for m in runs_))
              for name, runs_ in measured.items()}
    ratio = median["taskkernel"][0] / median["minimal"][0]
    report = {"runs": runs,
              **{f"{name}_initialize_s": round(m[0], 3) for name, m in median.items()},
              **{f"{name}_tools_list_s": round(m[1], 3) for name, m in median.items()},
              "ratio": round(ratio, 3), "tools_list_ratio": round(median["taskkernel"][1] / median["minimal"][1], 3),
              "targets": {"ratio": GOAL},  # issue 29 goal 4c: at most
              "goal_met": ratio <= GOAL}
    print(json.dumps(report, indent=2))
    if ratio > GOAL:
        sys.exit(1)


if __name__ == "__main__":
    main()
