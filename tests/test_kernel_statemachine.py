"""Random command sequences against a plain reference model of the lifecycle.

The model restates the rules independently (states, edges, authority, rounds, reports,
children, receipts) and predicts each verdict; kernel and model must agree on every
accepted/rejected verdict and every reason code.
"""

from __future__ import annotations

import itertools
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from taskkernel.kernel.model.principal import Principal
from taskkernel.kernel.store.db import Database
from tests.kernel_harness import ADMIN, DEV, PM, Harness

PRINCIPALS = {"ADMIN": ADMIN, "PM": PM, "DEV": DEV}
EDGES = {"claim": ({"inbox"}, "active"), "submit": ({"active"}, "review"), "approve": ({"review"}, "done"),
         "reject": ({"review"}, "active"), "reopen": ({"done"}, "active"), "archive": ({"done"}, "archive"),
         "force_archive": ({"inbox", "active", "review"}, "archive")}
AUTHORITY = {"claim": "driver", "submit": "driver", "submit_report": "driver", "approve": "done",
             "reject": "done", "reopen": "done", "archive": "done", "force_archive": "done", "amend": "done"}
WORKER_MAY = {"claim", "submit", "submit_report", "create_task"}
NEEDS_REASON = {"reject", "archive", "force_archive"}


@dataclass
class ModelTask:
    sender: str
    recipient: str
    parent: str | None
    thread: str
    state: str = "inbox"
    revision: int = 1
    round: int = 0
    done_rounds: set[int] = field(default_factory=set)


class KernelMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self._tmp = tempfile.TemporaryDirectory()
        self.h = Harness(Database(f"sqlite:///{Path(self._tmp.name) / 'k.db'}", durability="process"))
        self.tasks: dict[str, ModelTask] = {}
        # receipts are scoped to the principal: (who, key) -> the command first submitted under it
        self.receipts: dict[tuple[str, str], tuple[Any, dict[str, Any], str]] = {}
        self.keys = itertools.count()

    def teardown(self) -> None:
        self.h.db.dispose()
        self._tmp.cleanup()

    @initialize()
    def first_task(self) -> None:
        self._create("ADMIN", "PM", None)

    def _create(self, sender: str, recipient: str, parent: str | None) -> None:
        payload = {"sender": sender, "recipient": recipient, "subject": "s"}
        if parent:
            payload["parent"] = parent
        r = self.h.kernel.submit({"type": "create_task", "idempotency_key": f"c{next(self.keys)}",
                                  "payload": payload}, PRINCIPALS[sender])
        assert r.status == "accepted", r
        thread = self.tasks[parent].thread if parent else r.task_id
        self.tasks[r.task_id] = ModelTask(sender, recipient, parent, thread)

    @precondition(lambda self: len(self.tasks) < 6)
    @rule(data=st.data())
    def create_child(self, data: st.DataObject) -> None:
        parents = [t for t, m in self.tasks.items() if m.recipient == "PM" and m.state != "archive"]
        if parents:
            self._create("PM", "DEV", data.draw(st.sampled_from(parents)))

    @rule(data=st.data(),
          kind=st.sampled_from(["claim", "submit", "approve", "reject", "reopen", "archive", "force_archive",
                                "submit_report", "amend"]),
          who=st.sampled_from(list(PRINCIPALS)),
          rev_off=st.sampled_from([0, 0, 0, -1, 1]), round_off=st.sampled_from([0, 0, 0, -1]),
          with_reason=st.booleans(), report_status=st.sampled_from(["done", "done", "blocked"]),
          reuse_key=st.sampled_from([None, None, None, "same", "other"]))
    def command(self, data: st.DataObject, kind: str, who: str, rev_off: int, round_off: int, with_reason: bool,
                report_status: str, reuse_key: str | None) -> None:
        task_id = data.draw(st.sampled_from(sorted(self.tasks)))
        m = self.tasks[task_id]
        payload: dict[str, Any] = {}
        if kind in NEEDS_REASON and with_reason:
            payload["reason"] = "because"
        if kind == "submit_report":
            payload = {"status": report_status}
        if kind == "amend":
            payload = {"subject": "changed"}
        command = {"type": kind, "task_id": task_id, "thread_key": m.thread, "expected_revision":
                   max(0, m.revision + rev_off), "round": max(0, m.round + round_off), "payload": payload}
        semantic = (kind, task_id, who, tuple(sorted(payload.items())))
        key = f"k{next(self.keys)}"
        if reuse_key and self.receipts:
            old = data.draw(st.sampled_from(sorted(self.receipts)))
            old_semantic, old_command, old_who = self.receipts[old]
            key = old[1]
            if reuse_key == "same":
                command, semantic, who = dict(old_command), old_semantic, old_who
                kind, m = command["type"], self.tasks[command["task_id"]]
        command["idempotency_key"] = key
        expected = self._predict(key, semantic, kind, who, command, m)
        result = self.h.kernel.submit(command, PRINCIPALS[who])
        assert (result.status, result.reason) == expected, (command, who, result)
        if result.status == "accepted":
            self.receipts[(who, key)] = (semantic, command, who)
            self._apply(kind, m, command)

    def _predict(self, key: str, semantic: Any, kind: str, who: str, command: dict[str, Any],
                 m: ModelTask) -> tuple[str, str | None]:
        if kind in NEEDS_REASON and "reason" not in command["payload"]:
            return "rejected", "invalid_command"
        if (who, key) in self.receipts:  # another principal's use of the same key is a new command
            return ("replayed", None) if self.receipts[(who, key)][0] == semantic else ("rejected",
                                                                                        "idempotency_conflict")
        if m.state == "archive":
            return "rejected", "task_terminal"
        if command["expected_revision"] != m.revision:
            return "rejected", "stale_task_revision"
        if command["round"] != m.round:
            return "rejected", "stale_round"
        if who == "DEV" and kind not in WORKER_MAY:
            return "rejected", "role_not_authorized"
        holder = m.recipient if AUTHORITY[kind] == "driver" else ("ADMIN" if m.sender == "ADMIN" else m.sender)
        if who != "ADMIN" and who != holder and not (kind == "amend" and who == m.sender):
            return "rejected", "role_not_authorized"
        if kind in EDGES:
            if m.state not in EDGES[kind][0]:
                return "rejected", "illegal_transition"
        elif m.state not in ({"active", "review"} if kind == "submit_report" else {"inbox", "active", "review",
                                                                                    "done"}):
            return "rejected", "illegal_transition"
        if kind == "submit" and m.round not in m.done_rounds:
            return "rejected", "report_required"
        if kind == "archive" and any(c.parent == command["task_id"] and c.state in ("inbox", "active", "review")
                                     for c in self.tasks.values()):
            return "rejected", "child_tasks_open"
        return "accepted", None

    def _apply(self, kind: str, m: ModelTask, command: dict[str, Any]) -> None:
        m.revision += 1
        if kind in EDGES:
            m.state = EDGES[kind][1]
        if kind in ("claim", "reject", "reopen"):
            m.round += 1
        if kind == "submit_report" and command["payload"]["status"] == "done":
            m.done_rounds.add(m.round)

    @invariant()
    def projection_matches_model(self) -> None:
        for task_id, m in self.tasks.items():
            doc = self.h.kernel.task(task_id)
            assert (doc["state"], doc["revision"], doc["round"]) == (m.state, m.revision, m.round)


KernelMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=30, deadline=None,
                                           suppress_health_check=[HealthCheck.too_slow])
TestKernelAgainstModel = KernelMachine.TestCase


def test_model_principals_are_distinct() -> None:
    assert len({p.id for p in PRINCIPALS.values()}) == 3 and isinstance(ADMIN, Principal)
