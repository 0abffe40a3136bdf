"""The task page gets the loop of a running agent (issue 28), through the real `taskkernel serve` process: the live
output of the task's agents (a JSON read after a cursor, and the event feed saying when there is more), the message
box and the interrupt button as `taskkernel task say|interrupt` with their refusals, credentials and CSRF, and the
instructions in the task's timeline with their delivery state; then, in a real Chromium, a stand-in agent run by a
real `taskkernel up` streams lines into an open task page, never its token, and reads a message typed in the box."""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from taskkernel.coordinator.runners.ledger import Purpose, RunLedger, RunState
from taskkernel.coordinator.runners.live import RunOutput
from taskkernel.coordinator.tables import runs
from taskkernel.coordinator.web.patchlines import patch_lines
from taskkernel.coordinator.workspace import Workspace
from taskkernel.kernel.queries import task_history
from taskkernel.kernel.store.db import Database
from tests.cli_support import new_workspace, run
from tests.test_steering import Loop, until
from tests.web_support import (
    board,
    change,
    chromium,
    create,
    issue,
    owner_token,
    policy_violations,
    report_done,
    repository_workspace,
    sign_in,
    task_json,
    to_review,
)

WAIT_MS = 15_000
Served = tuple[Path, str, dict[str, str]]
Diffed = tuple[Path, str, dict[str, str], dict[str, str]]  # + the tasks: "active" and "review", each with a diff
APP = "def greet():\n    return 'hello'\n\n\ndef shout():\n    return 'HELLO'\n"
CHANGED = "def greet(name):\n    return f'hello {name}'\n\n\ndef shout():\n    return 'HELLO'\n"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    ws = new_workspace(tmp_path_factory.mktemp("web-steering"))
    tokens = {"admin": owner_token(ws), "dev": issue(ws, "DEV", "dev-web"), "qa": issue(ws, "QA", "qa-web")}
    with board(ws) as url:
        yield ws, url, tokens


@pytest.fixture(scope="module")
def diffed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Diffed]:
    """A git repository's workspace served, with two tasks whose done report records a diff of app.py: one still
    active (reported, not submitted), one in review."""
    ws = repository_workspace(tmp_path_factory.mktemp("web-comments"), {"app.py": APP})
    tokens = {"admin": owner_token(ws), "dev": issue(ws, "DEV", "dev-diff"), "qa": issue(ws, "QA", "qa-diff")}
    tasks = {"active": create(ws, "greet by name"), "review": create(ws, "greet by name, reviewed")}
    for state, task in tasks.items():
        change(ws, task, {"app.py": CHANGED})
        report_done(ws, task, tokens["dev"], *([("submit", task)] if state == "review" else []))
    with board(ws) as url:
        yield ws, url, tokens, tasks


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def database(ws: Path) -> Database:
    return Database(Workspace.load(ws).database_url, "process")


def running_run(ws: Path, task_id: str, name: str) -> str:
    """A run of the task's driver (DEV) that the ledger says is running, as a coordinator would have claimed it."""
    run_id = f"{task_id}:r0:execute:{name}"
    with database(ws).write() as uow:
        RunLedger.insert(uow.conn, run_id, task_id, 0, "DEV", Purpose.EXECUTE, 1)
        uow.conn.execute(runs.update().where(runs.c.run_id == run_id).values(state=RunState.RUNNING.value, attempt=1))
    return run_id


def printed(ws: Path, task_id: str, run_id: str, lines: list[str], secret: str = "") -> None:
    """What an agent printed, stored as the dispatcher stores it (RunOutput: typed, redacted, bounded)."""
    output = RunOutput(database(ws), run_id=run_id, task_id=task_id, attempt=1, output_kind=None,
                       secrets=[secret] if secret else [])
    output.feed("".join(f"{line}\n" for line in lines).encode())
    output.close()


