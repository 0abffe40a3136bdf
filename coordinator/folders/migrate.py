"""Convert a G2 FCoP root ("five buckets") to G3 (``_lifecycle/``) in one atomic step (docs/import-and-migrate.md).

fcop's own migrator is not enough: it puts every open task in the inbox whatever its real state, leaves loose
files behind (so ``log/`` stays and fcop reads the result as "mixed"), and moves file by file (mixed in
between). Here:

* the complete G3 root is built in a sibling temp folder (``.<root>.migrate-<random>``, which no reader takes
  for a workspace): files whose bytes do not change are hard-linked, TASK files are new files with fcop's
  baseline transition (``from: null`` to their stage, by ``migration``, tool ``fcop_migrate_v3``, at the file's
  mtime, and for a task the kernel knows ``kernel_event`` = its last event) appended;
* the old tree is listed again: if anything changed meanwhile (a coordinator still running), nothing happens;
* the two folders are exchanged with one ``renameat2(RENAME_EXCHANGE)``, inside the database transaction that
  moves every ``folder_files`` record to its file's new path (a failed commit exchanges them back), so the
  root is the whole G2 tree or the whole G3 tree at every instant (without renameat2: two renames, and for
  their moment no root at all);
* the old root, untouched, becomes the backup ``.taskkernel/migrate-backup-<UTC>/<root>/``.

Every file operation goes through ``taskkernel.coordinator.fcop.safeio`` (checked descriptors, no symlink ever
followed); a symlink or special file anywhere in the tree refuses the whole migration before anything is written.
The only other operations are ``shutil.rmtree`` of our own temp and backup folders after a failure (it never
follows links either) and the renames of the swap, on a descriptor safeio opened.
"""

from __future__ import annotations

import ctypes
import errno
import os
import secrets
import shutil
import stat
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from taskkernel.coordinator.fcop import frontmatter
from taskkernel.coordinator.fcop.detect import (
    BUCKETS,
    LIFECYCLE_DIR,
    STAGES,
    Generation,
    find_workspace_root,
    open_workspace,
)
from taskkernel.coordinator.fcop.errors import FcopError, FcopReason
from taskkernel.coordinator.fcop.filenames import (
    EnvelopeKind,
    envelope_prefix,
    is_reason_note,
    parse_filename,
    reason_note_name,
)
from taskkernel.coordinator.fcop.models import Transition
from taskkernel.coordinator.fcop.parse import DEFAULT_MAX_BYTES, decode
from taskkernel.coordinator.fcop.safeio import (
    confine,
    ensure_dir,
    list_dir,
    open_read,
    parent_fd,
    read_bytes,
    sha256_hex,
    write_new,
)
from taskkernel.coordinator.folders.projection import EVENT_KEY
from taskkernel.coordinator.folders.tracking import Origin, folder_files, folders_metadata
from taskkernel.kernel.store.db import Database
from taskkernel.kernel.store.schema import tasks

LEGACY_DIR = "shared/g2-legacy"  # loose files of tasks/ and log/ keep their path below it
BASELINE_BY, BASELINE_TOOL = "migration", "fcop_migrate_v3"  # fcop.lifecycle.events.synthetic_baseline_event
TASK_AREAS = {"tasks": "inbox", "log/tasks": "archive"}  # where a task the kernel does not know goes
LOG_BUCKETS = {f"log/{bucket}": kind for kind, bucket in BUCKETS.items()}
ENVELOPE_SUFFIXES = (".md", ".fcop")  # what fcop's readers take
_RENAME_EXCHANGE = 2  # linux/fs.h


class MigrateRefused(Exception):
    """Why the workspace was left as it was: a stable reason code, a message and details for the JSON."""

    def __init__(self, reason: str, message: str, **extra: Any) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason, self.message, self.extra = reason, message, extra


