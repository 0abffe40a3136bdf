"""A workspace on disk: taskkernel.toml, .taskkernel/kernel.db and the FCoP folders.

The toml file marks the root; commands find it from ``--workspace``,
``TASKKERNEL_WORKSPACE`` or by walking up from the current directory. The FCoP folders are
wherever the project already keeps them (``fcop/`` or ``docs/agents/``); `init` lays out
``fcop/`` only in a project that has none, and never adds anything to one that exists.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from taskkernel.coordinator.fcop.detect import CONFIG_NAME as FCOP_CONFIG
from taskkernel.coordinator.fcop.detect import G2_MARKERS, LIFECYCLE_DIR, find_workspace_root
from taskkernel.coordinator.fcop.errors import FcopError
from taskkernel.coordinator.fcop.filenames import BROADCAST, RESERVED_ROLES, EnvelopeKind, is_role_code, parse_filename
from taskkernel.kernel.canonical import utc_now_iso
from taskkernel.kernel.private import private_dir, write_private

CONFIG_NAME = "taskkernel.toml"
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
_NOT_TEAM = RESERVED_ROLES | {BROADCAST}  # the human owner, the system and a broadcast are no team roles

DEFAULT_TOML = """\
# taskkernel workspace configuration (see docs/cli.md)
[kernel]
# "full": fsync every commit (survives kill -9 and power loss); "process": survives kill -9 only.
durability = "full"
# No token means no authority: the owner's CLI reads its credential from .taskkernel/owner.token (0600);
# agents get only their run's scoped token (docs/security.md).
require_token = true
# database = "postgresql+psycopg://user@host/db"   # default: .taskkernel/kernel.db (SQLite, WAL)
"""


class WorkspaceNotFound(Exception):
    pass


@dataclass
class Team:
    """A team's leader and roles; ``source`` says where it was found: "fcop.json", "taskkernel.toml" (its
    ``[team]`` table), "files" (the roles the FCoP files use) or "preset"."""

    leader: str
    roles: list[str]
    name: str = "custom"
    source: str = "preset"

    @classmethod
    def from_fcop_json(cls, data: dict[str, Any], source: str = FCOP_CONFIG) -> Team:
        roles = [r["code"] if isinstance(r, dict) else str(r) for r in data.get("roles", [])]
        return cls(leader=str(data.get("leader") or (roles[0] if roles else "ADMIN")), roles=roles,
                   name=str(data.get("team") or data.get("mode") or "custom"), source=source)

    @classmethod
    def preset(cls, name: str) -> Team:
        if name not in TEAM_PRESETS:
            raise ValueError(f"unknown team preset {name!r}; choose one of {', '.join(TEAM_PRESETS)}")
        return cls.from_fcop_json(TEAM_PRESETS[name], source="preset")

    @classmethod
    def from_toml(cls, table: Any) -> Team:
        """taskkernel.toml's ``[team]``: ``leader = "…"``, ``roles = [...]``, optionally ``name``."""
        roles = table.get("roles") if isinstance(table, dict) else None
        if not (isinstance(roles, list) and roles and all(isinstance(r, str) and is_role_code(r)
                                                          and r not in _NOT_TEAM for r in roles)):
            raise ValueError(f"[team] in {CONFIG_NAME} needs roles = [...]: role codes (A-Z, 0-9, _ and inner "
                             f"hyphens) other than {', '.join(sorted(_NOT_TEAM))}")
        leader = table.get("leader")
        if leader not in roles:
            raise ValueError(f"[team] leader in {CONFIG_NAME} must be one of its roles {roles}, not {leader!r}")
        return cls(leader, roles, name=str(table.get("name", "custom")), source=CONFIG_NAME)

    def toml(self) -> str:
        """This team as taskkernel.toml's ``[team]`` table (role codes and preset names are plain ASCII)."""
        why = "the roles its FCoP files use" if self.source == "files" else f"the {self.name} preset"
        return (f"\n[team]\n# The team (init took {why}); an fcop.json in the FCoP folder takes precedence.\n"
                f"name = {json.dumps(self.name)}\nleader = {json.dumps(self.leader)}\n"
                f"roles = {json.dumps(self.roles)}\n")


@dataclass
class Workspace:
    root: Path
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def state_dir(self) -> Path:
        return self.root / STATE_DIR

    @property
    def fcop_dir(self) -> Path:
        """The FCoP root the folder adapter uses: ``fcop/`` or ``docs/agents/`` (``find_workspace_root``). When
        both exist `up` and `verify` refuse with ambiguous_workspace_root; this then says ``fcop/``."""
        try:
            return find_workspace_root(self.root)
        except FcopError:
            return self.root / "fcop"

    @property
    def sqlite_path(self) -> Path:
        return self.state_dir / DB_NAME

    @property
    def database_url(self) -> str:
        return str(self.config.get("kernel", {}).get("database") or f"sqlite:///{self.sqlite_path}")

    @property
    def require_token(self) -> bool:
        """New workspaces say true; a workspace written before the setting existed keeps the old
        meaning (no token = the local owner) until its owner turns it on."""
        return bool(self.config.get("kernel", {}).get("require_token", False))

    @property
    def grant_sessions(self) -> frozenset[str]:
        """Sessions that hold grants and belong to ADMIN: `admin` and the gate's configured session."""
        configured = self.config.get("gate", {}).get("session")
        return frozenset({"admin", *([str(configured)] if configured else [])})

    @property
    def owner_token_path(self) -> Path:
        return self.state_dir / OWNER_TOKEN_NAME

    @property
    def chain_key_path(self) -> Path:
        return self.state_dir / CHAIN_KEY_NAME

    @property
    def durability(self) -> str:
        return str(self.config.get("kernel", {}).get("durability", "full"))

    def team(self) -> Team:
        """The FCoP root's fcop.json, else taskkernel.toml's ``[team]``, else the dev-team preset."""
        path = self.fcop_dir / FCOP_CONFIG
        if path.exists():
            return Team.from_fcop_json(json.loads(path.read_text(encoding="utf-8-sig")))
        if "team" in self.config:
            return Team.from_toml(self.config["team"])
        return Team.preset(DEFAULT_TEAM)

    @classmethod
    def load(cls, root: Path) -> Workspace:
        with open(root / CONFIG_NAME, "rb") as fh:
            return cls(root.resolve(), tomllib.load(fh))

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


