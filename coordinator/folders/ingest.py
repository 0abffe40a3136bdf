"""Ingest: settled FCoP files become kernel commands; malformed files are quarantined.

- a new TASK in `_lifecycle/inbox/` (G3) or `tasks/` (G2): `create_task` as its sender;
- a TASK unknown to the kernel in a later stage or an archive folder: `adopt_task` (ADMIN importing);
- a known TASK an agent moved to another stage: the driver's claim or submit; any other move (or a
  refused one) is moved back with the reason written beside it;
- a REPORT: `submit_report` as its sender (claiming first when the driver reports on an inbox task;
  a driver's `done` report then submits);
- a REVIEW: `approve` / `reject` as its reviewer.

Files carry no credential: a command born from a file acts as the role the file names, with agent
`fcop-file`, and every role and authority check still applies. Idempotency keys are derived from
path and content digest, so rescans and restarts never duplicate a command.

Reason notes ("Not applied", "Moved back") are `_reason.<name>.txt` beside the file
(`taskkernel.coordinator.fcop.filenames.reason_note_name`): no envelope rule matches that name, so no pass ever takes a
note for an envelope. A file has at most one note (a new refusal replaces it); it goes when the file
is accepted (re-written so it is, or taken in as it is) and when the file leaves the folder.

One file can never stop the pass: whatever fails while taking it in (a store or disk error, a bug
it triggers) is logged against that file, which is looked at again next pass, and the pass goes on
with the next file; `IngestIncomplete` then tells the coordinator the stage did not fully succeed.
"""

from __future__ import annotations

import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from taskkernel.coordinator.fcop import (
    FcopError,
    FcopReason,
    FcopWarning,
    FcopWorkspace,
    Generation,
    ReportEnvelope,
    ReviewEnvelope,
    ScanBatch,
    ScanEntry,
    Scanner,
    TaskEnvelope,
    move_no_overwrite,
    quarantine,
    safeio,
)
from taskkernel.coordinator.fcop.filenames import EnvelopeKind, parse_filename, reason_note_name
from taskkernel.coordinator.fcop.numbering import max_sequence
from taskkernel.coordinator.fcop.quarantining import sweep_notes
from taskkernel.coordinator.fcop.safeio import rewrite
from taskkernel.coordinator.fcop.scan import shown_state
from taskkernel.coordinator.folders.tracking import FileTracker, Origin
from taskkernel.kernel.commands import TaskCommandKernel
from taskkernel.kernel.logging import get_logger
from taskkernel.kernel.model.commands import CommandResult
from taskkernel.kernel.model.principal import Principal

log = get_logger(__name__)
FILE_AGENT = "fcop-file"
# (kernel state, stage the file was moved to) -> the command that move stands for
MOVES = {("inbox", "active"): "claim", ("active", "review"): "submit", ("review", "done"): "approve",
         ("review", "active"): "reject", ("done", "active"): "reopen", ("done", "archive"): "archive",
         ("inbox", "archive"): "force_archive", ("active", "archive"): "force_archive",
         ("review", "archive"): "force_archive"}
# A file carries no credential, so a move is only taken as the driver's own claim or submit; decisions
# (approve, reject, reopen, archive) need a REVIEW file or an authenticated command.
DRIVER_MOVES = frozenset({"claim", "submit"})
REPORT_STATUS = {"done": "done", "accepted": "done", "blocked": "blocked", "in_progress": "in_progress",
                 "aborted": "aborted"}


@dataclass
class IngestStats:
    commands: int = 0
    accepted: int = 0
    refused: int = 0
    quarantined: int = 0
    moved_back: int = 0
    notes: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # rel -> "<error class>: <message>", retried next pass

    @property
    def progress(self) -> int:
        return self.commands + self.quarantined


class IngestIncomplete(Exception):
    """Raised after a pass in which some files failed; the other files were taken in."""

    def __init__(self, stats: IngestStats) -> None:
        rel, error = next(iter(stats.failed.items()))
        super().__init__(f"{len(stats.failed)} file(s) failed, first {rel}: {error}")
        self.stats = stats


