"""The worktrees of a workspace's tasks: ``<workspace>/.taskkernel/worktrees/<TASK-ID>`` on branch
``task/<TASK-ID>``, recorded in the ``worktrees`` table.

- ``ensure``: the task's worktree, created from the base branch on the first run and reused by every later run of
  the task, a crashed run's retry included. Only a worktree this table recorded, that git lists unlocked, is
  reused; anything else at its path (a creation cut short, a folder planted) is set aside and the worktree made
  again from the task branch, never written into.
- ``evidence``: at a done report, the worktree's uncommitted changes are committed on the task branch and the diff
  against the base is recorded (commit range, diffstat with each binary file's size, the patch as a file under
  ``.taskkernel/evidence/``, binary files named in it, never encoded); what is committed is what the repository
  would track, less build caches and environments (``exclude``, read by git as its ``core.excludesFile``), so a
  run that only ran the tests commits nothing;
- ``merge``: on approval, exactly the commit the approved report recorded, into the base: a fast-forward, or a
  merge commit computed without touching any checkout (``git merge-tree``); a conflict changes nothing;
- ``archive``: the worktree removed (anything left uncommitted first committed), the branch kept.

Every git command on a worktree names its administrative folder and work tree explicitly (recorded when it was
made): the worktree's own ``.git`` file is the agent's to rewrite, and git must never follow it elsewhere. One lock
file serialises what changes the repository's worktree list or the base branch, across threads and processes; the
evidence step moves only its own task branch, while that task's done report is being taken.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from taskkernel.coordinator.config_tables import DEFAULT_EXCLUDES
from taskkernel.coordinator.tables import worktrees
from taskkernel.coordinator.worktrees.git import GitError, Ran, RepoGit, git, toplevel
from taskkernel.coordinator.worktrees.protected import (
    IGNORE_RULES,
    SCRATCH_INDEX,
    STATE_DIR,
    WORKTREES_DIR,
    ProtectedPaths,
)
from taskkernel.kernel.canonical import sha256_hex, utc_now_iso
from taskkernel.kernel.private import private_dir
from taskkernel.kernel.store.db import Database

BRANCH_PREFIX = "task/"
FILES_LISTED = 50  # a report's diffstat names at most this many files (the patch file has them all)
TASKKERNEL_ID = {"GIT_COMMITTER_NAME": "taskkernel", "GIT_COMMITTER_EMAIL": "taskkernel@taskkernel.invalid"}
TASKKERNEL_AUTHOR = {"GIT_AUTHOR_NAME": "taskkernel", "GIT_AUTHOR_EMAIL": "taskkernel@taskkernel.invalid",
                     **TASKKERNEL_ID}  # the coordinator's own commits (merges, paths left out)


@dataclass(frozen=True)
class Worktree:
    task_id: str
    path: Path
    branch: str
    git_dir: str
    base_branch: str
    base_commit: str
    state: str


@dataclass(frozen=True)
class Merged:
    """What a merge did: ``ok`` with the base's new head, or why not: ``conflicts`` (the files both changed)
    when the branch does not merge cleanly; none when the base's checkout could not take it."""

    ok: bool
    commit: str | None = None
    message: str = ""
    conflicts: tuple[str, ...] = ()
    conflicted: bool = False


