"""The worktrees of a workspace's tasks: ``<workspace>/.taskkernel/worktrees/<TASK-ID>`` on branch
``task/<TASK-ID>``, recorded in the ``worktrees`` table.

- ``ensure``: the task's worktree, created from the base branch on the first run and reused by every later run of
  the task, a crashed run's retry included (a folder git no longer lists is set aside, never written into);
- ``evidence``: at a done report, the worktree's uncommitted changes are committed on the task branch and the diff
  against the base is recorded (commit range, diffstat, the patch as a file under ``.taskkernel/evidence/``);
- ``merge``: on approval, the branch into the base, fast-forward or a merge commit computed without touching any
  checkout (``git merge-tree``); a conflict changes nothing;
- ``archive``: the worktree removed (anything left uncommitted first committed), the branch kept.

One lock file serialises what changes the repository's worktree list or a branch, across threads and processes.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from taskkernel.coordinator.tables import worktrees
from taskkernel.coordinator.worktrees.git import GitError, git, run_git, toplevel
from taskkernel.kernel.canonical import sha256_hex, utc_now_iso
from taskkernel.kernel.private import private_dir
from taskkernel.kernel.store.db import Database

BRANCH_PREFIX = "task/"
FILES_LISTED = 50  # a report's diffstat names at most this many files (the patch file has them all)


@dataclass(frozen=True)
class Worktree:
    task_id: str
    path: Path
    branch: str
    base_branch: str
    base_commit: str
    state: str


@dataclass(frozen=True)
class Merged:
    """What a merge did: ``ok`` with the base's new head, or why not (``conflicts``: the files both changed)."""

    ok: bool
    commit: str | None = None
    message: str = ""
    conflicts: tuple[str, ...] = ()