@dataclass(frozen=True)
class Move:
    """One file whose path or bytes change. ``stage``/``stage_from`` for TASK files; ``unstamped`` says why a
    TASK file keeps its bytes (not UTF-8, no front matter: fcop's migrator leaves those as they are too)."""

    src: str
    dst: str
    kind: str  # task, report, issue, review, note (a reason note following its file), other (kept in LEGACY_DIR)
    stage: str | None = None
    stage_from: str | None = None  # "kernel" (its database knows the task) or the G2 folder it came from
    unstamped: str | None = None
    data: bytes | None = field(default=None, repr=False)  # the stamped bytes

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"from": self.src, "to": self.dst, "kind": self.kind}
        if self.stage:
            out.update(stage=self.stage, stage_from=self.stage_from, stamped=self.data is not None)
        if self.unstamped:
            out["unstamped"] = self.unstamped
        return out


@dataclass
class Plan:
    project: Path
    root: Path  # the FCoP root: <project>/fcop or <project>/docs/agents
    root_mode: int
    backup_base: Path  # .taskkernel/migrate-backup-<UTC>/: the old root goes below it, at its own path
    dirs: dict[str, int]  # folder of the old tree -> its mode
    files: dict[str, os.stat_result]  # regular file of the old tree -> its lstat
    moves: dict[str, Move]  # by source path

    @property
    def backup(self) -> Path:
        return self.backup_base / self.root.relative_to(self.project)

    def target(self, rel: str) -> str:
        move = self.moves.get(rel)
        return move.dst if move else rel

    def as_json(self) -> dict[str, Any]:
        moves = sorted(self.moves.values(), key=lambda m: m.src)
        return {"root": str(self.root), "backup": str(self.backup), "moves": [m.as_json() for m in moves],
                "counts": dict(sorted(Counter(m.kind for m in moves).items())),
                "stages": dict(sorted(Counter(m.stage for m in moves if m.stage).items())),
                "unchanged": len(self.files) - len(moves)}


def known_states(db: Database) -> dict[str, tuple[str, int]]:
    """task id -> (its state in the read model: the stage its TASK file belongs in, its last event's position)."""
    with db.read() as conn:
        return {row.task_id: (row.state, row.last_pos)
                for row in conn.execute(sa.select(tasks.c.task_id, tasks.c.state, tasks.c.last_pos))}


def tracked_origins(db: Database) -> dict[str, str]:
    """rel -> origin of every file the folder adapter recorded (none if it never ran)."""
    with db.read() as conn:
        if not sa.inspect(conn).has_table(folder_files.name):
            return {}
        return {row.rel: row.origin for row in conn.execute(sa.select(folder_files.c.rel, folder_files.c.origin))}


def plan(project: Path, state_dir: Path, states: dict[str, tuple[str, int]], origins: dict[str, str]) -> Plan:
    """Where every file of the project's G2 root goes; reads the tree, writes nothing."""
    try:
        root = find_workspace_root(project)
        if root == project:
            raise MigrateRefused("unsupported_layout", f"the FCoP root is the project folder {project} itself; "
                                 "migrate converts fcop/ or docs/agents/ beside .taskkernel/")
        confine(project)
        entry = dict(list_dir(root.parent)).get(root.name)
        dirs, files = walk_tree(root) if entry else ({}, {})  # first: a link is refused before anything is read
        fcop = open_workspace(project)
        if fcop.generation is Generation.G4:
            raise MigrateRefused(FcopReason.UNSUPPORTED_WORKSPACE_GENERATION.value,
                                 f"{root} is already FCoP 4 (G4); neither fcop nor taskkernel converts G4 back to G3",
                                 generation="g4")
        if entry is None or fcop.generation is not Generation.G2:
            reason = "already_g3" if fcop.generation is Generation.G3 else "not_g2"
            raise MigrateRefused(reason, f"{root} is {fcop.generation.value.upper()}, not G2 "
                                 "(tasks/ or log/): nothing to migrate", generation=fcop.generation.value)
        root_mode = stat.S_IMODE(entry.st_mode)
    except FcopError as exc:
        raise MigrateRefused(exc.reason.value, exc.message, path=str(exc.path) if exc.path else None) from exc
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    p = Plan(project, root, root_mode, state_dir / f"migrate-backup-{stamp}", dirs, files, {})
    notes = []
    for rel, st in files.items():
        if not _in_g2_area(rel):
            continue
        area, name = _area(rel), rel.rsplit("/", 1)[-1]
        kind = envelope_prefix(name) if name.endswith(ENVELOPE_SUFFIXES) else None
        if area in TASK_AREAS and kind is EnvelopeKind.TASK:
            p.moves[rel] = _task_move(root, rel, name, st, area, states, origins)
        elif area in LOG_BUCKETS and kind is LOG_BUCKETS[area]:
            p.moves[rel] = Move(rel, f"{BUCKETS[kind]}/{name}", kind.value.lower())
        elif is_reason_note(name):
            notes.append(rel)
        else:
            p.moves[rel] = Move(rel, f"{LEGACY_DIR}/{rel}", "other")
    for rel in notes:  # a reason note stays beside its file, wherever that goes
        folder, name = rel.rsplit("/", 1)
        owner = next((m for m in p.moves.values() if m.src.rsplit("/", 1)[0] == folder
                      and reason_note_name(m.src.rsplit("/", 1)[-1]) == name and m.kind != "other"), None)
        dst = f"{owner.dst.rsplit('/', 1)[0]}/{name}" if owner else f"{LEGACY_DIR}/{rel}"
        p.moves[rel] = Move(rel, dst, "note" if owner else "other")
    _check_collisions(p)
    return p


