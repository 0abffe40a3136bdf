"""The web board in a real headless Chromium (Debian's `chromium`, driven by Playwright; no browser is downloaded):
a card moves columns when the CLI acts in another process, without a reload; a signed-in ADMIN approves a high-risk
task, is refused with the grant hint, grants from the page and approves; the task page shows the report's body and
its diff. The screenshots in docs/img/ are taken here."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from taskkernel.coordinator import schema
from taskkernel.coordinator.workspace import Workspace
from taskkernel.coordinator.worktrees.manager import Worktrees
from taskkernel.kernel.store.db import Database
from tests.cli_support import ROOT, run
from tests.test_agents import git
from tests.web_support import board, create, issue, owner_token, to_review

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None and not os.environ.get("TASKKERNEL_REQUIRE_BROWSER"):
    pytest.skip("no chromium on this machine (.ci/run installs Debian's; TASKKERNEL_REQUIRE_BROWSER=1 makes this a "
                "failure)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api")
IMAGES = ROOT / "docs" / "img"
WAIT_MS = 10_000


@pytest.fixture
def browser() -> Iterator[object]:
    assert CHROMIUM is not None, "TASKKERNEL_REQUIRE_BROWSER is set but chromium is not installed"
    with sync_api.sync_playwright() as p:
        chrome = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            yield chrome
        finally:
            chrome.close()


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


def test_a_card_moves_columns_live_when_the_cli_acts(tmp_path: Path, browser: object) -> None:
    ws = repository_workspace(tmp_path)
    dev = issue(ws, "DEV", "dev-live")
    for i in range(3):
        create(ws, f"groundwork {i}")
    with board(ws) as url:
        page = browser.new_page(viewport={"width": 1400, "height": 800})  # type: ignore[attr-defined]
        page.goto(url)
        page.wait_for_selector("#live-status.on", timeout=WAIT_MS)
        page.evaluate("window.notReloaded = true")
        task = create(ws, "Live card from the CLI")  # another process
        card = f'#col-inbox [data-task-id="{task}"]'
        page.wait_for_selector(card, timeout=WAIT_MS)
        assert page.inner_text('[data-count="inbox"]') == "4"
        assert run("--token", dev, "task", "claim", task, cwd=ws).code == 0
        page.wait_for_selector(f'#col-active [data-task-id="{task}"]', timeout=WAIT_MS)
        assert page.query_selector(card) is None
        assert page.evaluate("window.notReloaded") is True  # moved in place: the page was never reloaded
        IMAGES.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(IMAGES / "board.png"))


def test_approve_is_refused_with_the_grant_hint_then_granted_from_the_page(tmp_path: Path, browser: object) -> None:
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
        page.wait_for_function("document.querySelector('#action-result .outcome').innerText.includes('accepted')",
                               timeout=WAIT_MS)
        page.wait_for_selector("#approve", timeout=WAIT_MS).click()  # the page re-rendered live: a fresh button
        page.wait_for_function("document.querySelector('#task-state').innerText === 'done'", timeout=WAIT_MS)
        assert run("task", "show", task, "--json", cwd=ws).json["state"] == "done"
        page.screenshot(path=str(IMAGES / "task.png"), full_page=True)
