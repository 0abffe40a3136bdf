"""The scheduler as the coordinator runs it: actions wired to the kernel and the session log, and
every fire recorded as usage (feature `automation`) so a runaway automation shows in `usage --top`.

Each fire acts as its schedule's principal (``taskkernel.scheduler.authority``): the kernel judges a schedule's
task exactly as it judges that role's own commands, and session inputs carry that role's trust.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from taskkernel.kernel.commands import TaskCommandKernel
from taskkernel.kernel.model.commands import TASK_ID_RE
from taskkernel.kernel.sessionlog import SessionLog
from taskkernel.kernel.usage import Feature, UsageRecord, record_usage
from taskkernel.kernel.usage import install as install_usage
from taskkernel.scheduler.actions import ActionContext, ActionRegistry, ActionResult
from taskkernel.scheduler.clockjump import DEFAULT_MAX_CLOCK_SKEW
from taskkernel.scheduler.models import SchedulerException, parse_duration
from taskkernel.scheduler.runtime import SchedulerRuntime


class _AttributedActions(ActionRegistry):
    """Every action that ran is a unit of work owned by its task's root (or by the schedule)."""

    def __init__(self, kernel: TaskCommandKernel, session_log: SessionLog) -> None:
        super().__init__(submit=kernel.submit, session_log=session_log)
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


def max_clock_skew(config: Mapping[str, Any]) -> timedelta:
    """``[scheduler] max_clock_skew`` (a duration such as ``"1d"`` or ``"6h"``; default one day). A bad value
    is a ``ValueError``, which `up` reports as a configuration error (exit 64)."""
    value = config.get("max_clock_skew")
    if value is None:
        return DEFAULT_MAX_CLOCK_SKEW
    try:
        return timedelta(seconds=parse_duration(value))
    except SchedulerException as exc:
        raise ValueError(f"[scheduler] max_clock_skew: {exc.message}") from None


class Automations:
    def __init__(self, kernel: TaskCommandKernel, owner: str, config: Mapping[str, Any] | None = None, *,
                 session_log: SessionLog | None = None) -> None:
        """``config``: the workspace's ``[scheduler]`` table; ``session_log``: the workspace's, which knows its
        grant sessions (a schedule writes sessions under the same rules as its creator)."""
        install_usage(kernel.db)
        self.actions = _AttributedActions(kernel, session_log or SessionLog(kernel.db))
        self.runtime = SchedulerRuntime(kernel.db, self.actions, owner=owner,
                                        max_clock_skew=max_clock_skew(config or {}))

    def tick(self, now: datetime | None = None) -> int:
        """One durable pass (`up --once`); returns how many occurrences were claimed."""
        return self.runtime.tick(now).claimed

    async def run(self, stop: asyncio.Event) -> None:
        """The long-running scheduler: APScheduler wakes it at the next due time, plus a safety tick."""
        await self.runtime.run(stop)
