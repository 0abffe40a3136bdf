"""The worktree manager on a real repository, where a process test cannot stop it at the right moment: an archive
cut short after it committed the leftovers and began removing files is finished, never committed as deletions."""

from __future__ import annotations

from pathlib import Path

from tests.agents_support import git, worktrees_in_repository


def test_an_archive_cut_short_while_removing_files_commits_no_deletions(tmp_path: Path) -> None:
    trees, root = worktrees_in_repository(tmp_path)
    wt = trees.ensure("TASK-20261201-001", None)
    (wt.path / "work.txt").write_text("left uncommitted\n")
    trees._commit_pending(wt, "leftovers", "taskkernel")  # the archive, cut short: its first step done
    trees._set_state(wt.task_id, "archiving")
    tip = git(root, "rev-parse", wt.branch)
    (wt.path / "README.md").unlink()  # `git worktree remove` deletes files before its own records: killed here
    assert trees.archive(wt.task_id)
    assert git(root, "rev-parse", wt.branch) == tip, "the half-removed checkout was not committed as deletions"
    assert "README.md" in git(root, "ls-tree", "--name-only", wt.branch).split()
    assert not wt.path.exists() and trees.get(wt.task_id).state == "archived"  # type: ignore[union-attr]
