"""MCP server benchmark (issue 12): what an agent pays for its kernel calls through `taskkernel mcp`.

    python bench/mcp.py             # 60 claim -> report -> submit cycles, 5 agent runs
    python bench/mcp.py --quick     # 15 cycles, 3 agent runs

In one fresh workspace (durability full), in the same run:

- **throughput**: tool calls per second through one stdio session of the official SDK's client (claim_task,
  report, submit_task on one task after another), against the same commands (claim, submit_report, submit)
  through ``TaskCommandKernel.submit`` in process. The two alternate in chunks so disk noise hits them alike.
  Goal: ``ratio`` (MCP / in process) >= 0.5. Beside it, the SDK's own floor in the same session: a ``ping``
  round trip and a ``whoami`` call (one credential read, no command), in ms: a command through MCP costs at least
  ``sdk_whoami_ms`` + ``in_process_ms_per_call``, which bounds the ratio whatever the server does (``ratio_ceiling``).
- **one agent run**: a host starts `taskkernel mcp` (a fresh process, until ``initialize`` answers) and makes an
  agent run's kernel calls: claim, report, submit. Median over the runs, with and without the start-up.
  Goal: ``agent_run_s`` (the three calls, without the start-up) <= 0.5 s. The start-up is mostly the SDK's
  import; a host session pays it once.

Prints one JSON document.
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

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# This file is named like the SDK: its own folder (which Python puts first on the path) must not shadow it.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(ROOT))

import anyio  # noqa: E402
from mcp import ClientSession, StdioServerParameters  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402

from taskkernel.coordinator.cli.common import CliContext  # noqa: E402
from taskkernel.kernel.model.principal import LOCAL_OWNER, Principal  # noqa: E402

CLI = [sys.executable, "-m", "taskkernel"]
GOALS = {"ratio": 0.5, "agent_run_s": 0.5}
FLOOR_CALLS = 100
CHILD_ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "TASKKERNEL_TOKEN",
                                                              "TASKKERNEL_DB", "TASKKERNEL_WORKSPACE")}


def cli(*args: str, cwd: Path) -> str:
    done = subprocess.run([*CLI, *args], cwd=cwd, capture_output=True, text=True, env=CHILD_ENV)
    if done.returncode != 0:
        raise SystemExit(f"taskkernel {' '.join(args)} failed: {done.stderr.strip()[-500:]}")
    return done.stdout.strip()


class InProcess:
    """The same three commands a driver makes, straight into the kernel the CLI builds (no verbs, no reads)."""

    def __init__(self, context: CliContext, dev: Principal) -> None:
        self.kernel = context.kernel()
        self.dev = dev

    def cycle(self, task_id: str, i: int) -> int:
        steps = (("claim", 1, 0, {}), ("submit_report", 2, 1, {"status": "done", "body": f"done {i}"}),
                 ("submit", 3, 1, {}))
        for kind, revision, round_, payload in steps:
            result = self.kernel.submit({"type": kind, "task_id": task_id, "expected_revision": revision,
                                         "round": round_, "idempotency_key": f"bench-{kind}-{task_id}",
                                         "payload": payload}, self.dev, external=True)
            assert result.status == "accepted", result
        return len(steps)


async def mcp_cycle(session: ClientSession, task_id: str, i: int) -> int:
    calls = (("claim_task", {"task_id": task_id}), ("report", {"task_id": task_id, "status": "done",
                                                               "body": f"done {i}"}),
             ("submit_task", {"task_id": task_id}))
    for name, arguments in calls:
        result = await session.call_tool(name, arguments)
        assert not result.is_error and result.structured_content["status"] == "accepted", result
    return len(calls)


def server(ws: Path, token: str) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=["-m", "taskkernel", "mcp"],
                                 env={**CHILD_ENV, "TASKKERNEL_TOKEN": token, "PYTHONPATH": str(ROOT)}, cwd=str(ws))


async def throughput(ws: Path, token: str, local: InProcess, mcp_tasks: list[str], local_tasks: list[str],
                     chunks: int) -> dict[str, float]:
    spent = {"mcp": 0.0, "in_process": 0.0}
    calls = {"mcp": 0, "in_process": 0}
    size = max(1, len(mcp_tasks) // chunks)
    with open(os.devnull, "w") as quiet:
        async with stdio_client(server(ws, token), errlog=quiet) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            await session.list_tools()
            await mcp_cycle(session, mcp_tasks[0], 0)  # warm: first call paths, the client's validators
            local.cycle(local_tasks[0], 0)
            t0 = time.perf_counter()
            for _ in range(FLOOR_CALLS):
                await session.send_ping()
            t1 = time.perf_counter()
            for _ in range(FLOOR_CALLS):
                await session.call_tool("whoami", {})
            floor = {"ping_ms": (t1 - t0) / FLOOR_CALLS * 1000,
                     "whoami_ms": (time.perf_counter() - t1) / FLOOR_CALLS * 1000}
            for start in range(1, len(mcp_tasks), size):
                t0 = time.perf_counter()
                for i in range(start, min(start + size, len(mcp_tasks))):
                    calls["mcp"] += await mcp_cycle(session, mcp_tasks[i], i)
                t1 = time.perf_counter()
                for i in range(start, min(start + size, len(local_tasks))):
                    calls["in_process"] += local.cycle(local_tasks[i], i)
                t2 = time.perf_counter()
                spent["mcp"] += t1 - t0
                spent["in_process"] += t2 - t1
    return {**{k: calls[k] / spent[k] for k in spent}, **floor}


async def agent_run(ws: Path, token: str, task_id: str) -> tuple[float, float]:
    """(start-up, the three calls) of one agent run through a fresh server process, in seconds."""
    with open(os.devnull, "w") as quiet:
        t0 = time.perf_counter()
        async with stdio_client(server(ws, token), errlog=quiet) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            t1 = time.perf_counter()
            await mcp_cycle(session, task_id, 0)
            t2 = time.perf_counter()
    return t1 - t0, t2 - t1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="15 cycles and 3 agent runs")
    parser.add_argument("--cycles", type=int, default=None, help="claim -> report -> submit cycles per variant")
    args = parser.parse_args()
    cycles = args.cycles or (15 if args.quick else 60)
    runs = 3 if args.quick else 5
    with tempfile.TemporaryDirectory(prefix="bench-mcp-") as tmp:
        ws = Path(tmp) / "ws"
        cli("init", str(ws), cwd=Path(tmp))
        token = cli("token", "issue", "DEV", "--agent", "bench", cwd=ws)
        context = CliContext(workspace_path=str(ws))
        owner = context.kernel()

        def create(n: int, tag: str) -> list[str]:
            out = []
            for i in range(n):
                r = owner.submit({"type": "create_task", "idempotency_key": f"{tag}-{i}", "payload": {
                    "sender": "ADMIN", "recipient": "DEV", "subject": f"{tag} {i}"}}, LOCAL_OWNER)
                out.append(str(r.task_id))
            return out

        mcp_tasks, local_tasks, run_tasks = create(cycles + 1, "mcp"), create(cycles + 1, "local"), create(runs, "run")
        local = InProcess(context, Principal("DEV", "bench"))
        rates = anyio.run(throughput, ws, token, local, mcp_tasks, local_tasks, 6)
        measured = [anyio.run(agent_run, ws, token, task) for task in run_tasks]
        context.database().dispose()
    startup = statistics.median(m[0] for m in measured)
    calls = statistics.median(m[1] for m in measured)
    with_startup = statistics.median(m[0] + m[1] for m in measured)
    report: dict[str, Any] = {
        "cycles": cycles, "calls_per_cycle": 3,
        "in_process_calls_per_s": round(rates["in_process"], 1), "mcp_calls_per_s": round(rates["mcp"], 1),
        "ratio": round(rates["mcp"] / rates["in_process"], 3),
        "in_process_ms_per_call": round(1000 / rates["in_process"], 3),
        "mcp_ms_per_call": round(1000 / rates["mcp"], 3),
        "sdk_ping_ms": round(rates["ping_ms"], 3), "sdk_whoami_ms": round(rates["whoami_ms"], 3),
        "ratio_ceiling": round(1000 / rates["in_process"] / (rates["whoami_ms"] + 1000 / rates["in_process"]), 3),
        "agent_runs": runs, "server_startup_s": round(startup, 3), "agent_run_s": round(calls, 3),
        "agent_run_with_startup_s": round(with_startup, 3), "targets": GOALS}
    report["goals_met"] = {"ratio": report["ratio"] >= GOALS["ratio"],
                           "agent_run_s": report["agent_run_s"] <= GOALS["agent_run_s"]}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
