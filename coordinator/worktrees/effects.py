"""What a task's approval or archive does to its worktree, as an outbox effect of those events (at least once;
each step is idempotent). ``on_approve = "merge"`` merges into the base exactly the commit the approved done
report recorded, and only while the task is still done in the approved round (a late or retried effect after a
reopen merges nothing). A branch that does not merge puts the task back to work (reopened, a new round) with a
`blocked` report starting ``merge_conflict:``; a base checkout that cannot move (local changes) fails the effect,
which the relay retries and logs (`outbox_effect_failed`) until a person clears the checkout. An archive removes
the worktree and keeps the branch.

The task's history says what became of the merge: the coordinator records ``task_merged`` {branch, base, commit,
how} when it landed and ``merge_failed`` {error} when it waits for a person (kernel/records.py: no credential may
write either). `taskkernel task merge ID` runs the same merge (``merge_approved``) once the cause is fixed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from taskkernel.coordinator.config import OnApprove, RunnerSpec
from taskkernel.coordinator.worktrees.git import GitError
from taskkernel.coordinator.worktrees.manager import Worktrees
from taskkernel.kernel.canonical import sha256_hex
from taskkernel.kernel.commands import EffectRule, TaskCommandKernel
from taskkernel.kernel.logging import get_logger
from taskkernel.kernel.model.commands import CommandResult
from taskkernel.kernel.model.principal import Principal
from taskkernel.kernel.model.task import current_done_report

log = get_logger(__name__)

WORKTREE_EFFECT = "worktree"
WORKTREE_RULE = EffectRule(WORKTREE_EFFECT, frozenset({"task_approved", "task_archived", "task_force_archived"}))
MERGE_CONFLICT = "merge_conflict"  # the branch does not merge into its base
MERGE_FAILED = "merge_failed"  # nothing merged: no diff was recorded, or the base checkout cannot take it
COORDINATOR = "coordinator"  # the agent name the coordinator's own commands are recorded under
MERGED, FAILED, REOPENED = "merged", "failed", "reopened"  # what ``merge_approved`` did


@dataclass(frozen=True)
class MergeOutcome:
    """What a merge of an approved task came to: ``merged`` (``commit`` is the base's new head), ``failed`` (nothing
    moved; it waits for a person: ``merge_failed`` is on the task) or ``reopened`` (back to work: ``reason`` is
    ``merge_conflict`` or ``merge_failed``, the blocked report says why)."""

    status: str
    message: str
    reason: str | None = None
    branch: str | None = None
    base: str | None = None
    commit: str | None = None
    how: str | None = None


def recorder(doc: dict[str, Any]) -> Principal:
    """Who records a merge: the coordinator, in-process, for the task's done authority (the same principal from the
    outbox effect and from `task merge`, so the record of one merge is one command whichever ran it)."""
    return Principal(doc["authority"]["done_authority"], COORDINATOR, internal=True)


class WorktreeEffects:
    def __init__(self, kernel: TaskCommandKernel, worktrees: Worktrees, specs: Mapping[str, RunnerSpec]) -> None:
        self.kernel = kernel
        self.worktrees = worktrees
        self.specs = specs

    def __call__(self, key: str, payload: dict[str, Any]) -> None:
        task_id = payload["task_id"]
        wt = self.worktrees.get(task_id)
        doc = self.kernel.task(task_id)
        if wt is None or doc is None:
            return
        if payload["event_type"] != "task_approved":
            if self.worktrees.archive(task_id):
                log.info("worktree_archived", task_id=task_id, branch=wt.branch)
            return
        spec = self.specs.get(doc["authority"]["driver"])
        if spec is None or spec.on_approve is not OnApprove.MERGE:
            return
        if doc["state"] != "done" or doc["round"] != payload["round"]:  # reopened since: that approval is past
            log.info("worktree_merge_skipped", task_id=task_id, reason="the task moved since its approval",
                     state=doc["state"], round=doc["round"], approved_round=payload["round"])
            return
        outcome = self.merge_approved(doc, payload["global_pos"])
        if outcome.status == FAILED:  # the base's checkout cannot move (local changes): a person can fix that
            raise RuntimeError(outcome.message)

    def merge_approved(self, doc: dict[str, Any], approval_pos: int) -> MergeOutcome:
        """Merge the commit the approved done report recorded into the task's base and record what came of it.
        ``approval_pos``: the approval's position, which names the records (a retried merge replays them)."""
        task_id = doc["task_id"]
        wt = self.worktrees.get(task_id)
        if wt is None:
            return MergeOutcome(FAILED, f"{task_id} has no worktree: nothing to merge", MERGE_FAILED)
        report = current_done_report(doc)
        diff = (report or {}).get("diff") or {}
        if not diff.get("head"):  # nothing reviewed to merge: the work must be reported again
            why = f"the approved report recorded no diff to merge ({diff.get('error') or 'none was taken'})"
            log.warning("worktree_merge_failed", task_id=task_id, reason=why)
            self._back_to_work(doc, f"{MERGE_FAILED}: {why}", "Report done again: its diff is what a merge takes.",
                               approval_pos)
            return MergeOutcome(REOPENED, f"{why}: the task was reopened", MERGE_FAILED, wt.branch, wt.base_branch)
        try:
            merged = self.worktrees.merge(task_id, diff["head"], doc["subject"])
        except (GitError, OSError) as exc:
            return self._waits(doc, approval_pos, wt.branch, wt.base_branch, f"git failed: {exc}")
        if merged.ok and merged.commit:
            log.info("worktree_merged", task_id=task_id, branch=wt.branch, base=wt.base_branch, commit=merged.commit,
                     how=merged.message)
            recorded = doc.get("merge") or {}
            if recorded.get("status") != "merged" or recorded.get("round") != doc["round"]:  # once per round: a
                # re-run (a requeued dead letter, a second `task merge`) finds it "already in the base" at another head
                self._record(doc, approval_pos, "merged", "record_merge", {
                    "branch": wt.branch, "base": wt.base_branch, "commit": merged.commit, "how": merged.message})
            return MergeOutcome(MERGED, f"merged into {wt.base_branch} at {(merged.commit or '')[:12]}", None,
                                wt.branch, wt.base_branch, merged.commit, merged.message)
        if merged.ok:  # no repository to merge in: nothing was there to do
            return MergeOutcome(MERGED, merged.message, None, wt.branch, wt.base_branch)
        if merged.conflicted:
            log.warning("worktree_merge_conflict", task_id=task_id, branch=wt.branch, base=wt.base_branch,
                        conflicts=list(merged.conflicts), message=merged.message)
            files = ", ".join(merged.conflicts[:20]) or "see the message"
            self._back_to_work(doc, f"{MERGE_CONFLICT}: {merged.message}; conflicting files: {files}",
                               f"Nothing was merged. Bring {wt.base_branch} into {wt.branch} in the task's worktree, "
                               "resolve the conflicts, and report done again.", approval_pos)
            return MergeOutcome(REOPENED, f"{merged.message}: the task was reopened", MERGE_CONFLICT, wt.branch,
                                wt.base_branch)
        return self._waits(doc, approval_pos, wt.branch, wt.base_branch,
                           f"merge of {wt.branch} into {wt.base_branch} waits: {merged.message}")

    def _waits(self, doc: dict[str, Any], pos: int, branch: str, base: str, error: str) -> MergeOutcome:
        """Nothing moved and nothing an agent could fix: say so on the task (``merge_failed``; the same error again
        replays the record), for a person to fix, then `taskkernel task merge ID`."""
        log.warning("worktree_merge_waits", task_id=doc["task_id"], branch=branch, base=base, error=error)
        shown = error.encode("utf-8")[:4000].decode("utf-8", errors="ignore")  # the reason's limit is in bytes
        self._record(doc, pos, f"failed:{sha256_hex(error)[:16]}", "record_merge_failure", {"error": shown})
        return MergeOutcome(FAILED, error, MERGE_FAILED, branch, base)

    def _record(self, doc: dict[str, Any], pos: int, what: str, kind: str, payload: dict[str, Any]) -> None:
        """Record a merge's outcome on the task as the coordinator (judged against the task as it is now)."""
        task_id = doc["task_id"]
        result: CommandResult | None = None
        for _ in range(5):
            now = self.kernel.task(task_id)
            if now is None:
                return
            result = self.kernel.submit({
                "type": kind, "task_id": task_id, "thread_key": now["thread_key"], "expected_revision": now["revision"],
                "round": now["round"], "idempotency_key": f"merge:{task_id}:{pos}:{what}", "payload": payload},
                recorder(now))
            if result.reason != "stale_task_revision":
                break
        if result is not None and not result.ok:
            log.error("merge_record_refused", task_id=task_id, kind=kind, reason=result.reason,
                      message=result.message)

    def _back_to_work(self, doc: dict[str, Any], reason: str, advice: str, pos: int) -> None:
        """Reopen the approved task (as its done authority) and say why in a blocked report (as its driver)."""
        task_id, authority = doc["task_id"], doc["authority"]
        reopened = self.kernel.submit({
            "type": "reopen", "task_id": task_id, "thread_key": doc["thread_key"], "expected_revision": doc["revision"],
            "round": doc["round"], "idempotency_key": f"merge:{task_id}:{pos}:reopen",
            "payload": {"reason": reason[:2000]}}, Principal(authority["done_authority"], COORDINATOR))
        if not reopened.ok:
            log.error("merge_reopen_refused", task_id=task_id, reason=reopened.reason, message=reopened.message)
            return
        body = f"{reason}\n\n{advice}"
        for _ in range(5):  # the woken agent may move the task first: judge against the task as it is now
            now = self.kernel.task(task_id)
            if now is None or now["state"] != "active":
                return
            blocked = self.kernel.submit({
                "type": "submit_report", "task_id": task_id, "thread_key": now["thread_key"],
                "expected_revision": now["revision"], "round": now["round"],
                "idempotency_key": f"merge:{task_id}:{pos}:blocked",
                "payload": {"status": "blocked", "body": body[:8000]}},
                Principal(authority["driver"], COORDINATOR, task_id, now["round"]))
            if blocked.reason != "stale_task_revision":
                if not blocked.ok:
                    log.error("merge_report_refused", task_id=task_id, reason=blocked.reason,
                              message=blocked.message)
                return
