"""One kernel lifecycle step as one edge of fcop's Core, with the evidence and authorization the Core requires.

T2 claim and T3 submit (the attempt's REPORT written first when it has none), T4/T5 with an acceptance/rejection
REVIEW of the REPORT head and an authorization REVIEW signed for the Profile ``taskkernel-authority/1``, T6/T7 with an
authorization REVIEW. The Core itself appends the transition (attempt id, evidence digests of the exact bytes it
consumed), moves the file and writes its receipt. Used by the live projection and by ``migrate --to g4``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from taskkernel.coordinator.fcop import safeio
from taskkernel.coordinator.fcop4.authority import PROFILE_ID, adopt_profile, core, issuer_proof

STAGES = ("inbox", "active", "review", "done", "archive")
TOOLS = {("inbox", "active"): "claim_task", ("active", "review"): "submit_task", ("review", "done"): "approve_task",
         ("review", "active"): "reject_task", ("done", "active"): "reopen_task", ("done", "archive"): "archive_task"}
# Who acts on each edge: the task's authority the kernel checked for the same step.
AUTHORITY = {"claim_task": "driver", "submit_task": "driver", "approve_task": "done_authority",
             "reject_task": "done_authority", "reopen_task": "done_authority", "archive_task": "archive_authority"}


def now() -> str:
    return datetime.now(UTC).isoformat()


class CoreEdges:
    def __init__(self, project_root: Path, key: bytes, written: Callable[[Path, str], None]) -> None:
        self.project_root = project_root
        self.fcop_root = project_root / "fcop"
        self.key = key
        self.written = written  # (a file the Core or we wrote, the kernel task it is about)
        self.workspace_id: str = json.loads((self.fcop_root / "fcop.json").read_bytes())["workspace_id"]

    @property
    def core(self) -> Any:
        """fcop's Core, bound anew for each use (under a millisecond): a Project bound to a manifest that changed
        since (another coordinator adopting the Profile, a hand edit) refuses every call."""
        return core(self.project_root, self.key)

    def find(self, file_id: str) -> Path | None:
        for stage in STAGES:
            path = self.fcop_root / "_lifecycle" / stage / f"{file_id}.md"
            if safeio.lexists(path):
                return path
        return None

    def state(self, file_id: str) -> tuple[str, str | None]:
        """(stage, current attempt id) as the Core reads them."""
        state = self.core.inspect_state(task_id=file_id)
        return state["stage"], state["current_attempt_id"]

    def write_task(self, doc: dict[str, Any]) -> Path:
        """A task the kernel named (``TASK-<32 hex>``): its TASK file in the Core's canonical bytes (the Core's
        ``create_task`` would name it anew)."""
        from fcop.v4.encoding import envelope_bytes

        at = now()
        fields = {"protocol": "fcop", "version": 4, "type": "TASK", "task_id": doc["task_id"],
                  "workspace_id": self.workspace_id, "sender": doc["sender"], "recipient": doc["recipient"],
                  "created_at": at, "subject": doc["subject"], "priority": doc["priority"],
                  "parent": doc["parent"], "branch_of": None, "references": list(doc["references"]),
                  "transitions": [{"at": at, "from": None, "to": "inbox", "by": doc["sender"],
                                   "tool": "create_task"}]}
        path = self.fcop_root / "_lifecycle" / "inbox" / f"{doc['task_id']}.md"
        safeio.write_new(path, envelope_bytes(fields, doc["body"] or doc["subject"]))
        self.written(path, doc["task_id"])
        return path

    def step(self, file_id: str, task_id: str, authority: dict[str, str], stage: str, target: str, *,
             report_body: str, reason: str = "") -> None:
        """Move the file ``stage`` -> ``target`` (one Core edge), acting as the authority the edge needs.
        ``report_body``: the REPORT written for the attempt if it has none; ``reason``: a rejection's."""
        tool = TOOLS[(stage, target)]
        actor = authority[AUTHORITY[tool]]
        _, attempt = self.state(file_id)
        request: dict[str, Any] = {"task_id": file_id, "from_stage": stage, "to_stage": target, "tool": tool,
                                   "actor": actor}
        if tool in ("submit_task", "approve_task", "reject_task"):
            request["report_ref"] = self._report_head(file_id, task_id, authority, attempt, report_body)
        if tool in ("approve_task", "reject_task"):
            request["review_ref"] = self._review(file_id, task_id, authority, tool, actor, attempt,
                                                 request["report_ref"], reason)
        if tool in ("approve_task", "reject_task", "reopen_task", "archive_task"):
            request["authorization_ref"] = self._authorize(file_id, task_id, authority, actor, stage, target,
                                                           attempt, request.get("review_ref"))
            request["profile_ref"] = PROFILE_ID
            if tool == "reopen_task":
                request["review_ref"] = request["authorization_ref"]
        self.core.transition(**request)
        path = self.find(file_id)
        if path is not None:
            self.written(path, task_id)

    def _report_head(self, file_id: str, task_id: str, authority: dict[str, str], attempt: str | None,
                     body: str) -> str:
        from fcop.errors import V4ProtocolError

        try:
            heads = self.core.list_reports(subject_ref=file_id, attempt_id=attempt, head_only=True)
        except V4ProtocolError as exc:
            if exc.code != "REPORT_REQUIRED":  # the attempt has none yet: the kernel's report is written below
                raise
            heads = {}
        items = heads.get("items", []) if isinstance(heads, dict) else heads
        if items:
            return str(items[-1]["report_id"])
        written = self.core.write_report(workspace_id=self.workspace_id, sender=authority["driver"],
                                         recipient=authority["done_authority"], body=body or "done",
                                         subject_ref=file_id, attempt_id=attempt, report_kind="final",
                                         result="done")
        self.written(Path(written["path"]), task_id)
        return str(written["report_id"])

    def _review(self, file_id: str, task_id: str, authority: dict[str, str], tool: str, actor: str,
                attempt: str | None, report_ref: str, reason: str) -> str:
        approve = tool == "approve_task"
        written = self.core.write_review(
            workspace_id=self.workspace_id, sender=actor, recipient=authority["driver"], subject_ref=file_id,
            review_kind="acceptance" if approve else "rejection", decision="approved" if approve else "rejected",
            attempt_id=attempt, references=[report_ref],
            body=("Approved in taskkernel." if approve else f"Rejected in taskkernel. {reason}").strip() + "\n")
        self.written(Path(written["path"]), task_id)
        return str(written["review_id"])

    def _authorize(self, file_id: str, task_id: str, authority: dict[str, str], actor: str, stage: str,
                   target: str, attempt: str | None, evidence: str | None) -> str:
        adopt_profile(self.fcop_root)  # the first decision: the manifest adopts the kernel's Profile
        written = self.core.write_review(
            workspace_id=self.workspace_id, sender=actor, recipient=authority["driver"], subject_ref=file_id,
            review_kind="authorization", decision="authorize", attempt_id=attempt,
            references=[evidence] if evidence else [], profile_ref=PROFILE_ID,
            transition={"from": stage, "to": target}, issued_at=now(), expires_at=None,
            authorization_scope="single_use", operation_kind="lifecycle_transition",
            issuer_proof=issuer_proof(self.key, actor), body=f"The kernel accepted {stage} -> {target} by {actor}.\n")
        self.written(Path(written["path"]), task_id)
        return str(written["review_id"])
