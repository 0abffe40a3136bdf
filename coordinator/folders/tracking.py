"""What the adapter knows about each file: the version it last ingested or wrote, and for which task.

A file whose (path, sha256) matches its record is old news, so rescans and restarts never turn
the same bytes into a second command, and the projection's own writes are not read back as
requests.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import PurePosixPath

import sqlalchemy as sa

from taskkernel.coordinator.fcop.scan import StatKey
from taskkernel.coordinator.tables import folder_files, folder_stats
from taskkernel.coordinator.tables import metadata as folders_metadata
from taskkernel.kernel.canonical import utc_now_iso
from taskkernel.kernel.store.db import Database

STATS_CHUNK = 500  # rows per statement: a first pass saves every file of the workspace


class Origin(StrEnum):
    PROJECTED = "projected"  # the kernel wrote or moved it
    INGESTED = "ingested"  # an agent or person wrote it and the kernel took it in
    REFUSED = "refused"  # read, but its command was rejected (a reason file sits beside it)
    QUARANTINED = "quarantined"
    KEPT = "kept"  # malformed, but history: found by the import and left where it was (never quarantined)


@dataclass(frozen=True)
class Tracked:
    rel: str
    sha256: str
    task_id: str | None
    origin: Origin
    note: str | None = None


class FileTracker:
    def __init__(self, db: Database) -> None:
        self.db = db
        db.create_schema(folders_metadata)

    def get(self, rel: str) -> Tracked | None:
        with self.db.read() as conn:
            row = conn.execute(sa.select(folder_files).where(folder_files.c.rel == rel)).first()
        return Tracked(row.rel, row.sha256, row.task_id, Origin(row.origin), row.note) if row else None

    def task_file(self, task_id: str) -> str | None:
        """The TASK file the kernel last placed (or took in) for ``task_id`` (matched by file name: reports
        and reviews about the task are tracked under its id too)."""
        with self.db.read() as conn:
            rels = conn.execute(sa.select(folder_files.c.rel).where(
                folder_files.c.task_id == task_id,
                folder_files.c.origin.in_([Origin.PROJECTED.value, Origin.INGESTED.value])
            ).order_by(folder_files.c.updated_at.desc())).scalars().all()
        return next((rel for rel in rels if PurePosixPath(rel).name.startswith(f"{task_id}-")
                     or PurePosixPath(rel).name == f"{task_id}.md"), None)  # G3 names, or FCoP 4's <id>.md

    def digests(self) -> dict[str, str]:
        """rel -> sha256 of every file recorded: what a pass need not read again while its bytes are the same."""
        with self.db.read() as conn:
            return dict(conn.execute(sa.select(folder_files.c.rel, folder_files.c.sha256)).all())

    def stats(self) -> Iterator[tuple[str, StatKey, str]]:
        """(rel, stat key, sha256) of every file a pass saved, a row at a time (a workspace's every file)."""
        with self.db.read() as conn:
            rows = conn.execute(sa.select(folder_stats.c.rel, folder_stats.c.stat, folder_stats.c.sha256)
                                .execution_options(yield_per=STATS_CHUNK))
            for rel, stat, sha in rows:
                yield rel, _key(stat), sha

    def save_stats(self, changed: Iterable[tuple[str, StatKey, str]], removed: set[str]) -> list[str]:
        """One transaction per pass, and only for what changed since the last one, written a chunk at a time (a
        first pass saves every file); returns the rels saved."""
        saved: list[str] = []
        chunks = iter(lambda: list(itertools.islice(changed, STATS_CHUNK)), [])
        first = next(chunks, [])
        if not first and not removed:
            return saved
        with self.db.write() as uow:
            gone = list(removed)
            for start in range(0, len(gone), STATS_CHUNK):
                uow.conn.execute(folder_stats.delete().where(folder_stats.c.rel.in_(gone[start:start + STATS_CHUNK])))
            for chunk in itertools.chain([first], chunks):
                if not chunk:
                    continue
                rels = [rel for rel, _, _ in chunk]
                uow.conn.execute(folder_stats.delete().where(folder_stats.c.rel.in_(rels)))
                uow.conn.execute(folder_stats.insert(), [{"rel": rel, "stat": ":".join(map(str, key)), "sha256": sha}
                                                         for rel, key, sha in chunk])
                saved += rels
        return saved

    def record_many(self, rows: list[tuple[str, str, str | None, Origin, str | None]]) -> None:
        """(rel, sha256, task_id, origin, note) rows in one transaction: an import records thousands."""
        if not rows:
            return
        now = utc_now_iso()
        with self.db.write() as uow:
            uow.conn.execute(folder_files.delete().where(folder_files.c.rel.in_([r[0] for r in rows])))
            uow.conn.execute(folder_files.insert(), [
                {"rel": rel, "sha256": sha, "task_id": task_id, "origin": origin.value, "note": note,
                 "updated_at": now} for rel, sha, task_id, origin, note in rows])

    def record(self, rel: str, sha256: str, task_id: str | None, origin: Origin, note: str | None = None,
               *, moved_from: str | None = None) -> None:
        with self.db.write() as uow:
            if moved_from is not None:
                uow.conn.execute(folder_files.delete().where(folder_files.c.rel == moved_from))
            uow.conn.execute(folder_files.delete().where(folder_files.c.rel == rel))
            uow.conn.execute(folder_files.insert().values(rel=rel, sha256=sha256, task_id=task_id,
                                                          origin=origin.value, note=note, updated_at=utc_now_iso()))


def _key(text: str) -> StatKey:
    size, mtime, ino, ctime = (int(x) for x in text.split(":"))
    return size, mtime, ino, ctime