def test_say_is_task_say_with_its_refusals(served: Served) -> None:
    ws, url, tokens = served
    task = create(ws, "steer me over http")
    path = url + f"api/tasks/{task}/say"
    assert httpx2.post(path, json={"text": "hello"}).status_code == 401
    said = httpx2.post(path, json={"text": "also handle floats", "mode": "steer"}, headers=bearer(tokens["admin"]))
    assert said.status_code == 200, said.text
    by_cli = run("task", "say", task, "and ints", "--json", cwd=ws).json
    assert set(said.json()) == set(by_cli) and said.json()["kind"] == "steer"
    assert said.json()["accept_seq"] + 1 == by_cli["accept_seq"] and said.json()["queued_run"] is None  # inbox
    once = {"text": "a retried click", "input_id": "click-1"}
    first = httpx2.post(path, json=once, headers=bearer(tokens["admin"])).json()
    again = httpx2.post(path, json=once, headers=bearer(tokens["admin"])).json()
    assert (first["status"], again["status"], again["accept_seq"]) == ("accepted", "replayed", first["accept_seq"])
    for body, who, status, reason in (
            ({"text": "x", "input_id": "click-1"}, "admin", 409, "idempotency_conflict"),
            ({"text": "do more"}, "dev", 409, "may_not_instruct"),  # the driver does not instruct itself
            ({"text": "do more"}, "qa", 409, "may_not_instruct"),  # neither its sender nor its done authority
            ({"text": "   "}, "admin", 409, "invalid_input"),
            ({"text": "x", "mode": "answer"}, "admin", 409, "invalid_input"),  # an answer names its question
            ({"text": 5}, "admin", 409, "invalid_command"),
            ({"text": "x", "urgent": "yes"}, "admin", 409, "invalid_command")):
        refused = httpx2.post(path, json=body, headers=bearer(tokens[who]))
        assert (refused.status_code, refused.json()["reason"]) == (status, reason), (body, who, refused.text)
    gone = httpx2.post(url + "api/tasks/TASK-20200101-999/say", json={"text": "x"}, headers=bearer(tokens["admin"]))
    assert gone.status_code == 404 and gone.json()["reason"] == "task_not_found"
    shown = httpx2.get(url + f"api/tasks/{task}").json()
    assert shown == task_json(ws, task) and shown["inputs_pending"] == 3  # `task show`'s document, count included
    reviewed = create(ws, "already in review")
    to_review(ws, reviewed, tokens["dev"])
    late = httpx2.post(url + f"api/tasks/{reviewed}/say", json={"text": "x"}, headers=bearer(tokens["admin"]))
    assert late.status_code == 409 and late.json()["reason"] == "task_not_in_work"


def test_the_message_box_with_a_sign_in_needs_the_csrf_token(served: Served) -> None:
    ws, url, tokens = served
    task = create(ws, "steer me from the page")
    client, csrf = sign_in(url, tokens["admin"])
    with contextlib.closing(client):
        page = client.get(f"/tasks/{task}").text
        assert 'id="say-text"' in page and 'id="interrupt"' not in page  # nothing runs: nothing to interrupt
        missing = client.post(f"/api/tasks/{task}/say", json={"text": "hello"})
        foreign = client.post(f"/api/tasks/{task}/say", json={"text": "hello"},
                              headers={"x-csrf-token": csrf, "origin": "http://evil.example"})
        assert [missing.status_code, foreign.status_code] == [403, 403]
        assert task_json(ws, task)["inputs_pending"] == 0  # nothing was accepted
        ok = client.post(f"/api/tasks/{task}/say", json={"text": "hello", "csrf_token": csrf})
        assert ok.status_code == 200 and ok.json()["status"] == "accepted"
    assert 'id="say-text"' not in httpx2.get(url + f"tasks/{task}").text  # read-only without a sign-in
    for who in ("dev", "qa"):  # signed in, but not one who may instruct it
        client, _ = sign_in(url, tokens[who])
        with contextlib.closing(client):
            assert 'id="say-text"' not in client.get(f"/tasks/{task}").text


