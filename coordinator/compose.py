"""The composition root: the kernel exactly as every process of a workspace builds it (the
coordinator, every CLI command, the demo, tests) — same roles, same guards, same effect rules.

What the core cannot know is injected here: whether a `task retry` could help is a question of the workspace's
runners and runs (runners/retrycheck.py); a retry wakes an agent as a claim does (``WAKE_RULE`` lists
``task_retried``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from taskkernel.coordinator.config import GateTable
from taskkernel.coordinator.fcop import EnvelopeKind, FcopError, open_workspace
from taskkernel.coordinator.fcop.detect import Generation, detect_generation, find_workspace_root
from taskkernel.coordinator.fcop.numbering import sequences_in_use
from taskkernel.coordinator.folders.projection import PROJECT_RULE
from taskkernel.coordinator.runners.dispatcher import WAKE_RULE
from taskkernel.coordinator.runners.inputs import role_specs, run_session_of
from taskkernel.coordinator.runners.retrycheck import retry_check
from taskkernel.coordinator.runners.tools import PERFORM_RULE
from taskkernel.coordinator.workspace import Workspace
from taskkernel.coordinator.worktrees.effects import WORKTREE_RULE
from taskkernel.coordinator.worktrees.evidence import DiffEvidence
from taskkernel.coordinator.worktrees.manager import Worktrees
from taskkernel.kernel.commands import EffectRule, TaskCommandKernel
from taskkernel.kernel.instructions import PendingInputsGuard
from taskkernel.kernel.model.upcasters import task_upcasters
from taskkernel.kernel.permissions import HumanGrantGuard
from taskkernel.kernel.protected import DEFAULT_PROTECTED, GateGuard
from taskkernel.kernel.retry import RetryGuard
from taskkernel.kernel.sessionlog import SessionLog
from taskkernel.kernel.store.db import Database
from taskkernel.kernel.store.events import EventStore
from taskkernel.kernel.store.schema import metadata
from taskkernel.roles.registry import RoleRegistry

STANDARD_EFFECTS: tuple[EffectRule, ...] = (WAKE_RULE, PERFORM_RULE, PROJECT_RULE, WORKTREE_RULE)


def build_kernel(db: Database, workspace: Workspace | None) -> TaskCommandKernel:
    """The kernel as every process of a workspace must build it (same roles, same effect rules)."""
    team = workspace.team() if workspace else None
    roles = RoleRegistry.for_team(team.leader, team.roles) if team else RoleRegistry.for_team(
        "PM", ["PM", "DEV", "QA", "OPS"])
    db.create_schema(metadata)
    log = SessionLog(db, workspace.grant_sessions) if workspace else SessionLog(db)
    store = EventStore(task_upcasters())
    gate_cfg = workspace.config.gate if workspace else GateTable()
    gate = GateGuard(log, store, default_session=gate_cfg.session,
                     protected_by_risk={**DEFAULT_PROTECTED, **gate_cfg.protected},
                     protected_by_role=gate_cfg.roles)
    folders = workspace is not None and workspace.config.folders.enabled
    # Last: a done report's diff (prepared before the transaction) is recorded once every other check let it through.
    evidence = [DiffEvidence(Worktrees(db, workspace.root, workspace.config.worktrees.patterns()))
                ] if workspace is not None else []
    pending = PendingInputsGuard(db, run_session_of(role_specs(workspace.config) if workspace else {}))
    retry = [RetryGuard(retry_check(workspace.config, workspace.root, roles))] if workspace is not None else []
    return TaskCommandKernel(db, roles, effect_rules=STANDARD_EFFECTS, store=store,
                             guards=[HumanGrantGuard(log), gate, *retry, pending, *evidence],
                             preparers=[e.prepare for e in evidence],
                             numbers_in_use=_task_numbers_on_disk(workspace.root) if folders and workspace else None,
                             fcop4_ids=folders and workspace is not None and _is_g4(workspace.root))


def _is_g4(root: Path) -> bool:
    """Does the workspace keep an FCoP 4 folder (its tasks are named TASK-<32 hex>)?"""
    try:
        return detect_generation(find_workspace_root(root)) is Generation.G4
    except FcopError:
        return False


def _task_numbers_on_disk(root: Path) -> Callable[[str], set[int]]:
    """The day's TASK numbers present as files in the workspace's FCoP folders, any stage, any state."""
    def numbers(day: str) -> set[int]:
        try:
            fcop = open_workspace(root, allow_mixed=True)
        except FcopError:  # no readable workspace (G4, ambiguous): nothing on disk the kernel would write into
            return set()
        return sequences_in_use(fcop, EnvelopeKind.TASK, day)
    return numbers
