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
"""

from __future__ import annotations

import json
import os
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
from taskkernel.coordinator.fcop.scan import ARCHIVE_AREAS
from taskkernel.coordinator.folders.ingest import REPORT_STATUS, file_key, taken_refusal, write_reason
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


@dataclass
class _Task:
    entry: ScanEntry
    env: TaskEnvelope
    state: str = "inbox"
    parent: str | None = None


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

    def run(self, *, dry_run: bool = False, live: Scanner | None = None) -> ImportReport:
        """Import everything the workspace holds (under the import lock: two coordinators import once).
        ``live``: the live ingest's scanner, told which files the import read so it does not read them again."""
        with locked(self.lock_file):
            if not dry_run and self.imported():
                return ImportReport()
            scanner = Scanner(self.fcop, settle_s=0, grace_s=0, legacy_encoding=True)
            report = _Run(self, dry_run).run(scanner)
            if live is not None and not dry_run:
                live.absorb(scanner)
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
        with self.kernel.db.read() as conn:
            self.tracked = {r.rel: r.sha256 for r in conn.execute(sa.select(folder_files.c.rel,
                                                                            folder_files.c.sha256))}
            self.docs = {tid: json.loads(doc) for tid, doc in conn.execute(sa.select(tasks.c.task_id, tasks.c.doc))}
        self.known = frozenset(self.docs)

    def run(self, scanner: Scanner) -> ImportReport:
        batch = scanner.scan()
        for rel, exc in sorted(batch.refused.items()):  # a folder or a link: no file the kernel read, no record
            self.report.skipped.append({"file": rel, "reason": exc.reason.value, "message": exc.message})
        for entry in batch.invalid:
            if self._new(entry):
                err = entry.error or FcopError(FcopReason.MALFORMED_FRONT_MATTER, "unreadable envelope")
                left = self.report.skipped if err.reason in NOT_READ else self.report.kept
                left.append({"file": entry.rel, "reason": err.reason.value, "message": err.message})
                self.rows.append((entry.rel, entry.sha256 or "", None, Origin.KEPT, err.reason.value))
        entries = [e for e in batch.ready if self._new(e)]
        for e in entries:
            if FcopWarning.LEGACY_ENCODING in e.envelope.warnings:  # type: ignore[union-attr]
                self._warn(e, FcopWarning.LEGACY_ENCODING.value, "not UTF-8: read as GB18030, or with damaged "
                           "bytes replaced (U+FFFD) in the kernel's copy; the file keeps its bytes")
        found = self._tasks([e for e in entries if isinstance(e.envelope, TaskEnvelope)])
        records = [e for e in entries if not isinstance(e.envelope, TaskEnvelope)]
        by_task = self._reports_by_task(records)
        for task in found.values():
            task.state = self._state(task, by_task.get(task.env.id, []))
        self._adopt(found)
        for start in range(0, len(found), self.i.batch_size):  # what the adoptions made: read once, in chunks
            self._refresh(list(found)[start:start + self.i.batch_size])
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
    def _tasks(self, entries: list[ScanEntry]) -> dict[str, _Task]:
        """One task per id (see the module docstring); the other files with that id are refused."""
        groups: dict[str, list[ScanEntry]] = {}
        for e in entries:
            groups.setdefault(e.envelope.id, []).append(e)  # type: ignore[union-attr]
        found: dict[str, _Task] = {}
        for task_id, group in groups.items():
            group.sort(key=lambda e: (e.path.name.encode(), e.rel.encode()))
            winner, *others = group  # a known id too: the kernel replays an interrupted import's adoption
            assert isinstance(winner.envelope, TaskEnvelope)
            found[task_id] = _Task(winner, winner.envelope)
            for e in others:
                self._refuse(e, FcopReason.DUPLICATE_TASK_ID,
                             f"{task_id} is already the task of {winner.rel} (the first file of that id by name); "
                             "this file is not applied and never written into")
        for task in found.values():
            parent = task.env.parent
            if parent and (parent in found or parent in self.docs) and parent != task.env.id:
                task.parent = parent
            elif parent:
                self._warn(task.entry, "parent_not_found", f"parent {parent} is in no TASK file; imported as a root")
        self._break_cycles(found)
        return found

    def _break_cycles(self, found: dict[str, _Task]) -> None:
        for task in found.values():
            seen, node = {task.env.id}, task.parent
            while node in found:
                if node in seen:
                    self._warn(task.entry, "parent_cycle", f"parent chain of {task.env.id} loops; imported as a root")
                    task.parent = None
                    break
                seen.add(node)
                node = found[node].parent

    def _reports_by_task(self, records: list[ScanEntry]) -> dict[str, list[ReportEnvelope]]:
        out: dict[str, list[ReportEnvelope]] = {}
        for e in records:
            if isinstance(e.envelope, ReportEnvelope) and e.envelope.task_id:
                out.setdefault(e.envelope.task_id, []).append(e.envelope)
        return out

    def _state(self, task: _Task, reports: list[ReportEnvelope]) -> str:
        entry = task.entry
        if entry.stage:
            return entry.stage
        if entry.area in ARCHIVE_AREAS:
            return "archive"
        driver = [r for r in reports if r.sender == task.env.recipient]
        if not driver:
            return "inbox"
        last = max(driver, key=lambda r: (r.name.date, r.name.sequence))
        return "review" if REPORT_STATUS.get(last.status) == "done" else "active"

    # -- committing ----------------------------------------------------------------------------
    def _adopt(self, found: dict[str, _Task]) -> None:
        depth: dict[str, int] = {}

        def level(task_id: str) -> int:
            if task_id not in depth:
                parent = found[task_id].parent
                depth[task_id] = 0 if parent not in found else level(parent) + 1  # type: ignore[arg-type]
            return depth[task_id]

        levels: dict[int, list[_Task]] = {}
        for task_id in sorted(found):
            levels.setdefault(level(task_id), []).append(found[task_id])
        failed: set[str] = set()
        for n in sorted(levels):
            items = []
            for task in levels[n]:
                if task.parent in failed:
                    self._warn(task.entry, "parent_not_found", f"parent {task.parent} was not imported; "
                                                                "imported as a root")
                    task.parent = None
                items.append((self._adopt_command(task), task))
            for (_, task), result in zip(items, self._submit([c for c, _ in items]), strict=True):
                if result.ok:
                    self.report.tasks[task.state] += 1
                    self.rows.append((task.entry.rel, task.env.sha256, task.env.id, Origin.INGESTED, None))
                    if self.report.dry_run:
                        self.docs[task.env.id] = {"task_id": task.env.id, "thread_key": "", "revision": 1,
                                                  "round": _round(task)}
                elif result.reason == "task_exists" and self._refresh([task.env.id]):
                    failed.add(task.env.id)  # the kernel holds this id with another file: never adopted
                    reason, why = taken_refusal(self.i.fcop, task.env, self.docs[task.env.id])
                    self._refuse(task.entry, reason, why)
                else:
                    failed.add(task.env.id)
                    self._refuse(task.entry, result.reason or "invalid_command", result.message)
            self._flush()

    def _adopt_command(self, task: _Task) -> dict[str, Any]:
        env = task.env
        subject = (env.subject or env.id).strip() or env.id
        payload: dict[str, Any] = {
            "sender": env.sender, "recipient": env.recipient, "body": env.body.strip(),
            "subject": subject if len(subject) <= MAX_SUBJECT else subject[:MAX_SUBJECT - 1] + "…",
            "priority": env.priority.value, "references": list(env.references), "state": task.state,
            "round": _round(task), "source": task.entry.rel}
        if task.parent:
            payload["parent"] = task.parent
        if env.risk_level in RISKS:
            payload["risk_level"] = env.risk_level
        elif env.risk_level:
            self._warn(task.entry, "unknown_risk_level", f"risk_level {env.risk_level!r} is not one of "
                                                          f"{', '.join(sorted(RISKS))}; imported as low")
        command = {"type": "adopt_task", "task_id": env.id, "idempotency_key": file_key(task.entry, env.sha256),
                   "payload": self._fit(task.entry, payload)}
        if env.thread_key and len(env.thread_key.encode()) <= MAX_THREAD_KEY_BYTES:
            command["thread_key"] = env.thread_key
        elif env.thread_key:
            self._warn(task.entry, "history_shortened", f"thread_key is over {MAX_THREAD_KEY_BYTES} bytes; the "
                                                         "task keeps its own id as its thread")
        return command

    def _fit(self, e: ScanEntry, payload: dict[str, Any]) -> dict[str, Any]:
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
            self._warn(e, "history_shortened", f"the kernel's copy keeps {', '.join(cut)}; the file is whole")
        return payload

    def _attach(self, records: list[ScanEntry]) -> None:
        """Each REPORT/REVIEW/ISSUE about a known task is attached to it, in file order; the rest is evidence."""
        pending = []
        for e in sorted(records, key=lambda e: e.rel.encode()):
            env = e.envelope
            target = _record_task(env)
            if target is not None and (target in self.docs or self._refresh([target])):
                if isinstance(env, ReportEnvelope) and FcopWarning.TASK_NAMED_OUTSIDE_REFERENCES in env.warnings:
                    self._warn(e, FcopWarning.TASK_NAMED_OUTSIDE_REFERENCES.value,
                               f"names {target} outside references: (fcop does not attach it); attached")
                pending.append((e, target))
            elif isinstance(env, ReportEnvelope):  # a report answers a task: one we cannot find is refused
                self._refuse(e, "task_not_found", f"the report names no known task ({target or 'none'})")
            else:
                self.report.evidence += 1
                self.rows.append((e.rel, e.sha256 or "", None, Origin.INGESTED, "evidence"))
        while pending:
            stale: list[tuple[ScanEntry, str]] = []
            for start in range(0, len(pending), self.i.batch_size):
                chunk = pending[start:start + self.i.batch_size]
                self._refresh([t for _, t in chunk])
                commands = []
                for e, target in chunk:
                    doc = self.docs[target]
                    commands.append(self._attach_command(e, doc))
                    doc["revision"] += 1  # the next record of this task in the batch sees this one
                for (e, target), result in zip(chunk, self._submit(commands), strict=True):
                    if result.ok:
                        self.report.records[e.envelope.name.kind.value.lower()] += 1  # type: ignore[union-attr]
                        self.rows.append((e.rel, e.sha256 or "", target, Origin.INGESTED, None))
                    elif result.reason == "stale_task_revision" and len(stale) < len(pending) - 1:
                        stale.append((e, target))  # behind a refused record of its task: again, re-read
                    else:
                        self._refuse(e, result.reason or "invalid_command", result.message)
                self._flush()
            pending = stale

    def _refresh(self, task_ids: list[str]) -> bool:
        """Re-read these tasks' documents (revision, round, thread) before building commands on them."""
        if not self.report.dry_run:
            with self.kernel.db.read() as conn:
                rows = conn.execute(sa.select(tasks.c.task_id, tasks.c.doc).where(
                    tasks.c.task_id.in_(set(task_ids))))
                self.docs.update({tid: json.loads(doc) for tid, doc in rows})
        return all(t in self.docs for t in task_ids)

    def _attach_command(self, e: ScanEntry, doc: dict[str, Any]) -> dict[str, Any]:
        env = e.envelope
        payload: dict[str, Any] = {"record_id": env.id, "source": e.rel, "body": env.body.strip()}  # type: ignore[union-attr]
        if isinstance(env, ReportEnvelope):
            payload.update(kind="report", author=env.sender, status=REPORT_STATUS.get(env.status, env.status),
                           references=list(env.references))
        elif isinstance(env, ReviewEnvelope):
            payload.update(kind="review", author=env.reviewer, status=env.decision)
        else:
            assert isinstance(env, IssueEnvelope)
            payload.update(kind="issue", author=env.reporter, status=env.status, references=list(env.references))
        return {"type": "attach_record", "task_id": doc["task_id"], "thread_key": doc["thread_key"],
                "expected_revision": doc["revision"], "round": doc["round"],
                "idempotency_key": file_key(e, env.sha256, "attach"),  # type: ignore[union-attr]
                "payload": self._fit(e, payload)}

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
    def _refuse(self, e: ScanEntry, reason: FcopReason | str, message: str) -> None:
        code = reason.value if isinstance(reason, FcopReason) else reason
        self.report.refused.append({"file": e.rel, "reason": code, "message": message})
        if not self.report.dry_run:
            write_reason(e.path, "Not applied", f"{code}: {message}")
        task_id = e.envelope.id if isinstance(e.envelope, TaskEnvelope) else None
        self.rows.append((e.rel, e.sha256 or "", task_id, Origin.REFUSED, f"{code}: {message}"))

    def _warn(self, e: ScanEntry, warning: str, message: str) -> None:
        self.report.warnings.append({"file": e.rel, "warning": warning, "message": message})


def _round(task: _Task) -> int:
    if task.state == "inbox":
        return 0
    return max(1, sum(1 for t in task.env.transitions if t.to == "active"))


def _record_task(env: Any) -> str | None:
    if isinstance(env, ReportEnvelope):
        return env.task_id
    if isinstance(env, ReviewEnvelope):
        return env.subject_task_id
    refs = [normalize_reference(r) for r in getattr(env, "references", ())]
    return next((r for r in refs if TASK_ID_RE.match(r)), None)