def test_interrupt_stops_only_a_running_run_once(served: Served) -> None:
    ws, url, tokens = served
    task = create(ws, "interrupt me")
    path = url + f"api/tasks/{task}/interrupt"
    idle = httpx2.post(path, json={}, headers=bearer(tokens["admin"]))
    assert idle.status_code == 409 and idle.json()["reason"] == "no_running_run"
    run_id = running_run(ws, task, "busy")
    client, _ = sign_in(url, tokens["admin"])
    with contextlib.closing(client):
        assert 'id="interrupt"' in client.get(f"/tasks/{task}").text
    assert httpx2.post(path, json={}, headers=bearer(tokens["dev"])).json()["reason"] == "may_not_instruct"
    assert httpx2.post(path, json={"message": 3}, headers=bearer(tokens["admin"])).json()["reason"] == \
        "invalid_command"
    asked = httpx2.post(path, json={"message": "use the new API"}, headers=bearer(tokens["admin"]))
    assert asked.status_code == 200, asked.text
    seq = asked.json()["message_seq"]
    assert asked.json() == {"status": "requested", "task_id": task, "run_id": run_id,
                            "requested_by": "ADMIN:local-owner", "message_seq": seq} and isinstance(seq, int)
    again = httpx2.post(path, json={"message": "again"}, headers=bearer(tokens["admin"])).json()
    assert again["status"] == "replayed" and again["message_seq"] == seq
    told = httpx2.get(url + f"api/tasks/{task}/page", headers=bearer(tokens["admin"])).json()["instructions"]
    assert [(i["accept_seq"], i["kind"], i["state"], i["text"]) for i in told] == [
        (seq, "queued", "accepted", "use the new API")]  # held for the resumed run


def test_the_timeline_lists_instructions_and_their_delivery_to_those_who_may_read_them(served: Served) -> None:
    ws, url, tokens = served
    task = create(ws, "tell me twice")
    seqs = [httpx2.post(url + f"api/tasks/{task}/say", json={"text": text}, headers=bearer(tokens["admin"]))
            .json()["accept_seq"] for text in ("first <b>this</b>", "then that")]
    own_run = run("token", "issue", "DEV", "--agent", "dev-agent", "--task", task, cwd=ws).out.strip()
    read = run("--token", own_run, "task", "inputs", task, "--consume", "--json", cwd=ws)  # as `read_inputs` does
    assert read.code == 0 and [i["accept_seq"] for i in read.json["inputs"]] == seqs, read.err
    later = httpx2.post(url + f"api/tasks/{task}/say", json={"text": "one more", "mode": "queue"},
                        headers=bearer(tokens["admin"])).json()["accept_seq"]
    page = httpx2.get(url + f"api/tasks/{task}/page", headers=bearer(tokens["admin"])).json()
    assert page["instructions"] == run("task", "inputs", task, "--json", cwd=ws).json["inputs"]
    assert [(i["accept_seq"], i["state"], (i["delivered"] or {}).get("via")) for i in page["instructions"]] == [
        (seqs[0], "consumed", "cli"), (seqs[1], "consumed", "cli"), (later, "accepted", None)]
    assert page["task"]["inputs_pending"] == 1
    for reader in (bearer(tokens["admin"]), bearer(tokens["dev"])):  # an instructor, and the driver's role
        assert len(httpx2.get(url + f"api/tasks/{task}/page", headers=reader).json()["instructions"]) == 3
    for reader in ({}, bearer(tokens["qa"])):  # anyone else learns only how many
        shown = httpx2.get(url + f"api/tasks/{task}/page", headers=reader).json()
        assert (shown["instructions"], shown["instructions_given"]) == ([], 3)
    html = httpx2.get(url + f"tasks/{task}", headers=bearer(tokens["admin"])).text
    rows = re.findall(r'<tr class="instruction" id="instruction-(\d+)">.*?badge in-(\w+)', html, re.S)
    assert rows == [(str(seqs[0]), "consumed"), (str(seqs[1]), "consumed"), (str(later), "accepted")]
    assert "first &lt;b&gt;this&lt;/b&gt;" in html and "<b>this</b>" not in html
    assert "not submitted for review until its agent reads them" in html
    assert "instruction #" not in httpx2.get(url + f"tasks/{task}").text


