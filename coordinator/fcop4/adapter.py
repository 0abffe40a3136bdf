"""A G4 workspace as the coordinator drives it: fcop agents' T1–T3 in, the kernel's decisions out, through fcop's Core.

Ingest (each pass, level-triggered on what the Core validates):
- the first pass imports the workspace: every TASK adopted in its stage (round = its attempts), every REPORT,
  REVIEW and ISSUE attached to its task as history;
- later, a new inbox TASK is the ``create_task`` of its sender (the kernel keeps fcop's id); a TASK the Core moved
  inbox→active is its driver's claim, active→review its driver's submit (after the REPORT it consumed); a new
  REPORT is ``submit_report`` by its sender; REVIEWs and ISSUEs are evidence. What the kernel refuses is answered
  by an ISSUE on the task (fcop agents' ``list_issues``), once per refusal.
Projection (for every task event): the Core is walked from the file's stage to the kernel's state one edge at a
time — T2 claim, T3 submit (the kernel's done report written as the attempt's REPORT first), T4/T5 with an
acceptance/rejection REVIEW plus an authorization REVIEW signed for the Profile ``taskkernel/1``, T6 and T7 with
an authorization REVIEW — so every transition carries the attempt ids, evidence digests and receipts the Core
makes. A task the kernel created gets its TASK file written in the Core's own canonical bytes.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from taskkernel.coordinator.fcop import FcopWorkspace, safeio
from taskkernel.coordinator.fcop.detect import Generation
from taskkernel.coordinator.fcop4.authority import PROFILE_ID, adopt_profile, core, issuer_proof, profile_key
from taskkernel.coordinator.fcop4.reader import G4Envelope, G4Listing, read_workspace
from taskkernel.coordinator.folders.importer import ImportReport, mark_imported, root_key_of
from taskkernel.coordinator.folders.ingest import FILE_AGENT, REPORT_STATUS, IngestIncomplete, IngestStats
from taskkernel.coordinator.folders.projection import PROJECT_EFFECT
from taskkernel.coordinator.folders.tracking import FileTracker, Origin
from taskkernel.kernel.commands import TaskCommandKernel
from taskkernel.kernel.logging import get_logger
from taskkernel.kernel.model.commands import CommandResult
from taskkernel.kernel.model.principal import LOCAL_OWNER, Principal
from taskkernel.kernel.outbox import OutboxRelay

log = get_logger(__name__)
PROJECT_BATCH = 25
# Each kernel lifecycle event is one Core edge (its tool below); the kernel's own extensions (force_archive, amend)
# have none: they stay in the kernel (logged once).
EDGE_OF_EVENT = {"task_claimed": ("inbox", "active"), "task_submitted": ("active", "review"),
                 "task_approved": ("review", "done"), "task_rejected": ("review", "active"),
                 "task_reopened": ("done", "active"), "task_archived": ("done", "archive")}
TOOLS = {("inbox", "active"): "claim_task", ("active", "review"): "submit_task", ("review", "done"): "approve_task",
         ("review", "active"): "reject_task", ("done", "active"): "reopen_task", ("done", "archive"): "archive_task"}
AUTHORITY = {"claim_task": "driver", "submit_task": "driver", "approve_task": "done_authority",
             "reject_task": "done_authority", "reopen_task": "done_authority", "archive_task": "archive_authority"}


def _now() -> str:
    return datetime.now(UTC).isoformat()


class G4Adapter:
    """The folder adapter's interface (ingest_pass, project_pass, ledger_pass, projection.find/place) for G4."""

    def __init__(self, kernel: TaskCommandKernel, workspace_root: Path, state_dir: Path) -> None:
        self.kernel = kernel
        self.project_root = workspace_root
        self.fcop = FcopWorkspace(root=workspace_root / "fcop", generation=Generation.G4,
                                  config=json.loads((workspace_root / "fcop" / "fcop.json").read_bytes()))
        self.workspace_id: str = self.fcop.config["workspace_id"]
        self.key = profile_key(state_dir)
        self.core = core(workspace_root, self.key)
        self.tracker = FileTracker(kernel.db)
        self.relay = OutboxRelay(kernel.db, {PROJECT_EFFECT: self._on_event})
        self.projection = self
        self.root_key = root_key_of(self.fcop.root, workspace_root)
        self.last_import: ImportReport | None = None
        self.last_ingest = IngestStats()

    # -- ingest ------------------------------------------------------------------------------------------------
    def ingest_pass(self) -> int:
        stats = IngestStats()
        listing = read_workspace(self.project_root)
        for rel, why in listing.invalid.items():
            if self.tracker.get(rel) is None:
                log.warning("fcop4.invalid", rel=rel, reason=why)
                self.tracker.record(rel, "", None, Origin.KEPT, note=why)
        from taskkernel.coordinator.folders.importer import is_imported

        if self.last_import is None and not is_imported(self.kernel.db, self.root_key):
            self.last_import = self._import(listing, stats)
        else:
            self._live(listing, stats)
        self.last_ingest = stats
        if stats.failed:
            raise IngestIncomplete(stats)
        return stats.progress

    def _import(self, listing: G4Listing, stats: IngestStats) -> ImportReport:
        report = ImportReport()
        for task in sorted(listing.tasks.values(), key=lambda t: (str(t.fields.get("created_at")), t.id)):
            attempts = len(task.attempts)
            payload = {**self._task_payload(task), "state": task.stage,
                       "round": 0 if task.stage == "inbox" else max(attempts, 1), "source": task.rel}
            result = self._submit({"type": "adopt_task", "task_id": task.id, "payload": payload,
                                   "idempotency_key": f"fcop4:{task.id}:adopt"}, LOCAL_OWNER, stats)
            if result.ok or result.reason == "task_exists":
                report.tasks[task.stage or "inbox"] += 1
                self.tracker.record(task.rel, task.sha256, task.id, Origin.INGESTED)
            else:
                report.refused.append({"file": task.rel, "reason": result.reason, "message": result.message})
        for record in listing.records:
            doc = self.kernel.task(str(record.fields.get("subject_ref")))
            if doc is None:
                self.tracker.record(record.rel, record.sha256, None, Origin.INGESTED, note="evidence")
                continue
            kind = record.kind.lower()
            status = record.fields.get("result") if kind == "report" else record.fields.get("decision", record.fields.get("severity"))
            payload = {"kind": kind, "record_id": record.id, "source": record.rel, "author": record.fields["sender"],
                       "status": str(status)[:100] if status is not None else None, "body": record.body.strip(),
                       "references": [r for r in record.fields.get("references", []) if isinstance(r, str)]}
            result = self._submit({"type": "attach_record", "task_id": doc["task_id"],
                                   "thread_key": doc["thread_key"], "expected_revision": doc["revision"],
                                   "round": doc["round"], "idempotency_key": f"fcop4:{record.id}:attach",
                                   "payload": payload}, LOCAL_OWNER, stats)
            if result.ok:
                report.records[kind] += 1
            self.tracker.record(record.rel, record.sha256, doc["task_id"], Origin.INGESTED,
                                note=None if result.ok else f"{result.reason}: {result.message}")
        mark_imported(self.kernel.db, self.root_key, "g4", report)
        log.info("fcop_import", generation="g4", tasks=dict(report.tasks), records=dict(report.records),
                 refused=len(report.refused))
        return report

    def _task_payload(self, task: G4Envelope) -> dict[str, Any]:
        f = task.fields
        payload: dict[str, Any] = {"sender": f["sender"], "recipient": f["recipient"],
                                   "subject": str(f.get("subject") or task.id)[:500], "body": task.body.strip(),
                                   "priority": f.get("priority") or "P2",
                                   "references": [r for r in f.get("references") or [] if isinstance(r, str)]}
        parent = f.get("branch_of") or f.get("parent")
        if parent and self.kernel.task(parent) is not None:
            payload["parent"] = parent
        return payload

    def _live(self, listing: G4Listing, stats: IngestStats) -> None:
        moved: list[tuple[G4Envelope, dict[str, Any]]] = []
        for task in listing.tasks.values():
            known = self.tracker.get(task.rel)
            if known is not None and known.sha256 == task.sha256:
                continue  # unchanged since the kernel last wrote or took it in
            doc = self.kernel.task(task.id)
            if doc is None:
                if task.stage == "inbox":
                    result = self._submit({"type": "create_task", "task_id": task.id,
                                           "payload": self._task_payload(task),
                                           "idempotency_key": f"fcop4:{task.id}:create"},
                                          Principal(task.fields["sender"], FILE_AGENT), stats)
                    self._settle(task, task.id, result, stats)
                else:
                    self._refuse(task, task.id, "unknown_task_outside_inbox: after the import, new tasks start in "
                                                "the inbox", stats)
            elif task.stage != doc["state"]:
                moved.append((task, doc))
            else:
                self.tracker.record(task.rel, task.sha256, task.id, Origin.INGESTED)
        for record in listing.records:
            if self.tracker.get(record.rel) is None:
                self._record(record, stats)
        for task, doc in moved:
            self._agent_move(task, self.kernel.task(task.id) or doc, stats)

    def _agent_move(self, task: G4Envelope, doc: dict[str, Any], stats: IngestStats) -> None:
        """An fcop agent's T2 or T3 (a move the kernel did not make): its driver's claim or submit."""
        kind = {("inbox", "active"): "claim", ("active", "review"): "submit"}.get((doc["state"], task.stage))
        if kind is None:
            return  # behind the kernel (the projection moves it on) or a decision fcop made without the kernel
        driver = doc["authority"]["driver"]
        result = self._submit({"type": kind, "task_id": doc["task_id"], "thread_key": doc["thread_key"],
                               "expected_revision": doc["revision"], "round": doc["round"], "payload": {},
                               "idempotency_key": f"fcop4:{task.id}:{task.attempt_id}:{kind}"},
                              Principal(driver, FILE_AGENT), stats)
        self._settle(task, task.id, result, stats)

    def _record(self, record: G4Envelope, stats: IngestStats) -> None:
        task_id = str(record.fields.get("subject_ref"))
        doc = self.kernel.task(task_id)
        if record.kind != "REPORT" or doc is None:
            self.tracker.record(record.rel, record.sha256, doc["task_id"] if doc else None, Origin.INGESTED,
                                note="evidence")
            return
        status = REPORT_STATUS.get(str(record.fields.get("result", "")).lower(), "done")
        payload = {"status": status, "body": record.body.strip(), "report_id": record.id,
                   "references": [r for r in record.fields.get("references") or [] if isinstance(r, str)]}
        sender = Principal(record.fields["sender"], FILE_AGENT)
        if doc["state"] == "inbox" and record.fields["sender"] == doc["authority"]["driver"]:
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
        subject = task_id if self.kernel.task(task_id) is not None or env.kind == "TASK" else None
        try:
            issue = self.core.write_issue(
                workspace_id=self.workspace_id, sender="SYSTEM", recipient=str(env.fields.get("sender", "TEAM")),
                subject_ref=subject or f"workspace:{self.workspace_id}", severity="high",
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
            if event.type in ("task_force_archived",):
                log.warning("fcop4.not_expressible", task_id=task_id, event=event.type,
                            message="FCoP 4 has no edge for it: the task's file stays where it is")
            return
        state = self.core.inspect_state(task_id=task_id)
        if state["stage"] != edge[0]:
            return  # already there: an fcop agent made this move and the kernel took it in
        self._transition(doc, edge[0], edge[1], state["current_attempt_id"], event)
        path = self.find(task_id)
        if path is not None:
            self.tracker.record(self.fcop.relative(path), _sha(path), task_id, Origin.PROJECTED)

    def find(self, task_id: str) -> Path | None:
        for stage in ("inbox", "active", "review", "done", "archive"):
            path = self.fcop.root / "_lifecycle" / stage / f"{task_id}.md"
            if safeio.lexists(path):
                return path
        return None

    def place(self, task_id: str) -> Path | None:
        """The task's TASK file, written if the kernel created the task and it has none yet."""
        doc = self.kernel.task(task_id)
        if doc is None:
            return None
        return self.find(task_id) or self._write_new(doc)

    def _write_new(self, doc: dict[str, Any]) -> Path:
        """A task the kernel created: its TASK file in the Core's canonical bytes (the Core would name it anew)."""
        from fcop.v4.encoding import envelope_bytes

        at = _now()
        fields = {"protocol": "fcop", "version": 4, "type": "TASK", "task_id": doc["task_id"],
                  "workspace_id": self.workspace_id, "sender": doc["sender"], "recipient": doc["recipient"],
                  "created_at": at, "subject": doc["subject"], "priority": doc["priority"],
                  "parent": doc["parent"], "branch_of": None, "references": list(doc["references"]),
                  "transitions": [{"at": at, "from": None, "to": "inbox", "by": doc["sender"],
                                   "tool": "create_task"}]}
        path = self.fcop.root / "_lifecycle" / "inbox" / f"{doc['task_id']}.md"
        sha = safeio.write_new(path, envelope_bytes(fields, doc["body"] or doc["subject"]))
        self.tracker.record(self.fcop.relative(path), sha, doc["task_id"], Origin.PROJECTED)
        return path

    def _transition(self, doc: dict[str, Any], stage: str, target: str, attempt_id: str | None,
                    event: Any) -> None:
        tool = TOOLS[(stage, target)]
        actor = doc["authority"][AUTHORITY[tool]]
        request: dict[str, Any] = {"task_id": doc["task_id"], "from_stage": stage, "to_stage": target,
                                   "tool": tool, "actor": actor}
        if tool == "submit_task":
            request["report_ref"] = self._report_head(doc, attempt_id, event.global_pos)
        elif tool in ("approve_task", "reject_task"):
            request["report_ref"] = self._report_head(doc, attempt_id, event.global_pos)
            request["review_ref"] = self._review(doc, tool, actor, attempt_id, request["report_ref"],
                                                 str(event.data.get("reason") or ""))
            request["authorization_ref"] = self._authorize(doc, actor, stage, target, attempt_id,
                                                           request["review_ref"])
        elif tool in ("reopen_task", "archive_task"):
            request["authorization_ref"] = self._authorize(doc, actor, stage, target, attempt_id, None)
            if tool == "reopen_task":
                request["review_ref"] = request["authorization_ref"]
        if "authorization_ref" in request:
            request["profile_ref"] = PROFILE_ID
        self.core.transition(**request)
        log.info("fcop4.projected", task_id=doc["task_id"], edge=f"{stage}->{target}", tool=tool)

    def _report_head(self, doc: dict[str, Any], attempt_id: str | None, before: int) -> str:
        """The attempt's REPORT head; the kernel's latest done report of the round, written now if it has none."""
        from fcop.errors import V4ProtocolError

        try:
            heads = self.core.list_reports(subject_ref=doc["task_id"], attempt_id=attempt_id, head_only=True)
        except V4ProtocolError as exc:
            if exc.code != "REPORT_REQUIRED":  # the attempt has none yet: the kernel's report is written below
                raise
            heads = {}
        items = heads.get("items", heads) if isinstance(heads, dict) else heads
        if items:
            return str(items[-1]["report_id"])
        done = [e.data for e in self.kernel.history(doc["task_id"])
                if e.global_pos < before and e.data.get("status") == "done" and "report_id" in e.data]
        body = str(done[-1].get("body") or "") if done else "Submitted through taskkernel."
        written = self.core.write_report(workspace_id=self.workspace_id, sender=doc["authority"]["driver"],
                                         recipient=doc["authority"]["done_authority"], body=body or "done",
                                         subject_ref=doc["task_id"], attempt_id=attempt_id, report_kind="final",
                                         result="done")
        self._track_written(written["path"], doc["task_id"])
        return str(written["report_id"])

    def _review(self, doc: dict[str, Any], tool: str, actor: str, attempt_id: str | None, report_ref: str,
                reason: str) -> str:
        approve = tool == "approve_task"
        written = self.core.write_review(
            workspace_id=self.workspace_id, sender=actor, recipient=doc["authority"]["driver"],
            subject_ref=doc["task_id"], review_kind="acceptance" if approve else "rejection",
            decision="approved" if approve else "rejected", attempt_id=attempt_id, references=[report_ref],
            body=("Approved in taskkernel." if approve else f"Rejected in taskkernel. {reason}").strip() + "\n")
        self._track_written(written["path"], doc["task_id"])
        return str(written["review_id"])

    def _authorize(self, doc: dict[str, Any], actor: str, stage: str, target: str, attempt_id: str | None,
                   evidence: str | None) -> str:
        if adopt_profile(self.fcop.root):  # first decision: the manifest adopts the kernel's Profile
            self.core = core(self.project_root, self.key)
        written = self.core.write_review(
            workspace_id=self.workspace_id, sender=actor, recipient=doc["authority"]["driver"],
            subject_ref=doc["task_id"], review_kind="authorization", decision="authorize",
            attempt_id=attempt_id, references=[evidence] if evidence else [], profile_ref=PROFILE_ID,
            transition={"from": stage, "to": target}, issued_at=_now(), expires_at=None,
            authorization_scope="single_use", operation_kind="lifecycle_transition",
            issuer_proof=issuer_proof(self.key, actor),
            body=f"The kernel accepted {stage} -> {target} by {actor}.\n")
        self._track_written(written["path"], doc["task_id"])
        return str(written["review_id"])

    def _track_written(self, path: str, task_id: str) -> None:
        p = Path(path)
        self.tracker.record(self.fcop.relative(p), _sha(p), task_id, Origin.PROJECTED)


def _sha(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()