class Worktrees:
    """``exclude``: gitignore patterns for untracked files no worktree commits (``[worktrees]`` of
    taskkernel.toml, ``WorktreesTable.patterns()``); None: the defaults (build caches and environments)."""

    def __init__(self, db: Database, root: Path, exclude: Sequence[str] | None = None) -> None:
        self.db = db
        self.root = root.resolve()
        self.home = self.root / STATE_DIR / WORKTREES_DIR
        self.exclude = tuple(DEFAULT_EXCLUDES if exclude is None else exclude)
        self._exclude_file: Path | None = None
        self._repo: Path | None | bool = False  # False: not looked up yet
        self._common: Path | None = None
        self._git: RepoGit | None = None

    @property
    def repo(self) -> Path | None:
        """The git work tree the workspace is in (None: not in a repository)."""
        if self._repo is False:
            self._repo = toplevel(self.root)
        return self._repo if isinstance(self._repo, Path) else None

    @property
    def common_dir(self) -> Path:
        """The repository's own git folder (where its config, objects and branches are)."""
        if self._common is None:
            assert self.repo is not None
            found = Path(git(self.repo, "rev-parse", "--git-common-dir"))
            self._common = (found if found.is_absolute() else self.repo / found).resolve()
        return self._common

    @property
    def git(self) -> RepoGit:
        """git on this repository, its named drivers disarmed (worktrees/git.py)."""
        if self._git is None:
            self._git = RepoGit(self.common_dir)
        return self._git

    def protected(self) -> ProtectedPaths:
        """The workspace's own files, as paths in the repository (looked up again each time: the FCoP layout
        can change)."""
        assert self.repo is not None
        return ProtectedPaths.of(self.repo, self.root)

    def get(self, task_id: str, conn: sa.Connection | None = None) -> Worktree | None:
        """The task's worktree record (read in ``conn``, a transaction in progress, when given)."""
        query = sa.select(worktrees).where(worktrees.c.task_id == task_id)
        if conn is not None:
            row = conn.execute(query).mappings().first()
        else:
            with self.db.read() as own:
                row = own.execute(query).mappings().first()
        if row is None:
            return None
        return Worktree(row["task_id"], Path(row["path"]), row["branch"], row["git_dir"], row["base_branch"],
                        row["base_commit"], row["state"])

    def workdir(self, wt: Worktree, cwd: str | None) -> Path:
        """Where the agent works: the worktree's counterpart of the workspace folder (and of ``cwd`` in it)."""
        assert self.repo is not None
        inner = wt.path / self.root.relative_to(self.repo)
        return inner / cwd if cwd else inner

    # -- creating ------------------------------------------------------------------------------
    def ensure(self, task_id: str, base_branch: str | None) -> Worktree:
        """The task's worktree, found or made. Raises GitError (not_a_repository, base_unknown, git_failed)."""
        repo = self.repo
        if repo is None:
            raise GitError("not_a_repository", f"{self.root} is not inside a git repository")
        with self._locked():
            known = self.get(task_id)
            path, branch = self.home / task_id, f"{BRANCH_PREFIX}{task_id}"
            listed = self._listed(repo).get(path.resolve())
            if known is not None and listed is not None and not listed[1] and path.is_dir() and not path.is_symlink():
                self._restore_dotgit(known)  # whatever the agent checked out (detached, mid-rebase): its work stays
                self._reset_agent_config(known)
                return self._reused(known)
            if listed is not None and listed[1]:  # locked: `worktree add` was cut short
                self.git.run(repo, "worktree", "unlock", str(path), ok=(0, 128))
            if path.exists() or path.is_symlink():  # never reuse what no finished creation left here
                path.rename(path.with_name(f"{task_id}.stale-{utc_now_iso().replace(':', '')}"))
            self.git.out(repo, "worktree", "prune")
            private_dir(self.home)
            if self.git.run(repo, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}", ok=(0, 1)).code == 0:
                self.git.out(repo, "worktree", "add", "--quiet", str(path), branch)
                base = base_branch or (known.base_branch if known else None) or self._current_branch(repo)
                commit = known.base_commit if known else self._commit_of(repo, base)
            else:
                base = base_branch or (known.base_branch if known else None) or self._current_branch(repo)
                commit = self._commit_of(repo, base)
                self.git.out(repo, "worktree", "add", "--quiet", "-b", branch, str(path), commit)
            return self._record(task_id, path, branch, self._git_dir_of(path), base, commit)

    def _reset_agent_config(self, wt: Worktree) -> None:
        """The agent CLIs' project configuration as the task's base has it (no change may touch it), whatever an
        earlier run wrote or committed there: a planted ``.gemini/settings.json`` never starts a program in the
        next run in this worktree (protected.py)."""
        specs = self.protected().agent_config()
        self._in(wt, "clean", "-ffdqx", "--", *specs)  # untracked and ignored files there, links never followed
        base = self._merge_base(wt, "HEAD")

        def tracked(commit: str) -> set[str]:
            listed = self._in(wt, "ls-tree", "-r", "-z", "--name-only", commit, "--", *specs).out.split("\0")
            return {name for name in listed if name}

        in_base, in_head = tracked(base), tracked("HEAD")
        if extra := sorted(in_head - in_base):  # committed by the agent: gone from the checkout and the index
            self._in(wt, "rm", "-rfq", "--ignore-unmatch", "--", *(f":(top,literal){n}" for n in extra))
        if in_base:
            self._in(wt, "checkout", base, "--", *(f":(top,literal){n}" for n in sorted(in_base)))

    def _reused(self, wt: Worktree) -> Worktree:
        """A later run in the worktree: a task reopened after its merge is active again (its next approval merges
        its new work)."""
        if wt.state == "active":
            return wt
        self._set_state(wt.task_id, "active")
        return Worktree(wt.task_id, wt.path, wt.branch, wt.git_dir, wt.base_branch, wt.base_commit, "active")

    def _record(self, task_id: str, path: Path, branch: str, git_dir: str, base: str, commit: str) -> Worktree:
        now = utc_now_iso()
        with self.db.write() as uow:
            uow.conn.execute(worktrees.delete().where(worktrees.c.task_id == task_id))
            uow.conn.execute(worktrees.insert().values(
                task_id=task_id, path=str(path), branch=branch, git_dir=git_dir, base_branch=base, base_commit=commit,
                state="active", created_at=now, updated_at=now))
        return Worktree(task_id, path, branch, git_dir, base, commit, "active")

    @staticmethod
    def _restore_dotgit(wt: Worktree) -> None:
        """Point the worktree's .git file at its recorded git folder again, if the agent removed or rewrote it (a
        .git folder of its own is left alone: the coordinator's git never reads either)."""
        dotgit, wanted = wt.path / ".git", f"gitdir: {wt.git_dir}\n"
        with contextlib.suppress(OSError):
            if dotgit.is_file() and not dotgit.is_symlink() and dotgit.read_text(encoding="utf-8") == wanted:
                return
        if dotgit.is_dir() and not dotgit.is_symlink():
            return
        with contextlib.suppress(FileNotFoundError):
            dotgit.unlink()
        fd = os.open(dotgit, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(wanted)

    @staticmethod
    def _git_dir_of(path: Path) -> str:
        """git's administrative folder of a worktree it just made (the ``gitdir:`` its new .git file names)."""
        text = (path / ".git").read_text(encoding="utf-8").strip()
        if not text.startswith("gitdir: "):
            raise GitError("git_failed", f"{path}/.git does not name its git folder")
        return str(Path(text[len("gitdir: "):]).resolve())

    # -- evidence ------------------------------------------------------------------------------
    def evidence(self, wt: Worktree, round_: int, author: str) -> dict[str, Any]:
        """The diff a done report records, after committing what the agent left uncommitted, with the
        coordinator's own files left out (``protected``: each path and why; worktrees/protected.py). A failure is
        recorded as ``{"error": ...}``: the report stands, the reviewer sees why."""
        task_id = wt.task_id
        if self.repo is None:
            return {"error": f"{self.root} is no longer inside a git repository"}
        try:
            self._own_head(wt)
            protected = self.protected()
            left_out = self._uncommitted_protected(wt, protected)
            self._commit_pending(wt, f"{task_id} round {round_}: the work of the done report", author)
            head = self.head(wt)
            base = self._merge_base(wt, head)
            head, kept_out = self._keep_out(wt, base, head, protected, round_)
            left_out |= kept_out
            files, added, removed = self._numstat(wt, base, head)
            self._sizes(wt, base, head, [f for f in files[:FILES_LISTED] if f.get("binary")])
            # without --binary: a binary file is one line ("Binary files … differ"), never base85 patch text
            patch = self._in(wt, "diff", "--no-ext-diff", "--no-textconv", base, head).raw
            where = self._write_patch(task_id, round_, patch)
            commits = int(self._in(wt, "rev-list", "--count", f"{base}..{head}").out.strip())
        except (GitError, OSError, ValueError) as exc:
            return {"error": str(exc)[:500]}
        shown = [{"path": path, "reason": why} for path, why in sorted(left_out.items())]
        return {"base": wt.base_branch, "base_commit": base, "head": head, "branch": wt.branch,
                "range": f"{base[:12]}..{head[:12]}", "commits": commits, "files_changed": len(files),
                "insertions": added, "deletions": removed, "files": files[:FILES_LISTED],
                "patch": str(where.relative_to(self.root)), "patch_sha256": sha256_hex(patch),
                **({"protected": shown[:FILES_LISTED], "protected_count": len(shown)} if shown else {})}

    def _own_head(self, wt: Worktree) -> None:
        """The worktree's HEAD names its task branch (or no branch): an agent that pointed it at the base branch
        would have the coordinator commit its work there."""
        ran = self._in(wt, "symbolic-ref", "--quiet", "HEAD", ok=(0, 1))
        named = ran.out.strip()
        if ran.code == 0 and named != f"refs/heads/{wt.branch}":
            raise GitError("git_failed", f"the worktree's HEAD names {named}, not its task branch {wt.branch}: "
                           f"check out {wt.branch} in the worktree and report done again")

    def head(self, wt: Worktree) -> str:
        """The commit the worktree is at."""
        return self._in(wt, "rev-parse", "HEAD").out.strip()

    def _in(self, wt: Worktree, *args: str, ok: tuple[int, ...] = (0,), env: dict[str, str] | None = None,
            stdin: bytes | None = None) -> Ran:
        """A git command on the worktree through the folders recorded for it, whatever its .git file says."""
        if not wt.path.is_dir() or wt.path.is_symlink():
            raise GitError("git_failed", f"the worktree {wt.path} is missing")
        pinned = {"GIT_COMMON_DIR": str(self.common_dir), **(env or {})}  # never the admin folder's `commondir`
        return self.git.run(wt.path, "-c", f"core.excludesFile={self.exclude_file()}", f"--git-dir={wt.git_dir}",
                            f"--work-tree={wt.path}", *args, ok=ok, env=pinned, stdin=stdin)

    def exclude_file(self) -> Path:
        """The ignore file every git command on a worktree reads as its ``core.excludesFile`` (lowest precedence:
        the repository's own ``.gitignore`` and ``info/exclude`` win): ``self.exclude``, written once in the
        private worktrees folder under a name holding its hash (processes configured alike share it, processes
        configured otherwise never overwrite it)."""
        if self._exclude_file is None:
            text = "".join(f"{p}\n" for p in self.exclude).encode("utf-8")
            target = private_dir(self.home) / f"exclude-{sha256_hex(text)[:16]}"
            _write_once(target, text)
            self._exclude_file = target
        return self._exclude_file

    def _commit_pending(self, wt: Worktree, message: str, author: str) -> bool:
        """Commit what the agent left: never the coordinator's own paths (whatever .gitignore says), never into a
        nested repository (git would run `status` there, under that repository's own config and its drivers: a
        gitlink's pointer is left as it is)."""
        nested = [f":(top,exclude,literal){path}" for path in self._gitlinks(wt)]
        self._in(wt, "add", "-A", "--", ":/", *self.protected().excludes(), *nested)
        if self._in(wt, "diff", "--cached", "--quiet", "--no-ext-diff", "--ignore-submodules=all",
                    ok=(0, 1)).code == 0:
            return False
        who = {"GIT_AUTHOR_NAME": author, "GIT_AUTHOR_EMAIL": f"{author}@taskkernel.invalid", **TASKKERNEL_ID}
        self._in(wt, "commit", "--quiet", "--no-verify", "-m", message, env=who)
        return True

    def _gitlinks(self, wt: Worktree) -> list[str]:
        """The paths of the worktree's index that are nested repositories (gitlinks, mode 160000)."""
        out = self._in(wt, "ls-files", "-z", "--stage").out
        return [entry.split("\t", 1)[1] for entry in out.split("\0") if entry.startswith("160000 ")]

    def _uncommitted_protected(self, wt: Worktree, protected: ProtectedPaths) -> dict[str, str]:
        """The protected paths a plain ``git add -A`` would have taken from the worktree (what the agent wrote
        there and did not hide): listed in the report, never committed."""
        out = self._in(wt, "status", "--porcelain=v1", "-z", "--untracked-files=all", "--no-renames",
                       "--ignore-submodules=all", "--", *protected.includes()).out
        paths = [entry[3:] for entry in out.split("\0") if len(entry) > 3]
        return {p: why for p in paths if (why := protected.reason(p))}

    def _keep_out(self, wt: Worktree, base: str, head: str, protected: ProtectedPaths,
                  round_: int) -> tuple[str, dict[str, str]]:
        """``head``, or a commit on top of it that puts every protected path the range touches back as the base
        has it (the agent's files stay in its worktree, untracked): what a merge of the report can take."""
        hits = touched(lambda *a: self._in(wt, *a), base, head, protected)
        if not hits:
            return head, {}
        index = self.home / f"{SCRATCH_INDEX}{wt.task_id}-{os.getpid()}-{threading.get_ident()}"
        scratch = {"GIT_INDEX_FILE": str(index), "GIT_LITERAL_PATHSPECS": "1"}
        try:
            self._in(wt, "read-tree", head, env=scratch)
            self._in(wt, "restore", "--staged", f"--source={base}", "--pathspec-from-file=-", "--pathspec-file-nul",
                     env=scratch, stdin="\0".join(hits).encode())
            tree = self._in(wt, "write-tree", env=scratch).out.strip()
        finally:
            index.unlink(missing_ok=True)
        message = (f"{wt.task_id} round {round_}: the coordinator's own files left out of the change\n\n"
                   + "\n".join(f"{path} ({why})" for path, why in sorted(hits.items())[:FILES_LISTED]))
        new = self._in(wt, "commit-tree", tree, "-p", head, "-m", message,
                       env=TASKKERNEL_AUTHOR).out.strip()
        self._in(wt, "update-ref", "-m", "taskkernel: protected paths left out", "HEAD", new, head)
        self._in(wt, "reset", "--quiet")  # the index follows HEAD; the agent's files stay as they are
        return new, hits

    def _merge_base(self, wt: Worktree, head: str) -> str:
        ran = self._in(wt, "merge-base", f"refs/heads/{wt.base_branch}", head, ok=(0, 1, 128))
        return ran.out.strip() if ran.code == 0 and ran.out.strip() else wt.base_commit  # a deleted base

    def _numstat(self, wt: Worktree, base: str, head: str) -> tuple[list[dict[str, Any]], int, int]:
        out = self._in(wt, "diff", "--numstat", "-z", "--no-ext-diff", "--no-textconv", "--no-renames", base,
                       head).out
        files, added, removed = [], 0, 0
        for entry in filter(None, out.split("\0")):
            ins, dels, name = entry.split("\t", 2)
            binary = ins == "-"
            files.append({"path": name, "insertions": 0 if binary else int(ins),
                          "deletions": 0 if binary else int(dels), **({"binary": True} if binary else {})})
            added += 0 if binary else int(ins)
            removed += 0 if binary else int(dels)
        return files, added, removed

    def _sizes(self, wt: Worktree, base: str, head: str, binary: list[dict[str, Any]]) -> None:
        """Add ``bytes`` to each binary file's entry: its size at ``head`` (one ``ls-tree`` for all of them), or,
        for a file the range deletes, at ``base`` with ``deleted: true``."""
        for commit in (head, base):
            wanted = {f["path"]: f for f in binary if "bytes" not in f}
            if not wanted:
                return
            out = self._in(wt, "ls-tree", "-r", "-l", "-z", "--full-tree", commit, "--", *wanted,
                           env={"GIT_LITERAL_PATHSPECS": "1"}).out
            for entry in filter(None, out.split("\0")):
                meta, _, path = entry.partition("\t")
                size = meta.split()[-1]
                if path in wanted and size.isdigit():
                    wanted[path].update({"bytes": int(size), **({"deleted": True} if commit == base else {})})

    def _write_patch(self, task_id: str, round_: int, patch: bytes) -> Path:
        """The patch under a name that holds its hash, written once: a later diff of the same round (a report that
        is then refused) never changes the file an accepted report names."""
        folder = private_dir(self.root / STATE_DIR / "evidence" / task_id)
        target = folder / f"round-{round_}-{sha256_hex(patch)[:16]}.patch"
        _write_once(target, patch)
        return target

    # -- merging and archiving -----------------------------------------------------------------
    def merge(self, task_id: str, head: str, subject: str) -> Merged:
        """``head`` (the commit the approved report recorded) into the task's base, all or nothing; commits the
        branch gained since are not merged. Already in the base: ok, nothing done."""
        wt, repo = self.get(task_id), self.repo
        if wt is None or repo is None:
            return Merged(True, message="no worktree")
        with self._locked():
            tip = self._commit_of(repo, wt.branch)
            if not self._is_ancestor(repo, head, tip):
                return Merged(False, message=f"the reviewed commit {head[:12]} is not on {wt.branch}",
                              conflicted=True)
            base_head = self._commit_of(repo, wt.base_branch)
            if self._is_ancestor(repo, head, base_head):
                return self._merged(task_id, base_head, "already in the base")
            if self._is_ancestor(repo, base_head, head):
                new, how = head, "fast-forward"
            else:
                ran = self.git.run(repo, "merge-tree", "--write-tree", "--name-only", "--no-messages", base_head,
                                   head, ok=(0, 1))
                lines = ran.out.splitlines()
                if ran.code == 1:
                    return Merged(False, message=f"{wt.branch} does not merge cleanly into {wt.base_branch}",
                                  conflicts=tuple(line for line in lines[1:] if line), conflicted=True)
                new = self.git.out(repo, "commit-tree", lines[0], "-p", base_head, "-p", head, "-m",
                                   f"Merge {wt.branch} into {wt.base_branch}\n\n{task_id}: {subject}",
                                   env=TASKKERNEL_AUTHOR)
                how = "merge commit"
            hits = touched(lambda *a: self.git.run(repo, *a), base_head, new, self.protected())
            if hits:  # the evidence left them out; a report recorded before that did not: never merged
                return Merged(False, message=f"the change touches the coordinator's own files ("
                              f"{', '.join(sorted(hits)[:10])}): nothing was merged; report done again",
                              conflicts=tuple(sorted(hits)), conflicted=True)
            holder = self._checked_out(repo, wt.base_branch)
            if holder is not None and holder.is_relative_to(self.home.resolve()):
                return Merged(False, message=f"{wt.base_branch} is checked out in the task worktree {holder}, whose "
                              "files are an agent's: check it out elsewhere (or nowhere) to merge into it")
            if holder is not None:  # the base is someone's checkout: move it with its files, or not at all
                if self._holder_git(holder, "diff-index", "--cached", "--quiet", "--ignore-submodules=all", "HEAD",
                                    "--", ok=(0, 1)).code != 0:
                    return Merged(False, message=f"the checkout of {wt.base_branch} at {holder} has staged changes, "
                                  "or its branch moved without its files: commit, reset or check it out again")
                if in_the_way := self._in_the_way(holder, base_head, new):
                    return Merged(False, message=f"the checkout of {wt.base_branch} at {holder} has files the merge "
                                  f"would overwrite, untracked or ignored: {', '.join(in_the_way[:10])}")
                ran = self._holder_git(holder, "merge", "--ff-only", "--quiet", new, ok=(0, 1, 128))
                if ran.code != 0:
                    why = (ran.err or ran.out).strip().replace("\n", " ")[:300]
                    return Merged(False, message=f"the checkout of {wt.base_branch} at {holder} could not take the "
                                  f"merge: {why}")
            else:
                self.git.out(repo, "update-ref", f"refs/heads/{wt.base_branch}", new, base_head)
            if self._commit_of(repo, wt.base_branch) != new:
                raise GitError("git_failed", f"{wt.base_branch} did not move to the merge {new[:12]}")
            return self._merged(task_id, new, how)

    def _holder_git(self, holder: Path, *args: str, ok: tuple[int, ...] = (0,)) -> Ran:
        """git on the checkout that holds the base branch; the repository's main checkout by its folders
        (``core.worktree``, the agent's to set through its git, must not send the merge elsewhere)."""
        if self.repo is not None and holder == self.repo:
            return self.git.run(holder, f"--git-dir={self.common_dir}", f"--work-tree={holder}", *args, ok=ok)
        return self.git.run(holder, *args, ok=ok)

    def _in_the_way(self, holder: Path, old: str, new: str) -> list[str]:
        """Files of a checkout that moving it from ``old`` to ``new`` would overwrite without a word: git refuses to
        overwrite an untracked file but overwrites an ignored one (the coordinator's private files are ignored)."""
        added = self.git.run(holder, "diff", "--name-only", "-z", "--no-renames", "--diff-filter=A", old, new).out
        found = []
        for path in filter(None, added.split("\0")):
            parts = Path(path).parts
            steps = [holder.joinpath(*parts[:i]) for i in range(1, len(parts))]
            if os.path.lexists(holder / path) or any(s.is_symlink() or (s.exists() and not s.is_dir()) for s in steps):
                found.append(path)
        return found

    def _merged(self, task_id: str, commit: str, how: str) -> Merged:
        self._set_state(task_id, "merged", merged_commit=commit)
        return Merged(True, commit, how)

    def archive(self, task_id: str) -> bool:
        """Remove the task's worktree, keeping its branch (and what was left uncommitted, committed on it)."""
        wt, repo = self.get(task_id), self.repo
        if wt is None or repo is None or wt.state == "archived":
            return False
        with self._locked():
            if wt.state != "archiving" and wt.path.is_dir() and not wt.path.is_symlink():
                self._commit_pending(wt, f"{task_id}: work left in the worktree at archive", "taskkernel")
                self._set_state(task_id, "archiving")  # a removal cut short is never committed as deletions
            if wt.path.is_dir() and not wt.path.is_symlink():  # -f -f: a lock the agent put on it too
                self.git.out(repo, "worktree", "remove", "--force", "--force", str(wt.path))
            self.git.out(repo, "worktree", "prune")
            self._set_state(task_id, "archived")
        return True

    def _set_state(self, task_id: str, state: str, **columns: str) -> None:
        with self.db.write() as uow:
            uow.conn.execute(worktrees.update().where(worktrees.c.task_id == task_id).values(
                state=state, updated_at=utc_now_iso(), **columns))

    # -- git reads -----------------------------------------------------------------------------
    def _listed(self, repo: Path) -> dict[Path, tuple[str | None, bool]]:
        """Worktrees git knows: path -> (branch, or None when detached; locked)."""
        found: dict[Path, tuple[str | None, bool]] = {}
        path: Path | None = None
        for line in self.git.out(repo, "worktree", "list", "--porcelain").splitlines():
            if line.startswith("worktree "):
                path = Path(line[len("worktree "):]).resolve()
                found[path] = (None, False)
            elif path is not None and line.startswith("branch "):
                found[path] = (line[len("branch "):].removeprefix("refs/heads/"), found[path][1])
            elif path is not None and (line == "locked" or line.startswith("locked ")):
                found[path] = (found[path][0], True)
        return found

    def _checked_out(self, repo: Path, branch: str) -> Path | None:
        """Where ``branch`` is checked out; the main checkout (git lists it first) as the folder the repository
        is in on disk, never the ``core.worktree`` a config names."""
        listed = list(self._listed(repo).items())
        found = next((i for i, (_, (b, _l)) in enumerate(listed) if b == branch), None)
        return None if found is None else repo if found == 0 else listed[found][0]

    def _current_branch(self, repo: Path) -> str:
        ran = self.git.run(repo, "symbolic-ref", "--quiet", "--short", "HEAD", ok=(0, 1, 128))
        if ran.code != 0 or not ran.out.strip():
            raise GitError("base_unknown", f"{repo} has a detached HEAD: set base_branch for the role")
        return ran.out.strip()

    def _commit_of(self, repo: Path, branch: str) -> str:
        ran = self.git.run(repo, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}^{{commit}}",
                           ok=(0, 1, 128))
        if ran.code != 0:
            raise GitError("base_unknown", f"branch {branch!r} has no commit in {repo}")
        return ran.out.strip()

    def _is_ancestor(self, repo: Path, older: str, newer: str) -> bool:
        return self.git.run(repo, "merge-base", "--is-ancestor", older, newer, ok=(0, 1)).code == 0

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        private_dir(self.home)
        fd = os.open(self.home / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)