def test_live_output_is_read_after_a_cursor_redacted_and_shown_as_text(served: Served) -> None:
    ws, url, tokens = served
    task = create(ws, "chatty agent")
    run_id = running_run(ws, task, "chatty")
    token = issue(ws, "DEV", "dev-chatty")
    printed(ws, task, run_id, ["starting", f"my token is {token}", "<img src=x onerror=alert(1)>"], secret=token)
    path = url + f"api/tasks/{task}/live"
    first = httpx2.get(path).json()
    assert [e["text"] for e in first["events"]] == ["starting", "my token is [redacted]",
                                                    "<img src=x onerror=alert(1)>"]
    assert first["cursor"] == f"{run_id}:3" and first["more"] is False and first["events"][0]["kind"] == "output"
    printed(ws, task, run_id, ["next line", "and another"])
    after = httpx2.get(path, params={"after": first["cursor"], "limit": 1}).json()
    assert [e["text"] for e in after["events"]] == ["next line"] and after["more"] is True
    rest = httpx2.get(path, params={"after": after["cursor"]}).json()
    assert [e["text"] for e in rest["events"]] == ["and another"] and rest["more"] is False
    idle = httpx2.get(path, params={"after": rest["cursor"]}).json()
    assert (idle["events"], idle["cursor"]) == ([], rest["cursor"])
    for bad in ({"after": "no-number"}, {"after": f"{run_id}:x"}, {"limit": 0}, {"limit": 1001}):
        refused = httpx2.get(path, params=bad)
        assert refused.status_code == 400 and refused.json()["reason"] == "invalid_command", bad
    assert httpx2.get(url + "api/tasks/TASK-20200101-999/live").status_code == 404
    html = httpx2.get(url + f"tasks/{task}").text
    assert token not in html and "my token is [redacted]" in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html and "<img src=x" not in html
    assert f'data-cursor="{run_id}:5"' in html


def test_the_feed_says_when_the_watched_task_printed_more(served: Served) -> None:
    ws, url, _ = served
    watched, other = create(ws, "watched"), create(ws, "not watched")
    notices: list[dict[str, Any]] = []
    ready = threading.Event()

    def listen() -> None:
        with httpx2.stream("GET", url + "api/events", params={"live": watched}, timeout=30) as stream:
            name = None
            for line in stream.iter_lines():
                if line.startswith("event:"):
                    name = line[6:].strip()
                elif line.startswith("data:") and name == "live":
                    notices.append(json.loads(line[5:]))
                    ready.set()
                    if len(notices) >= 3:
                        return

    threading.Thread(target=listen, daemon=True).start()
    assert ready.wait(30)  # one at once: what was stored before the stream opened is read after the cursor
    time.sleep(0.5)
    settled = len(notices)
    printed(ws, other, running_run(ws, other, "other"), ["not for this page"])
    time.sleep(0.6)
    assert len(notices) == settled  # another task's output tells this page nothing
    printed(ws, watched, running_run(ws, watched, "watched"), ["for this page"])
    deadline = time.monotonic() + 10
    while len(notices) == settled and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(notices) > settled and {n["task_id"] for n in notices} == {watched}
    assert all(n["type"] == "live" and n["global_pos"] is None for n in notices)


