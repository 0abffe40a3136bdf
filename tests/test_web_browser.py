"""The web board in a real headless Chromium (Debian's `chromium`, driven by Playwright; no browser is downloaded):
a card moves columns when the CLI acts in another process, without a reload, and a blocked one leads the active
column; a signed-in ADMIN approves a high-risk task, is refused with the grant hint, grants from the page (the page
shows the grant live) and approves; the task page shows the report's body and its diff; a rejection typed on the
page is followed by the page; all of it under the board's Content-Security-Policy, with no violation in the console;
a page served from another port of this machine cannot frame the board. The screenshots in docs/img/ are taken here
(`make screenshots` writes them there; `make test` keeps them in the test's folder, so a test run leaves the
repository as it found it)."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from taskkernel.coordinator import schema
from taskkernel.coordinator.workspace import Workspace
from taskkernel.coordinator.worktrees.manager import Worktrees
from taskkernel.kernel.store.db import Database
from tests.cli_support import ROOT, run
from tests.test_agents import git
from tests.web_support import (
    CHROMIUM,
    NO_CHROMIUM,
    board,
    chromium,
    create,
    issue,
    owner_token,
    policy_violations,
    to_review,
)

if CHROMIUM is None and not os.environ.get("TASKKERNEL_REQUIRE_BROWSER"):
    pytest.skip(NO_CHROMIUM, allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api")
# Waits are locators, not wait_for_function: Playwright evaluates a function's text with eval(), which the board's
# policy (script-src 'self', no 'unsafe-eval') refuses, as it should.
expect = sync_api.expect
DOCS_IMAGES = ROOT / "docs" / "img"
WAIT_MS = 10_000


@pytest.fixture
def images(tmp_path: Path) -> Path:
    """Where screenshots go: docs/img under `make screenshots` (TASKKERNEL_SCREENSHOTS=docs), else the test's folder."""
    return DOCS_IMAGES if os.environ.get("TASKKERNEL_SCREENSHOTS") == "docs" else tmp_path


@pytest.fixture
def browser() -> Iterator[object]:
    with chromium() as chrome:
        yield chrome


def repository_workspace(tmp_path: Path) -> Path:
    """A git repository with a taskkernel workspace in it (`taskkernel init`), committed."""
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    (root / "app.py").write_text("def greet():\n    return 'hello'\n")
    assert run("init", str(root), cwd=tmp_path).code == 0
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "start")
    return root