def walk_tree(root: Path) -> tuple[dict[str, int], dict[str, os.stat_result]]:
    """Every folder and regular file below ``root``, listed through safeio; a symlink or special file refuses."""
    dirs: dict[str, int] = {}
    files: dict[str, os.stat_result] = {}
    pending = [""]
    while pending:
        folder = pending.pop()
        for name, st in list_dir(root / folder if folder else root):
            rel = f"{folder}/{name}" if folder else name
            if stat.S_ISDIR(st.st_mode):
                dirs[rel] = stat.S_IMODE(st.st_mode)
                pending.append(rel)
            elif stat.S_ISREG(st.st_mode):
                files[rel] = st
            elif stat.S_ISLNK(st.st_mode):
                raise FcopError(FcopReason.SYMLINK_REFUSED, f"{root / rel} is a symbolic link: migrate never "
                                "follows or moves one; remove it first", root / rel)
            else:
                raise FcopError(FcopReason.NOT_REGULAR_FILE, f"{root / rel} is not a regular file or folder",
                                root / rel)
    return dirs, files


def _in_g2_area(rel: str) -> bool:
    """Below tasks/ or log/: the folders that must be gone (fcop takes either for a G2 marker)."""
    return rel.split("/", 1)[0] in ("tasks", "log")


def _area(rel: str) -> str:
    """The G2 area of a file below tasks/ or log/: ``tasks``, ``log/<bucket>`` or ``log`` (directly in log/)."""
    parts = rel.split("/")
    if parts[0] == "tasks":
        return "tasks"
    return f"log/{parts[1]}" if len(parts) > 2 else "log"


def _task_move(root: Path, rel: str, name: str, st: os.stat_result, area: str,
               states: dict[str, tuple[str, int]], origins: dict[str, str]) -> Move:
    """A TASK file goes to the stage the kernel holds its task in, unless the adapter recorded this very file as
    something other than the task's (refused, kept, quarantined); else to inbox (tasks/) or archive (log/tasks/).

    The baseline of a task the kernel knows carries ``kernel_event`` = its last event's position: the file now
    says everything up to there, so the projection appends only what comes after (it replays a task's events
    from the last ``kernel_event`` its file carries)."""
    parsed = parse_filename(name)
    state, last_pos = states.get(parsed.id, (None, 0)) if parsed else (None, 0)
    event: dict[str, Any] = {"from": None, "by": BASELINE_BY, "tool": BASELINE_TOOL,
                             "at": datetime.fromtimestamp(st.st_mtime, tz=UTC).isoformat()}
    if state in STAGES and origins.get(rel) in (None, Origin.INGESTED.value, Origin.PROJECTED.value):
        stage, stage_from = str(state), "kernel"
        event[EVENT_KEY] = last_pos
    else:
        stage, stage_from = TASK_AREAS[area], f"{area}/"
    dst = f"{LIFECYCLE_DIR}/{stage}/{name}"
    baseline = Transition.model_validate({**event, "to": stage})
    try:
        data, _ = read_bytes(root / rel, DEFAULT_MAX_BYTES)
        text, _bom = decode(data)
        stamped = frontmatter.append_list_item(text, "transitions", baseline.to_mapping()).encode("utf-8")
    except FcopError as exc:
        return Move(rel, dst, "task", stage, stage_from, unstamped=exc.reason.value)
    return Move(rel, dst, "task", stage, stage_from, data=stamped)


