"""`taskkernel fcop migrate --to g4`: a G2 or G3 workspace rewritten as FCoP 4 through fcop's Core, in one swap.

The kernel's history is the source (the workspace must be imported first): every task is created by the Core in a
new ``fcop/`` built beside the old root, then walked through the Core's edges event by event (each claim, submit,
rejection, approval, reopen and archive the kernel recorded, with its round's report as the attempt's REPORT); a
task adopted by an import (its earlier life never recorded) is walked the shortest legal way to its state, the
REVIEWs saying so. The Core names each task ``TASK-<32 hex>``; ``task_aliases`` maps it to the kernel's id, which
stays (both answer `task show`). A force-archived task has no G4 edge to its state: it stays in the kernel only.
fcop's validator must accept the new root and the old one must be unchanged; then, inside the transaction that
records aliases and file records, the new root takes the old one's place (an atomic exchange where the system has
one) and the old root goes into ``.taskkernel/migrate-backup-<UTC>/`` byte for byte.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from taskkernel.coordinator.fcop import FcopError, Generation, open_workspace
from taskkernel.coordinator.fcop.detect import find_workspace_root
from taskkernel.coordinator.fcop4.adapter import EDGE_OF_EVENT, NOT_EXPRESSIBLE, report_before
from taskkernel.coordinator.fcop4.aliases import add_aliases
from taskkernel.coordinator.fcop4.authority import PROFILE_ID, core
from taskkernel.coordinator.fcop4.edges import STAGES, CoreEdges
from taskkernel.coordinator.folders.importer import root_key_of
from taskkernel.coordinator.folders.migrate import (
    MigrateRefused,
    mkdir_new,
    stash_root,
    swap_roots,
    unswap_roots,
    walk_tree,
)
from taskkernel.coordinator.folders.tracking import Origin
from taskkernel.coordinator.tables import folder_files, folder_imports
from taskkernel.kernel.canonical import utc_now_iso
from taskkernel.kernel.commands import TaskCommandKernel
from taskkernel.kernel.store.schema import tasks

# The one Core edge from a stage towards a state (the shortest legal way: an adopted task's unrecorded past).
TOWARDS = {("inbox", "active"): "active", ("inbox", "review"): "active", ("inbox", "done"): "active",
           ("inbox", "archive"): "active", ("active", "review"): "review", ("active", "done"): "review",
           ("active", "archive"): "review", ("review", "done"): "done", ("review", "archive"): "done",
           ("review", "active"): "active", ("done", "active"): "active", ("done", "archive"): "archive"}


@dataclass
class G4Plan:
    project: Path
    root: Path                    # the G2/G3 root now
    generation: str
    docs: list[dict[str, Any]]    # every task to write, parents before children
    kept: dict[str, str]          # task id -> why it stays in the kernel only
    backup: Path
    aliases: dict[str, str] = field(default_factory=dict)  # kernel id -> the file's TASK-<32 hex> id

    def as_json(self) -> dict[str, Any]:
        return {"from": self.generation, "to": "g4", "root": str(self.root), "target": str(self.project / "fcop"),
                "tasks": len(self.docs), "kernel_only": self.kept, "backup": str(self.backup)}


def plan_g4(project: Path, state_dir: Path, kernel: TaskCommandKernel) -> G4Plan:
    try:
        root = find_workspace_root(project)
        if root == project:
            raise MigrateRefused("unsupported_layout", f"the FCoP root is the project folder {project} itself; "
                                 "migrate converts fcop/ or docs/agents/ beside .taskkernel/")
        fcop = open_workspace(project)
    except FcopError as exc:
        raise MigrateRefused(exc.reason.value, exc.message, path=str(exc.path) if exc.path else None) from exc
    if fcop.generation is Generation.G4:
        raise MigrateRefused("already_g4", f"{root} is already FCoP 4 (G4): nothing to migrate", generation="g4")
    if fcop.generation is Generation.EMPTY:
        raise MigrateRefused("not_g2", f"{root} holds no FCoP workspace: nothing to migrate", generation="empty")
    with kernel.db.read() as conn:
        docs = {row.task_id: row for row in conn.execute(sa.select(tasks.c.task_id, tasks.c.doc))}
    loaded = {task_id: json.loads(row.doc) for task_id, row in docs.items()}
    kept = {t: "force-archived: FCoP 4 has no edge to archive from where it was" for t in loaded
            if any(e.type in NOT_EXPRESSIBLE for e in kernel.history(t))}
    ordered: list[dict[str, Any]] = []
    placed: set[str] = set()

    def place(task_id: str) -> None:  # parents first: a G4 parent is a strong relation, resolved at creation
        doc = loaded[task_id]
        if task_id in placed or task_id in kept:
            return
        placed.add(task_id)
        if doc["parent"] in loaded:
            place(doc["parent"])
        ordered.append(doc)

    for task_id in sorted(loaded, key=lambda t: (loaded[t]["created_at"], t)):
        place(task_id)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return G4Plan(project, root, fcop.generation.value, ordered, kept, state_dir / f"migrate-backup-{stamp}")


@dataclass
class G4Result:
    swap: str
    backup: Path
    files: int


def apply_g4(plan: G4Plan, kernel: TaskCommandKernel, key: bytes) -> G4Result:
    """Build, validate, then swap inside the transaction that records aliases and files (a failed commit swaps
    back); anything built is removed unless the swap published it."""
    from fcop.errors import FcopError as CoreError

    for stale in plan.backup.parent.glob("migrate-g4-*"):  # an earlier build that was never published
        shutil.rmtree(stale, ignore_errors=True)
    staging = plan.backup.parent / f"migrate-g4-{secrets.token_hex(4)}"  # in .taskkernel/: never in the project
    before = _keys(plan.root)
    written: list[tuple[Path, str]] = []
    swapped: tuple[str, str] | None = None
    made = [staging]
    try:
        mkdir_new(staging)
        final = staging / "root"
        final.mkdir()
        core(final, key).create_workspace(profiles=[PROFILE_ID])
        for i, doc in enumerate(plan.docs):
            try:
                _write_in_scratch(staging / f"task-{i}", final / "fcop", kernel, doc, plan.aliases, key, written)
            except CoreError as exc:  # what fcop's Core refuses of a task: the migration stops, nothing changed
                raise MigrateRefused("fcop_refused", f"fcop's Core refused {doc['task_id']}: {exc}; nothing was "
                                     "changed", task_id=doc["task_id"], code=getattr(exc, "code", None)) from exc
        if _keys(plan.root) != before:
            raise MigrateRefused("content_changed", "the old root changed while the new one was built (is "
                                 "`taskkernel up` running?); nothing was changed")
        mkdir_new(plan.backup)
        made.append(plan.backup)
        new_root = final / "fcop"
        records = _records(new_root, written)
        with _project_fd(plan.project) as dir_fd:
            name, staged_name = "fcop", f".fcop-g4-root-{secrets.token_hex(4)}"
            os.rename(new_root, plan.project / staged_name)
            try:
                with kernel.db.write() as uow:
                    _record(uow.conn, plan, records)
                    if plan.root == plan.project / "fcop":
                        swapped = swap_roots(dir_fd, name, staged_name)
                    else:  # docs/agents/: fcop/ is free (both would be ambiguous), the new root takes that name
                        os.rename(staged_name, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                        swapped = ("rename", "")
                    os.fsync(dir_fd)
            except BaseException:
                if swapped is not None and swapped[1]:
                    unswap_roots(dir_fd, name, staged_name, swapped)
                elif swapped is not None:
                    os.rename(name, staged_name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                swapped = None
                shutil.rmtree(plan.project / staged_name, ignore_errors=True)
                raise
    except FcopError as exc:
        raise MigrateRefused(exc.reason.value, exc.message, path=str(exc.path) if exc.path else None) from exc
    finally:
        if swapped is None:
            for folder in made:
                shutil.rmtree(folder, ignore_errors=True)
        else:
            shutil.rmtree(staging, ignore_errors=True)
    if swapped[1]:  # the exchanged old root, now under the staged name in the project folder
        backup = stash_root(plan.project / swapped[1], plan.backup / plan.root.name)
    else:  # docs/agents/ (a confinement root itself): moved by name, never through a link (checked by the walk)
        os.rename(plan.root, plan.backup / plan.root.name)
        backup = plan.backup / plan.root.name
    return G4Result(swapped[0], backup, len(records))


@contextlib.contextmanager
def _project_fd(project: Path) -> Iterator[int]:
    """The project folder, opened without following a link: both roots are entries of it."""
    fd = os.open(project, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        yield fd
    finally:
        os.close(fd)


def _write_in_scratch(scratch: Path, final: Path, kernel: TaskCommandKernel, doc: dict[str, Any],
                      aliases: dict[str, str], key: bytes, written: list[tuple[Path, str]]) -> None:
    """One task built in a workspace of its own (same manifest, its parent's file linked in), validated by fcop,
    then moved into the new root: fcop's Core parses every envelope of its workspace at each gate, so building all
    tasks in one workspace would cost the square of their number."""
    root = scratch / "fcop"
    for folder in (*(f"_lifecycle/{s}" for s in STAGES), "reports", "issues", "reviews", "operations", "cold"):
        (root / folder).mkdir(parents=True)
    os.link(final / "fcop.json", root / "fcop.json")
    linked = []
    ancestor = doc["parent"]
    while ancestor in aliases:  # the Core resolves a parent's own parent too: the whole line is linked in
        found = next(final.glob(f"_lifecycle/*/{aliases[ancestor]}.md"))
        os.link(found, root / found.relative_to(final))
        linked.append(root / found.relative_to(final))
        ancestor = (kernel.task(ancestor) or {}).get("parent")
    edges = CoreEdges(scratch, key, lambda path, task_id: written.append((path, task_id)))
    _write_task(edges, kernel, doc, aliases)
    _validated(scratch)
    for path in linked:
        path.unlink()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.name != "fcop.json"):
        target = final / path.relative_to(root)
        os.link(path, target)  # never over an existing name (ids and receipts are unique)
    written[:] = [(final / p.relative_to(root) if p.is_relative_to(root) else p, t) for p, t in written]
    shutil.rmtree(scratch)


def _write_task(edges: CoreEdges, kernel: TaskCommandKernel, doc: dict[str, Any], aliases: dict[str, str]) -> None:
    """One task into the new root: created by the Core, then every recorded edge, then the shortest way to its state."""
    task_id = doc["task_id"]
    history = kernel.history(task_id)
    refs = [aliases.get(r, r) for r in doc["references"]]
    created = edges.core.create_task(
        workspace_id=edges.workspace_id, operation_id=f"taskkernel-migrate-{task_id}"[:128], sender=doc["sender"],
        recipient=doc["recipient"], subject=doc["subject"], body=doc["body"] or doc["subject"],
        priority=doc["priority"], parent=aliases.get(doc["parent"]) if doc["parent"] else None, references=refs)
    file_id = str(created["task_id"])
    aliases[task_id] = file_id
    edges.written(Path(created["path"]), task_id)
    for event in history:
        edge = EDGE_OF_EVENT.get(event.type)
        if edge is not None and edges.state(file_id)[0] == edge[0]:
            edges.step(file_id, task_id, doc["authority"], *edge,
                       report_body=report_before(history, event.global_pos),
                       reason=str(event.data.get("reason") or ""))
    end = history[-1].global_pos + 1 if history else 0
    while (step := TOWARDS.get((edges.state(file_id)[0], doc["state"]))) is not None:
        edges.step(file_id, task_id, doc["authority"], edges.state(file_id)[0], step,
                   report_body=report_before(history, end),
                   reason="migrated: the kernel adopted this task in a later state; its earlier rounds are "
                          "in the kernel's history and the backup")


def _validated(project: Path) -> None:
    from fcop.workspace import validate_workspace

    report = validate_workspace(project)
    if not report["valid"]:
        first = report["errors"][0]
        raise MigrateRefused("fcop_invalid", f"fcop's validator refuses a migrated task: {first.get('code')}: "
                             f"{first.get('message')} ({first.get('path')}); nothing was changed")


def _keys(root: Path) -> tuple[dict[str, int], dict[str, tuple[int, int, int]]]:
    dirs, files = walk_tree(root)
    return dirs, {rel: (st.st_ino, st.st_size, st.st_mtime_ns) for rel, st in files.items()}


def _records(new_root: Path, written: list[tuple[Path, str]]) -> list[tuple[str, str, str]]:
    """(rel, sha256, kernel task id) of every envelope the migration wrote, where it is in the new root now."""
    owner: dict[str, str] = {}
    for path, task_id in written:
        owner[path.name] = task_id  # a TASK file moved between stages: its last place counts
    out = []
    for path in sorted(new_root.rglob("*.md")):
        if path.name in owner:
            out.append((path.relative_to(new_root).as_posix(), hashlib.sha256(path.read_bytes()).hexdigest(),
                        owner[path.name]))
    return out


def _record(conn: sa.Connection, plan: G4Plan, records: list[tuple[str, str, str]]) -> None:
    """Aliases, the new root's file records (the old root's go: its files are in the backup) and its import."""
    add_aliases(conn, [(file_id, task_id) for task_id, file_id in plan.aliases.items() if file_id != task_id])
    conn.execute(folder_files.delete())
    now = utc_now_iso()
    if records:
        conn.execute(folder_files.insert(), [{"rel": rel, "sha256": sha, "task_id": task_id,
                                              "origin": Origin.PROJECTED.value, "note": None, "updated_at": now}
                                             for rel, sha, task_id in records])
    old_key = root_key_of(plan.root, plan.project)
    conn.execute(folder_imports.delete().where(folder_imports.c.root.in_([old_key, "fcop"])))
    conn.execute(folder_imports.insert().values(root="fcop", generation="g4", imported_at=now,
                                                summary=f'{{"migrated_from": "{plan.generation}"}}'))
