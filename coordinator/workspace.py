"""A workspace on disk: taskkernel.toml, .taskkernel/kernel.db and the FCoP folders.

The toml file marks the root; commands find it from ``--workspace``,
``TASKKERNEL_WORKSPACE`` or by walking up from the current directory. The FCoP folders are
wherever the project already keeps them (``fcop/`` or ``docs/agents/``); `init` lays out
``fcop/`` only in a project that has none, and never adds anything to one that exists. ``.taskkernel/`` also keeps
the values of the last taskkernel.toml validated (``checked_config``, docs/config.md#cache), so a command reads an
unchanged file without validating it again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import stat
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING, Any

from taskkernel.coordinator.config import (
    CONFIG_NAME,
    MAX_ROLE_LEN,
    CheckedConfig,
    ConfigError,
    WorkspaceNotFound,
    not_team,
    read_bytes,
    validate_bytes,
)
from taskkernel.kernel.canonical import utc_now_iso
from taskkernel.kernel.private import private_dir, write_private

if TYPE_CHECKING:
    from taskkernel.coordinator.config import TaskkernelConfig, TeamTable

__all__ = ["CONFIG_NAME", "ConfigError", "DEFAULT_TEAM", "Initialized", "TEAM_PRESETS", "Team", "Workspace",
           "WorkspaceNotFound", "fcop_root_of", "init_workspace", "team_from_files"]
STATE_DIR = ".taskkernel"
DB_NAME = "kernel.db"
OWNER_TOKEN_NAME = "owner.token"  # the owner's credential (0600), read by the owner's CLI
CHAIN_KEY_NAME = "chain.key"  # HMAC key of the event hash chain (0600); back it up with the database
LIFECYCLE_STAGES = ("inbox", "active", "review", "done", "archive")

TEAM_PRESETS: dict[str, dict[str, Any]] = {
    "dev-team": {"mode": "preset", "team": "dev-team", "leader": "PM", "roles": ["PM", "DEV", "QA", "OPS"]},
    "media-team": {"mode": "preset", "team": "media-team", "leader": "PUBLISHER",
                   "roles": ["PUBLISHER", "COLLECTOR", "WRITER", "EDITOR"]},
    "mvp-team": {"mode": "preset", "team": "mvp-team", "leader": "MARKETER",
                 "roles": ["MARKETER", "RESEARCHER", "DESIGNER", "BUILDER"]},
    "qa-team": {"mode": "preset", "team": "qa-team", "leader": "LEAD-QA",
                "roles": ["LEAD-QA", "TESTER", "AUTO-TESTER", "PERF-TESTER"]},
    "solo": {"mode": "solo", "team": "solo", "leader": "ME", "roles": ["ME"]},
}
DEFAULT_TEAM = "dev-team"
# In .taskkernel/: the values of the taskkernel.toml last validated, keyed on its bytes and the validating code.
CONFIG_CACHE_NAME = "config-cache.json"
_CACHE_FORMAT = "taskkernel-config-cache/1"
_CACHE_MAX_BYTES = 4 * 2**20
# The code a validation's answer depends on besides the file: these sources (taskkernel's own, relative to the
# package) and libraries (pydantic's strictness, SQLAlchemy's URL parser). An edit or an upgrade is a new key.
_VALIDATING_SOURCES = ("coordinator/config.py", "coordinator/config_tables.py", "coordinator/agent_profiles.py",
                       "coordinator/agents.toml", "coordinator/fcop/filenames.py", "scheduler/models.py")
_VALIDATING_LIBRARIES = ("pydantic", "pydantic_core", "sqlalchemy")


@dataclass
class Team:
    """A team's leader and roles; ``source`` says where it was found: "fcop.json", "taskkernel.toml" (its
    ``[team]`` table), "files" (the roles the FCoP files use) or "preset"."""

    leader: str
    roles: list[str]
    name: str = "custom"
    source: str = "preset"

    @classmethod
    def from_fcop_json(cls, data: Any, source: str | None = None) -> Team:
        from taskkernel.coordinator.fcop.detect import CONFIG_NAME as FCOP_CONFIG

        if not isinstance(data, dict) or not isinstance(data.get("roles", []), list):
            raise ValueError(f"{FCOP_CONFIG} must hold a JSON object whose roles is a list")
        roles = [r["code"] if isinstance(r, dict) and "code" in r else str(r) for r in data.get("roles", [])]
        return cls(leader=str(data.get("leader") or (roles[0] if roles else "ADMIN")), roles=roles,
                   name=str(data.get("team") or data.get("mode") or "custom"), source=source or FCOP_CONFIG)

    @classmethod
    def preset(cls, name: str) -> Team:
        if name not in TEAM_PRESETS:
            raise ValueError(f"unknown team preset {name!r}; choose one of {', '.join(TEAM_PRESETS)}")
        return cls.from_fcop_json(TEAM_PRESETS[name], source="preset")

    @classmethod
    def from_toml(cls, table: TeamTable) -> Team:
        """taskkernel.toml's ``[team]`` (validated with the file: role codes, the leader one of them)."""
        return cls(table.leader, list(table.roles), name=table.name, source=CONFIG_NAME)

    def toml(self) -> str:
        """This team as taskkernel.toml's ``[team]`` table (role codes and preset names are plain ASCII)."""
        why = "the roles its FCoP files use" if self.source == "files" else f"the {self.name} preset"
        return (f"\n[team]\n# The team (init took {why}); an fcop.json in the FCoP folder takes precedence.\n"
                f"name = {json.dumps(self.name)}\nleader = {json.dumps(self.leader)}\n"
                f"roles = {json.dumps(self.roles)}\n")


