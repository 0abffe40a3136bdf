"""What a task's approval or archive does to its worktree, as an outbox effect of those events (at least once;
each step is idempotent). ``on_approve = "merge"`` merges into the base exactly the commit the approved done
report recorded, and only while the task is still done in the approved round (a late or retried effect after a
reopen merges nothing). A branch that does not merge puts the task back to work (reopened, a new round) with a
`blocked` report starting ``merge_conflict:``; a base checkout that cannot move (local changes) fails the effect,
which the relay retries and logs (`outbox_effect_failed`) until a person clears the checkout. An archive removes
the worktree and keeps the branch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from taskkernel.coordinator.config import OnApprove, RunnerSpec
from taskkernel.coordinator.worktrees.manager import Worktrees
from taskkernel.kernel.commands import EffectRule, TaskCommandKernel
from taskkernel.kernel.logging import get_logger
from taskkernel.kernel.model.principal import Principal
from taskkernel.kernel.model.task import current_done_report

log = get_logger(__name__)

WORKTREE_EFFECT = "worktree"
WORKTREE_RULE = EffectRule(WORKTREE_EFFECT, frozenset({"task_approved", "task_archived", "task_force_archived"}))
MERGE_CONFLICT = "merge_conflict"  # the branch does not merge into its base
MERGE_FAILED = "merge_failed"  # the approved report recorded no diff (git failed when it was taken)
COORDINATOR = "coordinator"  # the agent name the coordinator's own commands are recorded under


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
        report = current_done_report(doc)
        diff = (report or {}).get("diff") or {}
        if not diff.get("head"):  # nothing reviewed to merge: the work must be reported again
            why = f"the approved report recorded no diff to merge ({diff.get('error') or 'none was taken'})"
            log.warning("worktree_merge_failed", task_id=task_id, reason=why)
            self._back_to_work(doc, f"{MERGE_FAILED}: {why}", "Report done again: its diff is what a merge takes.",
                               payload["global_pos"])
            return
        merged = self.worktrees.merge(task_id, diff["head"], doc["subject"])
        if merged.ok:
            log.info("worktree_merged", task_id=task_id, branch=wt.branch, base=wt.base_branch, commit=merged.commit,
                     how=merged.message)
        elif merged.conflicted:
            log.warning("worktree_merge_conflict", task_id=task_id, branch=wt.branch, base=wt.base_branch,
                        conflicts=list(merged.conflicts), message=merged.message)
            files = ", ".join(merged.conflicts[:20]) or "see the message"
            self._back_to_work(doc, f"{MERGE_CONFLICT}: {merged.message}; conflicting files: {files}",
                               f"Nothing was merged. Bring {wt.base_branch} into {wt.branch} in the task's worktree, "
                               "resolve the conflicts, and report done again.", payload["global_pos"])
        else:  # the base's checkout cannot move (local changes): the agent cannot fix that, a person can
            raise RuntimeError(f"merge of {wt.branch} into {wt.base_branch} waits: {merged.message}")

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
