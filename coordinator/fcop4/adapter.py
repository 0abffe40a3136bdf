"""A G4 workspace as the coordinator drives it: fcop agents' T1–T3 in, the kernel's decisions out, through fcop's Core.

Ingest (each pass, level-triggered on what the Core validates):
- the first pass imports the workspace: every TASK adopted in its stage (round = its attempts), every REPORT,
  REVIEW and ISSUE attached to its task as history;
- later, a new inbox TASK is the ``create_task`` of its sender (the kernel keeps fcop's id); a TASK the Core moved
  inbox→active is its driver's claim, active→review its driver's submit (after the REPORT it consumed); a new
  REPORT is ``submit_report`` by its sender; REVIEWs and ISSUEs are evidence. What the kernel refuses is answered
  by an ISSUE on the task (fcop agents' ``list_issues``), once per refusal.
Projection (each kernel lifecycle event, in order): one Core edge per event through ``edges.CoreEdges`` — T2
claim, T3 submit (the round's done report written as the attempt's REPORT first), T4/T5 with an
acceptance/rejection REVIEW plus an authorization REVIEW signed for the kernel's Profile, T6 and T7 with an
authorization REVIEW — so every transition carries the attempt ids, evidence digests and receipts the Core
makes. A task the kernel created gets its TASK file written in the Core's own canonical bytes.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from taskkernel.coordinator.fcop import FcopError, FcopReason, FcopWorkspace, quarantine, safeio
from taskkernel.coordinator.fcop.detect import Generation
from taskkernel.coordinator.fcop.filenames import ROLE_RE
from taskkernel.coordinator.fcop4.aliases import Aliases
from taskkernel.coordinator.fcop4.authority import profile_key
from taskkernel.coordinator.fcop4.edges import STAGES, CoreEdges
from taskkernel.coordinator.fcop4.reader import G4Envelope, G4Listing, planted_entries, read_workspace
from taskkernel.coordinator.folders.importer import ImportReport, is_imported, mark_imported, root_key_of
from taskkernel.coordinator.folders.ingest import FILE_AGENT, REPORT_STATUS, IngestIncomplete, IngestStats
from taskkernel.coordinator.folders.projection import PROJECT_EFFECT
from taskkernel.coordinator.folders.tracking import FileTracker, Origin, folders_metadata
from taskkernel.kernel.commands import TaskCommandKernel
from taskkernel.kernel.logging import get_logger
from taskkernel.kernel.model.commands import CommandResult
from taskkernel.kernel.model.principal import LOCAL_OWNER, Principal
from taskkernel.kernel.outbox import OutboxRelay

log = get_logger(__name__)
PROJECT_BATCH = 25
# Each kernel lifecycle event is one Core edge; the kernel's own extensions (force_archive, amend) have none.
EDGE_OF_EVENT = {"task_claimed": ("inbox", "active"), "task_submitted": ("active", "review"),
                 "task_approved": ("review", "done"), "task_rejected": ("review", "active"),
                 "task_reopened": ("done", "active"), "task_archived": ("done", "archive")}
NOT_EXPRESSIBLE = frozenset({"task_force_archived"})  # the file stays where the last Core edge left it
DECISIONS = frozenset({"approve_task", "reject_task", "reopen_task", "archive_task"})  # T4-T7: the kernel's alone


class ProjectionBehind(Exception):
    """A kernel event whose Core edge cannot be made yet: the outbox retries it (a dead letter if it stays)."""


def role_of(principal: str) -> str:
    """The kernel role a G4 ``sender``/``recipient`` names. G4 leaves them free text: a role code (``DEV``) is
    itself, anything else its upper-cased form (``agent:worker-1`` → ``AGENT-WORKER-1``, ``human:eve`` →
    ``HUMAN-EVE``), which the kernel's role checks then judge like any other role: a free-text name never becomes
    ADMIN."""
    if ROLE_RE.fullmatch(principal):
        return principal
    code = re.sub(r"[^A-Z0-9_]+", "-", principal.upper()).strip("-")
    return code if ROLE_RE.fullmatch(code) else "UNKNOWN"


class G4Adapter:
    """The folder adapter's interface (ingest_pass, project_pass, ledger_pass, projection.find/place) for G4."""

    def __init__(self, kernel: TaskCommandKernel, workspace_root: Path, state_dir: Path) -> None:
        self.kernel = kernel
        self.project_root = workspace_root
        self.fcop = FcopWorkspace(root=workspace_root / "fcop", generation=Generation.G4,
                                  config=json.loads((workspace_root / "fcop" / "fcop.json").read_bytes()))
        self.root_key = root_key_of(self.fcop.root, workspace_root)
        self._refuse_a_half_migration(kernel)
        self._complete_layout()
        self.tracker = FileTracker(kernel.db)
        self.edges = CoreEdges(workspace_root, profile_key(state_dir), self._written)
        self.ids = Aliases(kernel.db)
        self.relay = OutboxRelay(kernel.db, {PROJECT_EFFECT: self._on_event})
        self.projection = self
        self.last_import: ImportReport | None = None
        self.last_ingest = IngestStats()

    def _refuse_a_half_migration(self, kernel: TaskCommandKernel) -> None:
        """A root the kernel imported as G2/G3 that is G4 now: a `migrate --to g4` stopped between publishing the
        new root and committing its records (or a hand swap). Taking it in would make every task again."""
        from taskkernel.coordinator.tables import folder_imports

        kernel.db.create_schema(folders_metadata)
        with kernel.db.read() as conn:
            generation = conn.execute(sa.select(folder_imports.c.generation).where(
                folder_imports.c.root == self.root_key)).scalar()
        if generation not in (None, "g4"):
            raise FcopError(FcopReason.MIGRATION_INCOMPLETE,
                            f"{self.fcop.root} is FCoP 4 but the kernel imported it as {generation}: a `taskkernel "
                            "fcop migrate --to g4` stopped after publishing the new root. Put the old root back (its "
                            "copy is the .fcop-g4-root-* folder beside it, or the migrate backup) and migrate again.",
                            self.fcop.root)

    def _complete_layout(self) -> None:
        """Make the layout's empty folders a clone lost (git keeps no empty folder): without them fcop's Core refuses
        the whole workspace (RECOVERY_REQUIRED: Incomplete workspace layout), for fcop-mcp as for us."""
        made = []
        for folder in (*(f"_lifecycle/{s}" for s in STAGES), "reports", "issues", "reviews", "operations", "cold"):
            path = self.fcop.root / folder
            if not safeio.lexists(path):
                safeio.ensure_dir(path)
                made.append(folder)
        if made:
            log.info("fcop4.layout_completed", created=made)

    # -- ingest ------------------------------------------------------------------------------------------------
    def ingest_pass(self) -> int:
        stats = IngestStats()
        for path in planted_entries(self.fcop.root):  # out of the Core's way, moved as what it is (never followed)
            try:
                moved = quarantine(self.fcop, path, FcopReason.NOT_REGULAR_FILE,
                                   "not a regular file: fcop's Core cannot work beside it (a link makes it refuse the "
                                   "workspace, a FIFO blocks it)")
                stats.quarantined += 1
                log.warning("fcop.quarantined", rel=self.fcop.relative(path), reason="not_regular_file",
                            to=self.fcop.relative(moved.path))
            except FcopError as exc:
                log.warning("quarantine_failed", rel=self.fcop.relative(path), reason=exc.reason.value)
        first = self.last_import is None and not is_imported(self.kernel.db, self.root_key)
        known = {} if first else self.tracker.digests()  # a file with the bytes recorded is not read again
        listing = read_workspace(self.project_root, known)
        for rel, (_sha, why) in listing.invalid.items():
            # left where it is and read again next pass (a file read while fcop's Core moves it is invalid for a
            # moment: never cached), said once while the reason stays the same
            recorded = self.tracker.get(rel)
            if recorded is None or recorded.note != why:
                log.warning("fcop4.invalid", rel=rel, reason=why)
                self.tracker.record(rel, "", None, Origin.KEPT, note=why)
        if first:
            self.last_import = self._import(listing, stats)
        else:
            self._live(listing, known, stats)
        self.last_ingest = stats
        if stats.failed:
            raise IngestIncomplete(stats)
        return stats.progress

    def import_history(self, *, dry_run: bool = False) -> ImportReport:
        """`taskkernel fcop import` on a G4 workspace: the import `up` runs on its first pass, once; a dry run counts
        what the Core validates (every task, every record) and stores nothing."""
        if is_imported(self.kernel.db, self.root_key):
            return ImportReport(dry_run=dry_run)
        listing = read_workspace(self.project_root)
        if not dry_run:
            return self._import(listing, IngestStats())
        report = ImportReport(dry_run=True)
        for task in listing.tasks.values():
            report.tasks[task.stage or "inbox"] += 1
        for record in listing.records:
            report.records[record.kind.lower()] += 1
        return report

    def _import(self, listing: G4Listing, stats: IngestStats) -> ImportReport:
        report = ImportReport()
        for task in sorted(listing.tasks.values(), key=lambda t: (str(t.fields.get("created_at")), t.id)):
            result = self._submit(self._adoption(task), LOCAL_OWNER, stats)
            if result.ok or result.reason == "task_exists":
                report.tasks[task.stage or "inbox"] += 1
                self.tracker.record(task.rel, task.sha256, task.id, Origin.INGESTED)
            else:
                report.refused.append({"file": task.rel, "reason": result.reason or "", "message": result.message})
        for record in listing.records:
            doc = self.kernel.task(str(record.fields.get("subject_ref")))
            if doc is None:  # about the workspace, or a task the import refused: evidence in the folder only
                self.tracker.record(record.rel, record.sha256, None, Origin.INGESTED, note="evidence")
                continue
            result = self._submit(self._attachment(record, doc), LOCAL_OWNER, stats)
            if result.ok:
                report.records[record.kind.lower()] += 1
            self.tracker.record(record.rel, record.sha256, doc["task_id"], Origin.INGESTED,
                                note=None if result.ok else f"{result.reason}: {result.message}")
        mark_imported(self.kernel.db, self.root_key, "g4", report)
        log.info("fcop_import", generation="g4", tasks=dict(report.tasks), records=dict(report.records),
                 refused=len(report.refused))
        return report

    def _adoption(self, task: G4Envelope) -> dict[str, Any]:
        """ADMIN's ``adopt_task`` of a TASK in its stage; its round is the number of attempts it had."""
        payload = {**self._task_payload(task), "state": task.stage, "source": task.rel,
                   "round": 0 if task.stage == "inbox" else max(len(task.attempts), 1)}
        return {"type": "adopt_task", "task_id": task.id, "payload": payload,
                "idempotency_key": f"fcop4:{task.id}:adopt"}

    @staticmethod
    def _attachment(record: G4Envelope, doc: dict[str, Any]) -> dict[str, Any]:
        """A REPORT, REVIEW or ISSUE of the imported history, attached to its task whatever the task's state."""
        f, kind = record.fields, record.kind.lower()
        status = f.get("result") if kind == "report" else f.get("decision", f.get("severity"))
        payload = {"kind": kind, "record_id": record.id, "source": record.rel, "author": role_of(f["sender"]),
                   "status": str(status)[:100] if status is not None else None, "body": record.body.strip(),
                   "references": [r for r in f.get("references") or [] if isinstance(r, str)]}
        return {"type": "attach_record", "task_id": doc["task_id"], "thread_key": doc["thread_key"],
                "expected_revision": doc["revision"], "round": doc["round"],
                "idempotency_key": f"fcop4:{record.id}:attach", "payload": payload}

    def _task_payload(self, task: G4Envelope) -> dict[str, Any]:
        f = task.fields
        payload: dict[str, Any] = {"sender": role_of(f["sender"]), "recipient": role_of(f["recipient"]),
                                   "subject": str(f.get("subject") or task.id)[:500], "body": task.body.strip(),
                                   "priority": f.get("priority") or "P2",
                                   "references": [self.ids.kernel_id(r) for r in f.get("references") or []
                                                  if isinstance(r, str)]}
        parent = f.get("branch_of") or f.get("parent")
        if parent and self.kernel.task(parent := self.ids.kernel_id(parent)) is not None:
            payload["parent"] = parent  # a migrated parent by its file id too
        return payload

    def _live(self, listing: G4Listing, known: dict[str, str], stats: IngestStats) -> None:
        """``listing`` holds only what changed since the tracker's record (``known``: rel -> sha256)."""
        moved: list[tuple[G4Envelope, dict[str, Any]]] = []
        for task in listing.tasks.values():
            task_id = self.ids.kernel_id(task.id)
            doc = self.kernel.task(task_id)
            if doc is None:
                if task.stage == "inbox":
                    result = self._submit({"type": "create_task", "task_id": task.id,
                                           "payload": self._task_payload(task),
                                           "idempotency_key": f"fcop4:{task.id}:create"},
                                          Principal(role_of(task.fields["sender"]), FILE_AGENT), stats)
                    self._settle(task, task.id, result, stats)
                else:
                    self._refuse(task, task.id, "unknown_task_outside_inbox: after the import, new tasks start in "
                                                "the inbox", stats)
            elif task.stage != doc["state"]:
                moved.append((task, doc))
            else:
                self.tracker.record(task.rel, task.sha256, task_id, Origin.INGESTED)
        for record in listing.records:
            if not known.get(record.rel):  # new, or invalid until now (recorded without a digest): taken in once
                self._record(record, stats)
        for task, doc in moved:
            self._agent_move(task, self.kernel.task(doc["task_id"]) or doc, stats)

    def _agent_move(self, task: G4Envelope, doc: dict[str, Any], stats: IngestStats) -> None:
        """An fcop agent's T2 or T3 (a move the kernel did not make): a claim or submit by the actor the Core
        recorded (``by``), judged by the kernel's role checks like any other (another role's task is refused)."""
        kind = {("inbox", "active"): "claim", ("active", "review"): "submit"}.get((doc["state"], task.stage or ""))
        if kind is None:
            last = (task.fields.get("transitions") or [{}])[-1]
            if last.get("tool") in DECISIONS:  # T4-T7 without the kernel (fcop run with an evaluator of its own)
                self._refuse(task, doc["task_id"], f"decision_not_taken: {last.get('tool')} by {last.get('by')} was "
                             f"made without taskkernel, which decides T4-T7; the kernel says {doc['state']}", stats)
            return  # else behind the kernel: the projection moves it on
        actor = role_of(str(task.last_by or doc["authority"]["driver"]))
        result = self._submit({"type": kind, "task_id": doc["task_id"], "thread_key": doc["thread_key"],
                               "expected_revision": doc["revision"], "round": doc["round"], "payload": {},
                               "idempotency_key": f"fcop4:{task.id}:{task.attempt_id}:{kind}"},
                              Principal(actor, FILE_AGENT), stats)
        self._settle(task, doc["task_id"], result, stats)

    def _record(self, record: G4Envelope, stats: IngestStats) -> None:
        task_id = self.ids.kernel_id(str(record.fields.get("subject_ref")))
        doc = self.kernel.task(task_id)
        if record.kind != "REPORT" or doc is None:
            self.tracker.record(record.rel, record.sha256, doc["task_id"] if doc else None, Origin.INGESTED,
                                note="evidence")
            return
        status = REPORT_STATUS.get(str(record.fields.get("result", "")).lower(), "done")
        payload = {"status": status, "body": record.body.strip(), "report_id": record.id,
                   "references": [r for r in record.fields.get("references") or [] if isinstance(r, str)]}
        sender = Principal(role_of(record.fields["sender"]), FILE_AGENT)
        if doc["state"] == "inbox" and sender.role == doc["authority"]["driver"]:
            self._submit({"type": "claim", "task_id": task_id, "thread_key": doc["thread_key"],
                          "expected_revision": doc["revision"], "round": doc["round"], "payload": {},
                          "idempotency_key": f"fcop4:{record.id}:claim"}, sender, stats)
            doc = self.kernel.task(task_id) or doc
        result = self._submit({"type": "submit_report", "task_id": task_id, "thread_key": doc["thread_key"],
                               "expected_revision": doc["revision"], "round": doc["round"], "payload": payload,
                               "idempotency_key": f"fcop4:{record.id}:report"}, sender, stats)
        self._settle(record, task_id, result, stats)

    def _submit(self, command: dict[str, Any], principal: Principal, stats: IngestStats) -> CommandResult:
        result = self.kernel.submit(command, principal)
        stats.commands += 1
        stats.accepted += result.ok
        return result

    def _settle(self, env: G4Envelope, task_id: str, result: CommandResult, stats: IngestStats) -> None:
        if result.ok:
            self.tracker.record(env.rel, env.sha256, task_id, Origin.INGESTED)
        else:
            self._refuse(env, task_id, f"{result.reason}: {result.message}", stats)

    def _refuse(self, env: G4Envelope, task_id: str, reason: str, stats: IngestStats) -> None:
        """Answered where fcop agents look: an ISSUE on the task (a G4 stage folder may hold no note file)."""
        self.tracker.record(env.rel, env.sha256, task_id, Origin.REFUSED, note=reason)
        stats.refused += 1
        stats.notes.append(f"{env.rel}: {reason}")
        log.warning("fcop.not_applied", rel=env.rel, reason=reason.partition(":")[0], message=reason)
        subject = self.ids.file_id(task_id) if self.kernel.task(task_id) is not None or env.kind == "TASK" else None
        try:
            issue = self.edges.core.write_issue(
                workspace_id=self.edges.workspace_id, sender="SYSTEM", recipient=str(env.fields.get("sender", "TEAM")),
                subject_ref=subject or f"workspace:{self.edges.workspace_id}", severity="high",
                body=f"taskkernel did not apply {env.rel}: {reason}\n", references=[env.id])
            self.tracker.record(self.fcop.relative(Path(issue["path"])), _sha(Path(issue["path"])), task_id,
                                Origin.PROJECTED, note="refusal")
        except Exception as exc:  # noqa: BLE001 - the refusal is recorded; its ISSUE is a courtesy
            log.warning("fcop4.issue_failed", rel=env.rel, error=str(exc))

    # -- projection --------------------------------------------------------------------------------------------
    def project_pass(self) -> int:
        return self.relay.run_pending(limit=PROJECT_BATCH)

    def ledger_pass(self) -> int:
        return 0

    def _on_event(self, effect_key: str, payload: dict[str, Any]) -> None:
        """One kernel event, one Core edge, in the kernel's order: every round and rejection is in the file."""
        task_id = payload["task_id"]
        with self.kernel.db.read() as conn:
            event = self.kernel.store.event_at(conn, payload["global_pos"])
        doc = self.kernel.task(task_id)
        if event is None or doc is None:
            return
        self.place(task_id)
        edge = EDGE_OF_EVENT.get(event.type)
        if edge is None:
            if event.type in NOT_EXPRESSIBLE:
                log.warning("fcop4.not_expressible", task_id=task_id, kernel_event=event.type,
                            message="FCoP 4 has no edge for it: the task's file stays where it is")
            return
        file_id = self.ids.file_id(task_id)
        stage = self.edges.state(file_id)[0]
        if stage == edge[1]:
            return  # already there: an fcop agent made this move and the kernel took it in
        if stage != edge[0]:
            if reached_by_later_edges(self.kernel.history(task_id), event.global_pos, stage):
                return  # an fcop agent made this move and the next ones between two passes; the kernel took them in
            # behind (an earlier edge is still to be retried) or moved without the kernel
            raise ProjectionBehind(f"{task_id}: the kernel's {event.type} needs its file in {edge[0]}/, it is in "
                                   f"{stage}/; retried after the task's earlier edges (a dead letter if it stays)")
        self.edges.step(file_id, task_id, doc["authority"], *edge,
                        report_body=report_before(self.kernel.history(task_id), event.global_pos),
                        reason=str(event.data.get("reason") or ""))
        log.info("fcop4.projected", task_id=task_id, edge="->".join(edge))

    def find(self, task_id: str) -> Path | None:
        return self.edges.find(self.ids.file_id(task_id))

    def place(self, task_id: str) -> Path | None:
        """The task's TASK file, written if the kernel created the task and it has none yet (never for one FCoP 4
        cannot hold: a force-archived task stays in the kernel only)."""
        doc = self.kernel.task(task_id)
        if doc is None:
            return None
        if (found := self.find(task_id)) is not None:
            return found
        if any(e.type in NOT_EXPRESSIBLE for e in self.kernel.history(task_id)):
            return None
        return self.edges.write_task(doc)

    def _written(self, path: Path, task_id: str) -> None:
        self.tracker.record(self.fcop.relative(path), _sha(path), task_id, Origin.PROJECTED)


def reached_by_later_edges(history: list[Any], position: int, stage: str) -> bool:
    """Whether the kernel's own edges from ``position`` on, each starting where the last ended, reach ``stage``:
    the file is ahead of this event, not behind it or moved without the kernel."""
    at: str | None = None
    for event in history:
        if event.global_pos < position or (edge := EDGE_OF_EVENT.get(event.type)) is None:
            continue
        if at is not None and edge[0] != at:
            return False
        at = edge[1]
        if at == stage:
            return True
    return False


def report_before(history: list[Any], position: int) -> str:
    """The body of the task's last done report before ``position`` (the REPORT an attempt without one gets): one
    the kernel took, or one an import attached."""
    done = [e.data for e in history if e.global_pos < position and e.data.get("status") == "done"
            and ("report_id" in e.data or e.data.get("kind") == "report")]
    return str(done[-1].get("body") or "done") if done else "Submitted through taskkernel."


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