@dataclass
class Workspace:
    root: Path
    checked: CheckedConfig  # taskkernel.toml, validated (its models: ``config``)

    @property
    def config(self) -> TaskkernelConfig:
        """taskkernel.toml's models (built on first use when the file's values came from the cache)."""
        return self.checked.config

    @property
    def config_path(self) -> Path:
        return self.root / CONFIG_NAME

    @property
    def state_dir(self) -> Path:
        return self.root / STATE_DIR

    @property
    def fcop_dir(self) -> Path:
        """The FCoP root the folder adapter uses: ``fcop/`` or ``docs/agents/`` (``find_workspace_root``). When
        both exist `up` and `verify` refuse with ambiguous_workspace_root; this then says ``fcop/``."""
        from taskkernel.coordinator.fcop.detect import find_workspace_root
        from taskkernel.coordinator.fcop.errors import FcopError

        try:
            return find_workspace_root(self.root)
        except FcopError:
            return self.root / "fcop"

    @property
    def sqlite_path(self) -> Path:
        return self.state_dir / DB_NAME

    @property
    def database_url(self) -> str:
        return self.checked.setting("kernel", "database") or f"sqlite:///{self.sqlite_path}"

    @property
    def require_token(self) -> bool:
        """New workspaces say true; a workspace written before the setting existed keeps the old
        meaning (no token = the local owner) until its owner turns it on."""
        return bool(self.checked.setting("kernel", "require_token"))

    @property
    def grant_sessions(self) -> frozenset[str]:
        """Sessions that hold grants and belong to ADMIN: `admin` and the gate's configured session."""
        return frozenset({"admin", self.checked.setting("gate", "session")})

    @property
    def owner_token_path(self) -> Path:
        return self.state_dir / OWNER_TOKEN_NAME

    @property
    def chain_key_path(self) -> Path:
        return self.state_dir / CHAIN_KEY_NAME

    @property
    def durability(self) -> str:
        return str(self.checked.setting("kernel", "durability"))

    def team(self) -> Team:
        """The FCoP root's fcop.json, else taskkernel.toml's ``[team]``, else the dev-team preset."""
        from taskkernel.coordinator.fcop.detect import CONFIG_NAME as FCOP_CONFIG

        if (data := team_json(self.fcop_dir / FCOP_CONFIG)) is not None:
            return Team.from_fcop_json(data)
        if self.config.team is not None:
            return Team.from_toml(self.config.team)
        return Team.preset(DEFAULT_TEAM)

    @classmethod
    def load(cls, root: Path) -> Workspace:
        """The workspace at ``root``; a taskkernel.toml that cannot be used raises ``ConfigError``. Its values
        come from the cache when this code validated these exact bytes before (``checked_config``)."""
        root = root.resolve()
        return cls(root, checked_config(root / CONFIG_NAME, root / STATE_DIR / CONFIG_CACHE_NAME))

    @classmethod
    def locate(cls, explicit: str | os.PathLike[str] | None = None) -> Workspace:
        start = Path(explicit or os.environ.get("TASKKERNEL_WORKSPACE") or Path.cwd()).resolve()
        if explicit or os.environ.get("TASKKERNEL_WORKSPACE"):
            if (start / CONFIG_NAME).exists():
                return cls.load(start)
            raise WorkspaceNotFound(f"{start} is not a taskkernel workspace (no {CONFIG_NAME})")
        for candidate in (start, *start.parents):
            if (candidate / CONFIG_NAME).exists():
                return cls.load(candidate)
        raise WorkspaceNotFound(f"no {CONFIG_NAME} in {start} or its parents; run `taskkernel init`")