def _check_collisions(p: Plan) -> None:
    """Two files may not land on one path, nor a file where a folder stays (nothing is ever overwritten)."""
    landing: dict[str, list[str]] = {}
    for rel in p.files:
        landing.setdefault(p.target(rel), []).append(rel)
    kept_dirs = {d for d in p.dirs if not _in_g2_area(d)}
    clashes = sorted((dst, sorted(srcs)) for dst, srcs in landing.items() if len(srcs) > 1 or dst in kept_dirs)
    if clashes:
        raise MigrateRefused(FcopReason.TARGET_EXISTS.value, f"{len(clashes)} destination(s) would hold two "
                             "files; rename or remove one of each pair, then migrate again",
                             conflicts=[{"to": dst, "from": srcs} for dst, srcs in clashes])


# -- apply ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Result:
    backup: Path
    swap: str  # "exchange" (atomic) or "rename" (two renames: for a moment there was no root)
    tracked: int  # folder_files records moved with their file


def apply(p: Plan, db: Database) -> Result:
    """Build the G3 root beside the old one, check the old one is unchanged, then swap them inside the transaction
    that moves the records (a failed commit swaps them back)."""
    staged = p.root.parent / f".{p.root.name}.migrate-{secrets.token_hex(4)}"
    made: list[Path] = []  # what we created, removed again unless the swap published it
    swapped: tuple[str, str] | None = None  # (how, the name the old root has now) while the swap stands
    try:
        for folder in (p.backup_base, staged):  # never an existing backup or temp folder
            mkdir_new(folder)
            made.append(folder)
        ensure_dir(p.backup.parent)
        _build(p, staged)
        changed = _changes(p)
        if changed:
            raise MigrateRefused(FcopReason.CONTENT_CHANGED.value, f"{len(changed)} path(s) changed while the new "
                                 "root was built (is `taskkernel up` running?); nothing was changed",
                                 changed=changed[:20])
        db.create_schema(folders_metadata)
        with parent_fd(staged) as (dir_fd, staged_name):
            try:
                with db.write() as uow:
                    tracked = _retrack(uow.conn, p)
                    swapped = swap_roots(dir_fd, p.root.name, staged_name)
                    os.fsync(dir_fd)
            except BaseException:
                if swapped is not None:
                    unswap_roots(dir_fd, p.root.name, staged_name, swapped)  # if this fails, nothing is removed below
                    swapped = None
                raise
    except FcopError as exc:
        raise MigrateRefused(exc.reason.value, exc.message, path=str(exc.path) if exc.path else None) from exc
    finally:
        if swapped is None:
            for folder in made:  # our links, files and empty folders; the live tree is untouched
                shutil.rmtree(folder, ignore_errors=True)
    return Result(stash_root(p.root.parent / swapped[1], p.backup), swapped[0], tracked)


def _retrack(conn: sa.Connection, p: Plan) -> int:
    """Give every record of a moving file its new path (and a stamped file its new digest); returns how many."""
    dsts = [m.dst for m in p.moves.values()]
    for i in range(0, len(dsts), 500):  # a stale record at a destination (its file long gone) gives way
        conn.execute(folder_files.delete().where(folder_files.c.rel.in_(dsts[i:i + 500])))
    tracked = 0
    for move in p.moves.values():
        values: dict[str, Any] = {"rel": move.dst}
        if move.data is not None:
            values["sha256"] = sha256_hex(move.data)
        tracked += conn.execute(folder_files.update().where(folder_files.c.rel == move.src).values(**values)).rowcount
    return tracked


def mkdir_new(path: Path) -> None:
    with parent_fd(path, create=True) as (dir_fd, name):
        try:
            os.mkdir(name, 0o700, dir_fd=dir_fd)
        except FileExistsError:
            raise FcopError(FcopReason.TARGET_EXISTS, f"{path} already exists", path) from None