def test_a_running_agent_streams_into_the_open_task_page_and_reads_the_box(tmp_path: Path) -> None:
    """A real `taskkernel up` runs the stand-in agent (tests/procs/steered_agent.py): the page, opened before the
    agent started, shows each line it prints without a reload, never the run's token it prints; a message typed in
    the box is read by the agent at its next tool call and the timeline says consumed; Interrupt stops it."""
    loop = Loop(tmp_path)
    task = loop.task("print-token\ncalls 4\npause 0.3\nhold")
    try:
        with board(loop.root) as url, chromium() as chrome:
            expect = pytest.importorskip("playwright.sync_api").expect
            page = chrome.new_page(viewport={"width": 1300, "height": 1000})
            violations = policy_violations(page)
            page.goto(url + f"login?next=/tasks/{task}")
            page.fill("#token", owner_token(loop.root))
            page.click("#sign-in-button")
            page.wait_for_selector("#live-status.on", timeout=WAIT_MS)
            assert page.locator("#live-events li").count() == 0 and page.is_visible("#live-empty")
            page.evaluate("window.notReloaded = true")
            loop.start()
            lines = page.locator("#live-events li .text")
            expect(lines.filter(has_text='"call": 4')).to_have_count(1, timeout=WAIT_MS * 2)
            shown = lines.all_inner_texts()
            assert "my token is [redacted]" in shown
            assert [t for t in shown if t.startswith('{"call"')] == [
                json.dumps({"call": n, "tool": "get_task"}) for n in range(1, 5)]  # each once, in order
            logs = list((loop.root / ".taskkernel" / "runs").glob("*/attempt-1/stdout.log"))
            raw = re.search(r"my token is (tk_\S+)", logs[0].read_text())  # the log keeps what it printed
            assert raw is not None and raw.group(1) not in page.content()
            page.fill("#say-text", "also handle floats")
            page.select_option("#say-mode", "steer")
            page.click("#say")
            expect(page.locator("#action-result .outcome")).to_contain_text("accepted", timeout=WAIT_MS)
            told = page.locator("tr.instruction")
            expect(told).to_contain_text("also handle floats", timeout=WAIT_MS)
            expect(told.locator(".badge")).to_have_text("consumed", timeout=WAIT_MS)
            assert "via tool" in told.inner_text() and "(steer)" in told.inner_text()
            until("the agent obeyed", lambda: loop.record(task, "obeyed"), loop)
            assert loop.record(task, "obeyed")[0].endswith("tool also handle floats")
            page.click("#interrupt")
            expect(page.locator("#action-result .outcome")).to_contain_text("requested", timeout=WAIT_MS)
            expect(page.locator("#interrupt")).to_have_count(0, timeout=WAIT_MS)  # the run ended
            assert loop.record(task, "terminated") == ["15"]
            assert page.evaluate("window.notReloaded") is True and violations == []
    finally:
        loop.stop()


PATCH = """diff --git a/app.py b/app.py
index 1111111..2222222 100644
--- a/app.py
+++ b/app.py
@@ -1,4 +1,5 @@
 import os
-import sys
+import re
+import json
 VERSION = 1
 def main():
@@ -20,4 +21,2 @@ def main():
     a = 1
---- a dashed line removed, not a header
-    b = 2
     return a
diff --git a/my notes.md b/my notes.md
--- a/my notes.md\t
+++ b/my notes.md\t
@@ -3,3 +3,2 @@
 keep
 this
-the last line
diff --git "a/caf\\303\\251.py" "b/caf\\303\\251.py"
new file mode 100644
--- /dev/null
+++ "b/caf\\303\\251.py"
@@ -0,0 +1 @@
+print('hi')
\\ No newline at end of file
diff --git a/gone.py b/gone.py
deleted file mode 100644
--- a/gone.py
+++ /dev/null
@@ -1 +0,0 @@
-bye
"""


