"""The scheduler as the coordinator runs it: actions wired to the kernel and the session log, and
every fire recorded as usage (feature `automation`) so a runaway automation shows in `usage --top`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from kernel.commands import TaskCommandKernel
from kernel.model.commands import TASK_ID_RE
from kernel.sessionlog import SessionLog
from kernel.usage import Feature, UsageRecord, record_usage
from kernel.usage import install as install_usage
from scheduler.actions import ActionContext, ActionRegistry, ActionResult
from scheduler.runtime import SchedulerRuntime

SCHEDULER_PRINCIPAL = "SYSTEM:scheduler"


class _SessionSink:
    """Inputs an automation accepts are accepted from the system, not from a person or an agent."""

    def __init__(self, log: SessionLog) -> None:
        self.log = log

    def accept(self, session: str, inp: Mapping[str, Any]) -> Any:
        return self.log.accept(session, inp, accepted_by=SCHEDULER_PRINCIPAL)


class _AttributedActions(ActionRegistry):
    """Every action that ran is a unit of work owned by its task's root (or by the schedule)."""

    def __init__(self, kernel: TaskCommandKernel) -> None:
        super().__init__(submit=kernel.submit, session_log=_SessionSink(SessionLog(kernel.db)))
        self.kernel = kernel

    def run(self, ctx: ActionContext) -> ActionResult:
        started = time.monotonic()
        result = super().run(ctx)
        c = ctx.claim
        ref = result.run_ref
        task = self.kernel.task(ref) if ref and TASK_ID_RE.match(ref) else None
        with self.kernel.db.write() as uow:
            record_usage(uow, UsageRecord(
                usage_id=f"automation:{c.schedule_id}:{c.key}:{c.attempt}", role=c.spec.owner_role,
                agent=f"scheduler:{c.name}", feature=Feature.AUTOMATION,
                root_task=task["root"] if task else f"schedule:{c.name}", task_id=task["task_id"] if task else None,
                wall_ms=int((time.monotonic() - started) * 1000)))
        return result


class Automations:
    def __init__(self, kernel: TaskCommandKernel, owner: str) -> None:
        install_usage(kernel.db)
        self.actions = _AttributedActions(kernel)
        self.runtime = SchedulerRuntime(kernel.db, self.actions, owner=owner)

    def tick(self, now: datetime | None = None) -> int:
        """One durable pass (`up --once`); returns how many occurrences were claimed."""
        return self.runtime.tick(now).claimed

    async def run(self, stop: asyncio.Event) -> None:
        """The long-running scheduler: APScheduler wakes it at the next due time, plus a safety tick."""
        await self.runtime.run(stop)
