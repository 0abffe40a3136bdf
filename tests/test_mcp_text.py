"""What a host that forwards only a tool result's text shows its model (issue 26): the text content is the
structured document itself, as compact JSON, for every tool the server lists, refusals included, and within the
output budget; cut for the budget, both are cut alike and say so. Gemini CLI hands the model only the text: a
reviewer there must see the report's body.

The server is the real `taskkernel mcp`, started over stdio by the official SDK's client, as a host starts it."""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import mcp_types
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from taskkernel.coordinator.mcp.results import Outcome, fit, refusal, size
from tests.cli_support import append_config, cli_env, new_workspace
from tests.test_mcp import issue

REPORT_BODY = "REPORT-BODY: the parser now accepts trailing commas; tests in tests/test_parser.py pass."
TASK_BODY = "TASK-BODY: make the parser accept trailing commas."


class TextClient:
    """Every call's result checked: one text block, which parses as exactly the structured content and fits the
    output budget (bytes of compact UTF-8 JSON)."""

    def __init__(self, session: ClientSession, budget: int) -> None:
        self.session = session
        self.budget = budget
        self.called: set[str] = set()
        self.texts: dict[str, list[str]] = {}

    async def call(self, name: str, **arguments: Any) -> dict[str, Any]:
        result = await self.session.call_tool(name, arguments)
        self.called.add(name)
        assert [c.type for c in result.content] == ["text"], result.content
        assert isinstance(result.content[0], mcp_types.TextContent)
        text = result.content[0].text
        doc = result.structured_content
        assert isinstance(doc, dict) and json.loads(text) == doc, (name, text, doc)
        assert len(text.encode()) == size(doc) <= self.budget, (name, len(text.encode()), self.budget)
        assert result.is_error == (doc["status"] == "rejected"), (name, doc)
        self.texts.setdefault(name, []).append(text)
        return doc


@asynccontextmanager
async def session(ws: Path, token: str | None, budget: int = 16384) -> AsyncIterator[TextClient]:
    env = cli_env(**({"TASKKERNEL_TOKEN": token} if token is not None else {}))
    params = StdioServerParameters(command=sys.executable, args=["-m", "taskkernel", "mcp"], env=env, cwd=str(ws))
    with tempfile.TemporaryFile("w+") as errlog:
        try:
            async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as client:
                await client.initialize()
                yield TextClient(client, budget)
        finally:
            errlog.seek(0)
            logged = errlog.read()
            assert "Traceback" not in logged, logged


def open_workspace(tmp_path: Path, budget: int | None = None) -> tuple[Path, str]:
    """A workspace where the local owner acts without a token (the reviewer's session) and a DEV token."""
    ws = new_workspace(tmp_path)
    config = ws / "taskkernel.toml"
    config.write_text(config.read_text().replace("require_token = true", "require_token = false"))
    if budget is not None:
        append_config(ws, f"\n[mcp]\noutput_budget = {budget}\n")
    [dev] = issue(ws, ("DEV", "dev-1"))
    return ws, dev


