"""Git as the coordinator runs it over repositories agents write to.

An agent can write files a later git command reads (hooks, attributes, its worktree's files), so every command
runs without hooks (``core.hooksPath=/dev/null``), without a file-system monitor (``core.fsmonitor`` runs a
program), without external diff or text conversion programs, never prompts, and gets a small environment: the
coordinator's secrets (the database URL, tokens) never reach a program git might start.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

_HARDENED = ("-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false", "-c", "commit.gpgSign=false",
             "-c", "tag.gpgSign=false", "-c", "core.pager=cat")
_ENV = ("PATH", "HOME", "TZ", "TMPDIR")
TIMEOUT_S = 120.0


class GitError(Exception):
    """A git command failed: ``code`` is git_missing, not_a_repository or git_failed; the message has git's
    own words."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def git_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: os.environ[k] for k in _ENV if k in os.environ}
    return {**env, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "",
            "GIT_OPTIONAL_LOCKS": "0", **(extra or {})}


@dataclass(frozen=True)
class Ran:
    code: int
    raw: bytes  # stdout as git wrote it (a patch keeps its bytes)
    err: str

    @property
    def out(self) -> str:
        """Stdout as text (bytes that are not UTF-8, such as a Latin-1 file name, replaced)."""
        return self.raw.decode("utf-8", errors="replace")


def run_git(where: Path, *args: str, ok: tuple[int, ...] = (0,), env: dict[str, str] | None = None) -> Ran:
    """``git -C where args``; an exit code outside ``ok`` raises GitError."""
    try:
        done = subprocess.run(["git", "-C", str(where), *_HARDENED, *args], capture_output=True, env=git_env(env),
                              timeout=TIMEOUT_S, stdin=subprocess.DEVNULL, check=False)
    except FileNotFoundError:
        raise GitError("git_missing", "git is not installed (not on PATH)") from None
    except subprocess.TimeoutExpired:
        raise GitError("git_failed", f"git {_verb(args)} took longer than {TIMEOUT_S:g}s") from None
    ran = Ran(done.returncode, done.stdout, done.stderr.decode("utf-8", errors="replace"))
    if ran.code not in ok:
        lines = (ran.err or ran.out).strip().splitlines()
        last = lines[-1] if lines else f"exit {ran.code}"
        said = next((w for w in lines if w.startswith(("fatal:", "error:"))), last)  # git's own reason first
        raise GitError("git_failed", f"git {_verb(args)}: {said}")
    return ran


def _verb(args: tuple[str, ...]) -> str:
    """The subcommand and its first argument, past global options such as --git-dir."""
    words = [a for a in args if not a.startswith("--git-dir=") and not a.startswith("--work-tree=")]
    return " ".join(words[:2])


def git(where: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """Stdout of a git command that must succeed, stripped."""
    return run_git(where, *args, env=env).out.strip()


def toplevel(path: Path) -> Path | None:
    """The work tree ``path`` is in, or None (not in a git repository, or no git)."""
    try:
        ran = run_git(path, "rev-parse", "--show-toplevel", ok=(0, 128))
    except GitError:
        return None
    return Path(ran.out.strip()).resolve() if ran.code == 0 and ran.out.strip() else None