def file_key(rel: str, sha256: str, step: str = "") -> str:
    return f"file:{rel}:{sha256[:16]}{':' + step if step else ''}"


def taken_refusal(fcop: FcopWorkspace, task_id: str, route: tuple[str, str, str | None],
                  doc: dict[str, Any]) -> tuple[FcopReason, str]:
    """Why a TASK file with ``task_id`` and ``route`` (sender, recipient, subject) that is not the task's own is
    refused: the same route and subject is a duplicate, anything else takes an id the kernel holds; the message
    suggests the next free number."""
    sender, recipient, subject = route
    same = (sender, recipient, (subject or task_id).strip()) == (doc["sender"], doc["recipient"], doc["subject"])
    _, day, _ = task_id.split("-")
    free = f"TASK-{day}-{max(max_sequence(fcop, EnvelopeKind.TASK, day), int(doc['task_id'].split('-')[2])) + 1:03d}"
    return (FcopReason.DUPLICATE_TASK_ID if same else FcopReason.TASK_ID_TAKEN,
            f"{task_id} is already a task ({doc['sender']} to {doc['recipient']}: {doc['subject']!r}) with its own "
            f"file; this file is not applied and never written into. Use a free number, e.g. {free}")


REFUSED_ADVICE = "The file itself is unchanged. Fix the cause and write a new file to retry."


def write_reason(path: Path, title: str, reason: str, advice: str = REFUSED_ADVICE) -> None:
    """Write (or replace) the file's one note; a note that cannot be written is reported, never fatal."""
    code, _, message = reason.partition(": ")
    text = (f"---\nreason: {code}\nfile: {path.name}\n---\n\n# {title}: {code}\n\n{message or reason}\n\n"
            f"{advice}\n")
    note = path.with_name(reason_note_name(path.name))
    try:
        rewrite(note, text.encode("utf-8"), expect_sha256=None)  # ours: replaced, never a link followed
    except FcopError as exc:
        safeio.report(exc, "reason_note", file=str(path))


