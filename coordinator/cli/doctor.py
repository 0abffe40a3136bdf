"""`taskkernel doctor`: is this workspace able to work, and what is waiting for a person? (docs/config.md)

Each check is ``ok``, ``warn`` or ``fail``. ``fail``: the workspace cannot work as configured (taskkernel.toml, the
database and its schema revision, the FCoP folder, the team, a runner, private files others can read); ``warn``:
it works, but something waits for a person (quarantined or refused files, blocked tasks, tasks for roles the team
lacks). Exit 0 without a ``fail``, 2 with one. Doctor only reads: it creates no database, key or folder, and it
reads file modes before anything opens the database (opening a SQLite file narrows it to 0600, as every command
does)."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import typer

from taskkernel.coordinator.cli.common import Exit, emit, get_ctx, say, warn
from taskkernel.coordinator.cli.output import oneline
from taskkernel.coordinator.config import CONFIG_NAME, ConfigError, Problem, WorkspaceNotFound
from taskkernel.coordinator.workspace import STATE_DIR, Team, Workspace
from taskkernel.coordinator.worktrees.protected import SCRATCH_INDEX, WORKTREES_DIR

Status = Literal["ok", "warn", "fail"]
OPEN_STATES = ("inbox", "active", "review")
LISTED = 20  # items a check lists in full; the count says how many there are
# Passed to an agent CLI with its credentials (runners/presets.py), but none of them authenticates it.
NOT_A_CREDENTIAL = frozenset({"HTTPS_PROXY", "NO_PROXY", "ANTHROPIC_BASE_URL"})


@dataclass
class Check:
    name: str
    status: Status
    message: str
    extra: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "message": self.message, **self.extra}


def _problems(problems: list[Problem]) -> dict[str, Any]:
    return {"problems": [p.as_json() for p in problems]}


# -- checks that need no database ------------------------------------------------------------------------


def check_config(start: str | None) -> tuple[Check, Workspace | None, Path | None]:
    """taskkernel.toml: found and valid. Returns the workspace (None if the file cannot be used) and its root."""
    try:
        ws = Workspace.locate(start)
    except ConfigError as exc:
        root = exc.path.parent if exc.path else None
        details = {k: v for k, v in exc.as_json().items() if k != "message"}
        return Check("config", "fail", exc.message, details), None, root
    except WorkspaceNotFound as exc:
        return Check("config", "fail", str(exc)), None, None
    return Check("config", "ok", f"{ws.config_path} is valid", {"file": str(ws.config_path)}), ws, ws.root


def _mode(path: Path) -> int | None:
    try:
        return stat.S_IMODE(os.lstat(path).st_mode)
    except OSError:
        return None


def _private_files(root: Path) -> Iterator[Path]:
    """taskkernel.toml and what .taskkernel/ holds, but the task checkouts under ``.taskkernel/worktrees/``: those
    are the repository's files as an agent left them (modes, symlinks and all), reached only through the private
    folders above them; the lock and the ignore file beside them are the coordinator's and are checked, a
    scratch index being written there (git's own mode, a copy of a task's tree) is not."""
    yield root / CONFIG_NAME
    state = root / STATE_DIR
    yield state
    if state.is_dir() and not state.is_symlink():
        checkouts = state / WORKTREES_DIR
        for folder, dirs, files in os.walk(state):
            base = Path(folder)
            if base == checkouts:
                dirs.clear()
                files = [f for f in files if not f.startswith(SCRATCH_INDEX)]
            yield from (base / d for d in dirs)
            yield from (base / f for f in files)


def _exposes(path: Path, root: Path, st: os.stat_result) -> bool:
    """Whether group or other bits on ``path`` matter: taskkernel.toml and .taskkernel/ themselves, and every
    file below with content (a folder inside .taskkernel/ is reached only through it, an empty lock file holds
    nothing)."""
    if path in (root / CONFIG_NAME, root / STATE_DIR):
        return True
    return stat.S_ISREG(st.st_mode) and st.st_size > 0


def check_permissions(root: Path) -> Check:
    """taskkernel.toml and what .taskkernel/ holds are the owner's alone (docs/security.md): no group or other
    bits, no symlink, owned by this user."""
    loose: list[dict[str, Any]] = []
    uid = os.geteuid()
    for path in _private_files(root):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        rel = str(path.relative_to(root))
        if stat.S_ISLNK(st.st_mode):
            loose.append({"path": rel, "problem": "a symlink: private state is never reached through one"})
        elif stat.S_IMODE(st.st_mode) & 0o077 and _exposes(path, root, st):
            want = "0700" if stat.S_ISDIR(st.st_mode) else "0600"
            loose.append({"path": rel, "mode": f"{stat.S_IMODE(st.st_mode):04o}", "problem":
                          f"readable or writable by others; chmod {want} {path}"})
        elif st.st_uid != uid and uid != 0:
            loose.append({"path": rel, "problem": f"owned by uid {st.st_uid}, not this user ({uid})"})
    if loose:
        shown = ", ".join(f"{x['path']} ({x.get('mode', x['problem'])})" for x in loose[:5])
        return Check("permissions", "fail", f"{len(loose)} private file(s) not private: {shown}",
                     {"files": loose[:LISTED], "count": len(loose)})
    return Check("permissions", "ok", f"{CONFIG_NAME} and {STATE_DIR}/ are the owner's only (0600/0700)")


def check_folders(ws: Workspace) -> Check:
    """The FCoP folder: where it is, its generation, and whether taskkernel can use it."""
    from taskkernel.coordinator.fcop import FcopError
    from taskkernel.coordinator.fcop.detect import Generation, open_workspace

    if not ws.config.folders.enabled:
        return Check("folders", "ok", "the folder adapter is off ([folders] enabled = false)")
    try:
        fcop = open_workspace(ws.root, allow_mixed=True)
    except FcopError as exc:
        return Check("folders", "fail", str(exc), {"reason": exc.reason.value})
    extra = {"root": str(fcop.root), "generation": fcop.generation.value}
    if fcop.generation is Generation.MIXED:
        return Check("folders", "warn", f"{fcop.root} holds both G3 (_lifecycle/) and G2 (tasks/, log/) folders: a "
                     "half-finished migration; finish it with `taskkernel fcop migrate`", extra)
    if fcop.generation is Generation.EMPTY:
        return Check("folders", "ok", f"no FCoP folder yet at {fcop.root}: `up` lays it out (G3)", extra)
    if fcop.generation is Generation.G4:
        from taskkernel.coordinator.fcop4.authority import PROFILE_ID

        adopted = PROFILE_ID in fcop.config.get("profiles", [])
        return Check("folders", "ok", f"{fcop.root}: FCoP 4 (G4) through fcop's Core; the kernel decides T4-T7 as "
                     f"the Profile {PROFILE_ID} ({'adopted' if adopted else 'adopted at the first decision'}); "
                     "run fcop-mcp 4 without a Profile beside it (docs/fcop4.md)",
                     {**extra, "profile_adopted": adopted})
    return Check("folders", "ok", f"{fcop.root}: FCoP {fcop.generation.value.upper()}", extra)


def _notes(ws: Workspace) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(quarantined files with their reason, files the kernel refused with their reason note)."""
    from taskkernel.coordinator.fcop.detect import QUARANTINE_DIR, find_workspace_root
    from taskkernel.coordinator.fcop.filenames import REASON_NOTE_PREFIX, REASON_NOTE_SUFFIX
    from taskkernel.coordinator.fcop.quarantining import REASON_SUFFIX

    root = find_workspace_root(ws.root)
    quarantined, refused = [], []
    qdir = root / QUARANTINE_DIR
    if qdir.is_dir() and not qdir.is_symlink():
        names = {e.name for e in os.scandir(qdir)}
        for name in sorted(names):
            if name.endswith(REASON_SUFFIX) and name[: -len(REASON_SUFFIX)] in names:
                quarantined.append({"file": f"{QUARANTINE_DIR}/{name[: -len(REASON_SUFFIX)]}",
                                    "reason": _front_matter_value(qdir / name, "reason")})
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != QUARANTINE_DIR and not (Path(folder) / d).is_symlink())
        for name in sorted(files):
            if name.startswith(REASON_NOTE_PREFIX) and name.endswith(REASON_NOTE_SUFFIX):
                path = Path(folder) / name
                refused.append({"file": str(path.relative_to(root).parent / name[len(REASON_NOTE_PREFIX):
                                                                                  -len(REASON_NOTE_SUFFIX)]),
                                "reason": _front_matter_value(path, "reason")})
    return quarantined, refused


