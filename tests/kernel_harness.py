"""A small driver for kernel tests: builds commands from the task's current state unless told otherwise."""

from __future__ import annotations

import itertools
from typing import Any

from taskkernel.kernel.commands import EffectRule, TaskCommandKernel
from taskkernel.kernel.model.commands import CommandResult
from taskkernel.kernel.model.principal import LOCAL_OWNER, Principal
from taskkernel.kernel.outbox import OutboxRelay
from taskkernel.kernel.store.db import Database
from taskkernel.kernel.store.schema import metadata
from taskkernel.roles.registry import RoleRegistry

ADMIN = LOCAL_OWNER
PM = Principal("PM", "pm-agent")
DEV = Principal("DEV", "dev-agent")
QA = Principal("QA", "qa-agent")
OPS = Principal("OPS", "ops-agent")

ALL_TASK_EVENTS = frozenset({"task_created", "task_claimed", "task_submitted", "task_approved", "task_rejected",
                             "task_reopened", "task_archived", "task_force_archived", "report_submitted",
                             "task_amended"})
_keys = itertools.count(1)


class Harness:
    def __init__(self, db: Database) -> None:
        db.create_schema(metadata)
        self.db = db
        self.roles = RoleRegistry.for_team("PM", ["PM", "DEV", "QA", "OPS"], load_plugins=False)
        self.kernel = TaskCommandKernel(db, self.roles, effect_rules=[EffectRule("notify", ALL_TASK_EVENTS)])
        self.effect_calls: list[tuple[str, dict[str, Any]]] = []
        self.relay = OutboxRelay(db, {"notify": lambda key, payload: self.effect_calls.append((key, payload))})

    def create(self, sender: Principal = ADMIN, recipient: str = "PM", *, key: str | None = None,
               **payload: Any) -> CommandResult:
        body = {"sender": sender.role, "recipient": recipient, "subject": payload.pop("subject", "a task"),
                **payload}
        return self.kernel.submit({"type": "create_task", "idempotency_key": key or f"k{next(_keys)}",
                                   "payload": body}, sender)

    def cmd(self, kind: str, task_id: str, who: Principal = ADMIN, *, key: str | None = None,
            payload: dict[str, Any] | None = None, **overrides: Any) -> CommandResult:
        doc = self.kernel.task(task_id) or {"thread_key": "none", "revision": 1, "round": 0}
        command = {"type": kind, "task_id": task_id, "thread_key": doc["thread_key"],
                   "expected_revision": doc["revision"], "round": doc["round"],
                   "idempotency_key": key or f"k{next(_keys)}", "payload": payload or {}}
        command.update(overrides)
        return self.kernel.submit(command, who)

    def report(self, task_id: str, who: Principal, status: str = "done", **kw: Any) -> CommandResult:
        return self.cmd("submit_report", task_id, who, payload={"status": status, "body": "evidence"}, **kw)

    def drive_to(self, task_id: str, state: str, driver: Principal = PM, reviewer: Principal = ADMIN) -> None:
        """Walk a task along the happy path until it reaches ``state``."""
        steps = {"active": [("claim", driver)],
                 "review": [("claim", driver), ("report", driver), ("submit", driver)],
                 "done": [("claim", driver), ("report", driver), ("submit", driver), ("approve", reviewer)],
                 "archive": [("claim", driver), ("report", driver), ("submit", driver), ("approve", reviewer),
                             ("archive", reviewer)]}[state]
        for kind, who in steps:
            if kind == "report":
                r = self.report(task_id, who)
            elif kind == "archive":
                r = self.cmd("archive", task_id, who, payload={"reason": "finished"})
            else:
                r = self.cmd(kind, task_id, who)
            assert r.status == "accepted", r

    def event_count(self) -> int:
        with self.db.read() as conn:
            return int(conn.exec_driver_sql("SELECT count(*) FROM events").scalar() or 0)

    def receipt_count(self) -> int:
        with self.db.read() as conn:
            return int(conn.exec_driver_sql("SELECT count(*) FROM receipts").scalar() or 0)

    def run_effects(self) -> int:
        return self.relay.run_pending()
