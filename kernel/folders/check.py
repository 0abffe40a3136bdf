"""Folder drift: does every task have exactly one TASK file, in the stage the event log says, and does every
TASK file belong to a task the log knows?

Lag is not drift. A task whose projection effect is still queued in the outbox has not been placed yet. A
TASK file of a task the log does not know is drift only when the folder adapter has already handled that
task: ``folder_files`` records a file it took in or wrote for that task id, or this very path as taken in
or written. The adapter never acts on a recorded file again, so the log really lost the task (a truncated
or rewritten log) or the record was forged to hide the file from ingest. Any other such file is waiting
for ingest (the next pass creates or adopts its task, or quarantines it), or was refused with a reason
file beside it.
"""

from __future__ import annotations

import contextlib
import json
import stat
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa

from kernel.fcop import FcopError, FcopWorkspace, parse_filename, safeio
from kernel.fcop.detect import STAGES
from kernel.folders.projection import PROJECT_EFFECT, Projection
from kernel.folders.tracking import Origin, folder_files
from kernel.store.schema import events, outbox, tasks

HANDLED = (Origin.PROJECTED.value, Origin.INGESTED.value)


@dataclass(frozen=True)
class FolderDrift:
    task_id: str
    position: int  # the task's last event position (an unknown task: where the log ends, plus one)
    detail: str
    reason: str = "folder_drift"  # folder_drift (repairable), folder_duplicate, unknown_task_file


def task_files(fcop: FcopWorkspace) -> dict[str, list[Path]]:
    """TASK files per id, read through the safe layer: a symlinked stage folder is not looked into
    (the scan reports it), and a link in a stage is not a TASK file."""
    found: dict[str, list[Path]] = {}
    for directory in [fcop.stage_dir(s) for s in STAGES] + [fcop.root / "tasks"]:
        try:
            entries = safeio.list_dir(directory)
        except (FcopError, OSError):  # missing, or a refused link
            continue
        for entry, st in entries:
            name = parse_filename(entry) if entry.startswith("TASK-") and entry.endswith(".md") else None
            if name is not None and stat.S_ISREG(st.st_mode):
                found.setdefault(name.id, []).append(directory / entry)
    return found


def check_folders(projection: Projection) -> list[FolderDrift]:
    """Drift in both directions, never lag (see the module docstring). Reads the task read model, which
    `taskkernel verify` has proven equal to the log before it looks at folders."""
    fcop = projection.fcop
    with projection.kernel.db.read() as conn:
        rows = conn.execute(sa.select(tasks.c.task_id, tasks.c.doc, tasks.c.last_pos)).all()
        queued = {json.loads(p)["task_id"] for p in conn.execute(sa.select(outbox.c.payload).where(
            outbox.c.effect == PROJECT_EFFECT, outbox.c.status.in_(("pending", "claimed")))).scalars()}
        handled = conn.execute(sa.select(folder_files.c.rel, folder_files.c.task_id).where(
            folder_files.c.origin.in_(HANDLED))).all()
        head = conn.execute(sa.select(sa.func.max(events.c.global_pos))).scalar() or 0
    files = task_files(fcop)
    drifts: list[FolderDrift] = []
    for task_id, doc_text, pos in rows:
        if task_id in queued:
            continue
        state = json.loads(doc_text)["state"]
        paths = files.get(task_id, [])
        if not paths:
            drifts.append(FolderDrift(task_id, pos, "no TASK file in any stage"))
        elif len(paths) > 1:
            drifts.append(FolderDrift(task_id, pos, "TASK file in several places: " +
                                      ", ".join(fcop.relative(p) for p in paths), "folder_duplicate"))
        elif paths[0].parent.name != state and not (state == "inbox" and paths[0].parent.name == "tasks"):
            drifts.append(FolderDrift(task_id, pos, f"TASK file is in {paths[0].parent.name}/, the kernel says "
                                                    f"{state}"))
    known = {row[0] for row in rows}
    handled_rels, handled_tasks = {rel for rel, _ in handled}, {task for _, task in handled}
    for task_id, paths in sorted(files.items()):
        taken = [fcop.relative(p) for p in paths if task_id in handled_tasks or fcop.relative(p) in handled_rels]
        if task_id not in known and taken:
            drifts.append(FolderDrift(task_id, head + 1, f"TASK file of a task the log does not know: "
                                      f"{', '.join(taken)} (the folder adapter already took in or wrote it)",
                                      "unknown_task_file"))
    return drifts


def repair_folders(projection: Projection, drifts: list[FolderDrift]) -> int:
    """Put each drifted task's file where the log says. Never deletes: duplicates and files of unknown tasks
    need a person; a refused move (e.g. a symlinked stage) stays drift and is reported again."""
    repaired = 0
    for d in drifts:
        if d.reason != "folder_drift":
            continue
        with contextlib.suppress(FcopError):
            if projection.place(d.task_id, by="kernel:verify", tool="repair") is not None:
                repaired += 1
    projection.refresh_ledger()
    return repaired
