"""Import: an FCoP workspace that agents already wrote is taken in as history, once.

The first `taskkernel up` after `init` (or `taskkernel fcop import`) runs it before any live ingest. History
is judged as history: every task is adopted in the state its files show (ADMIN's `adopt_task`), parents
before children whatever order files are listed in, and every REPORT, REVIEW and ISSUE that refers to a
task is attached to it (`attach_record`), even when the task is archived. Role and lifecycle rules judge the
commands that come after. Nothing in the workspace is moved or rewritten: a malformed file is kept where
it is (never quarantined: it is history too), a refused one gets its reason note beside it.

State from files: G3 — the stage folder. G2 — `log/tasks/` and `history/` are archived; a task in `tasks/`
is `review` when its driver's latest report says done, `active` when its driver reported anything else,
else `inbox`. Round: entries into `active` in its transitions (at least 1 past the inbox).

One id, one task: of several TASK files with one id, the task is the one whose route the kernel already
holds, else the first by file name (byte order), then path; the others are refused `duplicate_task_id`.

Files the import does not read at all — a link (to a file or a folder), a FIFO or device, a file over the
size limit, an unreadable file or folder, a folder deeper than the scans look — are listed in `skipped` with
their reason code, and the report's status is `incomplete`: what they hold is not in the kernel. They are
recorded like kept files, so a later pass leaves them where they are too.

Commands are committed in batches (one transaction, one fsync per batch), and every file it handled is
recorded in `folder_files`, so a later pass (or a re-run after a crash) never takes a file twice.

Each file is read and parsed once, in one walk that stands as the pass's scan too (`Ingest.took_over`). Memory
follows the files' number, not their size: per file the plan keeps its place, digest, id, route and parent;
bodies and the other command fields wait in an unnamed spill file in the state folder until the import ends.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from taskkernel.coordinator.fcop import (
    FcopError,
    FcopReason,
    FcopWarning,
    FcopWorkspace,
    IssueEnvelope,
    ReportEnvelope,
    ReviewEnvelope,
    ScanEntry,
    Scanner,
    TaskEnvelope,
)
from taskkernel.coordinator.fcop.filenames import TASK_ID_RE, normalize_reference
from taskkernel.coordinator.fcop.safeio import locked
from taskkernel.coordinator.fcop.scan import ARCHIVE_AREAS, EntryStatus, ScanBatch
from taskkernel.coordinator.folders.ingest import REPORT_STATUS, Ingest, file_key, taken_refusal, write_reason
from taskkernel.coordinator.folders.tracking import FileTracker, Origin
from taskkernel.coordinator.tables import folder_files, folder_imports, metadata
from taskkernel.kernel.canonical import utc_now_iso
from taskkernel.kernel.commands import TaskCommandKernel
from taskkernel.kernel.logging import get_logger
from taskkernel.kernel.model.commands import CommandResult, RiskLevel
from taskkernel.kernel.model.limits import MAX_BODY_BYTES, MAX_REFERENCE_BYTES, MAX_REFERENCES, MAX_THREAD_KEY_BYTES
from taskkernel.kernel.model.principal import LOCAL_OWNER
from taskkernel.kernel.store.db import Database
from taskkernel.kernel.store.schema import tasks

log = get_logger(__name__)
BATCH = 500
MAX_SUBJECT = 500
RISKS = frozenset(r.value for r in RiskLevel)
# The file layer refused these without reading them (its safety rules and limits): `skipped`, not `kept`.
NOT_READ = frozenset({FcopReason.SYMLINK_REFUSED, FcopReason.NOT_REGULAR_FILE, FcopReason.FILE_TOO_LARGE,
                      FcopReason.IO_ERROR, FcopReason.FOLDER_TOO_DEEP})
FileRow = tuple[str, str, str | None, Origin, str | None]
LISTS = ("refused", "kept", "skipped", "warnings")  # per file: logged, never stored in the import's summary


def root_key_of(fcop_root: Path, workspace_root: Path) -> str:
    return Path(os.path.relpath(fcop_root, workspace_root)).as_posix()


def is_imported(db: Database, root_key: str) -> bool:
    """Has the FCoP root at ``root_key`` (its path in the workspace) been imported?"""
    db.create_schema(metadata)
    with db.read() as conn:
        return conn.execute(sa.select(folder_imports.c.root).where(folder_imports.c.root == root_key)).first() \
            is not None


def mark_imported(db: Database, root_key: str, generation: str, report: ImportReport) -> None:
    """Record that the FCoP root at ``root_key`` was imported (the first pass of `up` never runs it again)."""
    with db.write() as uow:
        uow.conn.execute(folder_imports.insert().values(
            root=root_key, generation=generation, imported_at=utc_now_iso(),
            summary=json.dumps({k: v for k, v in report.wire().items() if k not in LISTS})))


@dataclass
class ImportReport:
    dry_run: bool = False
    tasks: Counter[str] = field(default_factory=Counter)  # by state
    records: Counter[str] = field(default_factory=Counter)  # attached, by kind
    evidence: int = 0  # REVIEWs and ISSUEs about no task
    refused: list[dict[str, str]] = field(default_factory=list)  # {file, reason, message}
    kept: list[dict[str, str]] = field(default_factory=list)  # read, malformed, left in place: {file, reason, message}
    skipped: list[dict[str, str]] = field(default_factory=list)  # never read (NOT_READ): {file, reason, message}
    warnings: list[dict[str, str]] = field(default_factory=list)  # {file, warning, message}
    batches: int = 0

    @property
    def status(self) -> str:
        """`incomplete` when a file or folder was not read: its content may be history the kernel lacks."""
        return "incomplete" if self.skipped else "ok"

    def wire(self) -> dict[str, Any]:
        return {"status": self.status, "dry_run": self.dry_run, "tasks": sum(self.tasks.values()),
                "tasks_by_state": dict(self.tasks), "records": dict(self.records), "evidence": self.evidence,
                "refused": self.refused, "kept": self.kept, "skipped": self.skipped, "warnings": self.warnings,
                "batches": self.batches}


@dataclass(slots=True)
class _File:
    """What the import keeps of a file it read: its place and digest (the envelope is dropped once read)."""

    rel: str
    area: str
    stage: str | None
    digest: bytes  # the sha256 of its bytes, raw (half its hex text: the plan holds one per file)
    task_id: str | None = None  # a TASK file's id (a refused one is recorded under it)

    @property
    def sha256(self) -> str:
        return self.digest.hex()


class _Spill:
    """What only a file's command needs (its body above all), in an unnamed temporary file (0600, gone when
    closed) in the workspace's private state folder (not ``$TMPDIR``: a tmpfs /tmp would hold it in RAM, a small
    one would fail the import), from the walk to the end of the import: what the import holds per file does not
    grow with what files say."""

    def __init__(self, directory: Path) -> None:
        self._file = tempfile.TemporaryFile(dir=directory)  # noqa: SIM115 - closed by the import's run
        self._end = 0

    def put(self, value: dict[str, Any]) -> int:
        data = json.dumps(value).encode()  # ASCII escapes: any string, a lone surrogate too, comes back whole
        start = self._end
        view, offset = memoryview(data), start
        while view:  # a short write is continued, never skipped
            written = os.pwrite(self._file.fileno(), view, offset)
            if written <= 0:
                raise OSError(errno.ENOSPC, "the import's spill file took no more bytes")
            view, offset = view[written:], offset + written
        self._end = offset
        return start << 32 | len(data)  # one int per file: where it starts, how long it is

    def get(self, ref: int) -> dict[str, Any]:
        offset, size = ref >> 32, ref & 0xFFFFFFFF
        value: dict[str, Any] = json.loads(os.pread(self._file.fileno(), size, offset))
        return value

    def close(self) -> None:
        self._file.close()


@dataclass(slots=True)
class _Task:
    """A TASK file as planning needs it; the command's other fields wait in the spill (``held``)."""

    file: _File
    id: str
    sender: str
    recipient: str
    declared_parent: str | None
    rounds: int  # entries into `active` in its transitions
    held: int  # in the spill: subject, body, priority, references, thread_key, risk_level
    state: str = "inbox"
    parent: str | None = None

    @classmethod
    def of(cls, f: _File, task_id: str, env: TaskEnvelope, spill: _Spill) -> _Task:
        held = spill.put({"subject": env.subject, "body": env.body, "priority": env.priority.value,
                          "references": env.references, "thread_key": env.thread_key, "risk_level": env.risk_level})
        return cls(f, task_id, sys.intern(env.sender), sys.intern(env.recipient), env.parent,  # a few roles, many files
                   sum(1 for t in env.transitions if t.to == "active"), held)

    @property
    def name(self) -> str:
        """The file name: of several files with one id, the first by name is the task."""
        return self.file.rel.rpartition("/")[2]