def test_a_card_moves_columns_live_when_the_cli_acts(tmp_path: Path, browser: object, images: Path) -> None:
    ws = repository_workspace(tmp_path)
    dev = issue(ws, "DEV", "dev-live")
    for i in range(3):
        create(ws, f"groundwork {i}")
    with board(ws) as url:
        page = browser.new_page(viewport={"width": 1400, "height": 800})  # type: ignore[attr-defined]
        violations = policy_violations(page)
        feeds: list[str] = []
        page.on("request", lambda r: feeds.append(r.url) if "/api/events" in r.url else None)
        page.goto(url)
        page.wait_for_selector("#live-status.on", timeout=WAIT_MS)
        position = page.evaluate("document.body.dataset.logPosition")
        assert feeds == [f"{url}api/events?after={position}"]  # the feed starts where the page was read
        page.evaluate("window.notReloaded = true")
        task = create(ws, "Live card from the CLI")  # another process
        card = f'#col-inbox [data-task-id="{task}"]'
        page.wait_for_selector(card, timeout=WAIT_MS)
        assert page.inner_text('[data-count="inbox"]') == "4"
        assert run("--token", dev, "task", "claim", task, cwd=ws).code == 0
        page.wait_for_selector(f'#col-active [data-task-id="{task}"]', timeout=WAIT_MS)
        assert page.query_selector(card) is None
        blocked = create(ws, "Waiting on a vendor key")
        assert run("--token", dev, "task", "claim", blocked, cwd=ws).code == 0
        assert run("--token", dev, "task", "report", blocked, "--status", "blocked", "--body", "the vendor has not "
                   "sent the key", cwd=ws).code == 0
        expect(page.locator("#col-active .card").first).to_have_attribute(  # blocked cards lead the active column
            "data-task-id", blocked, timeout=WAIT_MS)
        assert "blocked" in page.inner_text(f'#col-active [data-task-id="{blocked}"] .badges')
        assert page.inner_text('[data-count="active"]') == "2"
        assert page.evaluate("window.notReloaded") is True  # moved in place: the page was never reloaded
        images.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(images / "board.png"))
        hidden = browser.new_page()  # type: ignore[attr-defined]  # a tab opened in the background
        hidden.add_init_script("Object.defineProperty(document, 'hidden', {get: () => true})")
        hidden_feeds: list[str] = []
        hidden.on("request", lambda r: hidden_feeds.append(r.url) if "/api/events" in r.url else None)
        hidden.goto(url)
        hidden.wait_for_timeout(500)
        assert hidden_feeds == []  # it holds no connection until it is shown
        assert (images / "board.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert violations == []


def test_approve_is_refused_with_the_grant_hint_then_granted_from_the_page(tmp_path: Path, browser: object,
                                                                          images: Path) -> None:
    ws = repository_workspace(tmp_path)
    dev = issue(ws, "DEV", "dev-risky")
    task = create(ws, "Rotate the production keys", "--risk", "high")
    root = Database(Workspace.load(ws).database_url, "process")
    schema.ensure(root)
    tree = Worktrees(root, ws).ensure(task, None)  # the task's own worktree: its done report records the diff
    (tree.path / "app.py").write_text("def greet(name):\n    return f'hello {name}'\n")
    to_review(ws, task, dev)
    with board(ws) as url:
        page = browser.new_page(viewport={"width": 1300, "height": 1100})  # type: ignore[attr-defined]
        violations = policy_violations(page)
        page.goto(url + f"tasks/{task}")
        assert page.query_selector("#approve") is None  # read-only before signing in
        page.click("#sign-in")
        page.fill("#token", owner_token(ws))
        page.click("#sign-in-button")
        page.wait_for_url(f"**/tasks/{task}", timeout=WAIT_MS)
        assert "the work is done" in page.inner_text(".report-body")
        patch = page.inner_text("pre.patch")
        assert "+    return f'hello {name}'" in patch and "-    return 'hello'" in patch
        page.click("#approve")
        result = page.wait_for_selector("#action-result .outcome", timeout=WAIT_MS)
        assert "permission_required" in result.inner_text()
        assert "taskkernel session accept admin --kind allow" in page.inner_text("#action-result .hint")
        page.click("#action-result .grant-from-hint")
        expect(page.locator("#action-result .outcome")).to_contain_text("accepted", timeout=WAIT_MS)
        page.wait_for_selector("tr.k-allow", timeout=WAIT_MS)
        page.click("#approve")
        expect(page.locator("#task-state")).to_have_text("done", timeout=WAIT_MS)
        assert run("task", "show", task, "--json", cwd=ws).json["state"] == "done"
        images.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(images / "task.png"), full_page=True)
        assert violations == []


def task_page_in_review(tmp_path: Path, browser: object, subject: str, *options: str
                        ) -> Iterator[tuple[Path, str, Any]]:
    """A task in review in a fresh workspace, and its page open in the browser, signed in as the owner."""
    ws = repository_workspace(tmp_path)
    task = create(ws, subject, *options)
    to_review(ws, task, issue(ws, "DEV", "dev-page"))
    with board(ws) as url:
        page = browser.new_page()  # type: ignore[attr-defined]
        violations = policy_violations(page)
        page.goto(url + f"login?next=/tasks/{task}")
        page.fill("#token", owner_token(ws))
        page.click("#sign-in-button")
        page.wait_for_selector("#live-status.on", timeout=WAIT_MS)
        yield ws, task, page
        assert violations == []