async def test_every_tool_answers_its_document_as_its_text(tmp_path: Path) -> None:
    """Each tool the server lists, called through the real server: its text parses as its structured content
    (refusals too: the reason code and message are in the text). get_task on a task with a report: the report's
    body and the task's body are in the text a Gemini reviewer reads."""
    ws, dev_token = open_workspace(tmp_path)
    async with session(ws, dev_token) as dev, session(ws, None) as owner:
        listed = {t.name for t in (await dev.session.list_tools()).tools}
        tid = (await owner.call("create_task", recipient="DEV", subject="trailing commas", body=TASK_BODY,
                                risk_level="low"))["task_id"]
        assert (await dev.call("whoami"))["principal"]["id"] == "DEV:dev-1"
        assert tid in [t["task_id"] for t in (await dev.call("list_tasks", assigned_to_me=True))["tasks"]]
        assert (await dev.call("claim_task", task_id=tid))["status"] == "accepted"
        assert (await dev.call("add_progress", text="parser half done"))["status"] == "accepted"
        assert (await dev.call("resume"))["status"] == "resume"
        other = (await owner.call("create_task", recipient="DEV", subject="later"))["task_id"]
        told = await owner.call("say_to_task", task_id=other, text="also handle nested lists", mode="queue")
        assert told["status"] == "accepted" and told["kind"] == "queued"  # for its first run, still to come
        assert (await owner.call("interrupt_task", task_id=other))["reason"] == "no_running_run"
        assert (await dev.call("read_inputs"))["reason"] == "invalid_arguments"  # a person's token is no run's
        check = await dev.call("check_action", task_id=tid, operation="write", entity="file:src/parser.py",
                               tool="write_file")
        assert check["allowed"] is False
        performed = await dev.call("perform", task_id=tid, operation="write", entity="file:src/parser.py",
                                   tool="write_file")
        assert performed["status"] == "rejected"  # no evidence: the reason code is in the text
        assert json.loads(dev.texts["perform"][-1])["reason"] == performed["reason"]
        assert (await dev.call("report", task_id=tid, status="done", body=REPORT_BODY,
                               artifacts=["dist/fix.patch"]))["status"] == "accepted"
        assert (await dev.call("submit_task", task_id=tid))["status"] == "accepted"

        shown = await owner.call("get_task", task_id=tid)
        text = owner.texts["get_task"][-1]
        assert REPORT_BODY in text and TASK_BODY in text and "dist/fix.patch" in text, text
        assert shown["reports"][0]["body"] == REPORT_BODY

        assert (await owner.call("reject_task", task_id=tid, reason="add a test for nested lists"))["status"] \
            == "accepted"
        retried = await owner.call("retry_task", task_id=tid, reason="once more")
        assert retried["status"] == "accepted" or retried["reason"] == "retry_cannot_help", retried
        await dev.call("report", task_id=tid, status="done", body=REPORT_BODY + " Nested lists too.")
        await dev.call("submit_task", task_id=tid)
        refused = await dev.call("approve_task", task_id=tid)  # DEV is not the done authority
        assert (refused["status"], refused["reason"]) == ("rejected", "role_not_authorized")
        assert json.loads(dev.texts["approve_task"][-1])["message"] == refused["message"]
        assert (await owner.call("approve_task", task_id=tid))["status"] == "accepted"
        assert (await owner.call("archive_task", task_id=tid))["status"] == "accepted"
        assert (await dev.call("usage", by="role"))["by"] == "role"
        missing = await dev.call("get_task", task_id="TASK-20200101-999")
        assert missing["reason"] == "task_not_found"
    assert listed == dev.called | owner.called, listed - (dev.called | owner.called)


async def test_a_document_cut_for_the_budget_is_cut_alike_in_its_text(tmp_path: Path) -> None:
    """At a 2 KiB budget a long report body is cut: the text is the same cut document (its size within the
    budget), saying so (truncated, body_truncated, body_next), and reading on with body_next gets the rest."""
    ws, dev_token = open_workspace(tmp_path, budget=2048)
    body = "".join(f"line {i}: ünïcödé \"quoted\"\n" for i in range(400))
    async with session(ws, dev_token, budget=2048) as dev, session(ws, None, budget=2048) as owner:
        tid = (await owner.call("create_task", recipient="DEV", subject="long"))["task_id"]
        await dev.call("claim_task", task_id=tid)
        await dev.call("report", task_id=tid, status="done", body=body)
        doc = await dev.call("get_task", task_id=tid)
        report = doc["reports"][0]
        assert doc["truncated"] and report["body_truncated"] and report["body_next"], doc
        cut = json.loads(dev.texts["get_task"][-1])
        assert cut["reports"][0]["body"] == report["body"] and body.startswith(report["body"])
        read = report["body"]
        arguments = report["body_next"]["arguments"]
        while arguments is not None:
            page = (await dev.call("get_task", **arguments))["reports"][0]
            read += page["body"]
            arguments = page["body_next"]["arguments"] if page["body_next"] else None
        assert read == body.strip()


def test_a_result_over_the_budget_is_cut_whatever_it_holds() -> None:
    """The last guard (``fit``): a refusal quoting a long value is cut to the budget, its reason kept."""
    long = refusal("invalid_arguments", "x" * 5000, task_id="TASK-1")
    cut = fit(long, 1024)
    assert size(cut.structured) <= 1024 and cut.error and cut.structured["reason"] == "invalid_arguments"
    assert cut.structured["message"].endswith("…") and json.loads(cut.text) == cut.structured
    listing = Outcome({"status": "ok", "rows": ["r" * 400] * 10, "truncated": False})
    assert fit(listing, 1024).structured["truncated"] is True and long.structured["message"] == "x" * 5000
    small = Outcome({"status": "ok"})
    assert fit(small, 1024) is small