def test_each_line_of_a_patch_is_anchored_to_the_line_of_the_new_file_it_stands_for() -> None:
    """Context and added lines are their new line; a removed line anchors to the new line that takes its place (the
    next of its hunk, else the one before it); headers, and the lines of a deleted file, are not commentable."""
    rows = [(line["kind"], line["anchor"]) for line in patch_lines(PATCH)]
    assert [line["text"] for line in patch_lines(PATCH)] == PATCH.splitlines()
    assert rows == [
        ("note", None), ("note", None), ("file", None), ("file", None),
        ("hunk", None), ("context", "app.py:1"), ("del", "app.py:2"), ("add", "app.py:2"), ("add", "app.py:3"),
        ("context", "app.py:4"), ("context", "app.py:5"),
        ("hunk", None), ("context", "app.py:21"), ("del", "app.py:22"), ("del", "app.py:22"),
        ("context", "app.py:22"),
        ("note", None), ("file", None), ("file", None),
        ("hunk", None), ("context", "my notes.md:3"), ("context", "my notes.md:4"), ("del", "my notes.md:4"),
        ("note", None), ("note", None), ("file", None), ("file", None),
        ("hunk", None), ("add", "caf\u00e9.py:1"), ("note", None),
        ("note", None), ("note", None), ("file", None), ("file", None), ("hunk", None), ("del", None)]
    crlf = patch_lines("--- a/w.txt\r\n+++ b/w.txt\r\n@@ -1 +1 @@\r\n-old\r\n+new\fpage\r\n")
    assert [(line["text"], line["anchor"]) for line in crlf[3:]] == [("-old", "w.txt:1"), ("+new\fpage", "w.txt:1")]
    cut = patch_lines("+++ b/x.py\n@@ -1,3 +1,3 @@\n a\n")  # a patch cut at the page's limit
    assert [line["anchor"] for line in cut] == [None, None, "x.py:1"]


def test_say_takes_the_line_it_is_about_and_the_timeline_shows_it(served: Served) -> None:
    ws, url, tokens = served
    task = create(ws, "comment on my lines")
    path = url + f"api/tasks/{task}/say"
    said = httpx2.post(path, json={"text": "use an f-string", "mode": "steer", "anchor": "src/app.py:12"},
                       headers=bearer(tokens["admin"]))
    assert said.status_code == 200 and said.json()["kind"] == "steer", said.text
    for anchor in ("src/app.py", "src/app.py:0", ":3", "a b.py:x", "two\nlines.py:1", ""):
        refused = httpx2.post(path, json={"text": "x", "anchor": anchor}, headers=bearer(tokens["admin"]))
        assert (refused.status_code, refused.json()["reason"]) == (409, "invalid_input"), anchor
    typed = httpx2.post(path, json={"text": "x", "anchor": 12}, headers=bearer(tokens["admin"]))
    assert (typed.status_code, typed.json()["reason"]) == (409, "invalid_command")
    told = httpx2.get(url + f"api/tasks/{task}/page", headers=bearer(tokens["admin"])).json()["instructions"]
    assert [(i["text"], i["kind"], i["anchor"]) for i in told] == [("use an f-string", "steer", "src/app.py:12")]
    assert told == run("task", "inputs", task, "--json", cwd=ws).json["inputs"]
    html = httpx2.get(url + f"tasks/{task}", headers=bearer(tokens["admin"])).text
    assert f'id="instruction-{said.json()["accept_seq"]}"' in html and \
        '(steer) on <code class="anchor">src/app.py:12</code>' in html
    schema = httpx2.get(url + "api/openapi.json").json()["paths"]["/api/tasks/{task_id}/say"]["post"]
    assert "anchor" in schema["requestBody"]["content"]["application/json"]["schema"]["properties"]