class Worktrees:
    def __init__(self, db: Database, root: Path) -> None:
        self.db = db
        self.root = root.resolve()
        self.home = self.root / ".taskkernel" / "worktrees"
        self._repo: Path | None | bool = False  # False: not looked up yet

    @property
    def repo(self) -> Path | None:
        """The git work tree the workspace is in (None: not in a repository)."""
        if self._repo is False:
            self._repo = toplevel(self.root)
        return self._repo if isinstance(self._repo, Path) else None

    def get(self, task_id: str, conn: sa.Connection | None = None) -> Worktree | None:
        """The task's worktree record (read in ``conn``, a transaction in progress, when given)."""
        if conn is not None:
            row = conn.execute(sa.select(worktrees).where(worktrees.c.task_id == task_id)).mappings().first()
        else:
            with self.db.read() as own:
                row = own.execute(sa.select(worktrees).where(worktrees.c.task_id == task_id)).mappings().first()
        if row is None:
            return None
        return Worktree(row["task_id"], Path(row["path"]), row["branch"], row["base_branch"], row["base_commit"],
                        row["state"])

    def workdir(self, wt: Worktree, cwd: str | None) -> Path:
        """Where the agent works: the worktree's counterpart of the workspace folder (and of ``cwd`` in it)."""
        assert self.repo is not None
        inner = wt.path / self.root.relative_to(self.repo)
        return inner / cwd if cwd else inner

    # -- creating ------------------------------------------------------------------------------
    def ensure(self, task_id: str, base_branch: str | None) -> Worktree:
        """The task's worktree, made or found. Raises GitError (not_a_repository, base_unknown, git_failed)."""
        repo = self.repo
        if repo is None:
            raise GitError("not_a_repository", f"{self.root} is not inside a git repository")
        with self._locked():
            known = self.get(task_id)
            path, branch = self.home / task_id, f"{BRANCH_PREFIX}{task_id}"
            if path.resolve() in self._listed(repo) and path.is_dir():
                return known if known is not None else self._record(task_id, path, branch, base_branch, repo)
            git(repo, "worktree", "prune")
            if path.exists() or path.is_symlink():  # left by a crash mid-creation, or planted: set aside
                path.rename(path.with_name(f"{task_id}.stale-{utc_now_iso().replace(':', '')}"))
            private_dir(self.home)
            if run_git(repo, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}", ok=(0, 1))[0] == 0:
                git(repo, "worktree", "add", str(path), branch)
                return known if known is not None else self._record(task_id, path, branch, base_branch, repo)
            base = base_branch or (known.base_branch if known else None) or self._current_branch(repo)
            commit = self._commit_of(repo, base)
            git(repo, "worktree", "add", "-b", branch, str(path), commit)
            return self._record(task_id, path, branch, base, repo, commit)

    def _record(self, task_id: str, path: Path, branch: str, base: str | None, repo: Path,
                commit: str | None = None) -> Worktree:
        base = base or self._current_branch(repo)
        commit = commit or self._commit_of(repo, base)
        now = utc_now_iso()
        with self.db.write() as uow:
            uow.conn.execute(worktrees.delete().where(worktrees.c.task_id == task_id))
            uow.conn.execute(worktrees.insert().values(
                task_id=task_id, path=str(path), branch=branch, base_branch=base, base_commit=commit, state="active",
                created_at=now, updated_at=now))
        return Worktree(task_id, path, branch, base, commit, "active")

    # -- evidence ------------------------------------------------------------------------------
    def evidence(self, task_id: str, round_: int, author: str, conn: sa.Connection | None = None
                 ) -> dict[str, Any] | None:
        """The diff a done report records, after committing what the agent left uncommitted; None when the task
        has no worktree. A failure is recorded as ``{"error": ...}``: the report stands, the reviewer sees why."""
        wt = self.get(task_id, conn)
        if wt is None or self.repo is None:
            return None
        try:
            self._commit_pending(wt, f"{task_id} round {round_}: the work of the done report", author)
            head = git(wt.path, "rev-parse", "HEAD")
            base = self._merge_base(wt, head)
            files, added, removed = self._numstat(wt.path, base, head)
            patch = run_git(wt.path, "diff", "--binary", "--no-ext-diff", "--no-textconv", base, head)[1]
            where = self._write_patch(task_id, round_, patch)
            commits = int(git(wt.path, "rev-list", "--count", f"{base}..{head}"))
        except (GitError, OSError, ValueError) as exc:
            return {"error": str(exc)[:500]}
        return {"base": wt.base_branch, "base_commit": base, "head": head, "branch": wt.branch,
                "range": f"{base[:12]}..{head[:12]}", "commits": commits, "files_changed": len(files),
                "insertions": added, "deletions": removed, "files": files[:FILES_LISTED],
                "patch": str(where.relative_to(self.root)), "patch_sha256": sha256_hex(patch.encode("utf-8"))}

    def _commit_pending(self, wt: Worktree, message: str, author: str) -> bool:
        if not wt.path.is_dir():
            raise GitError("git_failed", f"the worktree {wt.path} is missing")
        git(wt.path, "add", "-A")
        if run_git(wt.path, "diff", "--cached", "--quiet", ok=(0, 1))[0] == 0:
            return False
        who = {"GIT_AUTHOR_NAME": author, "GIT_AUTHOR_EMAIL": f"{author}@taskkernel.invalid",
               "GIT_COMMITTER_NAME": "taskkernel", "GIT_COMMITTER_EMAIL": "taskkernel@taskkernel.invalid"}
        git(wt.path, "commit", "--quiet", "--no-verify", "-m", message, env=who)
        return True

    def _merge_base(self, wt: Worktree, head: str) -> str:
        code, out = run_git(wt.path, "merge-base", f"refs/heads/{wt.base_branch}", head, ok=(0, 1, 128))
        return out.strip() if code == 0 and out.strip() else wt.base_commit  # a deleted base: where it was cut

    @staticmethod
    def _numstat(where: Path, base: str, head: str) -> tuple[list[dict[str, Any]], int, int]:
        out = run_git(where, "diff", "--numstat", "-z", "--no-ext-diff", "--no-renames", base, head)[1]
        files, added, removed = [], 0, 0
        for entry in filter(None, out.split("\0")):
            ins, dels, name = entry.split("\t", 2)
            binary = ins == "-"
            files.append({"path": name, "insertions": 0 if binary else int(ins),
                          "deletions": 0 if binary else int(dels), **({"binary": True} if binary else {})})
            added += 0 if binary else int(ins)
            removed += 0 if binary else int(dels)
        return files, added, removed

    def _write_patch(self, task_id: str, round_: int, patch: str) -> Path:
        folder = private_dir(self.root / ".taskkernel" / "evidence" / task_id)
        target = folder / f"round-{round_}.patch"
        temp = folder / f".round-{round_}.{os.getpid()}.tmp"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(patch)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(temp, target)
        return target

    # -- merging and archiving -----------------------------------------------------------------
    def merge(self, task_id: str, subject: str) -> Merged:
        """The task branch into its base, all or nothing. Already merged: ok, nothing done."""
        wt, repo = self.get(task_id), self.repo
        if wt is None or repo is None:
            return Merged(True, message="no worktree")
        with self._locked():
            if wt.path.is_dir():
                self._commit_pending(wt, f"{task_id}: work left uncommitted at approval", "taskkernel")
            head = self._commit_of(repo, wt.branch)
            base_head = self._commit_of(repo, wt.base_branch)
            if self._is_ancestor(repo, head, base_head):
                return self._merged(task_id, base_head, "already in the base")
            if self._is_ancestor(repo, base_head, head):
                new, how = head, "fast-forward"
            else:
                code, out = run_git(repo, "merge-tree", "--write-tree", "--name-only", "--no-messages", base_head,
                                    head, ok=(0, 1))
                lines = out.splitlines()
                if code == 1:
                    return Merged(False, message=f"{wt.branch} does not merge cleanly into {wt.base_branch}",
                                  conflicts=tuple(line for line in lines[1:] if line))
                new = git(repo, "commit-tree", lines[0], "-p", base_head, "-p", head, "-m",
                          f"Merge {wt.branch} into {wt.base_branch}\n\n{task_id}: {subject}",
                          env={"GIT_AUTHOR_NAME": "taskkernel", "GIT_AUTHOR_EMAIL": "taskkernel@taskkernel.invalid",
                               "GIT_COMMITTER_NAME": "taskkernel",
                               "GIT_COMMITTER_EMAIL": "taskkernel@taskkernel.invalid"})
                how = "merge commit"
            holder = self._checked_out(repo, wt.base_branch)
            if holder is not None:  # the base is someone's checkout: move it with its files, or not at all
                code, out = run_git(holder, "merge", "--ff-only", "--quiet", new, ok=(0, 1, 128))
                if code != 0:
                    return Merged(False, message=f"the checkout of {wt.base_branch} at {holder} could not take the "
                                  f"merge (local changes in the files it changes?): {out.strip()[:300]}")
            else:
                git(repo, "update-ref", f"refs/heads/{wt.base_branch}", new, base_head)
            return self._merged(task_id, new, how)

    def _merged(self, task_id: str, commit: str, how: str) -> Merged:
        with self.db.write() as uow:
            uow.conn.execute(worktrees.update().where(worktrees.c.task_id == task_id).values(
                state="merged", merged_commit=commit, updated_at=utc_now_iso()))
        return Merged(True, commit, how)

    def archive(self, task_id: str) -> bool:
        """Remove the task's worktree, keeping its branch (and what was left uncommitted, committed on it)."""
        wt, repo = self.get(task_id), self.repo
        if wt is None or repo is None or wt.state == "archived":
            return False
        with self._locked():
            if wt.path.is_dir():
                self._commit_pending(wt, f"{task_id}: work left in the worktree at archive", "taskkernel")
                git(repo, "worktree", "remove", "--force", str(wt.path))
            git(repo, "worktree", "prune")
            with self.db.write() as uow:
                uow.conn.execute(worktrees.update().where(worktrees.c.task_id == task_id).values(
                    state="archived", updated_at=utc_now_iso()))
        return True

    # -- git reads -----------------------------------------------------------------------------
    @staticmethod
    def _listed(repo: Path) -> dict[Path, str | None]:
        """Worktrees git knows: path -> branch (None: detached)."""
        found: dict[Path, str | None] = {}
        path: Path | None = None
        for line in git(repo, "worktree", "list", "--porcelain").splitlines():
            if line.startswith("worktree "):
                path = Path(line[len("worktree "):]).resolve()
                found[path] = None
            elif line.startswith("branch ") and path is not None:
                found[path] = line[len("branch "):].removeprefix("refs/heads/")
        return found

    def _checked_out(self, repo: Path, branch: str) -> Path | None:
        return next((p for p, b in self._listed(repo).items() if b == branch), None)

    @staticmethod
    def _current_branch(repo: Path) -> str:
        code, out = run_git(repo, "symbolic-ref", "--quiet", "--short", "HEAD", ok=(0, 1, 128))
        if code != 0 or not out.strip():
            raise GitError("base_unknown", f"{repo} has a detached HEAD: set base_branch for the role")
        return out.strip()

    @staticmethod
    def _commit_of(repo: Path, branch: str) -> str:
        code, out = run_git(repo, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}^{{commit}}",
                            ok=(0, 1, 128))
        if code != 0:
            raise GitError("base_unknown", f"branch {branch!r} has no commit in {repo}")
        return out.strip()

    @staticmethod
    def _is_ancestor(repo: Path, older: str, newer: str) -> bool:
        return run_git(repo, "merge-base", "--is-ancestor", older, newer, ok=(0, 1))[0] == 0

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        private_dir(self.home)
        fd = os.open(self.home / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)
