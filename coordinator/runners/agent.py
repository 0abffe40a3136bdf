"""What a running agent sees: its task, its scoped identity, and helpers that go through the kernel."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from taskkernel.coordinator.fcop.errors import FcopError
from taskkernel.coordinator.fcop.safeio import confine, report, rewrite, safe_join
from taskkernel.coordinator.runners.ledger import Purpose
from taskkernel.kernel.commands import TaskCommandKernel
from taskkernel.kernel.model.commands import CommandResult
from taskkernel.kernel.model.principal import Principal


@dataclass
class AgentContext:
    kernel: TaskCommandKernel
    principal: Principal
    task: dict[str, Any]
    purpose: Purpose
    run_id: str
    workspace: Path
    task_file: Path
    merges_into: str | None = None  # the base branch approving this task would merge into (None: nothing merges)
    _seq: itertools.count[int] = field(default_factory=lambda: itertools.count(1), repr=False)

    def __post_init__(self) -> None:
        confine(self.workspace)  # artifacts go under workspace/, never through a symlink

    def submit(self, kind: str, task_id: str | None = None, **payload: Any) -> CommandResult:
        """Submit as this agent. Keys are derived from the run and call order, so a retried attempt
        replays what an earlier attempt already did instead of doing it twice."""
        key = f"{self.run_id}:{next(self._seq)}:{kind}"
        command: dict[str, Any] = {"type": kind, "idempotency_key": key, "payload": payload}
        if kind != "create_task":
            target = self.kernel.task(task_id or self.task["task_id"])
            if target is None:
                raise LookupError(f"task {task_id} vanished")
            command.update(task_id=target["task_id"], thread_key=target["thread_key"],
                           expected_revision=target["revision"], round=target["round"])
        return self.kernel.submit(command, self.principal)

    def refresh(self) -> dict[str, Any]:
        doc = self.kernel.task(self.task["task_id"])
        assert doc is not None
        self.task = doc
        return doc

    def children(self) -> list[dict[str, Any]]:
        return self.kernel.children(self.task["task_id"])

    def write_artifact(self, relative: str, text: str) -> Path:
        """Write under workspace/ through the safe layer (random temp + fsync + rename); replacing an earlier
        attempt's copy is intended. Refuses `path_escape` and `symlink_refused` (logged with the path)."""
        try:
            target = safe_join(self.workspace / "workspace", relative)
            rewrite(target, text.encode("utf-8"), expect_sha256=None)
        except FcopError as exc:
            report(exc, "write_artifact", run_id=self.run_id)
            raise
        return target