def checked_config(path: Path, cache: Path) -> CheckedConfig:
    """taskkernel.toml at ``path``, validated. When ``cache`` (in the owner's 0700 .taskkernel/) holds the values
    of these exact bytes as this very code validated them, they are taken from it: nothing is parsed, validated or
    built, and pydantic is not loaded. Otherwise the file is validated as ever (a ``ConfigError``, nothing cached)
    and its values cached for the next command. A cache that is missing, stale, damaged, foreign or not the
    owner's private file is never used, so deleting it is always safe (docs/config.md)."""
    raw = read_bytes(path)
    stamp = _code_stamp()
    # the workspace's own state folder, or none
    key = None if stamp is None or cache.parent.is_symlink() else hashlib.sha256(stamp.encode() + raw).hexdigest()
    if key is not None and (hit := _cached(cache, key, (raw, path))) is not None:
        return hit
    checked = CheckedConfig.of(validate_bytes(raw, path))
    if key is not None and _code_digest() == stamp:  # else this process runs code replaced since: not the key's
        _write_cache(cache, key, checked)
    return checked


@cache
def _code_stamp() -> str | None:
    """The validating code as this process found it at its first configuration read, before it loaded that code:
    what it validates with, all its life, whatever is installed meanwhile."""
    return _code_digest()


def _code_digest() -> str | None:
    """SHA-256 of the code that validates the file: taskkernel's and Python's versions and the validating
    sources' and libraries' files (size and mtime: an edit or an upgrade changes them). None: a file of that code
    cannot be found (nothing is cached then)."""
    from taskkernel import __version__

    digest = hashlib.sha256(f"{_CACHE_FORMAT}\0{__version__}\0{sys.version}\0".encode())
    try:
        for file in _validating_files():
            if file is None:
                return None
            info = os.stat(file)
            digest.update(f"{file}\0{info.st_size}\0{info.st_mtime_ns}\0".encode())
    except OSError:
        return None
    return digest.hexdigest()


@cache
def _validating_files() -> tuple[str | None, ...]:
    """The files of ``_VALIDATING_SOURCES`` and ``_VALIDATING_LIBRARIES`` (None: a library not found)."""
    package = Path(__file__).parent.parent  # taskkernel/
    libraries = (getattr(sys.modules.get(name), "__file__", None) or getattr(find_spec(name), "origin", None)
                 for name in _VALIDATING_LIBRARIES)
    return (*(str(package / source) for source in _VALIDATING_SOURCES), *libraries)


