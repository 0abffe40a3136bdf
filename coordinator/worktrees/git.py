"""Git as the coordinator runs it over repositories agents write to.

An agent can write what a later git command reads: hooks, attributes, its worktree's files, and (through git
itself, from its worktree) the repository's shared config, includes and conditional includes among them. So git
never runs a program a repository, user or system config names; the coordinator controls the configuration
instead of trying to spot dangerous keys in it:

- no system or global config at all (``GIT_CONFIG_NOSYSTEM``, ``GIT_CONFIG_GLOBAL=/dev/null``, no system or user
  attributes file);
- every key that names a program or makes git start one is set on the command line (``-c`` wins over every
  config file and every include): hooks, fsmonitor, signing and signature checks, pager, editor, credentials,
  transports, external diff;
- the drivers attributes select by name (``filter=``, ``diff=``, ``merge=``) are disarmed by name: every driver
  defined anywhere in the repository's config files, in any file they include, whatever its condition
  (``includeIf`` is evaluated by git per work tree and branch, so the union is read, not one evaluation):
  filters become no-ops, diff drivers empty, merge drivers ``false`` (the file conflicts, nothing runs); git
  2.39 cannot be told to skip attributes files (``--attr-source`` came in 2.40), so the names are disarmed;
- no user's ignore file (``core.excludesFile``): what a worktree commits depends on the repository and the
  workspace's configuration (``Worktrees.exclude_file``), never on whose machine the coordinator runs;
- a small environment: the coordinator's secrets (the database URL, tokens) never reach git or what it starts.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

_FIXED = {
    "core.hooksPath": "/dev/null", "core.fsmonitor": "false", "core.attributesFile": "/dev/null",
    "core.excludesFile": "/dev/null",  # not the user's ~/.config/git/ignore: a worktree names the coordinator's own
    "core.pager": "cat", "core.askPass": "", "core.sshCommand": "", "core.alternateRefsCommand": "",
    "credential.helper": "", "protocol.allow": "never", "diff.external": "", "submodule.recurse": "false",
    "commit.gpgSign": "false", "tag.gpgSign": "false", "merge.verifySignatures": "false",
    "gpg.program": "", "gpg.openpgp.program": "", "gpg.x509.program": "", "gpg.ssh.program": "",
    "gpg.ssh.defaultKeyCommand": "", "gc.auto": "0", "maintenance.auto": "false",
}
_HARDENED = tuple(arg for key, value in _FIXED.items() for arg in ("-c", f"{key}={value}"))
_DISARMED = {"filter": {"clean": "", "smudge": "", "process": "", "required": "false"},
             "diff": {"command": "", "textconv": ""},
             "merge": {"driver": "false"}}
_DRIVER_KEY = re.compile(r"^(filter|diff|merge)\.(.+)\.[^.]+$", re.DOTALL)
_INCLUDE_KEY = re.compile(r"^include(if\..*)?\.path$", re.DOTALL | re.IGNORECASE)
_ENV = ("PATH", "HOME", "TZ", "TMPDIR")
TIMEOUT_S = 120.0
_INCLUDE_DEPTH = 10  # git's own limit on nested includes


class GitError(Exception):
    """A git command failed: ``code`` is git_missing, not_a_repository or git_failed; the message has git's
    own words."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def git_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: os.environ[k] for k in _ENV if k in os.environ}
    return {**env, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "",
            "GIT_OPTIONAL_LOCKS": "0", "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null",
            "GIT_ATTR_NOSYSTEM": "1", "GIT_EDITOR": ":", "GIT_SEQUENCE_EDITOR": ":", "GIT_PAGER": "cat",
            "GIT_ALLOW_PROTOCOL": "",  # no transport at all: a per-protocol key cannot re-allow one (lazy fetch)
            **(extra or {})}


@dataclass(frozen=True)
class Ran:
    code: int
    raw: bytes  # stdout as git wrote it (a patch keeps its bytes)
    err: str

    @property
    def out(self) -> str:
        """Stdout as text (bytes that are not UTF-8, such as a Latin-1 file name, replaced)."""
        return self.raw.decode("utf-8", errors="replace")


def run_git(where: Path, *args: str, ok: tuple[int, ...] = (0,), env: dict[str, str] | None = None,
            stdin: bytes | None = None) -> Ran:
    """``git -C where args`` with the coordinator's fixed configuration; an exit code outside ``ok`` raises
    GitError. Commands on a repository's files go through ``RepoGit`` (its named drivers disarmed)."""
    try:
        done = subprocess.run(["git", "-C", str(where), *_HARDENED, *args], capture_output=True, env=git_env(env),
                              timeout=TIMEOUT_S, check=False, input=stdin,
                              stdin=subprocess.DEVNULL if stdin is None else None)
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
    """The subcommand and its first argument, past global options (``-c``, --git-dir, --work-tree)."""
    words: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
        elif a == "-c":
            skip = True
        elif not a.startswith(("--git-dir=", "--work-tree=")):
            words.append(a)
    return " ".join(words[:2])


