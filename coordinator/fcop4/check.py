"""`taskkernel verify` on a G4 workspace: each task's file, as fcop's Core reads and validates it, in the stage the
kernel's state says. fcop's whole-workspace validator (`fcop validate`, fcop-mcp's validate_workspace) is not run
here: it resolves every relation of every envelope, which grows with the square of the workspace (8 s at 51 tasks,
117 s at 201 measured with fcop 4.0.5)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from taskkernel.coordinator.fcop4.aliases import Aliases
from taskkernel.coordinator.folders.projection import PROJECT_EFFECT
from taskkernel.kernel.commands import TaskCommandKernel
from taskkernel.kernel.store.schema import outbox, tasks
from taskkernel.kernel.verify import VerifyReport

# FCoP 4 has no edge for these kernel states' way there: the file stays where the last Core edge left it.
NOT_EXPRESSIBLE = frozenset({"task_force_archived"})


def verify_g4(kernel: TaskCommandKernel, project_root: Path, report: VerifyReport) -> None:
    from fcop import Project
    from fcop.errors import FcopError as CoreError

    core: Any = Project(project_root)  # the v4 facade's methods are delegated at run time
    ids = Aliases(kernel.db)
    with kernel.db.snapshot() as conn:
        queued = {json.loads(p)["task_id"] for p in conn.execute(sa.select(outbox.c.payload).where(
            outbox.c.effect == PROJECT_EFFECT, outbox.c.status.in_(("pending", "claimed")))).scalars()}
        rows = conn.execute(sa.select(tasks.c.task_id, tasks.c.state, tasks.c.last_pos))
        for task_id, state, pos in rows:
            if task_id in queued:
                continue
            try:
                stage = core.inspect_state(task_id=ids.file_id(task_id))["stage"]
            except CoreError as exc:
                if not _forced(kernel, task_id):  # a force-archived task may have no file (migrate --to g4)
                    report.add("folder", "folder_drift", pos, f"no valid TASK file: {exc}", task_id=task_id)
                continue
            if stage != state and not _forced(kernel, task_id):
                report.add("folder", "folder_drift", pos, f"TASK file is in {stage}/, the kernel says {state}",
                           task_id=task_id)


def _forced(kernel: TaskCommandKernel, task_id: str) -> bool:
    return any(e.type in NOT_EXPRESSIBLE for e in kernel.history(task_id))
