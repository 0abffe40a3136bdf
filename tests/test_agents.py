"""Coding agent CLIs as runners (issue 14): the presets for Claude Code, Codex and Gemini CLI, one git worktree per
task, the diff as the done report's evidence, merge on approval. Real git, real `taskkernel` processes, and
stand-ins for the three CLIs (tests/procs/agent_cli.py) that take the prompt, the MCP configuration and the flags
the way the real ones do, talk to the kernel through the official MCP SDK client and print each CLI's documented
JSON output."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.agents_support import Team, git, role
from tests.cli_support import run_tty

SECRETS = {"PGPASSWORD": "secret-pg-password", "AWS_SECRET_ACCESS_KEY": "secret-aws", "GITHUB_TOKEN": "secret-gh"}


def test_each_preset_runs_its_cli_headless_with_the_kernel_mcp_server_and_records_usage_and_the_diff(
        tmp_path: Path) -> None:
    """DEV on Claude Code, QA on Codex, OPS on Gemini CLI, one task each: every CLI gets its documented
    flags, the prompt built from the task on stdin, the kernel's MCP server with the run's token file and the
    workspace named; it edits its own worktree, reports done and submits through MCP; usage (and Claude's cost)
    is read from its JSON; the done report carries the diff; no database URL or secret reaches the agent."""
    team = Team(tmp_path, f"\n[roles.DEV]\n{role('claude-code', model='sonnet', allowed_tools=['Bash(pytest:*)'])}"
                          f"\n[roles.QA]\n{role('codex', model='gpt-5-codex')}\n[roles.OPS]\n{role('gemini-cli')}")
    body = ("Add the greeting.\nwrite hello.txt hello from {cli}\n\n## 验收标准\n- hello.txt says hello\n\n"
            "## Notes\nnone")
    tasks = {cli: team.task(r, f"Greeting by {cli}", body.format(cli=cli))
             for cli, r in (("claude", "DEV"), ("codex", "QA"), ("gemini", "OPS"))}
    database = f"sqlite:///{team.root / '.taskkernel' / 'kernel.db'}"  # the coordinator's, given as a variable
    team.up(env={**SECRETS, "TASKKERNEL_DB": database, "ANTHROPIC_API_KEY": "anthropic-key",
                 "CODEX_API_KEY": "codex-key", "GEMINI_API_KEY": "gemini-key"})
    workspace = str(team.root)
    for cli, task_id in tasks.items():
        [record] = team.runs_of(task_id)
        wt = team.worktree(task_id)
        argv, env = record["argv"], record["env"]
        server = record["server"]
        assert server["command"] == sys.executable
        assert server["args"][:6] == ["-P", "-m", "taskkernel", "--workspace", workspace, "--token-file"]
        assert server["args"][-1] == "mcp" and Path(server["args"][6]).parent.parent.parent.name == "runs"
        assert not Path(server["args"][6]).exists(), "the token file is removed when the run ends"
        assert env["TASKKERNEL_WORKSPACE"] == workspace and env["TASKKERNEL_WORKDIR"] == str(wt)
        assert record["cwd"] == str(wt)
        assert not any(k in env for k in [*SECRETS, "TASKKERNEL_DB"]), env
        assert not any("secret" in v or "kernel.db" in v for v in env.values()), env
        prompt = record["prompt"]
        assert f"Greeting by {cli}" in prompt and "write hello.txt" in prompt
        assert "- hello.txt says hello" in prompt.split("## Acceptance criteria")[1].split("##")[0]
        assert "`report`" in prompt and "submit_task" in prompt
        if cli == "claude":
            assert argv == ["-p", "--output-format", "stream-json", "--verbose", "--permission-mode", "acceptEdits",
                            "--mcp-config", argv[7], "--strict-mcp-config", "--allowedTools",
                            "mcp__taskkernel,Bash(pytest:*)", "--model", "sonnet"]
            assert env["ANTHROPIC_API_KEY"] == "anthropic-key" and "CODEX_API_KEY" not in env
        elif cli == "codex":
            assert argv[:7] == ["exec", "--json", "--skip-git-repo-check", "--cd", str(wt), "--sandbox",
                                "workspace-write"]
            assert 'mcp_servers.taskkernel.default_tools_approval_mode="approve"' in argv
            assert "mcp_optional_startup_grace_ms=15000" in argv, "Codex waits for the kernel's tools"
            assert argv[-2:] == ["--model", "gpt-5-codex"] and env["CODEX_API_KEY"] == "codex-key"
        else:
            assert argv == ["--output-format", "json", "--skip-trust", "--approval-mode", "auto_edit",
                            "--allowed-mcp-server-names", "taskkernel"]
            assert record["server"] is not None, "the settings in the run's GEMINI_CLI_HOME name the server"
            home = Path(env["GEMINI_CLI_HOME"])
            assert home.parent.parent.parent.name == "runs" and home.stat().st_mode & 0o077 == 0
            settings = json.loads((home / ".gemini" / "settings.json").read_text())
            assert settings["security"]["auth"]["selectedType"] == "gemini-api-key"
            assert env["GEMINI_API_KEY"] == "gemini-key"
        doc = team.show(task_id)
        assert doc["state"] == "review", doc
        [report] = doc["reports"]
        diff = report["diff"]
        assert (diff["files_changed"], diff["insertions"], diff["deletions"]) == (1, 1, 0), diff
        assert diff["files"] == [{"path": "hello.txt", "insertions": 1, "deletions": 0}]
        assert diff["base"] == "main" and diff["branch"] == f"task/{task_id}" and diff["commits"] == 1
        patch = (team.root / diff["patch"]).read_text()
        assert f"+hello from {cli}" in patch
        assert git(team.root, "log", "-1", "--format=%s", f"task/{task_id}").startswith(f"{task_id} round 1")
    assert not (team.root / "hello.txt").exists(), "the base checkout is untouched"
    usage = team.ok("usage", "--by", "task")
    figures = {row["owner"]: row for row in usage["rows"]}
    claude, codex, gemini = (figures[tasks[c]] for c in ("claude", "codex", "gemini"))
    assert (claude["tokens_in"], claude["tokens_out"], claude["cost_usd"]) == (150, 7, pytest.approx(0.0123))
    assert (codex["tokens_in"], codex["tokens_out"], codex["cost_usd"]) == (500, 30, 0)
    assert (gemini["tokens_in"], gemini["tokens_out"], gemini["cost_usd"]) == (24939, 174, 0)


def worktrees_of(root: Path) -> list[str]:
    return [line.split(" ", 1)[1] for line in git(root, "worktree", "list", "--porcelain").splitlines()
            if line.startswith("worktree ")]


def test_parallel_tasks_edit_one_file_in_their_own_worktrees_then_merge_or_come_back_with_merge_conflict(
        tmp_path: Path) -> None:
    """Two DEV tasks at once write shared.txt, each in its own worktree. Approving the first merges it into main
    (the checkout moves with it); the second no longer merges: nothing of it reaches main, and it goes back to
    work (a new round) with a blocked report `merge_conflict`, which the next run's prompt explains."""
    team = Team(tmp_path, f"\n[roles.DEV]\n{role('claude-code', concurrency=2, on_approve='merge')}")
    a = team.task("DEV", "Shared from A", "write shared.txt from A")
    b = team.task("DEV", "Shared from B", "write shared.txt from B")
    team.up()
    [run_a], [run_b] = team.runs_of(a), team.runs_of(b)
    assert run_a["started"] < run_b["ended"] and run_b["started"] < run_a["ended"], "the two ran at once"
    assert run_a["cwd"] != run_b["cwd"]
    assert (team.worktree(a) / "shared.txt").read_text() == "from A\n"
    assert (team.worktree(b) / "shared.txt").read_text() == "from B\n"
    assert (team.root / "shared.txt").read_text() == "base\n"
    for task_id, text in ((a, "A"), (b, "B")):
        [report] = team.show(task_id)["reports"]
        assert report["diff"]["files"] == [{"path": "shared.txt", "insertions": 1, "deletions": 1}]
        assert f"+from {text}" in (team.root / report["diff"]["patch"]).read_text()

    team.ok("task", "approve", a)
    team.up()
    assert (team.root / "shared.txt").read_text() == "from A\n", "merged, and the base's checkout moved with it"
    merged = git(team.root, "rev-parse", "main")
    assert git(team.root, "rev-parse", f"task/{a}") == merged, "a fast-forward"

    team.ok("task", "approve", b)
    team.up()
    assert git(team.root, "rev-parse", "main") == merged and (team.root / "shared.txt").read_text() == "from A\n"
    assert git(team.root, "status", "--porcelain", "--untracked-files=no") == "", "nothing half-merged"
    doc = team.show(b)
    reopened = [h for h in doc["history"] if h["type"] == "task_reopened"]
    assert len(reopened) == 1 and reopened[0]["reason"].startswith("merge_conflict: "), doc["history"]
    assert "shared.txt" in reopened[0]["reason"]
    blocked = [r for r in doc["reports"] if r["status"] == "blocked"]
    assert [(r["round"], r["by"]) for r in blocked] == [(2, "DEV:coordinator")]
    rework = team.runs_of(b)[-1]
    assert len(team.runs_of(b)) == 2 and "This round is a rework" in rework["prompt"]
    assert "merge_conflict" in rework["prompt"] and rework["cwd"] == str(team.worktree(b))


def test_a_crashed_run_leaves_its_worktree_to_the_retry_and_archive_keeps_the_branch(tmp_path: Path) -> None:
    """The first attempt writes a file and dies; the retry works in the same worktree (one worktree for the
    task, the file still there) and its done report's diff holds both attempts' work. Archive removes the
    worktree and keeps the branch; on_approve = "keep" merges nothing."""
    team = Team(tmp_path, f"\n[roles.DEV]\n{role('codex')}")
    task = team.task("DEV", "Survive a crash", "crash-once\nwrite result.txt done")
    team.up()
    first, second = team.runs_of(task)
    assert first["ended"] is None and second["ended"] is not None
    assert first["cwd"] == second["cwd"] == str(team.worktree(task))
    assert worktrees_of(team.root).count(str(team.worktree(task))) == 1
    assert not list((team.root / ".taskkernel" / "worktrees").glob("*.stale-*"))
    doc = team.show(task)
    assert doc["state"] == "review"
    [report] = doc["reports"]
    assert {f["path"] for f in report["diff"]["files"]} == {"crash.txt", "result.txt"}
    shown = run_tty("task", "show", task, cwd=team.root).out  # what a person reads: the diffstat under the reports
    assert f"diff of {report['report_id']} (task/{task} against main, {report['diff']['range']}): 2 file(s) " \
           "changed, +2 -0" in shown and "  crash.txt | +1 -0" in shown and "  result.txt | +1 -0" in shown
    before = git(team.root, "rev-parse", "main")
    team.ok("task", "approve", task)
    team.ok("task", "archive", task)
    team.up()
    assert not team.worktree(task).exists() and str(team.worktree(task)) not in worktrees_of(team.root)
    assert git(team.root, "rev-parse", "--verify", f"task/{task}")
    assert git(team.root, "rev-parse", "main") == before, "on_approve = keep: the base is untouched"


def test_the_merge_is_the_reviewed_commit_of_the_approved_round_and_a_reopened_task_merges_again(
        tmp_path: Path) -> None:
    """What the reviewer approved is what reaches the base: not a file written after the report, not anything
    once the task was reopened after its approval (a late merge effect), and a reopened task that was merged
    before merges its new round when approved again."""
    team = Team(tmp_path, f"\n[roles.DEV]\n{role('claude-code', on_approve='merge')}")
    task = team.task("DEV", "Versioned", "stamp version.txt\nafter-report write late.txt unreviewed")
    team.up()
    team.ok("task", "approve", task)
    team.up()
    assert (team.root / "version.txt").read_text() == "round 1\n"
    assert "late.txt" not in git(team.root, "ls-tree", "--name-only", "main"), "written after the report"
    team.ok("task", "reopen", task, "--reason", "one more change")
    team.up()  # round 2: the agent works again in the same worktree
    assert team.show(task)["state"] == "review" and team.show(task)["round"] == 2
    team.ok("task", "approve", task)
    team.ok("task", "reopen", task, "--reason", "not yet")  # before any coordinator ran the approval's merge
    skipped = team.up()
    assert (team.root / "version.txt").read_text() == "round 1\n", "a reopened task's old approval merges nothing"
    assert "worktree_merge_skipped" in skipped.stderr
    team.ok("task", "approve", task)
    team.up()
    assert (team.root / "version.txt").read_text() == "round 3\n", "merged again after a reopen"
    assert "late.txt" in git(team.root, "ls-tree", "--name-only", "main"), "reported in round 2, merged now"


def test_what_an_agent_writes_into_its_worktree_cannot_redirect_git_or_the_mcp_server(tmp_path: Path) -> None:
    """The agent removes its worktree's .git file (git would then find the user's own repository), writes a
    Latin-1 file and plants a `taskkernel` package in its folder, then crashes; the retry runs the kernel's real MCP
    server (the planted one never runs), the diff is taken through the worktree's recorded git folder (the
    user's checkout and its uncommitted edit are untouched) and holds the non-UTF-8 file."""
    team = Team(tmp_path, f"\n[roles.DEV]\n{role('gemini-cli')}")
    (team.root / "README.md").write_text("the user's own unfinished edit\n")
    planted = tmp_path / "planted-ran"
    body = ("write taskkernel/__init__.py \n"
            f"write taskkernel/__main__.py open({str(planted)!r}, 'w').write('x')\n"
            "delete .git\nlatin1 menu.txt\nwrite feature.txt hello\ncrash-once")
    task = team.task("DEV", "Hostile", body)
    main_before = git(team.root, "rev-parse", "main")
    team.up()
    assert not planted.exists(), "the planted package never ran as the MCP server"
    doc = team.show(task)
    assert doc["state"] == "review", doc
    [report] = doc["reports"]
    diff = report["diff"]
    assert {f["path"] for f in diff["files"]} == {"taskkernel/__init__.py", "taskkernel/__main__.py", "menu.txt",
                                                  "feature.txt", "crash.txt"}, diff
    assert b"caf\xe9" in (team.root / diff["patch"]).read_bytes()
    assert git(team.root, "rev-parse", "main") == main_before
    assert (team.root / "README.md").read_text() == "the user's own unfinished edit\n"
    assert git(team.root, "status", "--porcelain", "README.md") == "M README.md", "the user's edit, not staged"


def test_a_worktree_whose_creation_was_cut_short_is_made_again_not_reused(tmp_path: Path) -> None:
    """A `git worktree add` killed half way leaves a locked, half-checked-out worktree git still lists: it is set
    aside and made again from the task branch, so the diff holds the agent's change, not a deleted checkout."""
    team = Team(tmp_path, f"\n[roles.DEV]\n{role('claude-code')}")
    task = team.task("DEV", "After a cut", "write feature.txt hello")
    half = team.worktree(task)
    half.parent.mkdir(parents=True)
    git(team.root, "worktree", "add", "--lock", "--no-checkout", "-b", f"task/{task}", str(half))
    team.up()
    [report] = team.show(task)["reports"]
    assert report["diff"]["files"] == [{"path": "feature.txt", "insertions": 1, "deletions": 0}], report["diff"]
    assert (half / "README.md").exists(), "a full checkout"
    assert len(list(half.parent.glob(f"{task}.stale-*"))) == 1, "the half-made folder was set aside, not deleted"


def test_a_refused_done_report_commits_nothing_in_the_worktree(tmp_path: Path) -> None:
    """The diff is prepared before the report's transaction, but only for a caller that may report on the task:
    another role's done report on it is refused and leaves the agent's uncommitted work as it was."""
    team = Team(tmp_path, f"\n[roles.DEV]\n{role('claude-code', max_attempts=1)}")
    task = team.task("DEV", "Left half done", "crash-once")
    team.up()  # the only attempt crashes: the task is blocked, crash.txt uncommitted in its worktree
    wt = team.worktree(task)
    head = git(wt, "rev-parse", "HEAD")
    assert git(wt, "status", "--porcelain") == "?? crash.txt"
    issued = team.cli("token", "issue", "QA")
    assert issued.returncode == 0, issued.stderr
    qa = issued.stdout.strip()
    refused = team.cli("task", "report", task, "--status", "done", "--body", "mine now", "--json",
                       env={"TASKKERNEL_TOKEN": qa})
    assert refused.returncode == 2 and json.loads(refused.stdout)["reason"] == "role_not_authorized", refused.stdout
    assert git(wt, "rev-parse", "HEAD") == head and git(wt, "status", "--porcelain") == "?? crash.txt"
    team.ok("task", "report", task, "--status", "done", "--body", "finished by hand")
    done = [r for r in team.show(task)["reports"] if r["status"] == "done"]
    assert [f["path"] for f in done[0]["diff"]["files"]] == ["crash.txt"]


def test_what_a_diff_records_stands_and_a_merge_needs_a_recorded_diff(tmp_path: Path) -> None:
    """A later done report that is refused (stale revision) leaves the accepted report's patch file as it was; a
    report taken while git was busy records the error, and approving it sends the task back to work
    (`merge_failed`) instead of merging nothing silently; a worktree rewired to another task's git folder, or
    left on a detached head, is reused as it is and costs the other task nothing."""
    team = Team(tmp_path, f"\n[roles.DEV]\n{role('claude-code', on_approve='merge', max_attempts=1, concurrency=2)}")
    a = team.task("DEV", "First", "write a.txt one")
    b = team.task("DEV", "Second", "write b.txt two")
    team.up()
    [report] = team.show(a)["reports"]
    patch = team.root / report["diff"]["patch"]
    accepted = patch.read_bytes()
    (team.worktree(a) / "a.txt").write_text("changed after the report\n")
    stale = team.cli("task", "report", a, "--status", "done", "--body", "again", "--expect-rev", "1", "--json")
    assert json.loads(stale.stdout)["reason"] == "stale_task_revision", stale.stdout
    assert patch.read_bytes() == accepted and team.show(a)["reports"][0]["diff"]["patch"] == report["diff"]["patch"]

    b_git = team.show(b)["reports"][0]["diff"]
    assert b_git["files"][0]["path"] == "b.txt"
    b_admin = (team.worktree(b) / ".git").read_text().split(": ", 1)[1].strip()
    (team.worktree(a) / ".git").write_text(f"gitdir: {b_admin}\n")  # a points itself at b's git folder
    git(team.worktree(b), "checkout", "-q", "--detach")
    (team.worktree(b) / "untracked.txt").write_text("b's unfinished work\n")
    team.ok("task", "reject", a, "--reason", "again")
    team.ok("task", "reject", b, "--reason", "again")
    team.up()
    assert not list((team.root / ".taskkernel" / "worktrees").glob("*.stale-*")), "nothing was set aside"
    b_round2 = [r for r in team.show(b)["reports"] if r["round"] == 2][0]["diff"]
    assert "untracked.txt" in {f["path"] for f in b_round2["files"]}, b_round2

    lock = Path(b_admin) / "index.lock"
    (team.worktree(b) / "late.txt").write_text("x\n")
    team.ok("task", "reject", b, "--reason", "once more")
    lock.write_text("")  # git is busy in b's worktree while the owner reports
    by_hand = team.cli("task", "report", b, "--status", "done", "--body", "by hand", "--submit", "--json")
    lock.unlink()
    assert by_hand.returncode == 0, by_hand.stdout + by_hand.stderr
    [busy] = [r for r in team.show(b)["reports"] if r["round"] == 3]
    assert "error" in busy["diff"] and "index.lock" in busy["diff"]["error"], busy
    team.ok("task", "approve", b)
    team.up()  # the merge finds no diff: back to work, and the agent's next round reports (and diffs) again
    doc = team.show(b)
    reopened = [h for h in doc["history"] if h["type"] == "task_reopened"]
    assert reopened and reopened[-1]["reason"].startswith("merge_failed: the approved report recorded no diff"), doc
    assert "late.txt" not in git(team.root, "ls-tree", "--name-only", "main")
    assert doc["state"] == "review" and "late.txt" in {f["path"] for f in doc["reports"][-1]["diff"]["files"]}