def _build(p: Plan, staged: Path) -> None:
    """The new root: every kept folder (same mode), the five stages and flat buckets, every file at its target."""
    new_dirs = {d: mode for d, mode in p.dirs.items() if not _in_g2_area(d)}
    for d in (*(f"{LIFECYCLE_DIR}/{s}" for s in STAGES), *BUCKETS.values()):
        new_dirs.setdefault(d, 0o755)
    for rel in sorted(new_dirs):
        ensure_dir(staged / rel)
    for rel, st in p.files.items():
        move = p.moves.get(rel)
        dst = staged / (move.dst if move else rel)
        if move is None or move.data is None:
            _link(p.root / rel, dst)
            continue
        write_new(dst, move.data)
        fd = open_read(dst)
        try:
            os.fchmod(fd, stat.S_IMODE(st.st_mode))
            os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(fd)
    modes = {**{f"{LEGACY_DIR}/{d}": mode for d, mode in p.dirs.items() if _in_g2_area(d)}, **new_dirs}
    made = {str(parent) for rel in map(p.target, p.files) for parent in Path(rel).parents} | set(new_dirs)
    for rel in sorted(made - {"."}, key=lambda d: -d.count("/")):  # deepest first: each fsync covers its entries
        _chmod_sync(staged / rel, modes.get(rel, 0o755))
    _chmod_sync(staged, p.root_mode)


def _link(src: Path, dst: Path) -> None:
    with parent_fd(src) as (src_fd, src_name), parent_fd(dst, create=True) as (dst_fd, dst_name):
        try:
            os.link(src_name, dst_name, src_dir_fd=src_fd, dst_dir_fd=dst_fd, follow_symlinks=False)
        except OSError as exc:
            raise FcopError(FcopReason.IO_ERROR, f"cannot link {src} into the new root: {exc.strerror}",
                            src) from exc


def _chmod_sync(folder: Path, mode: int) -> None:
    """Give a new folder its old mode and make its entries durable before the swap publishes them."""
    with parent_fd(folder) as (parent, name):
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    try:
        os.fchmod(fd, mode)
        os.fsync(fd)
    finally:
        os.close(fd)


def _changes(p: Plan) -> list[str]:
    """Paths added, removed or rewritten in the old tree since it was planned (our links change only ctime)."""
    dirs, files = walk_tree(p.root)

    def key(st: os.stat_result) -> tuple[int, int, int]:
        return st.st_ino, st.st_size, st.st_mtime_ns

    changed = {rel for rel in files.keys() | p.files.keys()
               if rel not in files or rel not in p.files or key(files[rel]) != key(p.files[rel])}
    return sorted(changed | (dirs.keys() ^ p.dirs.keys()))


def _renameat2_exchange(dir_fd: int, a: str, b: str) -> bool:
    """Exchange two names atomically; False where the system or file system cannot (then we rename twice)."""
    fn = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if fn is None:
        return False
    fn.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    if fn(dir_fd, os.fsencode(a), dir_fd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, f"renameat2: {os.strerror(err)}")


def swap_roots(dir_fd: int, live: str, staged: str) -> tuple[str, str]:
    """Publish the staged root under the live name: (how, the name the old root has now). It returns as soon as
    the names moved (the caller then knows what to undo), or raises with the old root back in place."""
    if _renameat2_exchange(dir_fd, live, staged):
        return "exchange", staged
    aside = f"{staged}.old"
    os.rename(live, aside, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)  # from here to the next rename: no root at all
    try:
        os.rename(staged, live, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError:
        os.rename(aside, live, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)  # the old root goes back
        raise
    return "rename", aside


def unswap_roots(dir_fd: int, live: str, staged: str, swapped: tuple[str, str]) -> None:
    how, old = swapped
    if how == "exchange":
        _renameat2_exchange(dir_fd, live, staged)
    else:
        os.rename(live, staged, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        os.rename(old, live, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    os.fsync(dir_fd)


def stash_root(old: Path, backup: Path) -> Path:
    """Move the old root into the backup folder; if it cannot go there (another file system) it stays where it
    is, beside the new root, and that is the backup."""
    with parent_fd(old) as (src_fd, src_name), parent_fd(backup) as (dst_fd, dst_name):
        try:
            os.rename(src_name, dst_name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
        except OSError:
            return old
        os.fsync(dst_fd)
        os.fsync(src_fd)
    return backup