def git(where: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """Stdout of a git command that must succeed, stripped."""
    return run_git(where, *args, env=env).out.strip()


def toplevel(path: Path) -> Path | None:
    """The checkout ``path`` is in, or None (not in a git repository, or no git): the nearest folder holding a
    ``.git``, as git discovers it, never a ``core.worktree`` the repository's config names (an agent can set it
    through its git and send the coordinator's work elsewhere)."""
    try:
        ran = run_git(path, "rev-parse", "--git-dir", ok=(0, 128))
    except GitError:
        return None
    if ran.code != 0:
        return None
    here = path.resolve()
    return next((d for d in (here, *here.parents) if os.path.lexists(d / ".git")), None)


class RepoGit:
    """git over one repository (``common_dir``, its shared git folder) with its named drivers disarmed."""

    def __init__(self, common_dir: Path) -> None:
        self.common_dir = common_dir
        self._lock = threading.Lock()
        self._seen: tuple[tuple[str, int, int, int], ...] = ()
        self._disarm: dict[str, str] = {}

    def run(self, where: Path, *args: str, ok: tuple[int, ...] = (0,), env: dict[str, str] | None = None,
            stdin: bytes | None = None) -> Ran:
        return run_git(where, *args, ok=ok, env={**self.disarmed(), **(env or {})}, stdin=stdin)

    def out(self, where: Path, *args: str, env: dict[str, str] | None = None) -> str:
        return self.run(where, *args, env=env).out.strip()

    def disarmed(self) -> dict[str, str]:
        """Environment entries (``GIT_CONFIG_COUNT``/``KEY_n``/``VALUE_n``: command-line precedence, a name may
        hold any character, inherited by the git processes git starts) disarming every driver the repository's
        config files define; the files are read again only when one of them changed."""
        with self._lock:
            files = self._config_files()
            seen = [Path(entry[0]) for entry in self._seen]
            if not self._seen or self._signature(seen) != self._seen or not set(files) <= set(seen):
                names, visited = self._driver_names(files)
                pairs = [(f"{kind}.{name}.{key}", value) for kind, name in sorted(names)
                         for key, value in _DISARMED[kind].items()]
                self._disarm = {"GIT_CONFIG_COUNT": str(len(pairs))}
                for i, (key, value) in enumerate(pairs):
                    self._disarm |= {f"GIT_CONFIG_KEY_{i}": key, f"GIT_CONFIG_VALUE_{i}": value}
                self._seen = self._signature(visited)
            return self._disarm

    def _config_files(self) -> list[Path]:
        """The repository's own config files: its config and every work tree's ``config.worktree``."""
        worktrees = self.common_dir / "worktrees"
        extra = sorted(worktrees.glob("*/config.worktree")) if worktrees.is_dir() else []
        return [self.common_dir / "config", self.common_dir / "config.worktree", *extra]

    @staticmethod
    def _signature(files: list[Path]) -> tuple[tuple[str, int, int, int], ...]:
        sig = []
        for path in files:
            try:
                st = path.stat()
            except OSError:
                sig.append((str(path), -1, -1, -1))
            else:
                sig.append((str(path), st.st_ctime_ns, st.st_size, st.st_ino))  # ctime: utime cannot set it back
        return tuple(sig)

    def _driver_names(self, files: list[Path]) -> tuple[set[tuple[str, str]], list[Path]]:
        """(kind, name) of every driver defined in ``files`` or anything they include, and every file read (or
        looked for: a missing include may appear later)."""
        names: set[tuple[str, str]] = set()
        visited: list[Path] = []
        queue = [(path, 0) for path in files]
        while queue:
            path, depth = queue.pop(0)
            if path in visited or depth > _INCLUDE_DEPTH:
                continue
            visited.append(path)
            if not path.exists():
                continue
            if not path.is_file():  # a FIFO's writer could tell git what it never told this reader
                raise GitError("git_failed", f"the git config include {path} is not a regular file")
            ran = run_git(Path(os.sep), "config", "--file", str(path), "--no-includes", "--null", "--list",
                          ok=(0, 1, 128))
            for entry in ran.out.split("\0"):
                key, _, value = entry.partition("\n")
                if match := _DRIVER_KEY.match(key):
                    names.add((match.group(1).lower(), match.group(2)))
                elif _INCLUDE_KEY.match(key) and value:
                    target = Path(os.path.expanduser(value))
                    queue.append(((path.parent / target) if not target.is_absolute() else target, depth + 1))
        return names, visited
