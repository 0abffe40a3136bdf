"""`task list` through the real entry point: pages with a cursor, a stream of JSON lines with --all, filters, and
clear usage errors for a cursor that belongs to another listing (issue 11, item 7)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from taskkernel.coordinator.cli.common import CliContext
from taskkernel.coordinator.compose import build_kernel
from taskkernel.coordinator.workspace import Workspace
from taskkernel.kernel.model.principal import LOCAL_OWNER
from tests.cli_support import new_workspace, run, run_tty

NEXT = re.compile(r"^next page: --cursor (\S+)$", re.M)


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """A workspace with seven tasks: DEV gets the odd ones, QA the even ones; the subjects hold markup."""
    root = new_workspace(tmp_path_factory.mktemp("list"))
    db = CliContext(workspace_path=str(root)).database()
    kernel = build_kernel(db, Workspace.load(root))
    ids = []
    for n in range(7):
        result = kernel.submit({"type": "create_task", "idempotency_key": f"k{n}", "payload": {
            "sender": "ADMIN", "recipient": "DEV" if n % 2 == 0 else "QA", "subject": f"task {n} [/b]"}},
            LOCAL_OWNER)
        assert result.status == "accepted", result
        ids.append(result.task_id)
    db.dispose()
    return root, ids


def test_pages_follow_their_cursor_to_the_end(ws: tuple[Path, list[str]]) -> None:
    root, ids = ws
    seen: list[str] = []
    args = ["task", "list", "--limit", "3"]
    for _ in range(5):
        page = run(*args, cwd=root)
        assert page.code == 0, page.err
        rows = json.loads(page.out)  # a page is still one JSON array, as `task list` always printed
        seen += [r["task_id"] for r in rows]
        found = NEXT.search(page.err)
        if found is None:
            break
        args = ["task", "list", "--limit", "3", "--cursor", found.group(1)]
    assert seen == sorted(ids) and len(rows) == 1  # 3 + 3 + 1, each task once, in task id order


def test_the_default_page_is_fifty_and_the_last_page_prints_no_cursor(ws: tuple[Path, list[str]]) -> None:
    root, ids = ws
    listed = run("task", "list", cwd=root)
    assert [r["task_id"] for r in listed.json] == sorted(ids)
    assert listed.json[0]["subject"] == "task 0 [/b]"
    assert "next page" not in listed.err


def test_all_streams_json_lines_and_filters_apply(ws: tuple[Path, list[str]]) -> None:
    root, ids = ws
    every = run("task", "list", "--all", cwd=root)
    lines = [json.loads(line) for line in every.out.splitlines()]
    assert [r["task_id"] for r in lines] == sorted(ids)
    qa = run("task", "list", "--all", "--role", "qa", "--state", "inbox", cwd=root)
    assert [json.loads(line)["task_id"] for line in qa.out.splitlines()] == sorted(ids)[1::2]
    assert run("task", "list", "--state", "done", cwd=root).json == []


def test_a_cursor_from_another_listing_or_no_cursor_at_all_is_a_usage_error(ws: tuple[Path, list[str]]) -> None:
    root, _ = ws
    cursor = NEXT.search(run("task", "list", "--limit", "2", cwd=root).err)
    assert cursor is not None
    other = run("task", "list", "--limit", "2", "--role", "DEV", "--cursor", cursor.group(1), cwd=root)
    assert other.code == 64 and other.json["code"] == "usage"
    assert "continues a listing of all tasks, not of tasks with role DEV" in other.json["message"]
    for bad in (["--cursor", "not-a-cursor"], ["--limit", "0"], ["--limit", "1001"], ["--state", "doing"]):
        refused = run("task", "list", *bad, cwd=root)
        assert refused.code == 64 and refused.json["status"] == "error", (bad, refused.out)
        assert "Traceback" not in refused.err


def test_a_terminal_gets_a_table_and_the_next_page_hint(ws: tuple[Path, list[str]]) -> None:
    root, ids = ws
    page = run_tty("task", "list", "--limit", "2", cwd=root)
    assert page.code == 0 and "task 0 [/b]" in page.out and ids[0] in page.out and ids[2] not in page.out
    assert NEXT.search(page.out + page.err) is not None
    every = run_tty("task", "list", "--all", cwd=root)
    assert all(i in every.out for i in ids) and "7 task(s)" in every.out + every.err


def test_control_characters_in_a_subject_neither_break_the_line_nor_reach_the_terminal(tmp_path: Path) -> None:
    root = new_workspace(tmp_path)
    db = CliContext(workspace_path=str(root)).database()
    subject = "line one\nline two \x1b[31mred"
    made = build_kernel(db, Workspace.load(root)).submit({"type": "create_task", "idempotency_key": "ctl",
                                                          "payload": {"sender": "ADMIN", "recipient": "DEV",
                                                                      "subject": subject}}, LOCAL_OWNER)
    db.dispose()
    shown = run_tty("task", "list", "--all", cwd=root)
    line = next(x for x in shown.out.splitlines() if made.task_id in x)
    assert line.endswith("line one\\nline two \\x1b[31mred") and "\x1b" not in shown.out
    assert run("task", "list", cwd=root).json[0]["subject"] == subject  # JSON keeps the data as it is
