"""Folder drift: does every task have exactly one TASK file, in the stage the event log says, and does every
TASK file belong to a task the log knows?

A task's own file carries its id and its route (sender, recipient); in G3 its subject is the kernel's too (the
projection keeps it so; a G2 file is history and is never rewritten). Another file with the id — a
duplicate or a spoof the ingest refused — is not the task's and is not drift, unless the adapter recorded
it as the task's file (`task_file_mismatch`). The files looked at are those the import and the scans take
(``fcop.scan.task_files``: every folder a TASK file may live in, batch folders below it included), so an
import followed by `verify` is clean; a file's place shows the state the import and ingest read from it
(``shown_state``: a batch folder below a stage is that stage, G2 history folders the archive).

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from taskkernel.coordinator.fcop import FcopError, FcopFilename, Generation, read_envelope
from taskkernel.coordinator.fcop.scan import Listed, shown_state, task_files
from taskkernel.coordinator.folders.projection import PROJECT_EFFECT, Projection
from taskkernel.coordinator.folders.tracking import Origin, folder_files
from taskkernel.kernel.store.schema import events, outbox, tasks

BATCH = 1000  # task documents per fetch
HANDLED = (Origin.PROJECTED.value, Origin.INGESTED.value)
REFUSED = (Origin.REFUSED.value, Origin.QUARANTINED.value, Origin.KEPT.value)  # intruders and kept history


@dataclass(frozen=True)
class FolderDrift:
    task_id: str
    position: int  # the task's last event position (an unknown task: where the log ends, plus one)
    detail: str
    reason: str = "folder_drift"  # folder_drift (repairable), folder_duplicate, unknown_task_file, task_file_mismatch


def check_folders(projection: Projection) -> list[FolderDrift]:
    """Drift in both directions, never lag (see the module docstring). Reads the task read model, which
    `taskkernel verify` has proven equal to the log before it looks at folders."""
    fcop = projection.fcop
    g2 = fcop.generation is Generation.G2
    drifts: list[FolderDrift] = []
    known: set[str] = set()
    with projection.kernel.db.snapshot() as conn:  # the reads below agree with each other, on PostgreSQL too
        queued = {json.loads(p)["task_id"] for p in conn.execute(sa.select(outbox.c.payload).where(
            outbox.c.effect == PROJECT_EFFECT, outbox.c.status.in_(("pending", "claimed")))).scalars()}
        records = {r.rel: (r.task_id, r.origin) for r in conn.execute(
            sa.select(folder_files.c.rel, folder_files.c.task_id, folder_files.c.origin))}
        head = conn.execute(sa.select(sa.func.max(events.c.global_pos))).scalar() or 0
        files = task_files(fcop)  # after the snapshot began: a task it holds is projected or still queued
        # one task document at a time (a streaming cursor): memory follows the folder, not the log
        rows = conn.execute(sa.select(tasks.c.task_id, tasks.c.doc, tasks.c.last_pos).execution_options(
            yield_per=BATCH))
        for task_id, doc_text, pos in rows:
            known.add(task_id)
            if task_id not in queued:
                drifts += _drift_of(g2, records, files.get(task_id, []), task_id, json.loads(doc_text), pos)
    handled_tasks = {task for task, origin in records.values() if origin in HANDLED}
    for task_id, found in sorted(files.items()):
        taken = [f.rel for f, _ in found if task_id in handled_tasks or records.get(f.rel, (None, ""))[1] in HANDLED]
        if task_id not in known and taken:
            drifts.append(FolderDrift(task_id, head + 1, f"TASK file of a task the log does not know: "
                                      f"{', '.join(taken)} (the folder adapter already took in or wrote it)",
                                      "unknown_task_file"))
    return drifts


def _drift_of(g2: bool, records: dict[str, tuple[str, str]], candidates: list[tuple[Listed, FcopFilename]],
              task_id: str, doc: dict[str, Any], pos: int) -> list[FolderDrift]:
    """The drift between one task of the read model and the TASK files that carry its id."""
    drifts: list[FolderDrift] = []
    own = [f for f, n in candidates if (n.sender, n.recipient) == (doc["sender"], doc["recipient"])
           and records.get(f.rel, (None, ""))[1] not in REFUSED]
    for f, _ in candidates:  # a file of this id with another route may only be a refused intruder
        if f not in own and records.get(f.rel, (None, ""))[1] in HANDLED:
            drifts.append(FolderDrift(task_id, pos, f"{f.rel} names {task_id} with another route than the "
                                                    "task's and is recorded as its file", "task_file_mismatch"))
    if not own:
        drifts.append(FolderDrift(task_id, pos, "no TASK file in any stage"))
        return drifts
    if len(own) > 1:
        drifts.append(FolderDrift(task_id, pos, "TASK file in several places: " + ", ".join(f.rel for f in own),
                                  "folder_duplicate"))
        return drifts
    f = own[0]
    if not g2 and shown_state(f.area, f.stage) != doc["state"]:
        drifts.append(FolderDrift(task_id, pos, f"TASK file is in {f.stage or f.area}/, the kernel says "
                                                f"{doc['state']}"))
    if not g2 and (subject := _subject(f.path)) is not None and not _same_subject(subject, doc["subject"]):
        drifts.append(FolderDrift(task_id, pos, f"{f.rel} has subject {subject!r}, the kernel "
                                                f"{doc['subject']!r}", "task_file_mismatch"))
    return drifts


def unknown_task_files(projection: Projection) -> list[dict[str, str]]:
    """TASK files whose id the log does not know and that are not drift: their status is the adapter's record of
    them (refused, kept, quarantined) or `waiting` (not taken in yet)."""
    fcop = projection.fcop
    with projection.kernel.db.read() as conn:
        known = set(conn.execute(sa.select(tasks.c.task_id)).scalars())
        records = dict(conn.execute(sa.select(folder_files.c.rel, folder_files.c.origin)).all())
    out = []
    for task_id, found in sorted(task_files(fcop).items()):
        for f, _ in found if task_id not in known else ():
            status = records.get(f.rel, "waiting")
            if status not in HANDLED:
                out.append({"file": f.rel, "task_id": task_id, "status": status})
    return out


def _subject(path: Path) -> str | None:
    """The file's subject as a reader sees it (None when it cannot be read: the scan reports that)."""
    try:
        env = read_envelope(path)
    except (FcopError, OSError):
        return None
    return (getattr(env, "subject", None) or env.id).strip()


def _same_subject(on_disk: str, kernel: str) -> bool:
    """Equal, or the kernel holds the import's shortened form (a subject beyond 500 characters)."""
    return on_disk == kernel or (kernel.endswith("…") and on_disk.startswith(kernel[:-1]))


def repair_folders(projection: Projection, drifts: list[FolderDrift]) -> int:
    """Put each drifted task's file where the log says. Never deletes: duplicates and files of unknown tasks
    need a person; a refused move (e.g. a symlinked stage) stays drift and is reported again."""
    repaired = 0
    for d in drifts:
        if d.reason != "folder_drift":
            continue
        with contextlib.suppress(FcopError):
            if projection.place(d.task_id) is not None:
                repaired += 1
    projection.refresh_ledger()
    return repaired