@dataclass(frozen=True)
class Initialized:
    """What `init` did: the workspace, its team, its FCoP root and whether `init` laid that root out (False: an
    existing FCoP workspace, left exactly as it was). ``note``: a team `init` could not write (see init_workspace)."""

    workspace: Workspace
    team: Team
    fcop_root: Path
    laid_out: bool
    note: str | None = None


def fcop_root_of(root: Path) -> tuple[Path, bool]:
    """Where the FCoP folders of the project ``root`` are (or go) and whether an FCoP workspace is already there:
    ``fcop/`` or ``docs/agents/`` with G2 folders, ``_lifecycle/`` or fcop.json. Raises FcopError
    (ambiguous_workspace_root) when both exist. FCoP folders directly in the project root are no workspace
    (fcop itself only looks in those two places): the layout then goes to ``fcop/``."""
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
    roles: set[str] = set()
    senders: Counter[str] = Counter()
    from_admin: Counter[str] = Counter()
    for name in _file_names(fcop_root):
        fn = parse_filename(name)
        if fn is None:
            continue
        roles.update(r for r in (fn.sender, fn.recipient) if r and r not in _NOT_TEAM)
        if fn.sender and fn.sender not in _NOT_TEAM:
            senders[fn.sender] += 1
        if fn.kind is EnvelopeKind.TASK and fn.sender == "ADMIN" and fn.recipient and fn.recipient not in _NOT_TEAM:
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


def _choose_team(fcop: Path, existing: bool, config: dict[str, Any], preset: str | None) -> tuple[Team, bool]:
    """The team `init` settles on, and whether it belongs in taskkernel.toml's ``[team]``."""
    if not existing:
        return Team.preset(preset or DEFAULT_TEAM), False  # written as the new layout's fcop.json
    fcop_json = fcop / FCOP_CONFIG
    if fcop_json.exists():
        current = Team.from_fcop_json(json.loads(fcop_json.read_text(encoding="utf-8-sig")))
    elif "team" in config:
        current = Team.from_toml(config["team"])
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
    for stage in LIFECYCLE_STAGES:
        (fcop / "_lifecycle" / stage).mkdir(parents=True, exist_ok=True)
    for bucket in ("reports", "issues", "reviews", "shared", "ledger/views", "_quarantine"):
        (fcop / bucket).mkdir(parents=True, exist_ok=True)
    fcop_json = fcop / FCOP_CONFIG
    if not fcop_json.exists():
        data = {**TEAM_PRESETS[preset], "lang": "en", "version": 1, "created_at": utc_now_iso()}
        fcop_json.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def init_workspace(root: Path, team: str | None = None, database: str | None = None) -> Initialized:
    """Create (or complete) a workspace; never overwrites a file, never adds anything to an existing FCoP workspace.

    A project without one gets the G3 layout in ``fcop/`` (or in an empty ``docs/agents/``) with the ``team``
    preset (default dev-team) as its fcop.json. An existing one (``fcop/`` or ``docs/agents/``) is left exactly as
    it is: its team is its fcop.json, else the ``[team]`` of taskkernel.toml, else ``team``'s preset or the roles
    its files use, written to the new taskkernel.toml's ``[team]`` (an existing taskkernel.toml is never changed:
    ``note`` then says what to add). ``database``: the URL a new taskkernel.toml names, so every later command
    (and agent) finds the store `init` wrote to. Raises ValueError (an unknown preset, a ``team`` other than the
    one already named) and FcopError (both ``fcop/`` and ``docs/agents/``) before writing anything."""
    if team is not None and team not in TEAM_PRESETS:
        raise ValueError(f"unknown team preset {team!r}; choose one of {', '.join(TEAM_PRESETS)}")
    root = root.resolve()
    config_path = root / CONFIG_NAME
    config: dict[str, Any] = {}
    if config_path.exists():
        with open(config_path, "rb") as fh:
            config = tomllib.load(fh)
    fcop, existing = fcop_root_of(root)
    chosen, to_config = _choose_team(fcop, existing, config, team)
    root.mkdir(parents=True, exist_ok=True)
    private_dir(root / STATE_DIR)
    if not existing:
        _lay_out(fcop, team or DEFAULT_TEAM)
    (root / "workspace").mkdir(exist_ok=True)
    note = None
    if not config_path.exists():
        text = DEFAULT_TOML if database is None else DEFAULT_TOML.replace(
            '# database = "postgresql+psycopg://user@host/db"', f"database = {json.dumps(database)}")
        write_private(config_path, (text + (chosen.toml() if to_config else "")).encode("utf-8"))  # may hold a password
    elif to_config:
        note = f"{config_path} exists and was left as it is; to use this team, add:{chosen.toml()}"
    ws = Workspace.load(root)
    effective = ws.team()
    if (effective.leader, effective.roles) != (chosen.leader, chosen.roles):
        chosen = effective
    return Initialized(ws, chosen, fcop, not existing, note)
