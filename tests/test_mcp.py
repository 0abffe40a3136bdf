"""The MCP server (issue 12) through the official SDK's client: `taskkernel mcp` runs as a real, separate process,
started by the client over stdio with an agent's DEV credential, as an agent host starts it. Every tool is listed
with a JSON Schema for its input and its output; every call's structured content is checked against its tool's
output schema, refusals included. Budgets and filters are also checked in process (fast, no server)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from jsonschema import Draft202012Validator
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError

from taskkernel.coordinator.cli.common import CliContext
from taskkernel.coordinator.mcp import schemas
from taskkernel.coordinator.mcp.tools import CHILDREN_MAX, TOOL_NAMES, TOOLS, TaskTools
from taskkernel.kernel.commands import TaskCommandKernel
from taskkernel.kernel.model.principal import LOCAL_OWNER, Principal
from taskkernel.kernel.store.db import Database
from tests.cli_support import CLI, ROOT, append_config, cli_env, new_workspace, run

EXPECTED_TOOLS = {"whoami", "list_tasks", "get_task", "create_task", "claim_task", "report", "submit_task",
                  "approve_task", "reject_task", "archive_task", "retry_task", "add_progress", "resume", "check_action",
                  "perform", "usage", "read_inputs", "say_to_task", "interrupt_task"}
COMMAND_KEYS = {"status", "reason", "message", "task_id", "revision", "round"}


# -- helpers (tests/test_mcp_http.py uses them too) ----------------------------------------------------------------

def issue(ws: Path, *specs: tuple[str, str]) -> list[str]:
    """Tokens from `taskkernel token issue ROLE --agent NAME`, run by the workspace owner (concurrently)."""
    def one(spec: tuple[str, str]) -> str:
        done = run("token", "issue", spec[0], "--agent", spec[1], cwd=ws)
        assert done.code == 0, done.err
        return done.out.strip()

    with ThreadPoolExecutor(len(specs)) as pool:
        return list(pool.map(one, specs))


class Owner:
    """The workspace owner acting in process (the kernel exactly as the CLI builds it): creates the tasks the
    agents work on."""

    def __init__(self, ws: Path) -> None:
        self.context = CliContext(workspace_path=str(ws))
        self.kernel: TaskCommandKernel = self.context.kernel()
        self.n = 0

    def create(self, recipient: str = "DEV", **payload: Any) -> str:
        self.n += 1
        result = self.kernel.submit({"type": "create_task", "idempotency_key": f"owner-{uuid.uuid4()}", "payload": {
            "sender": "ADMIN", "recipient": recipient, "subject": f"task {self.n}", **payload}}, LOCAL_OWNER)
        assert result.status == "accepted", result
        return str(result.task_id)

    def close(self) -> None:
        self.context.database().dispose()


class Client:
    """A ClientSession that checks every result: its structured content against the tool's output schema (a
    refusal too), and its one text block: the same document as compact JSON (what a host that forwards only
    text shows the model)."""

    def __init__(self, session: ClientSession) -> None:
        self.session = session
        self.validators: dict[str, Draft202012Validator] = {}

    async def list_tools(self) -> list[Any]:
        tools = (await self.session.list_tools()).tools
        self.validators = {t.name: Draft202012Validator(t.output_schema) for t in tools}
        return tools

    async def call(self, name: str, **arguments: Any) -> Any:
        if not self.validators:
            await self.list_tools()
        result = await self.session.call_tool(name, arguments)
        doc = result.structured_content
        assert isinstance(doc, dict), result
        errors = [e.message for e in self.validators[name].iter_errors(doc)]
        assert not errors, (name, errors, doc)
        assert [c.type for c in result.content] == ["text"], result.content
        text = result.content[0].text
        assert json.loads(text) == doc and "\n" not in text, text  # compact: one line
        assert result.is_error == (doc["status"] == "rejected"), (name, result.is_error, doc)
        return doc

    async def ok(self, name: str, **arguments: Any) -> Any:
        doc = await self.call(name, **arguments)
        assert doc["status"] != "rejected", (name, doc)
        return doc

    async def refused(self, name: str, reason: str, **arguments: Any) -> Any:
        doc = await self.call(name, **arguments)
        assert (doc["status"], doc["reason"]) == ("rejected", reason), (name, doc)
        return doc


@asynccontextmanager
async def stdio_session(ws: Path, token: str | None) -> AsyncIterator[Client]:
    """`taskkernel mcp` started by the SDK's stdio client, as a host starts it (cwd: the workspace)."""
    env = cli_env(**({"TASKKERNEL_TOKEN": token} if token is not None else {}))
    params = StdioServerParameters(command=sys.executable, args=["-m", "taskkernel", "mcp"], env=env, cwd=str(ws))
    with tempfile.TemporaryFile("w+") as errlog:
        try:
            async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                yield Client(session)
        finally:
            errlog.seek(0)
            logged = errlog.read()
            assert "Traceback" not in logged, logged