def _front_matter_value(path: Path, key: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for _, line in zip(range(20), fh, strict=False):
                if line.startswith(f"{key}:"):
                    return line.split(":", 1)[1].strip() or None
    except OSError:
        return None
    return None


def check_waiting_files(ws: Workspace) -> Check:
    """Files the folder adapter set aside: quarantined (unreadable as envelopes) or refused by the kernel."""
    if not ws.config.folders.enabled:
        return Check("quarantine", "ok", "the folder adapter is off")
    try:
        quarantined, refused = _notes(ws)
    except Exception as exc:  # noqa: BLE001 - an unreadable folder is this check's finding, not a crash
        return Check("quarantine", "warn", f"the FCoP folder could not be listed: {exc}")
    extra = {"quarantined": quarantined[:LISTED], "refused": refused[:LISTED], "quarantined_count": len(quarantined),
             "refused_count": len(refused)}
    if not quarantined and not refused:
        return Check("quarantine", "ok", "no quarantined or refused files", extra)
    shown = ", ".join(f"{x['file']} ({x['reason']})" for x in (quarantined + refused)[:3])
    return Check("quarantine", "warn", f"{len(quarantined)} quarantined and {len(refused)} refused file(s) wait for a "
                 f"fix (each has its reason beside it): {shown}", extra)


def check_team(ws: Workspace) -> tuple[Check, Any]:
    """The team (fcop.json, [team] or the preset) and the role registry built from it, plugins included."""
    from taskkernel.roles.registry import RoleRegistry

    try:
        team: Team = ws.team()
    except (ValueError, OSError) as exc:
        return Check("team", "fail", f"the team cannot be read: {exc}"), None
    registry = RoleRegistry.for_team(team.leader, team.roles)
    plugins = sorted(set(registry.codes()) - set(team.roles) - {"ADMIN"})
    without = sorted(set(team.roles) - {n.upper() for n in ws.config.roles})
    extra = {"team": team.name, "source": team.source, "leader": team.leader, "roles": team.roles,
             "role_packages": plugins, "without_runner": without}
    note = f"; no runner (tasks wait for a person): {', '.join(without)}" if without else ""
    return Check("team", "ok", f"{team.name} from {team.source}: leader {team.leader}, roles {', '.join(team.roles)}"
                 + (f", role packages {', '.join(plugins)}" if plugins else "") + note, extra), registry


def check_runners(ws: Workspace, registry: Any) -> list[Check]:
    """One check per [roles.X] table: a role of the team, a program this machine can start (placeholders were
    checked with the file), a working folder and an OS user it can use."""
    from taskkernel.coordinator.config import RunnerKind
    from taskkernel.coordinator.runners.config import binary_of, runner_problems, unknown_roles
    from taskkernel.coordinator.runners.presets import preset_of

    problems = runner_problems(ws.config, ws.root)
    if registry is not None:
        for p in unknown_roles(ws.config, registry.known, registry.codes()):
            problems.setdefault(p.table.removeprefix("roles.") if p.table and p.table.startswith("roles.")
                                else "[gate]", []).insert(0, p)
    checks = []
    for name, spec in ws.config.roles.items():
        label = f"runner {name.upper()}"
        found = problems.pop(name, [])
        if found:
            checks.append(Check(label, "fail", "; ".join(p.render() for p in found), _problems(found)))
        elif spec.runner == RunnerKind.SCRIPTED:
            checks.append(Check(label, "ok", "scripted: runs inside the coordinator"))
        else:
            program, _ = binary_of(spec, name.upper(), ws.root)
            runs = f"runs {program}" if program else "argv[0] depends on the task: checked when a run starts"
            names, given = _credentials(spec)
            extra = {"program": program, **({"credentials": names, "credentials_set": given} if names else {})}
            unusable = preset_of(spec).unusable({**os.environ, **spec.env})
            if unusable:
                checks.append(Check(label, "fail", f"{runs}; {unusable}", extra))
            elif names and not given:
                checks.append(Check(label, "warn", f"{runs}; no credential variable of the {spec.runner} CLI "
                                    f"is set ({', '.join(names)}): set one where `up` runs, or log the CLI in as "
                                    "this user (its login under HOME is what it uses then)", extra))
            else:
                checks.append(Check(label, "ok", runs, extra))
    for rest in problems.values():  # [gate] roles naming roles the team lacks
        checks.append(Check("gate", "fail", "; ".join(p.render() for p in rest), _problems(rest)))
    return checks


def _credentials(spec: Any) -> tuple[list[str], list[str]]:
    """(the variables that authenticate a preset's CLI, those of them its agent gets: from the coordinator's
    environment as the preset passes them, or the role's ``env`` and ``pass_env``). Both empty for a runner that
    is no preset. A cloud's switch (``CLAUDE_CODE_USE_BEDROCK``) stands for the credentials it selects."""
    from taskkernel.coordinator.runners.presets import preset_of

    if not spec.is_preset:
        return [], []
    profile = spec.profile
    if profile is None:
        return [], []
    preset = preset_of(spec)
    names = [n for n in profile.credential_vars if n not in NOT_A_CREDENTIAL]
    names += list(profile.switched_vars)
    given = {*(n for n in (*preset.credentials(os.environ), *spec.pass_env) if os.environ.get(n)),
             *(n for n, v in spec.env.items() if v)}
    return names, [n for n in names if n in given]


# -- checks that read the database -------------------------------------------------------------------------


def check_database(url: str, durability: str) -> tuple[Check, Any]:
    """Reachable, readable and intact (SQLite's quick_check, as every writer runs it at start: a damaged file is
    ``database_corrupt``, and the checks that read it are not run); never created here (a missing SQLite file is a
    finding)."""
    import sqlalchemy as sa

    from taskkernel.kernel.store.db import Database, DatabaseCorrupt, integrity_summary, is_corruption

    shown = _redacted(url)
    try:
        path = sa.engine.make_url(url).database if url.startswith("sqlite") else None
    except sa.exc.ArgumentError:
        return Check("database", "fail", f"{shown} is not a database URL"), None
    if path and path != ":memory:" and not Path(path).exists():
        return Check("database", "fail", f"no database at {path}: run `taskkernel init` (or check [kernel] database)",
                     {"url": shown}), None
    try:
        db = Database(url, durability)
        with db.read() as conn:
            conn.execute(sa.text("SELECT 1"))
        problems = db.integrity_problems(quick=True)
    except Exception as exc:  # noqa: BLE001 - every way of not reaching it is this check's answer
        corrupt = is_corruption(exc) or isinstance(exc, DatabaseCorrupt)
        reason = "database_corrupt" if corrupt else "database_unreachable"
        text = " ".join(str(getattr(exc, "orig", None) or exc).split())[:300]
        return Check("database", "fail", f"{reason}: {shown}: {text}", {"url": shown, "reason": reason}), None
    if problems:
        db.dispose()
        return Check("database", "fail", f"database_corrupt: {shown}: quick_check: {integrity_summary(problems)}; "
                     "writers refuse it (`taskkernel verify` reports it; restore a backup)",
                     {"url": shown, "reason": "database_corrupt", "problems": problems[:LISTED]}), None
    return Check("database", "ok", f"{shown} is reachable and intact (quick_check)", {"url": shown}), db


def _redacted(url: str) -> str:
    import sqlalchemy as sa

    try:
        return sa.engine.make_url(url).render_as_string(hide_password=True)
    except sa.exc.ArgumentError:
        return "the configured URL"


def check_schema(db: Any) -> Check:
    """The database's schema revision against this code's (coordinator/schema.py, docs/migrations.md): behind
    (``taskkernel db upgrade``) or ahead (a newer release upgraded it) fails, as `up` and `submit` refuse it."""
    from taskkernel.coordinator.schema import status

    found = status(db)
    extra = {"version": found.current, "head": found.head, "behind": found.behind, "ahead": found.ahead}
    if found.ahead:
        return Check("schema", "fail", f"the database is at revision {found.current}, which this taskkernel does not "
                     f"know (its newest is {found.head}): a newer release upgraded it; use that release", extra)
    if found.behind:
        return Check("schema", "fail", f"the database is at revision {found.current}, this taskkernel at {found.head}: "
                     "`up` and `submit` refuse it until `taskkernel db upgrade`", extra)
    if found.current is None:
        return Check("schema", "warn", f"the database holds no schema yet: the next command creates it at "
                     f"{found.head}", extra)
    return Check("schema", "ok", f"at revision {found.current} (this taskkernel's)", extra)


def check_tasks(db: Any, registry: Any) -> list[Check]:
    """Open tasks that wait for a person: blocked (their runner gave up), or addressed to a role the team lacks
    (adopted from history, or created before the kernel refused them): nothing will ever run them."""
    import sqlalchemy as sa

    from taskkernel.kernel.store.schema import tasks

    blocked, orphaned = [], []
    with db.read() as conn:
        if "tasks" not in set(sa.inspect(conn).get_table_names()):
            return [Check("blocked_tasks", "ok", "no tasks yet")]
        for task_id, state, recipient, raw in conn.execute(
                sa.select(tasks.c.task_id, tasks.c.state, tasks.c.recipient, tasks.c.doc)
                .where(tasks.c.state.in_(OPEN_STATES)).order_by(tasks.c.task_id)):
            doc = json.loads(raw)
            if doc.get("blocked"):  # the fold's own verdict (kernel/model/task.py), as task list --state blocked
                blocked.append({"task_id": task_id, "state": state, "recipient": recipient,
                                "report": doc["blocked"]["report_id"], "reason": doc["blocked"]["reason"]})
            if registry is not None and recipient and not registry.known(recipient):
                orphaned.append({"task_id": task_id, "state": state, "recipient": recipient})
    out = [Check("blocked_tasks", "warn" if blocked else "ok",
                 f"{len(blocked)} open task(s) blocked: " + ", ".join(b["task_id"] for b in blocked[:5])
                 if blocked else "no blocked tasks", {"tasks": blocked[:LISTED], "count": len(blocked)})]
    out.extend(check_stalled(db))
    if orphaned:
        out.append(Check("unknown_recipients", "warn", f"{len(orphaned)} open task(s) for roles the team does not "
                         "have: " + ", ".join(f"{o['task_id']} ({o['recipient']})" for o in orphaned[:5]),
                         {"tasks": orphaned[:LISTED], "count": len(orphaned)}))
    return out


def check_stalled(db: Any) -> list[Check]:
    """Tasks nothing moves any more (their runs ended without an outcome, coordinator/inbox.py ``stalled``) and
    side effects given up on (dead letters): each waits for a person, with the command that tries again."""
    import sqlalchemy as sa

    from taskkernel.coordinator.inbox import stalled
    from taskkernel.kernel.outbox import dead_letters

    try:
        with db.read() as conn:
            idle, count = stalled(conn, db.is_postgres, None, LISTED)
        letters = dead_letters(db)
    except sa.exc.SQLAlchemyError as exc:  # a schema behind this release (see the schema check): not these checks'
        return [Check("dead_letters", "warn", f"cannot read the outbox or runs: {str(exc).splitlines()[0][:200]}")]
    return [Check("stalled_tasks", "warn" if count else "ok",
                  f"{count} task(s) nothing moves: " + ", ".join(t["task_id"] for t in idle[:5])
                  + " (`taskkernel task retry ID`)" if count else "no stalled tasks", {"tasks": idle, "count": count}),
            Check("dead_letters", "warn" if letters else "ok",
                  f"{len(letters)} side effect(s) given up on: " + ", ".join(e["effect_key"] for e in letters[:5])
                  + " (fix the cause, then `taskkernel effects retry KEY`)" if letters else "no dead letters",
                  {"effects": letters[:LISTED], "count": len(letters)})]


# -- the command ---------------------------------------------------------------------------------------------


def diagnose(start: str | None, db_url: str | None = None) -> list[Check]:
    """Every check, in order; a check that cannot run because an earlier one failed says so."""
    config, ws, root = check_config(start)
    checks = [config]
    if root is not None:
        checks.append(check_permissions(root))  # before anything opens the database (which narrows its modes)
    registry = None
    if ws is not None:
        checks.append(check_folders(ws))
        checks.append(check_waiting_files(ws))
        team, registry = check_team(ws)
        checks.append(team)
        checks.extend(check_runners(ws, registry))
    url = db_url or (ws.database_url if ws is not None else None)
    if url is None:
        checks.append(Check("database", "warn", f"not checked: {CONFIG_NAME} cannot be used"))
        return checks
    database, db = check_database(url, ws.durability if ws is not None else "full")
    checks.append(database)
    if db is not None:
        try:
            checks.append(check_schema(db))
            checks.extend(check_tasks(db, registry))
        except Exception as exc:  # noqa: BLE001 - a database that fails mid-read is a finding
            checks.append(Check("tasks", "fail", f"the database could not be read: {exc}"))
        finally:
            db.dispose()
    return checks


def doctor(ctx: typer.Context) -> None:
    """Check the workspace: taskkernel.toml, private file modes, the FCoP folder, the team, each runner, the
    database and its schema, quarantined files and blocked tasks; exit 0 if healthy, 2 otherwise."""
    c = get_ctx(ctx)
    checks = diagnose(c.workspace_path, c.db_url or os.environ.get("TASKKERNEL_DB"))
    healthy = not any(ch.status == "fail" for ch in checks)
    emit({"status": "ok" if healthy else "unhealthy", "checks": [ch.as_json() for ch in checks]}, generic=False)
    colours = {"ok": "green", "warn": "yellow", "fail": "red"}
    for ch in checks:  # one line per check: the human rendering (on stderr when stdout carries the JSON)
        say((f"{ch.status:<4}", colours[ch.status]), f" {ch.name}: {oneline(ch.message)}")
    if not healthy:
        failed = [ch.name for ch in checks if ch.status == "fail"]
        warn(("unhealthy", "red"), f": {', '.join(failed)}")
        raise typer.Exit(int(Exit.REJECTED))