def _cached(cache: Path, key: str, source: tuple[bytes, Path]) -> CheckedConfig | None:
    """The values the cache holds for ``key``: only from the owner's own private regular file, whole (its payload's
    digest checks) and written for this key."""
    try:
        fd = os.open(cache, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)  # a FIFO never blocks
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
            return None
        with os.fdopen(fd, "rb", closefd=False) as fh:
            raw = fh.read(_CACHE_MAX_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        doc = json.loads(raw)
        payload = doc["payload"]
        if (doc["format"], doc["key"], doc["sha256"]) != (_CACHE_FORMAT, key, _sha256(payload)):
            return None
        return CheckedConfig.from_plain(json.loads(payload), source)
    except (ValueError, KeyError, TypeError, AttributeError):  # not JSON, not our document: validate instead
        return None


def _write_cache(cache: Path, key: str, checked: CheckedConfig) -> None:
    """Best effort, into the state folder only when it already is one (`init` makes it, 0700): a new 0600 file
    renamed over the old one, so a reader finds the old cache or the new one, never a part of either."""
    folder = cache.parent
    if folder.is_symlink() or not folder.is_dir():
        return
    payload = json.dumps(checked.plain(), separators=(",", ":"))
    doc = json.dumps({"format": _CACHE_FORMAT, "key": key, "sha256": _sha256(payload), "payload": payload})
    temp = folder / f".{cache.name}.{secrets.token_hex(8)}"
    try:
        write_private(temp, doc.encode("utf-8"))
        os.replace(temp, cache)
    except OSError:
        with contextlib.suppress(OSError):
            temp.unlink()


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Initialized:
    """What `init` did: the workspace, its team, its FCoP root and whether `init` laid that root out (False: an
    existing FCoP workspace, left exactly as it was). ``note``: a team `init` could not write (see init_workspace)."""

    workspace: Workspace
    team: Team
    fcop_root: Path
    laid_out: bool
    note: str | None = None
    gitignored: bool = False  # `.taskkernel/` was added to the workspace's .gitignore


def fcop_root_of(root: Path) -> tuple[Path, bool]:
    """Where the FCoP folders of the project ``root`` are (or go) and whether an FCoP workspace is already there:
    ``fcop/`` or ``docs/agents/`` with G2 folders, ``_lifecycle/`` or fcop.json. Raises FcopError
    (ambiguous_workspace_root) when both exist. FCoP folders directly in the project root are no workspace
    (fcop itself only looks in those two places): the layout then goes to ``fcop/``."""
    from taskkernel.coordinator.fcop.detect import CONFIG_NAME as FCOP_CONFIG
    from taskkernel.coordinator.fcop.detect import G2_MARKERS, LIFECYCLE_DIR, find_workspace_root

    found = find_workspace_root(root)
    if found == root:
        return root / "fcop", False
    marked = (found / FCOP_CONFIG).is_file() or (found / LIFECYCLE_DIR).is_dir() or any(
        (found / m).is_dir() for m in G2_MARKERS)
    return found, marked


def team_from_files(fcop_root: Path) -> Team | None:
    """The team the envelope file names under ``fcop_root`` use (None if they name no role).

    Roles: TASK/REPORT sender and recipient, ISSUE reporter and recipient, REVIEW reviewer; never ADMIN,
    SYSTEM or TEAM. Leader: the role ADMIN sends the most TASKs to, else the most frequent sender (ties by name)."""
    from taskkernel.coordinator.fcop.filenames import EnvelopeKind, parse_filename

    roles: set[str] = set()
    senders: Counter[str] = Counter()
    from_admin: Counter[str] = Counter()
    for name in _file_names(fcop_root):
        fn = parse_filename(name)
        if fn is None:
            continue
        roles.update(r for r in (fn.sender, fn.recipient) if r and r not in not_team() and len(r) <= MAX_ROLE_LEN)
        if fn.sender and fn.sender in roles:
            senders[fn.sender] += 1
        if fn.kind is EnvelopeKind.TASK and fn.sender == "ADMIN" and fn.recipient in roles:
            from_admin[fn.recipient] += 1
    if not roles:
        return None
    ranked = from_admin or senders
    leader = min(ranked, key=lambda r: (-ranked[r], r)) if ranked else min(roles)
    return Team(leader, sorted(roles), source="files")


def _file_names(root: Path) -> Iterator[str]:
    """Names of the regular files under ``root``, recursively; a symlink is neither followed nor listed, an
    unreadable folder is skipped."""
    if root.is_symlink():
        return
    folders = [root]
    while folders:
        try:
            with os.scandir(folders.pop()) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        folders.append(Path(entry.path))
                    elif entry.is_file(follow_symlinks=False):
                        yield entry.name
        except OSError:
            continue


def team_json(path: Path) -> dict[str, Any] | None:
    """fcop.json as a team config (None when absent, or an FCoP 4 manifest: it names no team)."""
    if not path.exists():
        return None
    data = json.loads(path.read_text(encoding="utf-8-sig"))
    if isinstance(data, dict) and str(data.get("protocol_version", "")).startswith("4"):
        return None
    return data  # type: ignore[no-any-return]


def _choose_team(fcop: Path, existing: bool, config: TaskkernelConfig, preset: str | None,
                 g4: bool = False) -> tuple[Team, bool]:
    """The team `init` settles on, and whether it belongs in taskkernel.toml's ``[team]`` (always, for G4: its
    manifest names no team)."""
    from taskkernel.coordinator.fcop.detect import CONFIG_NAME as FCOP_CONFIG

    if not existing:
        return Team.preset(preset or DEFAULT_TEAM), g4  # G3: written as the new layout's fcop.json
    fcop_json = fcop / FCOP_CONFIG
    if (data := team_json(fcop_json)) is not None:
        current = Team.from_fcop_json(data)
    elif config.team is not None:
        current = Team.from_toml(config.team)
    else:
        chosen = Team.preset(preset) if preset else team_from_files(fcop)
        return (chosen, True) if chosen else (Team.preset(DEFAULT_TEAM), False)
    if preset is not None and preset != current.name:
        where = fcop_json if current.source == FCOP_CONFIG else f"[team] in {CONFIG_NAME}"
        raise ValueError(f"{where} already names the team ({current.name}, leader {current.leader}); "
                         "change it there, or drop --team")
    return current, False


def _lay_out(fcop: Path, preset: str) -> None:
    """Today's G3 layout and the preset's fcop.json, in a project without an FCoP workspace."""
    from taskkernel.coordinator.fcop.detect import CONFIG_NAME as FCOP_CONFIG

    for stage in LIFECYCLE_STAGES:
        (fcop / "_lifecycle" / stage).mkdir(parents=True, exist_ok=True)
    for bucket in ("reports", "issues", "reviews", "shared", "ledger/views", "_quarantine"):
        (fcop / bucket).mkdir(parents=True, exist_ok=True)
    fcop_json = fcop / FCOP_CONFIG
    if not fcop_json.exists():
        data = {**TEAM_PRESETS[preset], "lang": "en", "version": 1, "created_at": utc_now_iso()}
        fcop_json.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def init_workspace(root: Path, team: str | None = None, database: str | None = None, agents: str | None = None,
                   fcop_generation: str | None = None) -> Initialized:
    """Create (or complete) a workspace; never overwrites a file, never adds anything to an existing FCoP workspace.

    A project without one gets the G3 layout in ``fcop/`` (or in an empty ``docs/agents/``) with the ``team``
    preset (default dev-team) as its fcop.json. An existing one (``fcop/`` or ``docs/agents/``) is left exactly as
    it is: its team is its fcop.json, else the ``[team]`` of taskkernel.toml, else ``team``'s preset or the roles
    its files use, written to the new taskkernel.toml's ``[team]`` (an existing taskkernel.toml is never changed:
    ``note`` then says what to add). ``database``: the URL a new taskkernel.toml names, so every later command
    (and agent) finds the store `init` wrote to; ``agents``: the agent CLI its role examples use. Inside a git
    repository, ``.taskkernel/`` is added to the workspace's .gitignore (database, run logs, worktrees). Raises
    ValueError (an unknown preset, a ``team`` other than the one already named) and FcopError (both ``fcop/``
    and ``docs/agents/``) before writing anything."""
    from taskkernel.coordinator.config import TaskkernelConfig, load_config
    from taskkernel.coordinator.config_template import AgentTeam, config_template, role_tables
    from taskkernel.coordinator.fcop.detect import Generation, open_workspace

    if team is not None and team not in TEAM_PRESETS:
        raise ValueError(f"unknown team preset {team!r}; choose one of {', '.join(TEAM_PRESETS)}")
    root = root.resolve()
    config_path = root / CONFIG_NAME
    config = load_config(config_path) if config_path.exists() else TaskkernelConfig()  # ConfigError: a ValueError
    fcop, existing = fcop_root_of(root)
    found = open_workspace(fcop, allow_mixed=True).generation if existing else None  # refused as `up` would
    if fcop_generation is not None and found is not None and found.value != fcop_generation:
        raise ValueError(f"{fcop} is already a {found.value.upper()} workspace; to convert it, run "
                         f"`taskkernel fcop migrate --to {fcop_generation}`")
    g4 = (found or fcop_generation) in (Generation.G4, "g4")
    chosen, to_config = _choose_team(fcop, existing, config, team, g4)
    root.mkdir(parents=True, exist_ok=True)
    private_dir(root / STATE_DIR)
    if not existing and g4:
        if fcop.name != "fcop":
            raise ValueError(f"an FCoP 4 workspace lives at <project>/fcop, not {fcop}")
        from fcop.errors import FcopError as CoreError

        from taskkernel.coordinator.fcop4.authority import PROFILE_ID, core

        if fcop.is_dir() and not any(fcop.iterdir()):
            fcop.rmdir()  # an empty fcop/ is no workspace: fcop's Core makes its own in one publish
        try:
            core(root, b"").create_workspace(profiles=[PROFILE_ID])
        except CoreError as exc:
            raise ValueError(f"fcop's Core could not make the FCoP 4 workspace at {fcop}: {exc}") from exc
    elif not existing:
        _lay_out(fcop, team or DEFAULT_TEAM)
    (root / "workspace").mkdir(exist_ok=True)
    note = None
    agent_team = None if agents is None else AgentTeam(chosen.leader, chosen.roles, _in_git(root))
    if not config_path.exists():
        text = config_template(database, chosen.toml() if to_config else None, agents, agent_team)
        write_private(config_path, text.encode("utf-8"))  # may hold a password
    elif to_config:
        note = f"{config_path} exists and was left as it is; to use this team, add:{chosen.toml()}"
    elif agents is not None and agent_team is not None and not config.roles:
        tables, _ = role_tables(agents, agent_team)
        note = f"{config_path} exists and was left as it is; to run the team on {agents}, add:\n{tables}"
    ignored = ignore_state_dir(root)
    ws = Workspace.load(root)
    effective = ws.team()
    if (effective.leader, effective.roles) != (chosen.leader, chosen.roles):
        chosen = effective
    return Initialized(ws, chosen, fcop, not existing, note, ignored)


def _in_git(root: Path) -> bool:
    from taskkernel.coordinator.worktrees.git import toplevel

    return toplevel(root) is not None


IGNORE_LINE = f"/{STATE_DIR}/"


def ignore_state_dir(root: Path) -> bool:
    """In a git repository, keep ``.taskkernel/`` (database, run logs, worktrees, evidence) out of every commit:
    the line is added to ``root/.gitignore`` unless a line there already names it. Returns whether it added it."""
    if not _in_git(root):
        return False
    path = root / ".gitignore"
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    if any(line.strip().strip("/") == STATE_DIR for line in text.splitlines()):
        return False
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(("" if not text or text.endswith("\n") else "\n") + IGNORE_LINE + "\n")
    return True