def test_the_lines_of_the_newest_diff_take_comments_from_who_may_instruct_or_decide(diffed: Diffed) -> None:
    ws, url, tokens, tasks = diffed
    report = httpx2.get(url + f"api/tasks/{tasks['active']}/page").json()["reports"][-1]
    lines = [(line["kind"], line["anchor"], line["text"]) for line in report["patch"]["lines"]]
    assert ("add", "app.py:2", "+    return f'hello {name}'") in lines and ("del", "app.py:1", "-def greet():") in lines
    client, _ = sign_in(url, tokens["admin"])
    with contextlib.closing(client):
        active, review = (client.get(f"/tasks/{tasks[state]}").text for state in ("active", "review"))
    for html, mode in ((active, "send"), (review, "collect")):
        assert html.count('class="comment-at"') == len([a for _, a, _ in lines if a]) and \
            '<span class="add" data-anchor="app.py:2"><button type="button" class="comment-at"' in html
        assert f'data-mode="{mode}"' in html and ('id="reject-comments"' in html) == (mode == "collect")
    for who in ("dev", "qa"):  # signed in, neither instructing the task nor deciding it
        client, _ = sign_in(url, tokens[who])
        with contextlib.closing(client):
            html = client.get(f"/tasks/{tasks['active']}").text
        assert 'data-anchor="app.py:2"' in html and "comment-at" not in html and 'id="line-comment"' not in html
    assert "comment-at" not in httpx2.get(url + f"tasks/{tasks['review']}").text  # nobody signed in


def test_comments_on_diff_lines_steer_an_active_task_and_make_a_rejection(diffed: Diffed) -> None:
    """In Chromium, under the board's policy: a comment on a line of an active task's diff is sent at once as a
    steer anchored to the line, and shows in the timeline; on a task in review, comments gather into the Reject
    form, one line each, and the rejection sends them as its reason."""
    ws, url, tokens, tasks = diffed
    with chromium() as chrome:
        expect = pytest.importorskip("playwright.sync_api").expect
        page = chrome.new_page(viewport={"width": 1300, "height": 1000})
        violations = policy_violations(page)
        page.goto(url + f"login?next=/tasks/{tasks['active']}")
        page.fill("#token", tokens["admin"])
        page.click("#sign-in-button")
        page.wait_for_selector("#live-status.on", timeout=WAIT_MS)
        assert "\n+    return f'hello {name}'\n" in page.inner_text("pre.patch")  # the buttons add no text
        page.click('.add[data-anchor="app.py:2"] .comment-at')
        assert page.inner_text("form.line-comment .where") == "app.py:2"
        page.fill("form.line-comment input[name=text]", "use str.format: this must run on 3.5")
        page.press("form.line-comment input[name=text]", "Enter")
        expect(page.locator("#action-result .outcome")).to_contain_text("accepted", timeout=WAIT_MS)
        told = page.locator("tr.instruction")
        expect(told).to_contain_text("(steer) on app.py:2", timeout=WAIT_MS)
        assert "use str.format" in told.inner_text() and page.locator("form.line-comment").count() == 0
        inputs = run("task", "inputs", tasks["active"], "--json", cwd=ws).json["inputs"]
        assert [(i["kind"], i["anchor"], i["text"]) for i in inputs] == [
            ("steer", "app.py:2", "use str.format: this must run on 3.5")]

        page.goto(url + f"tasks/{tasks['review']}")
        for anchor, text in (("app.py:1", "keep greet() working without a name"), ("app.py:2", "escape name")):
            page.click(f'.add[data-anchor="{anchor}"] .comment-at')
            page.fill("form.line-comment input[name=text]", text)
            page.click("form.line-comment button:not(.cancel)")
        page.click('.context[data-anchor="app.py:5"] .comment-at')
        page.click("form.line-comment .cancel")
        assert page.locator("form.line-comment").count() == 0
        comments = "app.py:1: keep greet() working without a name\napp.py:2: escape name"
        assert page.input_value("#reject-comments") == comments
        page.fill("input[name=reason]", "two lines need work")
        page.click("#reject")
        expect(page.locator("#task-state")).to_have_text("active", timeout=WAIT_MS)
        rejected = [e.data["reason"] for e in task_history(database(ws), tasks["review"])
                    if e.type == "task_rejected"]
        assert rejected == [f"two lines need work\n{comments}"] and violations == []
