"""A workspace on disk: taskkernel.toml, .taskkernel/kernel.db and the FCoP folders.

The toml file marks the root; commands find it from ``--workspace``,
``TASKKERNEL_WORKSPACE`` or by walking up from the current directory.
"""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel.canonical import utc_now_iso
from kernel.private import private_dir, write_private

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
    leader: str
    roles: list[str]
    name: str = "custom"

    @classmethod
    def from_fcop_json(cls, data: dict[str, Any]) -> Team:
        roles = [r["code"] if isinstance(r, dict) else str(r) for r in data.get("roles", [])]
        return cls(leader=str(data.get("leader") or (roles[0] if roles else "ADMIN")), roles=roles,
                   name=str(data.get("team") or data.get("mode") or "custom"))


@dataclass
class Workspace:
    root: Path
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def state_dir(self) -> Path:
        return self.root / STATE_DIR

    @property
    def fcop_dir(self) -> Path:
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
        path = self.fcop_dir / "fcop.json"
        if path.exists():
            return Team.from_fcop_json(json.loads(path.read_text(encoding="utf-8-sig")))
        return Team.from_fcop_json(TEAM_PRESETS["dev-team"])

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


def init_workspace(root: Path, team: str = "dev-team", database: str | None = None) -> Workspace:
    """Create (or complete) a workspace; never overwrites an existing file. ``database``: the URL a new
    taskkernel.toml names, so every later command (and agent) finds the store `init` wrote to."""
    if team not in TEAM_PRESETS:
        raise ValueError(f"unknown team preset {team!r}; choose one of {', '.join(TEAM_PRESETS)}")
    root.mkdir(parents=True, exist_ok=True)
    private_dir(root / STATE_DIR)
    fcop = root / "fcop"
    for stage in LIFECYCLE_STAGES:
        (fcop / "_lifecycle" / stage).mkdir(parents=True, exist_ok=True)
    for bucket in ("reports", "issues", "reviews", "shared", "ledger/views", "_quarantine"):
        (fcop / bucket).mkdir(parents=True, exist_ok=True)
    (root / "workspace").mkdir(exist_ok=True)
    fcop_json = fcop / "fcop.json"
    if not fcop_json.exists():
        data = {**TEAM_PRESETS[team], "lang": "en", "version": 1, "created_at": utc_now_iso()}
        fcop_json.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    config = root / CONFIG_NAME
    if not config.exists():
        text = DEFAULT_TOML if database is None else DEFAULT_TOML.replace(
            '# database = "postgresql+psycopg://user@host/db"', f"database = {json.dumps(database)}")
        write_private(config, text.encode("utf-8"))  # may hold a database password
    return Workspace.load(root)
