"""The tables of taskkernel.toml besides the roles' (docs/config.md): each a strict pydantic model, unknown keys
forbidden. ``taskkernel.coordinator.config`` assembles them into the whole file, with the role tables
(``RunnerSpec``), the loading and the messages; this module holds the tables that need nothing of those."""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

RISK_LEVELS = ("low", "medium", "high")  # irreversible tasks protect every operation: nothing to configure


def near(word: str, candidates: Sequence[str]) -> str | None:
    """The candidate ``word`` is most likely a misspelling of (case-insensitive), if any is close enough."""
    lowered = {c.lower(): c for c in candidates}
    found = difflib.get_close_matches(word.lower(), list(lowered), n=1, cutoff=0.6)
    return lowered[found[0]] if found else None


class KeyProblem(ValueError):
    """A model-level check that can name the key it is about (so the message points at that key's line)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


class Table(BaseModel):
    """A table of taskkernel.toml: unknown keys are errors, values taken strictly (no "600" for 600)."""

    model_config = ConfigDict(extra="forbid", strict=True)


class KernelTable(Table):
    """``[kernel]``: where the store is and how it behaves."""

    durability: Literal["full", "process"] = "full"
    # Absent: a workspace written before the setting existed keeps the old meaning (no token = the local owner).
    require_token: bool = False
    database: str | None = Field(default=None, min_length=1)
    max_runs: int = Field(default=4, ge=1, le=256)  # agent runs at once in this coordinator, all roles together
    # Seconds `up` waits after the first SIGINT/SIGTERM for running agents to finish before stopping them.
    shutdown_grace: float = Field(default=30.0, ge=0, le=86400, allow_inf_nan=False)

    @field_validator("database")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None:
            from sqlalchemy.engine import make_url  # only when a URL is configured
            from sqlalchemy.exc import ArgumentError

            try:
                make_url(value)
            except ArgumentError:
                raise ValueError("not a database URL (sqlite:///path/to/file.db or "
                                 "postgresql+psycopg://user@host/db)") from None
        return value


class TeamTable(Table):
    """``[team]``: used when the FCoP folder has no fcop.json (which takes precedence)."""

    name: str = Field(default="custom", min_length=1)
    leader: str
    roles: list[str] = Field(min_length=1)


class GateTable(Table):
    """``[gate]``: the session grants are read from and which operations need a grant (docs/gate.md)."""

    session: str = Field(default="admin", min_length=1, max_length=200)
    protected: dict[str, list[str]] = Field(default_factory=dict)  # risk level -> operations needing a grant
    roles: dict[str, list[str]] = Field(default_factory=dict)  # role -> operations protected for it too

    @field_validator("protected")
    @classmethod
    def _levels(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        for key in value:
            if key == "irreversible":
                raise ValueError("irreversible tasks protect every operation already: nothing to configure")
            if key not in RISK_LEVELS:
                guess = near(key, RISK_LEVELS)
                raise ValueError(f"{key} is not a risk level ({', '.join(RISK_LEVELS)})"
                                 + (f"; did you mean {guess}?" if guess else ""))
        return value

    @field_validator("protected", "roles")
    @classmethod
    def _operations(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        for key, ops in value.items():
            if any(not op.strip() or op != op.strip() for op in ops):
                raise ValueError(f"{key}: operations are non-empty names without surrounding spaces (\"*\": all)")
        return value


class FoldersTable(Table):
    """``[folders]``: the FCoP folder adapter."""

    enabled: bool = True
    submit_on_done_report: bool = True


class SchedulerTable(Table):
    """``[scheduler]``: the durable automations."""

    max_clock_skew: str | int | None = None  # a duration ("1d", "6h") or seconds; default one day

    @field_validator("max_clock_skew")
    @classmethod
    def _duration(cls, value: str | int | None) -> str | int | None:
        if value is not None:
            from taskkernel.scheduler.models import SchedulerException, parse_duration

            try:
                parse_duration(value)
            except SchedulerException as exc:
                raise ValueError(exc.message) from None
        return value

    def as_mapping(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


MIN_OUTPUT_BUDGET = 1024  # a refusal, a summary and a cursor must always fit
MAX_OUTPUT_BUDGET = 16 * 2**20


class McpTable(Table):
    """``[mcp]``: the MCP server (`taskkernel mcp`, docs/mcp.md)."""

    # Bytes of one tool result's structured content; past it lists are cut (truncated, next_cursor) and long
    # texts are cut with a pointer to get_task.
    output_budget: int = Field(default=16384, ge=MIN_OUTPUT_BUDGET, le=MAX_OUTPUT_BUDGET)


class ServeTable(Table):
    """``[serve]``: the web board (`taskkernel serve`, docs/web.md)."""

    # Every page and API route needs a signed-in credential (else 401 / the sign-in page). Required before the
    # board may listen beyond loopback (--host other than 127.0.0.1/::1/localhost).
    require_login: bool = False
    # Host names the board answers besides the address it listens on (and, on loopback, 127.0.0.1, localhost and
    # ::1): the public name a TLS proxy in front passes on. Any other Host is refused (DNS rebinding).
    hosts: list[Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9.:\[\]-]+$")]] = Field(
        default_factory=list)


# Untracked files a worktree never commits (gitignore syntax), on top of the repository's own ignore rules: the
# caches and environments tools write while an agent works (pytest, mypy, ruff, tox, pip, npm), which no
# repository means to track. A tracked file stays tracked: ignore rules only apply to untracked files.
DEFAULT_EXCLUDES = (
    "__pycache__/", "*.py[cod]", "*$py.class", ".venv/", "venv/", ".tox/", ".nox/", ".pytest_cache/",
    ".mypy_cache/", ".ruff_cache/", ".pytype/", ".hypothesis/", ".ipynb_checkpoints/", ".coverage", ".coverage.*",
    "htmlcov/", "*.egg-info/", ".eggs/", "node_modules/", ".parcel-cache/", ".eslintcache", ".gradle/",
    ".DS_Store", "Thumbs.db",
)
_PATTERN_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class WorktreesTable(Table):
    """``[worktrees]``: what a task's worktree never commits (docs/agents.md#what-a-worktree-commits)."""

    exclude: list[str] = Field(default_factory=list)  # gitignore patterns added to DEFAULT_EXCLUDES
    drop_defaults: list[str] = Field(default_factory=list)  # entries of DEFAULT_EXCLUDES this workspace commits

    @field_validator("exclude")
    @classmethod
    def _patterns(cls, value: list[str]) -> list[str]:
        for pattern in value:
            if not pattern.strip() or pattern != pattern.strip():
                raise ValueError(f"{pattern!r}: a pattern is not empty and has no surrounding spaces")
            if _PATTERN_CONTROL.search(pattern):
                raise ValueError(f"{pattern!r}: a pattern holds no line break or control character")
            if pattern.startswith("#"):
                raise ValueError(f"{pattern!r} would be a comment in an ignore file; write \\# for a leading #")
        return value

    @field_validator("drop_defaults")
    @classmethod
    def _defaults(cls, value: list[str]) -> list[str]:
        for pattern in value:
            if pattern not in DEFAULT_EXCLUDES:
                guess = near(pattern, DEFAULT_EXCLUDES)
                raise ValueError(f"{pattern!r} is not one of the default excludes"
                                 + (f"; did you mean {guess!r}?" if guess else f" ({', '.join(DEFAULT_EXCLUDES)})"))
        return value

    def patterns(self) -> list[str]:
        """The patterns a worktree's ``git add`` and ``git status`` ignore: the defaults this workspace keeps,
        then its own (later lines win, so a ``!pattern`` of its own can re-include what a default hid)."""
        return [p for p in DEFAULT_EXCLUDES if p not in self.drop_defaults] + self.exclude
