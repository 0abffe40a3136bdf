"""Random interleavings of fcop-mcp 4.0.5 calls (an agent's T1–T3) and kernel commands (any step, T4–T7
included) on one G4 workspace, with coordinator passes in between: never two tasks for one id, never a
transition fcop's Core rejects, and in the end the kernel and fcop agree on every task."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from taskkernel.coordinator.workspace import Workspace, init_workspace
from taskkernel.kernel.model.principal import LOCAL_OWNER
from taskkernel.kernel.store.schema import outbox
from tests.coord_support import coordinator
from tests.fcop_mcp import FcopMcp, ToolError

KERNEL_STEPS = ("claim", "submit", "approve", "reject", "reopen", "archive")
ACTIONS = st.lists(st.one_of(
    st.tuples(st.just("fcop_create"), st.just(0)),
    st.tuples(st.sampled_from(["fcop_claim", "fcop_submit"]), st.integers(0, 3)),
    st.tuples(st.just("kernel_create"), st.just(0)),
    st.tuples(st.sampled_from(KERNEL_STEPS), st.integers(0, 3)),
    st.tuples(st.just("pass"), st.just(0))), min_size=1, max_size=14)


def kernel_step(c: Any, task_id: str, step: str, n: int) -> None:
    """One kernel command as the owner (refusals are the kernel's business: it may refuse)."""
    doc = c.kernel.task(task_id)
    on = {"task_id": task_id, "thread_key": doc["thread_key"], "expected_revision": doc["revision"],
          "round": doc["round"], "idempotency_key": f"{step}-{n}"}
    if step == "submit":
        c.kernel.submit({**on, "type": "submit_report", "payload": {"status": "done", "body": f"done {n}"}},
                        LOCAL_OWNER)
        doc = c.kernel.task(task_id)
        on.update(expected_revision=doc["revision"], idempotency_key=f"submit-{n}-s")
    payload = {"reason": f"because {n}"} if step in ("reject", "archive", "reopen") else {}
    c.kernel.submit({**on, "type": step, "payload": payload}, LOCAL_OWNER)


def fcop_step(fcop: FcopMcp, ws_id: str, task_id: str, step: str, n: int) -> None:
    """What an fcop agent does with its tools; fcop may refuse it (the agent erred), which proves nothing."""
    try:
        if step == "fcop_claim":
            fcop.call("claim_task", task_id=task_id, actor="DEV")
            return
        state = fcop.call("inspect_task", task_id=task_id)
        if state["stage"] != "active":
            return
        report = fcop.call("write_report", workspace_id=ws_id, sender="DEV", recipient="ADMIN", subject_ref=task_id,
                           attempt_id=state["current_attempt_id"], body=f"agent {n}", result="done")
        fcop.call("submit_task", task_id=task_id, actor="DEV", report_ref=report["report_id"])
    except ToolError:
        pass


EXAMPLES = int(os.environ.get("TASKKERNEL_G4_EXAMPLES", "10"))  # `make soak` style runs: more


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=ACTIONS)
# an agent claims and submits between two passes: the kernel's claim finds the file already in review/
@example(actions=[("fcop_create", 0), ("pass", 0), ("fcop_claim", 0), ("fcop_submit", 0)])
def test_fcop_agents_and_the_kernel_interleaved_never_split_a_task_nor_break_the_core(
        tmp_path_factory: Any, actions: list[tuple[str, int]]) -> None:
    project = tmp_path_factory.mktemp("g4")
    init_workspace(project, "dev-team", fcop_generation="g4")
    c = coordinator(Workspace.load(project))
    ws_id = json.loads((project / "fcop" / "fcop.json").read_bytes())["workspace_id"]
    tasks: list[str] = []
    with FcopMcp(project) as fcop:
        for n, (action, i) in enumerate(actions):
            if action == "fcop_create":
                tasks.append(fcop.call("create_task", workspace_id=ws_id, operation_id=f"op-{n}", sender="ADMIN",
                                       recipient="DEV", subject=f"agent task {n}", body="Do it.")["task_id"])
            elif action == "kernel_create":
                r = c.kernel.submit({"type": "create_task", "idempotency_key": f"k-{n}", "payload": {
                    "sender": "ADMIN", "recipient": "DEV", "subject": f"kernel task {n}"}}, LOCAL_OWNER)
                tasks.append(str(r.task_id))
            elif action == "pass":
                c.run_once()
            elif tasks and c.kernel.task(tasks[i % len(tasks)]) is not None:
                task_id = tasks[i % len(tasks)]
                if action.startswith("fcop_"):
                    fcop_step(fcop, ws_id, task_id, action, n)
                else:
                    kernel_step(c, task_id, action, n)
        c.run_once()
        c.run_once()
        files = {p.stem: p.parent.name for p in (project / "fcop" / "_lifecycle").glob("*/TASK-*.md")}
        assert sorted(files) == sorted(set(tasks)) and len(tasks) == len(set(tasks)), "one id, one task, one file"
        for task_id in tasks:
            doc = c.kernel.task(task_id)
            assert doc is not None, task_id
            assert files[task_id] == doc["state"], (task_id, files[task_id], doc["state"], actions)
            assert fcop.call("inspect_task", task_id=task_id)["stage"] == doc["state"]
        with c.kernel.db.read() as conn:
            failed = conn.execute(sa.select(outbox.c.effect_key, outbox.c.last_error).where(
                outbox.c.last_error.is_not(None))).all()
        assert failed == [], f"a transition fcop's Core rejected: {failed} after {actions}"
        assert fcop.call("validate_workspace")["valid"]


def test_the_property_test_sees_a_refused_agent_move_as_a_difference(tmp_path: Path) -> None:
    """The agreement check above is not vacuous: an fcop agent claiming a task of a role the kernel does not let it
    act for leaves the file in active/ while the kernel says inbox, and the refusal is answered by an ISSUE."""
    init_workspace(tmp_path, "dev-team", fcop_generation="g4")
    c = coordinator(Workspace.load(tmp_path))
    r = c.kernel.submit({"type": "create_task", "idempotency_key": "k", "payload": {
        "sender": "ADMIN", "recipient": "QA", "subject": "QA's task"}}, LOCAL_OWNER)
    c.run_once()
    with FcopMcp(tmp_path) as fcop:
        fcop.call("claim_task", task_id=r.task_id, actor="DEV")  # fcop lets any actor claim
        c.run_once()
        doc = c.kernel.task(str(r.task_id))
        assert doc is not None and (doc["state"], doc["authority"]["driver"]) == ("inbox", "QA")
        issues = fcop.call("list_issues", subject_ref=r.task_id)["items"]
        assert len(issues) == 1 and issues[0]["sender"] == "SYSTEM"