@dataclass(slots=True)
class _Record:
    """A REPORT, REVIEW or ISSUE file as planning needs it; its body and references wait in the spill."""

    file: _File
    kind: str  # report, review, issue
    target: str | None  # the task it is about
    author: str
    status: str
    outside_references: bool  # a report naming its task outside `references:`
    order: tuple[str, int]  # a report's (date, sequence): its driver's latest one sets a G2 task's state
    held: int  # in the spill: record_id, body, references (None for a review)

    @classmethod
    def of(cls, f: _File, env: ReportEnvelope | ReviewEnvelope | IssueEnvelope, spill: _Spill) -> _Record:
        order = (sys.intern(env.name.date), env.name.sequence)
        refs = None if isinstance(env, ReviewEnvelope) else env.references
        held = spill.put({"record_id": env.id, "body": env.body, "references": refs})
        if isinstance(env, ReportEnvelope):
            return cls(f, "report", env.task_id, sys.intern(env.sender), REPORT_STATUS.get(env.status, env.status),
                       FcopWarning.TASK_NAMED_OUTSIDE_REFERENCES in env.warnings, order, held)
        if isinstance(env, ReviewEnvelope):
            return cls(f, "review", env.subject_task_id, env.reviewer, env.decision, False, order, held)
        return cls(f, "issue", _issue_task(env), env.reporter, env.status, False, order, held)


