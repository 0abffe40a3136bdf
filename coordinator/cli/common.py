"""Shared CLI plumbing: the lazily opened workspace, database, credential and kernel of one command.

Output helpers live in output.py and are re-exported here. Nothing heavy is imported at module level:
`--help`, completion and the groups that need no database never load SQLAlchemy.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NoReturn

import typer

from taskkernel.coordinator.cli.output import Exit, emit, fail, reject, say, show, warn

if TYPE_CHECKING:
    from taskkernel.coordinator.config import ConfigError
    from taskkernel.coordinator.workspace import Workspace
    from taskkernel.kernel.commands import TaskCommandKernel
    from taskkernel.kernel.model.principal import Principal
    from taskkernel.kernel.reasons import KernelError
    from taskkernel.kernel.store.db import Database

__all__ = ["CliContext", "Exit", "emit", "fail", "fail_config", "get_ctx", "reject", "say", "show", "warn"]


@dataclass
class CliContext:
    """Global options, resolved lazily so commands that need no workspace never look for one."""

    db_url: str | None = None
    workspace_path: str | None = None
    token: str | None = None
    _workspace: Workspace | None = field(default=None, repr=False)
    _db: Database | None = field(default=None, repr=False)
    used_token: str | None = field(default=None, repr=False)
    _intact: bool = field(default=False, repr=False)  # quick_check passed in this process

    def workspace(self) -> Workspace:
        """The workspace; none found is a usage error (exit 64)."""
        found = self._locate()
        if isinstance(found, str):
            fail(Exit.USAGE, found)
        return found

    def database(self, *, writes: bool = False) -> Database:
        """The kernel database: --db / TASKKERNEL_DB, else the workspace's configured one. In a workspace its
        event chain is keyed with the workspace's chain key (.taskkernel/chain.key, 0600, created on first
        use; docs/durability.md); with only --db there is no key. A damaged file ends the command with
        ``database_corrupt`` (exit 2), never a traceback. ``writes``: the command is about to change the store,
        so the file is checked first (``require_intact``)."""
        from taskkernel.coordinator import schema
        from taskkernel.kernel.private import load_or_create_secret
        from taskkernel.kernel.store.db import Database, DatabaseCorrupt

        if self._db is None:
            url = self.db_url or os.environ.get("TASKKERNEL_DB")
            durability = "full"
            ws = self.optional_workspace() if url else self.workspace()
            if not url:
                assert ws is not None
                url, durability = ws.database_url, ws.durability
            try:
                db = Database(url, durability)
                if writes:
                    self.require_intact(db)  # before the schema or the chain record is touched
                schema.ensure(db)
                if ws is not None:
                    key_path = ws.chain_key_path

                    def load_key() -> bytes | None:
                        return load_or_create_secret(key_path) if key_path.exists() else None

                    db.use_chain_key(load_key, lambda: load_or_create_secret(key_path))
            except DatabaseCorrupt as exc:
                reject("database_corrupt", f"the database is damaged or not a database: {exc}")
            self._db = db
            if self.token is not None or "TASKKERNEL_TOKEN" in os.environ:
                self.principal()  # a credential given to any command must be live, reads included
        elif writes:
            self.require_intact(self._db)
        return self._db

    def require_intact(self, db: Database) -> None:
        """SQLite's ``PRAGMA quick_check`` (PostgreSQL: nothing), once per process, before a command writes: a
        damaged file is refused ``database_corrupt`` (exit 2, as `verify` names it) with nothing written, instead of
        growing a store `verify` calls corrupt. About 20 ms on 10,000 tasks (docs/cli.md, "Start-up integrity
        check")."""
        from taskkernel.kernel.store.db import DatabaseCorrupt, integrity_summary

        if self._intact:
            return
        try:
            problems = db.integrity_problems(quick=True)
        except DatabaseCorrupt as exc:
            problems = [str(exc)]
        if problems:
            reject("database_corrupt", f"the database is damaged (quick_check: {integrity_summary(problems)}); "
                   "nothing was written. `taskkernel verify` reports it; restore a backup", problems=problems[:20])
        self._intact = True

    def current_database(self, *, writes: bool = True) -> Database:
        """The database, refused (schema_behind / schema_ahead, exit 2) unless its schema is at this code's
        revision: for the commands that write with this code's idea of the tables (``up``, ``submit``), checked
        intact first (``writes``), and for the reads of tables only this revision has (``runs``)."""
        from taskkernel.coordinator import schema
        from taskkernel.kernel.reasons import KernelError

        db = self.database(writes=writes)
        try:
            schema.require_current(db)
        except KernelError as exc:
            reject(exc.reason.value, exc.message)
        return db

    def try_principal(self) -> Principal | KernelError:
        """Who is calling (docs/security.md), or why the credential stands for nobody. A token given
        (--token or TASKKERNEL_TOKEN, even empty) must be a live credential. Without one: in a workspace
        with ``require_token`` the owner's credential file is read; in an older workspace, or with only
        --db (whoever holds the database URL holds the database), the caller is the local owner."""
        from taskkernel.coordinator.runners.ledger import authenticate_agent
        from taskkernel.kernel.model.principal import LOCAL_OWNER
        from taskkernel.kernel.private import read_private
        from taskkernel.kernel.reasons import KernelError, ReasonCode

        token = self.token
        if token is None and "TASKKERNEL_TOKEN" in os.environ:
            token = os.environ["TASKKERNEL_TOKEN"]  # set but empty: an error, never the owner
        if token is None:
            ws = self.optional_workspace()
            if ws is None or not ws.require_token:
                return LOCAL_OWNER
            try:
                token = read_private(ws.owner_token_path).decode("ascii").strip()
            except (OSError, UnicodeDecodeError):
                return KernelError(ReasonCode.ACTOR_UNVERIFIED,
                                   f"no credential: pass --token or TASKKERNEL_TOKEN (the owner's is in "
                                   f"{ws.owner_token_path}, readable only by the workspace owner)")
        self.used_token = token  # `token revoke` will not revoke the credential it runs with
        try:
            return authenticate_agent(self.database(), token)  # a run's token: also its agent's heartbeat
        except KernelError as exc:
            return exc

    def kernel(self) -> TaskCommandKernel:
        """The kernel as the coordinator builds it (coordinator/compose.py); a bad team ([team] or fcop.json)
        is a usage error, never a traceback."""
        from taskkernel.coordinator.compose import build_kernel  # the whole wiring: only commands that need it
        from taskkernel.coordinator.config import ConfigError

        try:
            return build_kernel(self.database(), self.optional_workspace())
        except ConfigError as exc:
            fail_config(exc)
        except ValueError as exc:
            fail(Exit.USAGE, str(exc))

    def principal(self) -> Principal:
        """The caller's principal; an unverified credential ends the command with its refusal (exit 2)."""
        from taskkernel.kernel.reasons import KernelError

        found = self.try_principal()
        if isinstance(found, KernelError):
            reject(found.reason.value, found.message)
        return found

    def require_admin(self, what: str) -> Principal:
        """The caller, if it holds an unscoped ADMIN credential; else a ``role_not_authorized`` refusal."""
        from taskkernel.kernel.reasons import ReasonCode

        principal = self.principal()
        if not principal.is_admin:  # is_admin already requires an unscoped credential
            reject(ReasonCode.ROLE_NOT_AUTHORIZED.value,
                   f"{what} needs the workspace owner's or an unscoped ADMIN credential (caller: {principal.id})")
        return principal

    def optional_workspace(self) -> Workspace | None:
        """The workspace if there is one (commands given only --db may run without)."""
        found = self._locate()
        return None if isinstance(found, str) else found

    def _locate(self) -> Workspace | str:
        """The workspace, or why there is none. A workspace whose taskkernel.toml cannot be used is never
        taken for no workspace (not even with --db, where a silently ignored config would drop its team, roles
        and grants): its error code (``config_invalid``, docs/config.md) ends the command, exit 64."""
        from taskkernel.coordinator.config import ConfigError
        from taskkernel.coordinator.workspace import Workspace, WorkspaceNotFound

        if self._workspace is None:
            try:
                self._workspace = Workspace.locate(self.workspace_path)
            except ConfigError as exc:
                fail_config(exc)
            except WorkspaceNotFound as exc:
                return str(exc)
        return self._workspace


def fail_config(exc: ConfigError) -> NoReturn:
    """A taskkernel.toml that cannot be used: its own code (config_invalid, config_unreadable,
    runner_unavailable), the file, table, key and line; exit 64."""
    details = {k: v for k, v in exc.as_json().items() if k not in ("code", "message")}
    fail(Exit.USAGE, exc.message, error=exc.code, **details)


def get_ctx(ctx: typer.Context) -> CliContext:
    obj = ctx.find_root().obj
    assert isinstance(obj, CliContext)
    return obj
