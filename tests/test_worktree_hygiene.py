"""Worktrees commit what the repository would track (issue 25, item 5): build caches and environments an agent's
tools leave are never committed or merged, a binary file is recorded as "binary, N bytes" (never base85 patch
text), a run that changed nothing commits nothing, and `doctor` is green after a team ran in worktrees. Real git
and real `taskkernel` processes, with the stand-in agent CLIs (tests/procs/agent_cli.py)."""

from __future__ import annotations

import json
from pathlib import Path

from taskkernel.coordinator.config import DEFAULT_EXCLUDES, ConfigError, parse_config
from taskkernel.coordinator.worktrees.manager import Worktrees
from tests.agents_support import Team, git, role, worktrees_in_repository

CACHES = ("write __pycache__/app.cpython-311.pyc cached\nwrite pkg/__pycache__/mod.cpython-311.pyc cached\n"
          "write .pytest_cache/v/cache/lastfailed {}\nwrite .venv/bin/activate venv\n"
          "write node_modules/left-pad/index.js module\nwrite app.egg-info/PKG-INFO info\n")


def test_caches_an_agent_leaves_are_neither_committed_nor_merged_but_a_tracked_one_stays_tracked(
        tmp_path: Path) -> None:
    team = Team(tmp_path, f"\n[roles.DEV]\n{role('claude-code', on_approve='merge')}")
    (team.root / "vendored" / "__pycache__").mkdir(parents=True)
    (team.root / "vendored" / "__pycache__" / "kept.pyc").write_text("tracked on purpose\n")
    git(team.root, "add", "-f", "vendored")
    git(team.root, "commit", "-q", "-m", "a tracked cache file")
    task_id = team.task("DEV", "Greeting", f"{CACHES}write hello.txt hello\n"
                                           "write vendored/__pycache__/kept.pyc changed on purpose")
    team.up()
    [report] = team.show(task_id)["reports"]
    diff = report["diff"]
    assert sorted(f["path"] for f in diff["files"]) == ["hello.txt", "vendored/__pycache__/kept.pyc"], diff
    committed = git(team.root, "ls-tree", "-r", "--name-only", f"task/{task_id}").split("\n")
    assert not any("__pycache__/app" in p or "node_modules" in p or ".venv" in p or "egg-info" in p
                   or ".pytest_cache" in p for p in committed), committed
    assert (team.worktree(task_id) / "node_modules" / "left-pad" / "index.js").exists(), "left in the worktree"
    team.ok("task", "approve", task_id)
    team.up()
    on_main = git(team.root, "ls-tree", "-r", "--name-only", "main").split("\n")
    assert "hello.txt" in on_main and "vendored/__pycache__/kept.pyc" in on_main
    assert not any("node_modules" in p or "app.cpython" in p for p in on_main), on_main
    assert (team.root / "vendored" / "__pycache__" / "kept.pyc").read_text() == "changed on purpose\n"


def test_a_run_that_only_ran_the_tests_commits_nothing(tmp_path: Path) -> None:
    """A QA check leaves only caches: its done report records no commit and no file, its branch stays at the
    base, and archiving its worktree commits nothing either."""
    team = Team(tmp_path, f"\n[roles.QA]\n{role('codex')}")
    base = git(team.root, "rev-parse", "main")
    task_id = team.task("QA", "Run the tests", CACHES)
    team.up()
    diff = team.show(task_id)["reports"][0]["diff"]
    assert (diff["commits"], diff["files_changed"], diff["files"]) == (0, 0, []), diff
    assert git(team.root, "rev-parse", f"task/{task_id}") == base
    team.ok("task", "approve", task_id)
    team.ok("task", "archive", task_id)
    team.up()
    assert not team.worktree(task_id).exists()
    assert git(team.root, "rev-parse", f"task/{task_id}") == base, "the archive committed the caches"


def test_a_binary_file_is_recorded_as_binary_with_its_size_never_as_patch_text(tmp_path: Path) -> None:
    team = Team(tmp_path, f"\n[roles.DEV]\n{role('claude-code')}")
    # the agent's own git writes a tar archive (NUL bytes: binary to git) into its worktree
    task_id = team.task("DEV", "Bundle", "write assets/notes.txt notes\n"
                                         "git archive --format=tar -o assets/bundle.tar HEAD")
    team.up()
    diff = team.show(task_id)["reports"][0]["diff"]
    size = (team.worktree(task_id) / "assets" / "bundle.tar").stat().st_size
    assert {"path": "assets/bundle.tar", "insertions": 0, "deletions": 0, "binary": True, "bytes": size} in \
        diff["files"], diff
    patch = (team.root / diff["patch"]).read_bytes()
    assert b"Binary files /dev/null and b/assets/bundle.tar differ" in patch
    assert b"GIT binary patch" not in patch and b"+notes" in patch
    shown = team.cli("task", "show", task_id)
    assert shown.returncode == 0 and "assets/bundle.tar" in shown.stdout + shown.stderr