def test_a_grant_from_the_cli_reaches_an_open_task_page(tmp_path: Path, browser: object) -> None:
    """A grant commits no event of the log: the session log's change reaches the page as state_changed."""
    for ws, task, page in task_page_in_review(tmp_path, browser, "Rotate the staging keys", "--risk", "high"):
        assert page.query_selector("tr.k-allow") is None
        granted = run("session", "accept", "admin", "--kind", "allow", "--input-id", f"grant-approve-{task}",
                      "--payload", json.dumps({"permission": "approve", "scope": f"task:{task}"}), cwd=ws)
        assert granted.code == 0, granted.err
        page.wait_for_selector("tr.k-allow", timeout=WAIT_MS)


def test_a_rejection_typed_on_the_page_is_followed_live(tmp_path: Path, browser: object) -> None:
    """Review finding: a reason left in the form kept its region from ever refreshing again; text typed and left
    must survive a refresh."""
    for ws, task, page in task_page_in_review(tmp_path, browser, "Needs another pass"):
        page.fill("input[name=reason]", "add the missing tests")
        page.click("h1")  # the focus moves away, the reason stays typed
        assert run("task", "amend", task, "--priority", "P1", cwd=ws).code == 0  # another process moves the task
        expect(page.locator(".meta").first).to_contain_text("P1", timeout=WAIT_MS)
        assert page.input_value("input[name=reason]") == "add the missing tests"  # it survived the refresh
        page.click("#reject")
        expect(page.locator("#task-state")).to_have_text("active", timeout=WAIT_MS)
        assert "accepted" in page.inner_text("#action-result .outcome")  # the outcome outlives the refresh
        assert page.query_selector("#reject") is None


@contextmanager
def page_elsewhere(html: str) -> Iterator[str]:
    """``html`` served from another port of 127.0.0.1 (a page an agent's preview server could serve): its URL."""
    body = html.encode()

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
            self.send_response(200)
            self.send_header("content-type", "text/html; charset=utf-8")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def test_a_page_on_another_local_port_cannot_frame_the_signed_in_board(tmp_path: Path, browser: object) -> None:
    """Review finding (clickjacking): a frame on another port of 127.0.0.1 is the same site, so it got the
    SameSite=Strict cookie, and two clicks in it granted and approved a high-risk task. The browser now refuses to
    show the board in any frame: the frame holds Chromium's error page, not the board's buttons."""
    ws = repository_workspace(tmp_path)
    task = create(ws, "Rotate the production keys", "--risk", "high")
    to_review(ws, task, issue(ws, "DEV", "dev-framed"))
    with board(ws) as url, page_elsewhere(f'<h1>Win a prize</h1><iframe id="bait" src="{url}tasks/{task}" '
                                          'width="1000" height="700"></iframe>') as elsewhere:
        page = browser.new_page()  # type: ignore[attr-defined]
        page.goto(url + f"login?next=/tasks/{task}")
        page.fill("#token", owner_token(ws))
        page.click("#sign-in-button")
        page.wait_for_selector("#approve", timeout=WAIT_MS)  # signed in: the buttons are there, outside a frame
        console = policy_violations(page)
        answers: list[Any] = []
        page.on("response", lambda r: answers.append(r) if r.url == f"{url}tasks/{task}" else None)
        page.goto(elsewhere)
        page.wait_for_load_state("load", timeout=WAIT_MS)  # the frame's navigation has ended, in a page or an error
        framed = page.frame(name="bait") or page.frames[1]
        assert framed.url == "chrome-error://chromewebdata/"
        assert framed.query_selector("#approve") is None and framed.query_selector("#whoami") is None
        assert [a.status for a in answers] == [200]  # the board answered, and the browser would not show it
        assert answers[0].headers["x-frame-options"] == "DENY"
        assert "frame-ancestors 'none'" in answers[0].headers["content-security-policy"]
        assert any("frame-ancestors 'none'" in text for text in console)
        assert run("task", "show", task, "--json", cwd=ws).json["state"] == "review"