class Importer:
    def __init__(self, kernel: TaskCommandKernel, fcop: FcopWorkspace, tracker: FileTracker, root_key: str,
                 lock_file: Path, *, batch_size: int = BATCH) -> None:
        self.kernel = kernel
        self.lock_file = lock_file  # outside the FCoP root: a link planted in it cannot stop the import
        self.fcop = fcop
        self.tracker = tracker
        self.root_key = root_key
        self.batch_size = batch_size
        kernel.db.create_schema(metadata)

    @classmethod
    def for_workspace(cls, kernel: TaskCommandKernel, fcop: FcopWorkspace, tracker: FileTracker,
                      workspace_root: Path, state_dir: str) -> Importer:
        """One import per FCoP root (keyed by its path in the workspace); the lock sits in the state folder."""
        return cls(kernel, fcop, tracker, root_key_of(fcop.root, workspace_root),
                   Path(workspace_root) / state_dir / "import.lock")

    def imported(self) -> bool:
        return is_imported(self.kernel.db, self.root_key)

    def run(self, *, dry_run: bool = False, live: Ingest | None = None) -> ImportReport:
        """Import everything the workspace holds (under the import lock: two coordinators import once).
        ``live``: the live ingest, handed the import's walk as its own, so no file is visited twice."""
        with locked(self.lock_file):
            if not dry_run and self.imported():
                return ImportReport()
            scanner, batch = Scanner(self.fcop, settle_s=0, grace_s=0, legacy_encoding=True), ScanBatch()
            plan = _Run(self, dry_run)
            try:
                report = plan.run(scanner, batch)
            finally:
                plan.spill.close()
            if live is not None and not dry_run:
                live.took_over(scanner, batch)
            if not dry_run:
                mark_imported(self.kernel.db, self.root_key, self.fcop.generation.value, report)
            for w in report.warnings:  # `up` runs the import: the owner reads these in its log
                log.warning("fcop.import_warning", file=w["file"], warning=w["warning"], message=w["message"])
            for r in report.refused:
                log.warning("fcop.import_refused", file=r["file"], reason=r["reason"], message=r["message"])
            for k in report.kept:
                log.warning("fcop.import_kept", file=k["file"], reason=k["reason"], message=k["message"])
            for k in report.skipped:
                log.warning("fcop.import_skipped", file=k["file"], reason=k["reason"], message=k["message"])
            log.info("fcop_import", **{k: v for k, v in report.wire().items() if k in ("status", "tasks", "records",
                                                                                    "evidence", "batches")},
                     refused=len(report.refused), kept=len(report.kept), skipped=len(report.skipped))
            return report