def test_doctor_is_green_after_a_team_ran_in_worktrees(tmp_path: Path) -> None:
    """The checkouts under .taskkernel/worktrees/ are the agents' files (0644, symlinks the repository tracks):
    not private state. What is private still is: a run log or patch opened to others fails."""
    team = Team(tmp_path, f"\n[roles.DEV]\n{role('claude-code')}")
    task_id = team.task("DEV", "Greeting", f"{CACHES}write hello.txt hello")
    team.up()
    assert team.worktree(task_id).is_dir()
    (team.worktree(task_id) / "link").symlink_to("hello.txt")
    doctor = team.cli("doctor", "--json", env={"ANTHROPIC_API_KEY": "key"})
    assert doctor.returncode == 0, doctor.stdout
    checks = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}
    assert checks["permissions"]["status"] == "ok"
    patch = team.root / team.show(task_id)["reports"][0]["diff"]["patch"]
    assert patch.stat().st_mode & 0o777 == 0o600
    patch.chmod(0o644)
    doctor = team.cli("doctor", "--json", env={"ANTHROPIC_API_KEY": "key"})
    assert doctor.returncode == 2
    files = json.loads(doctor.stdout)["checks"][1]["files"]
    assert [f["path"] for f in files] == [str(patch.relative_to(team.root))]


def test_configured_excludes_add_to_the_defaults_and_may_drop_one(tmp_path: Path) -> None:
    config = parse_config('[worktrees]\nexclude = ["*.log", "build/"]\ndrop_defaults = ["node_modules/"]\n')
    patterns = config.worktrees.patterns()
    assert patterns[-2:] == ["*.log", "build/"] and "node_modules/" not in patterns and "__pycache__/" in patterns
    trees, root = worktrees_in_repository(tmp_path)
    trees = Worktrees(trees.db, root, exclude=patterns)
    wt = trees.ensure("TASK-20261201-001", None)
    for name in ("run.log", "build/out.o", "node_modules/m/index.js", "__pycache__/a.pyc", "kept.txt"):
        (wt.path / name).parent.mkdir(parents=True, exist_ok=True)
        (wt.path / name).write_text("x\n")
    diff = trees.evidence(wt, 1, "dev-agent")
    assert sorted(f["path"] for f in diff["files"]) == ["kept.txt", "node_modules/m/index.js"], diff
    assert Worktrees(trees.db, root).exclude == DEFAULT_EXCLUDES  # no list given: the defaults


def test_a_binary_file_the_change_deletes_is_sized_as_the_base_had_it(tmp_path: Path) -> None:
    trees, root = worktrees_in_repository(tmp_path)
    (root / "logo.bin").write_bytes(b"\x00\x01" * 50)
    git(root, "add", "logo.bin")
    git(root, "commit", "-q", "-m", "a binary file")
    wt = trees.ensure("TASK-20261201-001", None)
    (wt.path / "logo.bin").unlink()
    (wt.path / "new*name.bin").write_bytes(b"\x00" * 7)  # a name that is a glob: looked up literally
    diff = trees.evidence(wt, 1, "dev-agent")
    assert {"path": "logo.bin", "insertions": 0, "deletions": 0, "binary": True, "bytes": 100,
            "deleted": True} in diff["files"], diff
    assert {"path": "new*name.bin", "insertions": 0, "deletions": 0, "binary": True, "bytes": 7} in diff["files"]


def test_an_exclude_pattern_that_would_change_the_ignore_file_is_refused() -> None:
    for bad, said in (('["a\\nb"]', "line break"), ('["#x"]', "comment"), ('[" a"]', "surrounding spaces")):
        try:
            parse_config(f"[worktrees]\nexclude = {bad}\n")
        except ConfigError as exc:
            assert said in exc.message and exc.problems[0].table == "worktrees", exc.message
        else:
            raise AssertionError(bad)
    try:
        parse_config('[worktrees]\ndrop_defaults = ["node_module/"]\n')
    except ConfigError as exc:
        assert "did you mean 'node_modules/'?" in exc.message, exc.message
    else:
        raise AssertionError("an unknown default")