def _write_once(target: Path, data: bytes) -> None:
    """``data`` at ``target`` (0600), unless a file is there already: its name holds the hash of its content, so
    the file there holds the same bytes. Written whole (a temporary file, synced, renamed): a reader never sees
    half of it."""
    if target.is_file() and not target.is_symlink():
        return
    temp = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(temp, target)


def touched(run: Callable[..., Ran], base: str, head: str, protected: ProtectedPaths) -> dict[str, str]:
    """The protected paths the range ``base..head`` changes, with why: the coordinator's folders and files, an
    ignore file whose change weakens the rules that hide them, an attributes file beside one whose change rewrites
    what a checkout writes. ``run`` is a git command in the right place."""
    changed = [p for p in run("diff", "--name-only", "-z", "--no-renames", base, head).out.split("\0") if p]
    hits = {p: why for p in changed if (why := protected.reason(p))}
    rules = {**{f: protected.weakens_rules for f in protected.ignore_files},
             **{f: protected.rewrites_checkouts for f in protected.attribute_files}}
    for path in set(rules) & set(changed):
        patch = run("diff", "--text", "--no-ext-diff", "--no-textconv", base, head, "--",
                    f":(top,literal){path}").out  # --text: a NUL byte must not hide the rules as "binary"
        if rules[path](patch.splitlines()):
            hits[path] = IGNORE_RULES
    return hits