class _Run:
    """One import: plan from a full scan, then commit level by level (parents before children)."""

    def __init__(self, importer: Importer, dry_run: bool) -> None:
        self.i = importer
        self.kernel = importer.kernel
        self.report = ImportReport(dry_run=dry_run)
        self.rows: list[FileRow] = []
        self.docs: dict[str, dict[str, Any]] = {}  # the documents of the tasks the commands in hand are about
        with self.kernel.db.read() as conn:
            self.tracked = {r.rel: r.sha256 for r in conn.execute(sa.select(folder_files.c.rel,
                                                                            folder_files.c.sha256))}
            self.known = frozenset(conn.execute(sa.select(tasks.c.task_id)).scalars())
        self.ids = set(self.known)  # tasks the kernel holds: before the import, and adopted by it
        self.spill = _Spill(importer.lock_file.parent)  # the state folder: made by the import lock

    def run(self, scanner: Scanner, batch: ScanBatch) -> ImportReport:
        """Plan from one walk (each file read once; of a file only what planning needs is kept, the rest of its
        command waits in the spill), then commit level by level; ``batch`` gets what the walk found besides files
        (refused folders, stale notes)."""
        found: dict[str, _Task] = {}  # the first file of each id (in walk order)
        others: dict[str, list[_Task]] = {}  # the further files of an id, if any
        records: list[_Record] = []
        for entry in scanner.stream(batch):
            if entry.status is EntryStatus.INVALID and self._new(entry):
                err = entry.error or FcopError(FcopReason.MALFORMED_FRONT_MATTER, "unreadable envelope")
                left = self.report.skipped if err.reason in NOT_READ else self.report.kept
                left.append({"file": entry.rel, "reason": err.reason.value, "message": err.message})
                self.rows.append((entry.rel, entry.sha256 or "", None, Origin.KEPT, err.reason.value))
            elif entry.status is EntryStatus.READY and self._new(entry):
                env = entry.envelope
                assert env is not None and entry.sha256 is not None
                f = _File(entry.rel, entry.area, entry.stage, bytes.fromhex(entry.sha256))
                if FcopWarning.LEGACY_ENCODING in env.warnings:
                    self._warn(f, FcopWarning.LEGACY_ENCODING.value, "not UTF-8: read as GB18030, or with damaged "
                               "bytes replaced (U+FFFD) in the kernel's copy; the file keeps its bytes")
                if isinstance(env, TaskEnvelope):
                    f.task_id = env.id  # one string for the file, the task and its group
                    t = _Task.of(f, f.task_id, env, self.spill)
                    if found.setdefault(t.id, t) is not t:
                        others.setdefault(t.id, []).append(t)
                else:
                    records.append(_Record.of(f, env, self.spill))
        for rel, exc in sorted(batch.refused.items()):  # a folder or a link: no file the kernel read, no record
            self.report.skipped.append({"file": rel, "reason": exc.reason.value, "message": exc.message})
        self._tasks(found, others)
        by_task = self._reports_by_task(records)
        for task in found.values():
            task.state = self._state(task, by_task.get(task.id, []))
        del by_task
        self._adopt(found)
        self._attach(records)
        self._flush()
        self.report.skipped.sort(key=lambda s: s["file"].encode())
        return self.report

    def _flush(self) -> None:
        """Record the files handled so far, right after their commands committed: an import interrupted
        later replays those commands (same keys) instead of taking their files for intruders."""
        if not self.report.dry_run:
            for start in range(0, len(self.rows), self.i.batch_size):
                self.i.tracker.record_many(self.rows[start:start + self.i.batch_size])
        self.rows = []

    def _new(self, entry: ScanEntry) -> bool:
        """Not recorded with these bytes yet; a file that could not be read is recorded with no digest ("")."""
        return self.tracked.get(entry.rel) != (entry.sha256 or "")

    # -- planning ----------------------------------------------------------------------------
    def _tasks(self, found: dict[str, _Task], others: dict[str, list[_Task]]) -> None:
        """One task per id (see the module docstring), in ``found``; the other files with that id are refused."""
        for task_id, first in found.items():  # ids in walk order; a winner replaces its id's value only
            if task_id not in others:
                continue
            group = [first, *others[task_id]]
            group.sort(key=lambda t: (t.name.encode(), t.file.rel.encode()))
            winner, *rest = group  # a known id too: the kernel replays an interrupted import's adoption
            found[task_id] = winner
            for t in rest:
                self._refuse(t.file, FcopReason.DUPLICATE_TASK_ID,
                             f"{task_id} is already the task of {winner.file.rel} (the first file of that id by "
                             "name); this file is not applied and never written into")
        for task in found.values():
            parent = task.declared_parent
            if parent and (parent in found or parent in self.known) and parent != task.id:
                task.parent = parent
            elif parent:
                self._warn(task.file, "parent_not_found", f"parent {parent} is in no TASK file; imported as a root")
        self._break_cycles(found)

    def _break_cycles(self, found: dict[str, _Task]) -> None:
        """Each task's chain walked once in all (a task already walked ends a walk): where a walk comes back to a
        task on its own path, that task's parent link closes a loop and is cut (it is imported as a root)."""
        done: set[str] = set()
        for task in found.values():
            path: dict[str, None] = {}
            node: str | None = task.id
            while node in found and node not in done:
                if node in path:
                    looped = found[node]
                    self._warn(looped.file, "parent_cycle", f"parent chain of {node} loops; imported as a root")
                    looped.parent = None
                    break
                path[node] = None
                node = found[node].parent
            done.update(path)

    @staticmethod
    def _reports_by_task(records: list[_Record]) -> dict[str, list[_Record]]:
        out: dict[str, list[_Record]] = {}
        for r in records:
            if r.kind == "report" and r.target:
                out.setdefault(r.target, []).append(r)
        return out

    @staticmethod
    def _state(task: _Task, reports: list[_Record]) -> str:
        if task.file.stage:
            return task.file.stage
        if task.file.area in ARCHIVE_AREAS:
            return "archive"
        driver = [r for r in reports if r.author == task.recipient]
        if not driver:
            return "inbox"
        return "review" if max(driver, key=lambda r: r.order).status == "done" else "active"

    # -- committing ----------------------------------------------------------------------------
    def _adopt(self, found: dict[str, _Task]) -> None:
        """Level by level (a task's parent one level up), a batch of commands built and committed at a time."""
        levels: dict[int, list[_Task]] = {}
        depths: dict[str, int] = {}
        parents = {t.parent for t in found.values() if t.parent}
        for task_id in sorted(found):
            task = found[task_id]
            depth = 0 if task.parent is None and task_id not in parents else _depth(found, task_id, depths)
            levels.setdefault(depth, []).append(task)  # a task outside every chain is at 0, remembered nowhere
        failed: set[str] = set()
        for n in sorted(levels):
            level = levels.pop(n)
            for start in range(0, len(level), self.i.batch_size):
                items = []
                for task in level[start:start + self.i.batch_size]:
                    if task.parent in failed:
                        self._warn(task.file, "parent_not_found", f"parent {task.parent} was not imported; "
                                                                   "imported as a root")
                        task.parent = None
                    items.append((self._adopt_command(task), task))
                for (_, task), result in zip(items, self._submit([c for c, _ in items]), strict=True):
                    self._adopted(task, result, failed)
                self._flush()

    def _adopted(self, task: _Task, result: CommandResult, failed: set[str]) -> None:
        if result.ok:
            self.report.tasks[task.state] += 1
            self.ids.add(task.id)
            self.rows.append((task.file.rel, task.file.sha256, task.id, Origin.INGESTED, None))
            if self.report.dry_run:
                self.docs[task.id] = {"task_id": task.id, "thread_key": "", "revision": 1, "round": _round(task)}
        elif result.reason == "task_exists" and self._refresh([task.id]):
            failed.add(task.id)  # the kernel holds this id with another file: never adopted
            subject = self.spill.get(task.held)["subject"]
            reason, why = taken_refusal(self.i.fcop, task.id, (task.sender, task.recipient, subject),
                                        self.docs[task.id])
            self._refuse(task.file, reason, why)
        else:
            failed.add(task.id)
            self._refuse(task.file, result.reason or "invalid_command", result.message)

    def _adopt_command(self, task: _Task) -> dict[str, Any]:
        held = self.spill.get(task.held)
        subject = (held["subject"] or task.id).strip() or task.id
        payload: dict[str, Any] = {
            "sender": task.sender, "recipient": task.recipient, "body": held["body"].strip(),
            "subject": subject if len(subject) <= MAX_SUBJECT else subject[:MAX_SUBJECT - 1] + "…",
            "priority": held["priority"], "references": held["references"], "state": task.state,
            "round": _round(task), "source": task.file.rel}
        if task.parent:
            payload["parent"] = task.parent
        risk, thread = held["risk_level"], held["thread_key"]
        if risk in RISKS:
            payload["risk_level"] = risk
        elif risk:
            self._warn(task.file, "unknown_risk_level", f"risk_level {risk!r} is not one of "
                                                         f"{', '.join(sorted(RISKS))}; imported as low")
        command = {"type": "adopt_task", "task_id": task.id,
                   "idempotency_key": file_key(task.file.rel, task.file.sha256),
                   "payload": self._fit(task.file, payload)}
        if thread and len(thread.encode()) <= MAX_THREAD_KEY_BYTES:
            command["thread_key"] = thread
        elif thread:
            self._warn(task.file, "history_shortened", f"thread_key is over {MAX_THREAD_KEY_BYTES} bytes; the "
                                                        "task keeps its own id as its thread")
        return command

    def _fit(self, f: _File, payload: dict[str, Any]) -> dict[str, Any]:
        """History is never refused for its size: what is beyond the kernel's limits (docs/reason-codes.md) is
        shortened in the kernel's copy, with a warning; the file keeps every byte and is the record's source."""
        cut = []
        body = payload.get("body", "")
        if len(body.encode()) > MAX_BODY_BYTES:
            payload["body"] = body.encode()[:MAX_BODY_BYTES - 3].decode("utf-8", "ignore") + "…"
            cut.append(f"body to {MAX_BODY_BYTES} bytes")
        refs = payload.get("references", [])
        kept = [r for r in refs if len(r.encode()) <= MAX_REFERENCE_BYTES][:MAX_REFERENCES]
        if kept != refs:
            payload["references"] = kept
            cut.append(f"references to {len(kept)} of {len(refs)}")
        if cut:
            self._warn(f, "history_shortened", f"the kernel's copy keeps {', '.join(cut)}; the file is whole")
        return payload

    def _attach(self, records: list[_Record]) -> None:
        """Each REPORT/REVIEW/ISSUE about a known task is attached to it, in file order; the rest is evidence.
        Task documents are read a chunk at a time and dropped after it."""
        records.sort(key=lambda r: r.file.rel.encode())
        self._lookup({r.target for r in records if r.target is not None and r.target not in self.ids})
        pending = []
        for r in records:
            if r.target is not None and r.target in self.ids:
                if r.outside_references:
                    self._warn(r.file, FcopWarning.TASK_NAMED_OUTSIDE_REFERENCES.value,
                               f"names {r.target} outside references: (fcop does not attach it); attached")
                pending.append(r)
            elif r.kind == "report":  # a report answers a task: one we cannot find is refused
                self._refuse(r.file, "task_not_found", f"the report names no known task ({r.target or 'none'})")
            else:
                self.report.evidence += 1
                self.rows.append((r.file.rel, r.file.sha256, None, Origin.INGESTED, "evidence"))
        while pending:
            stale: list[_Record] = []
            for start in range(0, len(pending), self.i.batch_size):
                chunk = pending[start:start + self.i.batch_size]
                self._refresh([r.target for r in chunk])  # type: ignore[misc]
                commands = []
                for r in chunk:
                    doc = self.docs[r.target]  # type: ignore[index]
                    commands.append(self._attach_command(r, doc))
                    doc["revision"] += 1  # the next record of this task in the batch sees this one
                for r, result in zip(chunk, self._submit(commands), strict=True):
                    if result.ok:
                        self.report.records[r.kind] += 1
                        self.rows.append((r.file.rel, r.file.sha256, r.target, Origin.INGESTED, None))
                    elif result.reason == "stale_task_revision" and len(stale) < len(pending) - 1:
                        stale.append(r)  # behind a refused record of its task: again, re-read
                    else:
                        self._refuse(r.file, result.reason or "invalid_command", result.message)
                self._flush()
                if not self.report.dry_run:
                    self.docs.clear()  # re-read for the next chunk: nothing per task is held to the end
            pending = stale

    def _lookup(self, task_ids: set[str]) -> None:
        """Which of these tasks (named by records, with no TASK file here) the kernel holds now."""
        wanted = sorted(task_ids)
        for start in range(0, len(wanted), self.i.batch_size):
            with self.kernel.db.read() as conn:
                self.ids.update(conn.execute(sa.select(tasks.c.task_id).where(
                    tasks.c.task_id.in_(wanted[start:start + self.i.batch_size]))).scalars())

    def _refresh(self, task_ids: list[str]) -> bool:
        """Read these tasks' documents (revision, round, thread) before building commands on them."""
        with self.kernel.db.read() as conn:
            rows = conn.execute(sa.select(tasks.c.task_id, tasks.c.doc).where(tasks.c.task_id.in_(set(task_ids))))
            self.docs.update({tid: json.loads(doc) for tid, doc in rows})
        return all(t in self.docs for t in task_ids)

    def _attach_command(self, r: _Record, doc: dict[str, Any]) -> dict[str, Any]:
        held = self.spill.get(r.held)
        payload: dict[str, Any] = {"record_id": held["record_id"], "source": r.file.rel, "body": held["body"].strip(),
                                   "kind": r.kind, "author": r.author, "status": r.status}
        if held["references"] is not None:
            payload["references"] = held["references"]
        return {"type": "attach_record", "task_id": doc["task_id"], "thread_key": doc["thread_key"],
                "expected_revision": doc["revision"], "round": doc["round"],
                "idempotency_key": file_key(r.file.rel, r.file.sha256, "attach"), "payload": self._fit(r.file, payload)}

    def _submit(self, commands: list[dict[str, Any]]) -> list[CommandResult]:
        """One transaction per batch; a batch whose transaction fails is retried command by command."""
        if self.report.dry_run:  # what the kernel would say, as far as it can be told without storing
            return [CommandResult(status="rejected", reason="task_exists", task_id=c["task_id"])
                    if c["type"] == "adopt_task" and c["task_id"] in self.known
                    else CommandResult(status="accepted", task_id=c["task_id"]) for c in commands]
        results: list[CommandResult] = []
        for start in range(0, len(commands), self.i.batch_size):
            chunk = commands[start:start + self.i.batch_size]
            self.report.batches += 1
            try:
                results += self.kernel.submit_batch([(c, LOCAL_OWNER) for c in chunk])
            except Exception:  # noqa: BLE001 - one poisoned command must not keep the rest of its batch out
                log.exception("fcop_import_batch_failed", size=len(chunk))
                results += [self._one(c) for c in chunk]
        return results

    def _one(self, command: dict[str, Any]) -> CommandResult:
        try:
            return self.kernel.submit(command, LOCAL_OWNER)
        except Exception as exc:  # noqa: BLE001 - reported against its file, retried by the next import pass
            return CommandResult(status="rejected", reason="internal_error", message=f"{type(exc).__name__}: {exc}",
                                 task_id=command.get("task_id"))

    # -- outcomes ------------------------------------------------------------------------------
    def _refuse(self, f: _File, reason: FcopReason | str, message: str) -> None:
        code = reason.value if isinstance(reason, FcopReason) else reason
        self.report.refused.append({"file": f.rel, "reason": code, "message": message})
        if not self.report.dry_run:
            write_reason(self.i.fcop.root / f.rel, "Not applied", f"{code}: {message}")
        self.rows.append((f.rel, f.sha256, f.task_id, Origin.REFUSED, f"{code}: {message}"))

    def _warn(self, f: _File, warning: str, message: str) -> None:
        self.report.warnings.append({"file": f.rel, "warning": warning, "message": message})


def _depth(found: dict[str, _Task], task_id: str, memo: dict[str, int]) -> int:
    """How many of its ancestors are imported with it (cycles were broken before); ``memo`` keeps every depth
    found, so each task's chain is walked once over all calls (a long parent chain plans in linear time)."""
    chain: list[str] = []
    node: str | None = task_id
    while node in found and node not in memo:
        chain.append(node)
        node = found[node].parent
    depth = memo[node] + 1 if node in memo else 0  # type: ignore[index]
    for item in reversed(chain):
        memo[item] = depth
        depth += 1
    return memo[task_id]


def _round(task: _Task) -> int:
    return 0 if task.state == "inbox" else max(1, task.rounds)


def _issue_task(env: IssueEnvelope) -> str | None:
    refs = [normalize_reference(r) for r in env.references]
    return next((r for r in refs if TASK_ID_RE.match(r)), None)