def check_schemas(tools: list[Any]) -> None:
    """Every tool: an object input schema and an output schema, both valid JSON Schema (2020-12)."""
    assert {t.name for t in tools} == EXPECTED_TOOLS
    for tool in tools:
        assert re.fullmatch(r"[a-z]+(_[a-z]+)*", tool.name), tool.name
        assert tool.description and tool.input_schema["type"] == "object", tool.name
        assert tool.output_schema is not None and tool.output_schema["type"] == "object", tool.name
        Draft202012Validator.check_schema(tool.input_schema)
        Draft202012Validator.check_schema(tool.output_schema)
        assert "$ref" not in json.dumps(tool.input_schema) + json.dumps(tool.output_schema), tool.name


@pytest.fixture(scope="module")
def team(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    ws = new_workspace(tmp_path_factory.mktemp("mcp"))
    tokens = dict(zip(("dev1", "dev2", "dev3", "qa"), issue(ws, ("DEV", "dev-1"), ("DEV", "dev-2"),
                                                                ("DEV", "dev-3"), ("QA", "qa-1")), strict=True))
    yield ws, tokens


@pytest.fixture
def owner(team: tuple[Path, dict[str, str]]) -> Iterator[Owner]:
    made = Owner(team[0])
    yield made
    made.close()


# -- stdio --------------------------------------------------------------------------------------------------------

def test_no_token_means_the_server_refuses_to_start(team: tuple[Path, dict[str, str]]) -> None:
    """Nothing on stdin: the session ends at once, and the kernel is opened then, so the refusal is on stderr
    (stdout is the protocol channel) with its exit status."""
    ws, _ = team
    refused = run("mcp", cwd=ws, stdin="")
    envelope, line = refused.err.strip().splitlines()
    assert refused.code == 2 and refused.out == "" and json.loads(envelope)["reason"] == "actor_unverified", refused
    assert "TASKKERNEL_TOKEN" in line and "Traceback" not in refused.err
    for token in ("", "tk_" + "x" * 40):  # blank, and a token that is not live
        dead = run("--token", token, "mcp", cwd=ws, stdin="")
        assert (dead.code, dead.out) == (2, "") and json.loads(dead.err.splitlines()[0])["reason"] == \
            "actor_unverified", dead
    for bad in (("--transport", "tcp"), ("--port", "70000"), ("--port", "x")):
        usage = run("mcp", *bad, cwd=ws)
        assert usage.code == 64 and "Traceback" not in usage.err, (bad, usage.err)


def raw_session(ws: Path, *args: str, token: str | None) -> tuple[dict[int, Any], int, str]:
    """`taskkernel ARGS mcp` driven a line at a time: initialize, tools/list, a whoami call and resources/list;
    the answers by id, then stdin closed: the exit status and stderr."""
    messages = [{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "whoami", "arguments": {}}},
        {"jsonrpc": "2.0", "id": 4, "method": "resources/list"}]
    env = cli_env(**({"TASKKERNEL_TOKEN": token} if token is not None else {}))
    proc = subprocess.Popen([*CLI, *args, "mcp"], cwd=ws, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(b"".join(json.dumps(m).encode() + b"\n" for m in messages))
        proc.stdin.flush()
        answers: dict[int, Any] = {}
        while len(answers) < 4:
            line = proc.stdout.readline()
            assert line, "the server closed stdout"
            answer = json.loads(line)
            answers[answer["id"]] = answer
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return answers, proc.returncode, err.decode()


@pytest.mark.parametrize("case", ["dead token", "no token", "no database"])
def test_the_server_answers_at_once_and_each_call_says_why_the_kernel_cannot_be_opened(
        team: tuple[Path, dict[str, str]], tmp_path: Path, case: str) -> None:
    """initialize and tools/list are answered before the kernel is opened; what keeps it from opening (a token
    that is not live, none where the workspace requires one, a database that cannot be opened) is every call's
    answer: a tool call's refusal with its reason code, a resource read's error with it in data.reason; on stderr
    the CLI's envelope, and when stdin ends the exit status of that refusal or fault."""
    ws, tokens = team
    args, token, reason, status = {
        "dead token": ((), "tk_" + "x" * 40, "actor_unverified", 2),
        "no token": ((), None, "actor_unverified", 2),
        "no database": (("--db", f"sqlite:///{tmp_path}/missing/dir/kernel.db"), tokens["qa"],
                        "database_unreachable", 1)}[case]
    answers, code, err = raw_session(ws, *args, token=token)
    assert answers[1]["result"]["serverInfo"]["name"] == "taskkernel", answers
    assert "whoami" in {t["name"] for t in answers[2]["result"]["tools"]}
    call = answers[3]["result"]
    assert call["isError"] and call["structuredContent"]["reason"] == reason, call
    assert json.loads(call["content"][0]["text"]) == call["structuredContent"]
    assert answers[4]["error"]["data"]["reason"] == reason, answers[4]
    assert code == status and json.loads(err.splitlines()[0])["status"] in ("rejected", "error"), (code, err)
    assert "Traceback" not in err and (case != "no token" or "TASKKERNEL_TOKEN" in call["structuredContent"][
        "message"]), err


async def test_tools_schemas_and_one_agent_run(team: tuple[Path, dict[str, str]], owner: Owner) -> None:
    ws, tokens = team
    tid = owner.create(body="fix the parser", risk_level="low")
    other = owner.create(recipient="QA")
    from taskkernel.kernel.sessionlog import SessionLog

    SessionLog(owner.context.database()).accept("TOOL:vault", {"input_id": "v1", "kind": "message", "payload": {
        "entity": "file:src/a.py", "text": "vault-secret"}}, writer=Principal("TOOL", "vault"))
    async with stdio_session(ws, tokens["dev1"]) as dev:
        tools = await dev.list_tools()
        check_schemas(tools)
        docs = (ROOT / "docs" / "mcp.md").read_text()
        assert not [t.name for t in tools if f"`{t.name}`" not in docs], "docs/mcp.md names every tool"

        me = await dev.ok("whoami")
        assert (me["principal"]["id"], me["session"], me["transport"]) == ("DEV:dev-1", "DEV:dev-1", "stdio")
        mine = await dev.ok("list_tasks", assigned_to_me=True)
        assert tid in [t["task_id"] for t in mine["tasks"]] and other not in [t["task_id"] for t in mine["tasks"]]

        claimed = await dev.ok("claim_task", task_id=tid)
        assert set(claimed) >= COMMAND_KEYS and (claimed["status"], claimed["revision"], claimed["round"]) == (
            "accepted", 2, 1)
        report = {"task_id": tid, "status": "done", "body": "parser fixed", "artifacts": ["dist/fix.patch"]}
        first = await dev.ok("report", **report)
        again = await dev.ok("report", **report)  # a retry after a lost reply
        assert (first["status"], again["status"], again["revision"]) == ("accepted", "replayed", first["revision"])
        assert again["idempotency_key"] == first["idempotency_key"]
        stale = await dev.refused("submit_task", "stale_task_revision", task_id=tid, expect_rev=1)
        assert (stale["task_id"], stale["revision"], stale["round"]) == (tid, 3, 1)
        submitted = await dev.ok("submit_task", task_id=tid, expect_rev=3, round=1)
        assert submitted["message"].startswith("submit accepted") and submitted["revision"] == 4

        await dev.refused("approve_task", "role_not_authorized", task_id=tid)  # the owner decides, not the driver
        await dev.refused("claim_task", "role_not_authorized", task_id=other)  # QA's task
        await dev.refused("claim_task", "task_not_found", task_id="TASK-20200101-999")
        with pytest.raises(MCPError):  # a malformed call is a protocol error, not a refusal
            await dev.session.call_tool("claim_task", {"task_id": 7})
        with pytest.raises(MCPError):
            await dev.session.call_tool("claim_task", {"task_id": tid, "as_role": "PM"})
        with pytest.raises(MCPError):
            await dev.session.call_tool("no_such_tool", {})

        shown = await dev.ok("get_task", task_id=tid)
        assert (shown["task"]["state"], shown["task"]["body"]) == ("review", "fix the parser")
        assert [(r["status"], r["body"], r["artifacts"]) for r in shown["reports"]] == [
            ("done", "parser fixed", ["dist/fix.patch"])]
        assert [h["type"] for h in shown["history"]] == ["task_created", "task_claimed", "report_submitted",
                                                        "task_submitted"]
        review = await dev.ok("list_tasks", waiting_for_my_review=True)
        assert review["tasks"] == []  # in review, but the owner decides it

        saved = await dev.ok("add_progress", text="parser fixed, tests next", completed_tool_calls=4)
        assert (saved["status"], saved["session"]) == ("accepted", "DEV:dev-1")
        assert (await dev.ok("add_progress", text="parser fixed, tests next", completed_tool_calls=4))["status"] \
            == "replayed"
        resumed = await dev.ok("resume")
        assert (resumed["status"], resumed["anchor"]["text"], resumed["instructions"]) == (
            "resume", "parser fixed, tests next", [])
        await dev.refused("resume", "role_not_authorized", session="admin")  # the owner's grant session
        vault = {"task_id": tid, "operation": "write", "entity": "file:src/a.py", "tool": "write_file",
                 "session": "TOOL:vault"}  # another principal's session: check_action reads it under resume's rule
        await dev.refused("resume", "role_not_authorized", session="TOOL:vault")
        oracle = await dev.refused("check_action", "role_not_authorized", **vault)
        assert "vault-secret" not in json.dumps(oracle) and "TOOL:vault" in oracle["message"]

        verdict = await dev.ok("check_action", task_id=tid, operation="write", entity="file:src/a.py",
                               tool="write_file")
        assert (verdict["allowed"], verdict["verdict"]["status"]) == (False, "INSUFFICIENT_EVIDENCE")
        await dev.refused("perform", "illegal_transition", task_id=tid, operation="write", entity="file:src/a.py",
                          tool="write_file")
        assert (await dev.ok("usage", by="role"))["by"] == "role"
        assert (await dev.ok("usage", since="2999-01-01"))["rows"] == []
        await dev.refused("usage", "invalid_arguments", since="yesterday")

        task_file = (await dev.session.read_resource(f"task://{tid}")).contents[0]
        assert task_file.mime_type == "text/markdown" and "transitions:" in task_file.text
        assert "fix the parser" in task_file.text and task_file.text.count("tool: ") == 3  # create, claim, submit
        queue = (await dev.session.read_resource("todo://DEV")).contents[0].text
        assert queue.startswith("# DEV: what is waiting for you") and tid not in queue  # in review: not to do
        assert {t.uri_template for t in (await dev.session.list_resource_templates()).resource_templates} == {
            "task://{task_id}", "todo://{role}"}
        with pytest.raises(MCPError):
            await dev.session.read_resource("task://TASK-20200101-999")


async def test_racing_claims_one_wins_and_a_revoked_token_stops_mid_session(team: tuple[Path, dict[str, str]],
                                                                           owner: Owner) -> None:
    ws, tokens = team
    tid = owner.create()
    async with stdio_session(ws, tokens["dev2"]) as a, stdio_session(ws, tokens["dev3"]) as b:
        await a.list_tools()
        await b.list_tools()
        results = []

        async def claim(client: Client) -> None:
            results.append(await client.call("claim_task", task_id=tid))

        async with anyio.create_task_group() as group:
            group.start_soon(claim, a)
            group.start_soon(claim, b)
        assert sorted(r["status"] for r in results) == ["accepted", "rejected"], results
        loser = next(r for r in results if r["status"] == "rejected")
        assert loser["reason"] in ("stale_task_revision", "illegal_transition") and loser["revision"] == 2, loser

        assert (await b.ok("whoami"))["principal"]["agent"] == "dev-3"
        revoked = run("token", "revoke", tokens["dev3"], cwd=ws)
        assert revoked.code == 0, revoked.err
        gone = await b.refused("whoami", "actor_unverified")
        assert "revoked" in gone["message"]
        await b.refused("claim_task", "actor_unverified", task_id=owner.create())
        with pytest.raises(MCPError):  # resources ask for a live credential too
            await b.session.read_resource("todo://DEV")
        assert (await a.ok("whoami"))["principal"]["agent"] == "dev-2"  # the other credential still acts


async def test_a_run_token_acts_on_its_task_only_and_checkpoints_into_the_run_session(
        team: tuple[Path, dict[str, str]], owner: Owner) -> None:
    """A token as the dispatcher mints it for a run (task and round scoped): it claims, reports and submits its
    task, is refused on another, reads tasks, and its checkpoints go to the run's session by default."""
    from taskkernel.kernel.credentials import issue_token

    ws, _ = team
    mine, other = owner.create(), owner.create()
    claimed = owner.kernel.submit({"type": "claim", "task_id": mine, "expected_revision": 1, "round": 0,
                                   "idempotency_key": f"dispatch-{mine}"}, Principal("DEV", "runner-9"))
    assert claimed.status == "accepted", claimed  # as the dispatcher claims for the run it starts
    token = issue_token(owner.context.database(), "DEV", "runner-9", task_id=mine, round=claimed.round)
    async with stdio_session(ws, token) as run_agent:
        who = await run_agent.ok("whoami")
        assert (who["principal"]["task_id"], who["session"]) == (mine, f"RUN:DEV:runner-9@{mine}")
        refused = await run_agent.refused("claim_task", "role_not_authorized", task_id=other)
        assert f"scoped to {mine}" in refused["message"] and refused["revision"] == 1
        await run_agent.refused("create_task", "role_not_authorized", recipient="DEV", subject="escape")
        assert (await run_agent.ok("get_task", task_id=other))["task"]["task_id"] == other
        progress = await run_agent.ok("add_progress", text="half way")
        assert progress["session"] == f"RUN:DEV:runner-9@{mine}"
        await run_agent.ok("report", task_id=mine, status="done", body="done by the run")
        assert (await run_agent.ok("submit_task", task_id=mine))["revision"] == claimed.revision + 2
        await run_agent.refused("add_progress", "role_not_authorized", text="into DEV's own", session="DEV:dev-1")
    assert owner.kernel.task(other)["state"] == "inbox"  # type: ignore[index]


async def test_without_require_token_the_local_owner_acts(tmp_path: Path) -> None:
    ws = new_workspace(tmp_path)
    text = (ws / "taskkernel.toml").read_text().replace("require_token = true", "require_token = false")
    (ws / "taskkernel.toml").write_text(text)
    append_config(ws, "\n[mcp]\noutput_budget = 2048\n")
    async with stdio_session(ws, None) as me:
        who = await me.ok("whoami")
        assert (who["principal"]["id"], who["principal"]["admin"], who["output_budget"]) == (
            "ADMIN:local-owner", True, 2048)
        made = await me.ok("create_task", recipient="DEV", subject="from the owner")
        assert (await me.ok("create_task", recipient="DEV", subject="from the owner"))["status"] == "replayed"
        assert (await me.ok("get_task", task_id=made["task_id"]))["task"]["sender"] == "ADMIN"


# -- in process: budgets, cursors and filters ---------------------------------------------------------------------

@pytest.fixture
def tools(sqlite_db: Database) -> TaskTools:
    from taskkernel.coordinator.compose import build_kernel

    return TaskTools(sqlite_db, build_kernel(sqlite_db, None), None, budget=2048)


def call(tools: TaskTools, name: str, who: Principal, **arguments: Any) -> dict[str, Any]:
    tool = next(t for t in TOOLS if t.name == name)
    outcome = tools.run(name, lambda: who, tool.args.model_validate(arguments))
    Draft202012Validator(schemas.output_schema(tool.result)).validate(outcome.structured)
    assert outcome.error == (outcome.structured["status"] == "rejected")
    return outcome.structured


DEV, PM = Principal("DEV", "dev-1"), Principal("PM", "pm-1")


def wire_size(doc: Any) -> int:
    """Bytes of the document as the transport writes it: compact UTF-8 JSON."""
    return len(json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode())


def test_a_long_list_is_cut_to_the_budget_and_its_cursor_continues_exactly(tools: TaskTools) -> None:
    made = [call(tools, "create_task", LOCAL_OWNER, recipient="DEV", subject=f"task {i} " + "x" * 200)["task_id"]
            for i in range(25)]
    seen: list[str] = []
    page = call(tools, "list_tasks", DEV, limit=1000)
    while True:
        assert wire_size(page) <= tools.budget
        seen += [t["task_id"] for t in page["tasks"]]
        if page["next_cursor"] is None:
            break
        assert page["truncated"] and page["count"] == len(page["tasks"]) >= 1
        page = call(tools, "list_tasks", DEV, limit=1000, cursor=page["next_cursor"])
    assert seen == made  # every task once, in id order
    wrong = call(tools, "list_tasks", DEV, state="done", cursor=call(tools, "list_tasks", DEV, limit=1)["next_cursor"])
    assert wrong["reason"] == "invalid_cursor"


def test_a_long_body_is_cut_with_the_get_task_call_that_reads_on(tools: TaskTools) -> None:
    body = "".join(f"line {i}: ünïcödé\n" for i in range(3000))
    tid = call(tools, "create_task", LOCAL_OWNER, recipient="DEV", subject="long", body=body)["task_id"]
    call(tools, "claim_task", DEV, task_id=tid)
    call(tools, "report", DEV, task_id=tid, status="done", body=body[::-1])
    for report_id, expected in ((None, body.strip()), ("report", body[::-1].strip())):  # stored stripped
        read, arguments = "", {"task_id": tid}
        if report_id:
            rid = call(tools, "get_task", DEV, task_id=tid)["reports"][0]["report_id"]
            arguments["report_id"] = rid
        while True:
            doc = call(tools, "get_task", DEV, **arguments)
            assert wire_size(doc) <= tools.budget and doc["truncated"]
            text = doc["reports"][0] if report_id else doc
            read += text["body"] if report_id else doc["task"]["body"]
            if text["body_next"] is None:
                break
            assert text["body_next"]["tool"] == "get_task"
            arguments = text["body_next"]["arguments"]
        assert read == expected


def test_every_result_stays_within_the_budget_whatever_the_task_holds(tools: TaskTools) -> None:
    """A task at every limit the kernel accepts (references, reports with artifacts, long reject reasons, an
    escaped subject): get_task and check_action fit the default budget and a 1 KiB one, and the task's reports are
    sent once (`reports`, not again inside `task`)."""
    refs = [f"docs/{i}-" + "\u00e9" * 90 for i in range(32)]
    tid = call(tools, "create_task", LOCAL_OWNER, recipient="DEV", subject="\u0001" * 500, body="b" * 5000,
               references=refs)["task_id"]
    for round_ in range(3):
        if round_ == 0:
            call(tools, "claim_task", DEV, task_id=tid)
        for i in range(8):
            artifacts = [f"out/{round_}/{i}/{n}-" + "a" * 180 for n in range(32)]
            assert call(tools, "report", DEV, task_id=tid, status="done" if i == 7 else "in_progress",
                        body=f"report {round_}.{i} " + "r" * 3000, artifacts=artifacts)["status"] == "accepted"
        call(tools, "submit_task", DEV, task_id=tid)
        assert call(tools, "reject_task", LOCAL_OWNER, task_id=tid, reason="why " * 2000)["status"] == "accepted"
    whole = TaskTools(tools.db, tools.kernel, None, budget=16 * 2**20)
    full = call(whole, "get_task", DEV, task_id=tid, history_limit=1000)
    assert "reports" not in full["task"] and len(full["reports"]) == full["reports_total"] == 24
    assert all(len(h.get("reason", "")) <= 301 for h in full["history"]) and any(h.get("reason_truncated")
                                                                                for h in full["history"])
    plan = {"task_id": tid, "operation": "write", "entity": "file:" + "\u0002" * 490, "tool": "write_file",
            "args": {"content": "c" * 50_000}, "based_on_event": ["m" * 200] * 32,
            "permission_event": "p" * 200}
    for budget in (1024, 2048, 16384):
        small = TaskTools(tools.db, tools.kernel, None, budget=budget)
        for arguments in ({}, {"history_limit": 1000}, {"report_id": full["reports"][5]["report_id"]}):
            doc = call(small, "get_task", DEV, task_id=tid, **arguments)
            assert wire_size(doc) <= budget and doc["truncated"], (budget, arguments, wire_size(doc))
            assert "reports" not in doc["task"] and doc["task"]["task_id"] == tid
            cut = doc["reports"][0] if "report_id" in arguments else doc
            assert cut["body_next"] or budget == 16384, (budget, arguments)
            assert doc["reports"] or budget < 16384
        checked = call(small, "check_action", DEV, **plan)
        assert wire_size(checked) <= budget and checked["verdict"]["status"] != "PASS", (budget, wire_size(checked))
    with pytest.raises(ValueError):  # at most 32 input ids
        call(tools, "check_action", DEV, **{**plan, "based_on_event": ["m"] * 33})


def test_resume_pages_always_move_on_even_when_one_instruction_does_not_fit(tools: TaskTools) -> None:
    """At a 1 KiB budget an instruction of emoji and control characters (4 and 6 bytes each as written) is cut
    in bytes to fit: each page gives at least one instruction and a cursor that moves on (no client loops)."""
    from taskkernel.kernel.sessionlog import SessionLog

    small = TaskTools(tools.db, tools.kernel, None, budget=1024)
    assert call(small, "add_progress", DEV, text="checkpoint")["status"] == "accepted"
    texts = ["\U0001f600" * 3000, "\u0007\u0000" * 2000, "short one", "\U0001f680" * 300]
    log = SessionLog(tools.db)
    for i, text in enumerate(texts):
        log.accept("DEV:dev-1", {"input_id": f"m{i}", "kind": "message", "payload": {"text": text}},
                   writer=DEV)
    got: list[dict[str, Any]] = []
    page, cursors = call(small, "resume", DEV), set()
    while True:
        assert wire_size(page) <= 1024 and page["instructions"], page
        got += page["instructions"]
        if page["next_cursor"] is None:
            break
        assert page["next_cursor"] not in cursors
        cursors.add(page["next_cursor"])
        page = call(small, "resume", DEV, cursor=page["next_cursor"])
    assert [g["input_id"] for g in got] == ["m0", "m1", "m2", "m3"]
    assert [g["text_truncated"] for g in got][:2] == [True, True] and got[2]["text"] == "short one"
    assert all(t.startswith(g["text"]) for g, t in zip(got, texts, strict=True))


def test_list_filters_assigned_to_me_waiting_for_my_review_root_and_parent(tools: TaskTools) -> None:
    root = call(tools, "create_task", LOCAL_OWNER, recipient="DEV", subject="root", done_authority="PM")["task_id"]
    led = call(tools, "create_task", LOCAL_OWNER, recipient="PM", subject="driven by DEV", driver="DEV")["task_id"]
    child = call(tools, "create_task", LOCAL_OWNER, recipient="QA", subject="child", parent=root)["task_id"]
    call(tools, "claim_task", DEV, task_id=root)
    call(tools, "report", DEV, task_id=root, status="done", body="ok")
    call(tools, "submit_task", DEV, task_id=root)

    def ids(who: Principal, **filters: Any) -> list[str]:
        return [t["task_id"] for t in call(tools, "list_tasks", who, **filters)["tasks"]]

    assert ids(DEV, assigned_to_me=True) == [root, led]
    assert ids(DEV, assigned_to_me=True, state="inbox") == [led]
    assert ids(PM, waiting_for_my_review=True) == [root] and ids(DEV, waiting_for_my_review=True) == []
    assert ids(DEV, root=root) == [root, child] and ids(DEV, parent=root) == [child]
    assert call(tools, "list_tasks", PM, waiting_for_my_review=True, state="done")["reason"] == "invalid_arguments"
    assert call(tools, "approve_task", PM, task_id=root)["status"] == "accepted"
    assert ids(PM, waiting_for_my_review=True) == []
    assert set(TOOL_NAMES) == EXPECTED_TOOLS


def test_the_tool_table_in_docs_lists_each_tools_arguments() -> None:
    """docs/mcp.md's table names, for each tool, exactly the arguments its input schema has (so it cannot drift
    from what the server lists: the same models)."""
    rows = {}
    for line in (ROOT / "docs" / "mcp.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and re.fullmatch(r"`[a-z_]+`", cells[0]) and cells[0].strip("`") in EXPECTED_TOOLS:
            rows[cells[0].strip("`")] = set(re.findall(r"`([a-z_]+)`", re.sub(r"\([^)]*\)", "", cells[1])))
    assert set(rows) == EXPECTED_TOOLS
    for tool in TOOLS:
        assert rows[tool.name] == set(schemas.input_schema(tool.args)["properties"]), tool.name


def test_check_action_judges_exactly_as_perform_does(tools: TaskTools) -> None:
    """check_action builds the trace as perform's gate guard does: its verdict is what perform meets, and it
    records nothing (no gate_decision, no effect)."""
    from taskkernel.kernel.sessionlog import SessionLog

    tid = call(tools, "create_task", LOCAL_OWNER, recipient="DEV", subject="raise the timeout",
               risk_level="medium")["task_id"]
    call(tools, "claim_task", DEV, task_id=tid)
    log = SessionLog(tools.db)
    for input_id, kind, by, payload in (
            ("m1", "message", "ADMIN:alice", {"entity": "file:staging/config.json", "text": "raise it to 30s"}),
            ("o1", "observation", "TOOL:probe", {"tool": "get_env", "status": "ok", "entity": "env:current",
                                                 "key": "name", "value": "staging"}),
            ("g1", "allow", "ADMIN:alice", {"permission": "write", "scope": "file:staging/*", "principal": "DEV"})):
        log.accept("admin", {"input_id": input_id, "kind": kind, "payload": payload}, accepted_by=by)
    plan = {"task_id": tid, "operation": "write", "entity": "file:staging/config.json", "tool": "write_file",
            "args": {"path": "staging/config.json", "content": "{}\n"}, "based_on_event": "m1",
            "permission_event": "g1", "requires_state": {"entity": "env:current", "key": "name", "equals": "staging"}}
    events_before = tools.kernel.history(tid)
    checked = call(tools, "check_action", DEV, **plan)
    assert (checked["allowed"], checked["verdict"]["status"], checked["session"]) == (True, "PASS", "admin")
    assert tools.kernel.history(tid) == events_before  # nothing recorded
    blocked = call(tools, "check_action", DEV, **{**plan, "entity": "file:prod/config.json"})
    assert blocked["verdict"]["status"] == "BLOCK" and not blocked["allowed"]
    assert call(tools, "perform", DEV, **{**plan, "entity": "file:prod/config.json"})["reason"] == "gate_blocked"
    assert call(tools, "perform", DEV, **plan)["status"] == "accepted"
    log.accept("admin", {"input_id": "o2", "kind": "observation", "payload": {
        "tool": "get_env", "status": "ok", "entity": "env:current", "key": "name", "value": "production"}},
        accepted_by="TOOL:probe")  # the world moved on: the same plan no longer holds
    later = call(tools, "check_action", DEV, **plan)
    assert "STATE_DISALLOWS" in [r["code"] for r in later["verdict"]["reasons"]] and not later["allowed"]
    again = call(tools, "perform", DEV, **plan, idempotency_key="second")
    assert again["reason"] == "gate_blocked" and "STATE_DISALLOWS" in again["message"]


def test_task_resource_is_the_task_file_rendered_as_the_projection_writes_it(tmp_path: Path) -> None:
    """task://ID renders a task the folder adapter has not written yet byte for byte as `up` then writes it,
    and reads the file itself once it exists."""
    from taskkernel.coordinator.mcp.resources import task_markdown, todo_markdown

    ws = new_workspace(tmp_path)
    owner = Owner(ws)
    try:
        tid = owner.create(body="line one\nline two: with a colon", references=["docs/x.md"], priority="P1")
        claimed = owner.kernel.submit({"type": "claim", "task_id": tid, "expected_revision": 1, "round": 0,
                                       "idempotency_key": "claim-it", "payload": {}}, Principal("DEV", "dev-1"))
        assert claimed.status == "accepted"
        db, workspace = owner.context.database(), owner.context.optional_workspace()
        rendered = task_markdown(db, workspace, tid)
        assert run("up", "--once", cwd=ws).code == 0
        [written] = list((ws / "fcop" / "_lifecycle" / "active").glob(f"{tid}-*.md"))
        assert rendered == written.read_text(encoding="utf-8")
        written.write_text(written.read_text(encoding="utf-8") + "\nan agent's note\n", encoding="utf-8")
        assert task_markdown(db, workspace, tid) == written.read_text(encoding="utf-8")  # the file, as it is
        assert task_markdown(db, workspace, "TASK-20200101-001") is None
        queue = todo_markdown(db, "DEV")
        assert f"- [active] {tid} (round 1, P1): task 1" in queue and queue.endswith("## To review\n\n- nothing\n")
    finally:
        owner.close()


def test_get_task_counts_every_child_past_the_first_page(tools: TaskTools) -> None:
    """More children than get_task shows: children_total is the real count (not shown + 1), and children_next
    lists the rest exactly."""
    root = call(tools, "create_task", LOCAL_OWNER, recipient="DEV", subject="root")["task_id"]
    kids = [call(tools, "create_task", LOCAL_OWNER, recipient="DEV", subject=f"c{i}", parent=root)["task_id"]
            for i in range(CHILDREN_MAX + 3)]
    whole = TaskTools(tools.db, tools.kernel, None, budget=16 * 2**20)
    doc = call(whole, "get_task", DEV, task_id=root)
    assert doc["children_total"] == CHILDREN_MAX + 3 and len(doc["children"]) == CHILDREN_MAX
    rest = call(whole, "list_tasks", DEV, **doc["children_next"]["arguments"])
    assert [c["task_id"] for c in doc["children"] + rest["tasks"]] == kids


def test_a_retried_checkpoint_replays_but_the_same_text_later_is_a_new_one(tools: TaskTools) -> None:
    first = call(tools, "add_progress", DEV, text="tests pass")
    again = call(tools, "add_progress", DEV, text="tests pass")  # a retry after a lost answer
    assert (first["status"], again["status"]) == ("accepted", "replayed")
    assert again["input_id"] == first["input_id"] and again["accept_seq"] == first["accept_seq"]
    call(tools, "add_progress", DEV, text="refactored the parser")
    later = call(tools, "add_progress", DEV, text="tests pass")  # a new checkpoint with the same words
    assert later["status"] == "accepted" and later["accept_seq"] == first["accept_seq"] + 2
    assert call(tools, "resume", DEV)["anchor"]["input_id"] == later["input_id"]