class Ingest:
    def __init__(self, kernel: TaskCommandKernel, fcop: FcopWorkspace, tracker: FileTracker, scanner: Scanner,
                 *, submit_on_done_report: bool = True) -> None:
        self.kernel = kernel
        self.fcop = fcop
        self.tracker = tracker
        self.scanner = scanner
        self.submit_on_done_report = submit_on_done_report
        self.failing: dict[str, str] = {}  # the previous pass's failures: a traceback is logged once, not every pass
        self.trusted: bool | None = None  # folder_stats read into the scanner (None: not yet, in this process)
        self._walked: ScanBatch | None = None  # this pass's walk, when the import made it

    def took_over(self, scanner: Scanner, batch: ScanBatch) -> None:
        """The import walked every folder and handled every file it handed out: its walk stands as this pass's
        scan (what it found besides files, in ``batch``), and the files it read are not read again."""
        self.scanner.absorb(scanner)
        self._walked = ScanBatch(stale_notes=batch.stale_notes)

    def run(self) -> IngestStats:
        stats = IngestStats()
        walked, self._walked = self._walked, None  # taken first: a failure below never leaves a stale walk behind
        if self.trusted is None:  # a new process: files an earlier one handled, unchanged, are not read again
            rows = self.tracker.stats()
            self.scanner.trust(rows)
            self.trusted = True
        batch = walked or self.scanner.scan()
        self._sweep_notes(batch.stale_notes)
        for entry in batch.invalid:
            known = self.tracker.get(entry.rel)
            # history stays: a file the import kept (or skipped unread: no digest), or read leniently (a GBK task),
            # is old news while unchanged
            if known is None or known.origin is Origin.QUARANTINED or known.sha256 != (entry.sha256 or ""):
                self._contained(entry, stats, self._quarantine)
        # tasks first (of several with one id, the first by name), so reports and reviews find their task
        for entry in sorted(batch.ready, key=lambda e: (not isinstance(e.envelope, TaskEnvelope),
                                                        e.path.name.encode(), e.rel.encode())):
            self._contained(entry, stats, self._take)
        self.failing = dict(stats.failed)
        self._save_settled()
        return stats

    def _save_settled(self) -> None:
        """Remember what this pass handled (only changes): a pass costs what changed, not what exists. A file
        changed in the last seconds is left out (a coarse clock could hide a rewrite in the same tick). The
        scanner knows which of its files folder_stats holds as they are: nothing per file is copied here."""
        changed, removed = self.scanner.unsaved(older_than=time.time() - 2.0)
        saved = self.tracker.save_stats(changed, removed)
        self.scanner.saved(saved, removed)

    def _contained(self, entry: ScanEntry, stats: IngestStats,
                   step: Callable[[ScanEntry, IngestStats], None]) -> None:
        """Take one file; whatever goes wrong stays with it, and it is looked at again next pass."""
        try:
            step(entry, stats)
        except FcopError as exc:  # the file moved or changed under us
            log.warning("ingest_file_changed", rel=entry.rel, reason=exc.reason.value, message=str(exc))
            self.scanner.forget(entry.rel)
        except Exception as exc:  # noqa: BLE001 - a failure on one file must not keep the others out
            error = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
            repeated = self.failing.get(entry.rel) == error
            log.error("ingest_file_failed", rel=entry.rel, error=error, repeated=repeated, exc_info=not repeated)
            self.scanner.forget(entry.rel)
            stats.failed[entry.rel] = error

    def _take(self, entry: ScanEntry, stats: IngestStats) -> None:
        env = entry.envelope
        known = self.tracker.get(entry.rel)
        if env is None or (known is not None and known.sha256 == env.sha256):
            return
        if isinstance(env, TaskEnvelope):
            self._task(entry, env, stats)
        elif isinstance(env, ReportEnvelope):
            self._report(entry, env, stats)
        elif isinstance(env, ReviewEnvelope):
            self._review(entry, env, stats)
        else:  # ISSUEs are evidence only
            self.tracker.record(entry.rel, env.sha256, None, Origin.INGESTED)
        taken = self.tracker.get(entry.rel)
        if taken is not None and taken.sha256 == env.sha256 and taken.origin is not Origin.REFUSED:
            self._clear_note(entry.path)  # accepted (or fixed): its old note, if any, is obsolete

    # -- per kind ----------------------------------------------------------------------------
    def _task(self, entry: ScanEntry, env: TaskEnvelope, stats: IngestStats) -> None:
        doc = self.kernel.task(env.id)
        stage = shown_state(entry.area, entry.stage)
        if doc is None:
            if stage not in (None, "inbox"):  # after the import, history is closed: new tasks start in the inbox
                self._refuse(entry, env.sha256, None, f"{FcopReason.UNKNOWN_TASK_OUTSIDE_INBOX.value}: {env.id} "
                             f"is unknown to the kernel and appeared in {stage}/; write new tasks into the inbox",
                             stats)
                return
            self._new_task(entry, env, stats)
            return
        own = self.tracker.task_file(env.id)
        if not self._own_file(entry, env, doc, own):
            reason, why = taken_refusal(self.fcop, env.id, (env.sender, env.recipient, env.subject), doc)
            if reason is FcopReason.TASK_ID_TAKEN and stage == "inbox" and entry.path.name.startswith("TASK-"):
                self._adopt_renamed(entry, env, doc, stats)
                return
            if self._blocks_own_file(entry, env, doc, own):  # out of the way, bytes untouched
                self._quarantine(replace(entry, error=FcopError(reason, why, entry.path)), stats)
                return
            self._refuse(entry, env.sha256, None, f"{reason.value}: {why}", stats)
            return
        if stage is None or stage == doc["state"] or entry.area == "tasks":
            self.tracker.record(entry.rel, env.sha256, env.id, Origin.INGESTED)
            return
        self._agent_move(entry, env, doc, stage, stats)

    def _adopt_renamed(self, entry: ScanEntry, env: TaskEnvelope, doc: dict[str, Any], stats: IngestStats) -> None:
        """A new inbox TASK under an id the kernel already holds for other work (fcop's own ``create_task`` numbers
        from the inbox alone, so it reuses the id of a task that moved on): renamed to the next free number of its
        day, bytes untouched, and taken in under that id, with a note beside it saying what it was called."""
        name = parse_filename(entry.path.name)
        assert name is not None  # a ready TASK has a parsed name
        with safeio.locked(self.fcop.lock_dir / f"seq-{EnvelopeKind.TASK.value}.lock"):  # the writers' numbering lock
            seq = max(max_sequence(self.fcop, EnvelopeKind.TASK, name.date), name.sequence)
            while True:
                seq += 1
                renamed = name.model_copy(update={"sequence": seq})
                if self.kernel.task(renamed.id) is None:
                    break
            target = entry.path.with_name(renamed.render())
            move_no_overwrite(entry.path, target)
        self.scanner.forget(entry.rel)
        moved = replace(entry, path=target, rel=self.fcop.relative(target))
        why = (f"renamed: {env.id} was already a task ({doc['sender']} to {doc['recipient']}: {doc['subject']!r}); "
               f"this file, {entry.path.name}, is task {renamed.id} now (its bytes are unchanged)")
        self._new_task(moved, env.model_copy(update={"name": renamed}), stats)
        taken = self.tracker.get(moved.rel)
        if taken is not None and taken.origin is not Origin.REFUSED:
            self.tracker.record(moved.rel, env.sha256, renamed.id, Origin.INGESTED, note=why)
            write_reason(target, "Taken in under another id", why,
                         f"Nothing to do: refer to this work as {renamed.id}. This note goes when the file moves on.")
        stats.notes.append(f"{entry.rel}: {why}")
        log.warning("fcop.renamed", rel=entry.rel, to=moved.rel, task_id=renamed.id, taken=env.id)

    def _blocks_own_file(self, entry: ScanEntry, env: TaskEnvelope, doc: dict[str, Any], own: str | None) -> bool:
        """Does this file hold the name the kernel's own file needs: the one it will write (no own file yet),
        or, in G3, the one its own file moves under (a stage folder it will enter)?"""
        canonical = f"{env.id}-{doc['sender']}-to-{doc['recipient']}.md"
        if own is None:
            return entry.path.name == canonical
        return self.fcop.generation is not Generation.G2 and entry.path.name == Path(own).name

    def _own_file(self, entry: ScanEntry, env: TaskEnvelope, doc: dict[str, Any], own: str | None) -> bool:
        """Is this the task's own file: the one the kernel took in or wrote, or that file moved by an agent (its
        recorded place is empty now and this file has the task's route; an agent's fcop tool may have appended
        its transition on the way)? Another file with the task's id is never adopted, whatever its route."""
        if own is None or own == entry.rel:  # no file yet: the projection writes the kernel's own
            return own == entry.rel
        return (env.sender, env.recipient) == (doc["sender"], doc["recipient"]) and \
            not safeio.lexists(self.fcop.root / own)

    def _new_task(self, entry: ScanEntry, env: TaskEnvelope, stats: IngestStats) -> None:
        base = {"sender": env.sender, "recipient": env.recipient, "subject": env.subject or env.id,
                "body": env.body.strip(), "priority": env.priority.value, "references": list(env.references)}
        if env.parent and self.kernel.task(env.parent) is not None:
            base["parent"] = env.parent
        if env.risk_level:
            base["risk_level"] = env.risk_level
        command: dict[str, Any] = {"type": "create_task", "task_id": env.id, "payload": base,
                                   "idempotency_key": file_key(entry.rel, env.sha256)}
        if env.thread_key:
            command["thread_key"] = env.thread_key
        result = self._submit(command, Principal(env.sender, FILE_AGENT), stats)
        self._settle(entry, env.sha256, env.id, result, stats)

    def _agent_move(self, entry: ScanEntry, env: TaskEnvelope, doc: dict[str, Any], stage: str,
                    stats: IngestStats) -> None:
        kind = MOVES.get((doc["state"], stage))
        result: CommandResult | None = None
        refusal = None
        if kind is not None and kind not in DRIVER_MOVES:
            refusal = (f"role_not_authorized: moving a file may only claim or submit; {kind} needs a REVIEW file "
                       "or `taskkernel submit` with a credential")
        elif kind is not None:
            command = {"type": kind, "task_id": doc["task_id"], "thread_key": doc["thread_key"],
                       "expected_revision": doc["revision"], "round": doc["round"],
                       "idempotency_key": file_key(entry.rel, env.sha256, kind), "payload": {}}
            result = self._submit(command, Principal(doc["authority"]["driver"], FILE_AGENT), stats)
        if result is not None and result.ok:
            self.tracker.record(entry.rel, env.sha256, env.id, Origin.INGESTED)
            return
        reason = refusal or (f"{result.reason}: {result.message}" if result is not None
                             else f"illegal_transition: {doc['state']} -> {stage} is not a lifecycle edge")
        back = self.fcop.stage_dir(doc["state"]) / entry.path.name
        move_no_overwrite(entry.path, back)
        write_reason(back, f"Moved back to `{doc['state']}/`", reason)
        rel = self.fcop.relative(back)
        self.tracker.record(rel, env.sha256, env.id, Origin.INGESTED, note=reason, moved_from=entry.rel)
        stats.moved_back += 1
        stats.notes.append(f"{entry.rel}: moved back ({reason})")
        log.warning("fcop.moved_back", rel=entry.rel, reason=reason.partition(":")[0], message=reason)

    def _report(self, entry: ScanEntry, env: ReportEnvelope, stats: IngestStats) -> None:
        task_id = env.task_id
        doc = self.kernel.task(task_id) if task_id else None
        if doc is None:
            self._refuse(entry, env.sha256, task_id, f"task_not_found: the report references no known task "
                                                     f"({', '.join(env.references) or 'no references'})", stats)
            return
        if FcopWarning.TASK_NAMED_OUTSIDE_REFERENCES in env.warnings:
            log.warning("fcop.report_task_outside_references", rel=entry.rel, task_id=task_id,
                        warning=FcopWarning.TASK_NAMED_OUTSIDE_REFERENCES.value)
        who = Principal(env.sender, FILE_AGENT)
        driver_reports = env.sender == doc["authority"]["driver"]
        if doc["state"] == "inbox" and driver_reports:  # G2 agents never claim: a report implies the work began
            self._submit(self._on(doc, "claim", file_key(entry.rel, env.sha256, "claim")), who, stats)
            doc = self.kernel.task(doc["task_id"]) or doc
        status = REPORT_STATUS.get(env.status, "in_progress")
        payload = {"status": status, "body": env.body.strip(), "references": list(env.references),
                   "report_id": env.id}
        result = self._submit(self._on(doc, "submit_report", file_key(entry.rel, env.sha256), payload), who, stats)
        if result.ok and status == "done" and driver_reports and self.submit_on_done_report:
            doc = self.kernel.task(doc["task_id"]) or doc
            if doc["state"] == "active":
                self._submit(self._on(doc, "submit", file_key(entry.rel, env.sha256, "submit")), who, stats)
        self._settle(entry, env.sha256, doc["task_id"], result, stats)

    def _review(self, entry: ScanEntry, env: ReviewEnvelope, stats: IngestStats) -> None:
        doc = self.kernel.task(env.subject_task_id) if env.subject_task_id else None
        decision = env.decision
        if env.subject_task_id is None:  # a review of a document or a change: evidence, like an ISSUE
            self.tracker.record(entry.rel, env.sha256, None, Origin.INGESTED, note="evidence")
            return
        if doc is None or decision not in ("approved", "rejected", "needs_changes"):
            why = ("task_not_found: the review's subject is no known task" if doc is None
                   else f"review decision {decision!r} asks for no lifecycle change")
            if doc is None:
                self._refuse(entry, env.sha256, None, why, stats)
            else:
                self.tracker.record(entry.rel, env.sha256, doc["task_id"], Origin.INGESTED, note=why)
            return
        kind = "approve" if decision == "approved" else "reject"
        payload = {} if kind == "approve" else {
            "reason": env.rationale or "; ".join(env.required_changes) or f"review {decision}"}
        result = self._submit(self._on(doc, kind, file_key(entry.rel, env.sha256), payload),
                              Principal(env.reviewer, FILE_AGENT), stats)
        self._settle(entry, env.sha256, doc["task_id"], result, stats)

    # -- helpers -----------------------------------------------------------------------------
    @staticmethod
    def _on(doc: dict[str, Any], kind: str, key: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"type": kind, "task_id": doc["task_id"], "thread_key": doc["thread_key"],
                "expected_revision": doc["revision"], "round": doc["round"], "idempotency_key": key,
                "payload": payload or {}}

    def _submit(self, command: dict[str, Any], principal: Principal, stats: IngestStats) -> CommandResult:
        result = self.kernel.submit(command, principal)
        stats.commands += 1
        stats.accepted += result.ok
        return result

    def _settle(self, entry: ScanEntry, sha256: str, task_id: str | None, result: CommandResult,
                stats: IngestStats) -> None:
        if result.ok:
            self.tracker.record(entry.rel, sha256, task_id or result.task_id, Origin.INGESTED)
        else:
            self._refuse(entry, sha256, task_id, f"{result.reason}: {result.message}", stats)

    def _refuse(self, entry: ScanEntry, sha256: str, task_id: str | None, reason: str, stats: IngestStats) -> None:
        """A well-formed file whose command the kernel refused: it stays, with the reason beside it."""
        write_reason(entry.path, "Not applied", reason)
        self.tracker.record(entry.rel, sha256, task_id, Origin.REFUSED, note=reason)
        stats.refused += 1
        stats.notes.append(f"{entry.rel}: {reason}")
        log.warning("fcop.not_applied", rel=entry.rel, reason=reason.partition(":")[0], message=reason)

    @staticmethod
    def _clear_note(path: Path) -> None:
        Ingest._remove_note(path.with_name(reason_note_name(path.name)))

    @staticmethod
    def _remove_note(note: Path) -> None:
        try:
            if stat.S_ISREG(safeio.lstat(note).st_mode):
                safeio.unlink(note)
        except FileNotFoundError:
            return
        except FcopError as exc:
            safeio.report(exc, "reason_note", file=str(note))

    def _sweep_notes(self, stale: list[Path]) -> None:
        """Notes whose file left (moved on, moved away, quarantined, or out of the quarantine) describe nothing."""
        for note in stale:
            self._remove_note(note)
        for note in sweep_notes(self.fcop):
            log.info("quarantine_note_removed", note=self.fcop.relative(note))

    def _quarantine(self, entry: ScanEntry, stats: IngestStats) -> None:
        err = entry.error
        reason = err.reason if err is not None else FcopReason.MALFORMED_FRONT_MATTER
        try:
            q = quarantine(self.fcop, entry.path, reason, str(err) if err is not None else "unreadable envelope")
        except FcopError as exc:
            log.warning("quarantine_failed", rel=entry.rel, reason=exc.reason.value)
            self.scanner.forget(entry.rel)  # tried again next pass, never trusted as handled
            return
        self.scanner.forget(entry.rel)
        stats.quarantined += 1
        stats.notes.append(f"{entry.rel}: quarantined ({reason.value}) -> {q.path.name}")
        log.warning("fcop.quarantined", rel=entry.rel, reason=reason.value, to=self.fcop.relative(q.path))

