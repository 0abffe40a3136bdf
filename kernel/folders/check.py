"""Folder drift: does every task have exactly one TASK file, in the stage the event log says?"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa

from kernel.fcop import FcopWorkspace, parse_filename
from kernel.fcop.detect import STAGES
from kernel.folders.projection import PROJECT_EFFECT, Projection
from kernel.store.schema import outbox, tasks


@dataclass(frozen=True)
class FolderDrift:
    task_id: str
    position: int  # the task's last event position
    detail: str


def task_files(fcop: FcopWorkspace) -> dict[str, list[Path]]:
    found: dict[str, list[Path]] = {}
    for directory in [fcop.stage_dir(s) for s in STAGES] + [fcop.root / "tasks"]:
        if not directory.is_dir():
            continue
        for path in directory.glob("TASK-*.md"):
            name = parse_filename(path.name)
            if name is not None:
                found.setdefault(name.id, []).append(path)
    return found


def check_folders(projection: Projection) -> list[FolderDrift]:
    """Tasks whose folder projection is still queued (no coordinator has run since) are lag, not drift."""
    fcop = projection.fcop
    with projection.kernel.db.read() as conn:
        rows = conn.execute(sa.select(tasks.c.task_id, tasks.c.doc, tasks.c.last_pos)).all()
        queued = {json.loads(p)["task_id"] for p in conn.execute(sa.select(outbox.c.payload).where(
            outbox.c.effect == PROJECT_EFFECT, outbox.c.status.in_(("pending", "claimed")))).scalars()}
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
                                      ", ".join(fcop.relative(p) for p in paths)))
        elif paths[0].parent.name != state and not (state == "inbox" and paths[0].parent.name == "tasks"):
            drifts.append(FolderDrift(task_id, pos, f"TASK file is in {paths[0].parent.name}/, the kernel says "
                                                    f"{state}"))
    return drifts


def repair_folders(projection: Projection, drifts: list[FolderDrift]) -> int:
    """Put each drifted task's file where the log says (never deletes: duplicates need a person)."""
    repaired = 0
    for d in drifts:
        if "several places" in d.detail:
            continue
        if projection.place(d.task_id, by="kernel:verify", tool="repair") is not None:
            repaired += 1
    projection.refresh_ledger()
    return repaired
