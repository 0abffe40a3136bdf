"""`taskkernel init --agents claude-code|codex|gemini-cli` writes a team that runs as soon as the CLI is on PATH
(issue 25, item 6), and `doctor` says what is still missing for each runner: the CLI on PATH (fail), a credential
variable (warn). Real `taskkernel` processes, with the stand-in CLIs first on PATH (tests/procs/agent_cli.py)."""

from __future__ import annotations

import json
import os
import shutil
import tomllib
from pathlib import Path
from typing import Any

from taskkernel.coordinator.agent_profiles import builtin_profiles
from tests.agents_support import Team, git
from tests.cli_support import run, taskkernel


def agents_team(tmp_path: Path, cli: str) -> Team:
    """A git repository whose taskkernel.toml is the one `init --agents <cli>` writes, committed unedited."""
    team = Team(tmp_path, "")
    (team.root / "taskkernel.toml").unlink()
    init = team.cli("init", ".", "--agents", cli, "--json")
    assert init.returncode == 0, init.stderr
    assert json.loads(init.stdout)["runners"] == {r: cli for r in ("PM", "DEV", "QA", "OPS")}
    git(team.root, "commit", "-q", "-am", f"init --agents {cli}")
    return team


def doctor_checks(cwd: Path, env: dict[str, str]) -> tuple[int, dict[str, dict[str, Any]]]:
    done = taskkernel("doctor", "--json", cwd=cwd, env=env)
    return done.returncode, {c["name"]: c for c in json.loads(done.stdout)["checks"]}


def no_credentials(name: str) -> dict[str, str]:
    """Every variable that could authenticate the CLI, emptied (whatever the machine running the tests has)."""
    profile = builtin_profiles()[name]
    return {n: "" for n in (*profile.credential_vars, *profile.switched_vars)}


def test_init_agents_claude_code_runs_dev_without_editing_the_file(tmp_path: Path) -> None:
    team = agents_team(tmp_path, "claude-code")
    written = tomllib.loads((team.root / "taskkernel.toml").read_text())
    assert written["roles"]["DEV"] == {"runner": "claude-code", "timeout": 1800, "on_approve": "merge"}
    task_id = team.task("DEV", "Greeting", "write hello.txt hello")
    team.up(env={"ANTHROPIC_API_KEY": "key"})
    [record] = team.runs_of(task_id)
    assert record["cli"] == "claude" and record["cwd"] == str(team.worktree(task_id))
    doc = team.show(task_id)
    assert doc["state"] == "review" and doc["authority"]["done_authority"] == "ADMIN", doc  # the person decides
    team.ok("task", "approve", task_id)
    team.up()
    assert git(team.root, "show", "main:hello.txt") == "hello"


def test_doctor_names_the_cli_missing_from_path_and_a_credential_not_set(tmp_path: Path) -> None:
    team = agents_team(tmp_path, "claude-code")
    bare = tmp_path / "no-cli"
    bare.mkdir()
    git_dir = os.path.dirname(shutil.which("git") or "/usr/bin/git")
    code, checks = doctor_checks(team.root, {"PATH": f"{bare}{os.pathsep}{git_dir}"})
    assert code == 2 and checks["runner DEV"]["status"] == "fail"
    assert "'claude' (the claude-code CLI) is not on the agent's PATH" in checks["runner DEV"]["message"]
    empty = no_credentials("claude-code")
    code, checks = doctor_checks(team.root, team.env(**empty))
    assert code == 0 and checks["runner DEV"]["status"] == "warn", checks["runner DEV"]
    assert "ANTHROPIC_API_KEY" in checks["runner DEV"]["message"] and checks["runner DEV"]["credentials_set"] == []
    code, checks = doctor_checks(team.root, team.env(**{**empty, "CLAUDE_CODE_OAUTH_TOKEN": "token"}))
    assert code == 0 and checks["runner DEV"]["status"] == "ok"
    assert checks["runner DEV"]["credentials_set"] == ["CLAUDE_CODE_OAUTH_TOKEN"]


def test_init_agents_outside_git_writes_a_team_that_works_in_the_workspace(tmp_path: Path) -> None:
    """No git repository: no merge on approval (which `up` would refuse), every role shared; for the solo team
    its one role; an existing taskkernel.toml is never changed, the note says what to add."""
    root = tmp_path / "plain"
    assert run("init", str(root), "--agents", "gemini-cli", "--team", "solo", cwd=tmp_path).code == 0
    written = tomllib.loads((root / "taskkernel.toml").read_text())
    assert written["roles"] == {"ME": {"runner": "gemini-cli", "timeout": 1800}}
    assert run("task", "list", cwd=root).code == 0  # every command checks the file: it is valid as written
    other = tmp_path / "existing"
    other.mkdir()
    (other / "taskkernel.toml").write_text("[kernel]\ndurability = \"full\"\n")
    again = run("init", str(other), "--agents", "codex", "--json", cwd=tmp_path)
    assert again.code == 0 and (other / "taskkernel.toml").read_text() == "[kernel]\ndurability = \"full\"\n"
    assert again.json["runners"] == {}
    assert '[roles.DEV]\nrunner = "codex"' in again.err, again.err


def test_doctor_fails_a_gemini_runner_whose_cli_would_refuse_its_configuration(tmp_path: Path) -> None:
    """Gemini CLI runs with a configuration home of its own: without an API key (or Vertex AI) no login is there
    and it would exit 41. doctor says so before a run does."""
    team = agents_team(tmp_path, "gemini-cli")
    empty = no_credentials("gemini-cli")
    code, checks = doctor_checks(team.root, team.env(**empty))
    assert code == 2 and checks["runner DEV"]["status"] == "fail", checks["runner DEV"]
    assert "GEMINI_API_KEY" in checks["runner DEV"]["message"] and "41" in checks["runner DEV"]["message"]
    code, checks = doctor_checks(team.root, team.env(**{**empty, "GEMINI_API_KEY": "key"}))
    assert code == 0 and checks["runner DEV"]["status"] == "ok", checks["runner DEV"]
