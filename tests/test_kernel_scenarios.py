"""The 31 command/role scenarios of codeflowmu-kernel.md §7, adapted to this kernel (one test each).

Every rejection also asserts the zero-side-effect rule: no event, no receipt, no outbox effect.
"""

from __future__ import annotations

import pytest

from taskkernel.kernel.commands import TaskCommandKernel
from taskkernel.kernel.credentials import issue_token, resolve_principal, revoke_token
from taskkernel.kernel.model.principal import Principal
from taskkernel.kernel.store.db import Database
from taskkernel.kernel.verify import verify
from tests.kernel_harness import ADMIN, DEV, OPS, PM, QA, Harness


@pytest.fixture
def h(any_db: Database) -> Harness:
    return Harness(any_db)


def assert_no_effect(h: Harness, before_events: int, before_receipts: int) -> None:
    assert h.event_count() == before_events
    assert h.receipt_count() == before_receipts
    h.effect_calls.clear()
    h.run_effects()
    assert h.effect_calls == []


def snapshot(h: Harness) -> tuple[int, int]:
    h.run_effects()
    return h.event_count(), h.receipt_count()


# --- identity, revision and round ------------------------------------------------------------
def test_01_stale_revision_rejected_with_zero_effects(h: Harness) -> None:
    tid = h.create().task_id
    h.cmd("claim", tid, PM)
    h.report(tid, PM)
    ev, rc = snapshot(h)
    r = h.cmd("submit", tid, PM, expected_revision=2)
    assert (r.status, r.reason) == ("rejected", "stale_task_revision")
    assert (r.revision, r.round) == (3, 1)  # tells the caller where the task really is
    assert_no_effect(h, ev, rc)
    assert h.kernel.task(tid)["state"] == "active"


def test_02_old_round_command_cannot_change_task(h: Harness) -> None:
    tid = h.create().task_id
    h.drive_to(tid, "review")
    assert h.cmd("reject", tid, ADMIN, payload={"reason": "redo"}).round == 2
    ev, rc = snapshot(h)
    r = h.cmd("submit_report", tid, PM, round=1, payload={"status": "done"})
    assert r.reason == "stale_round"
    assert_no_effect(h, ev, rc)


def test_03_root_mismatch_is_identity_mismatch(h: Harness) -> None:
    a = h.create().task_id
    b = h.create().task_id
    ev, rc = snapshot(h)
    r = h.cmd("claim", a, PM, root=b)
    assert r.reason == "task_identity_mismatch"
    assert_no_effect(h, ev, rc)


def test_04_thread_key_lineage_suffix_is_canonicalised(h: Harness) -> None:
    r = h.kernel.submit(
        {"type": "create_task", "idempotency_key": "t4", "thread_key": "grid#TASK-20260601-002",
         "payload": {"sender": "ADMIN", "recipient": "PM", "subject": "grid"}}, ADMIN)
    tid = r.task_id
    assert h.kernel.task(tid)["thread_key"] == "grid"
    assert h.cmd("claim", tid, PM, thread_key="grid#TASK-20260601-002").status == "accepted"
    assert h.report(tid, PM, thread_key="grid").status == "accepted"
    assert h.cmd("submit", tid, PM, thread_key="other").reason == "thread_mismatch"


def test_04b_an_omitted_thread_key_is_the_tasks_own_and_a_supplied_one_is_still_checked(h: Harness) -> None:
    tid = h.create().task_id
    omitted = {"type": "claim", "task_id": tid, "expected_revision": 1, "round": 0, "idempotency_key": "no-thread"}
    r = h.kernel.submit(omitted, PM)
    assert (r.status, r.revision, r.round) == ("accepted", 2, 1), r
    assert h.kernel.submit(omitted, PM).status == "replayed"  # the same command, retried
    wrong = h.cmd("submit_report", tid, PM, thread_key="elsewhere", payload={"status": "done", "body": "e"})
    assert wrong.reason == "thread_mismatch"
    for kind in ("approve", "reject"):  # the refusal is the kernel's reason, never pydantic's wording on a field
        r = h.kernel.submit({"type": kind, "task_id": tid, "expected_revision": 2, "round": 1,
                             "idempotency_key": f"{kind}-no-thread", "payload": {"reason": "x"} if kind == "reject"
                             else {}}, ADMIN)
        assert r.reason not in ("invalid_command", None) and "thread_key" not in r.message, r


def test_05_unknown_task_is_not_found_and_writes_no_receipt(h: Harness) -> None:
    ev, rc = snapshot(h)
    r = h.cmd("claim", "TASK-20990101-001", PM, thread_key="x", expected_revision=1, round=0)
    assert r.reason == "task_not_found"
    assert_no_effect(h, ev, rc)


def test_06_credential_scoped_to_one_task_cannot_touch_another(h: Harness) -> None:
    a = h.create().task_id
    b = h.create().task_id
    scoped = Principal("PM", "runner", task_id=a, round=0)
    ev, rc = snapshot(h)
    r = h.cmd("claim", b, scoped)
    assert r.reason == "role_not_authorized" and a in r.message
    assert_no_effect(h, ev, rc)
    assert h.cmd("claim", a, scoped).status == "accepted"


def test_07_unverified_or_impersonating_caller_is_actor_unverified(h: Harness) -> None:
    tid = h.create().task_id
    token = issue_token(h.db, "PM", "pm-1")
    assert resolve_principal(h.db, token) == Principal("PM", "pm-1")
    revoke_token(h.db, token)
    ev, rc = snapshot(h)
    assert h.cmd("claim", tid, resolve_principal(h.db, token)).reason == "actor_unverified"
    assert h.cmd("claim", tid, DEV, payload={"actor": "PM"}).reason == "actor_unverified"
    assert h.create(sender=DEV, recipient="PM", key="spoof", done_authority="ADMIN").reason is None  # own role
    ev, rc = snapshot(h)
    r = h.kernel.submit({"type": "create_task", "idempotency_key": "spoof2",
                         "payload": {"sender": "ADMIN", "recipient": "DEV", "subject": "x"}}, DEV)
    assert r.reason == "actor_unverified"
    assert_no_effect(h, ev, rc)


def test_08_archived_task_is_terminal_for_every_command(h: Harness) -> None:
    tid = h.create().task_id
    h.drive_to(tid, "archive")
    ev, rc = snapshot(h)
    for kind, payload in [("claim", {}), ("reopen", {}), ("amend", {"subject": "new"}),
                          ("force_archive", {"reason": "x"})]:
        assert h.cmd(kind, tid, ADMIN, payload=payload).reason == "task_terminal"
    assert h.create(parent=tid).reason == "task_terminal"
    assert_no_effect(h, ev, rc)


# --- idempotency receipts --------------------------------------------------------------------
def test_09_replay_returns_first_result_without_running_again(h: Harness) -> None:
    tid = h.create().task_id
    first = h.cmd("claim", tid, PM, key="claim-1")
    h.run_effects()
    calls = len(h.effect_calls)
    ev, rc = snapshot(h)
    again = h.kernel.submit({"type": "claim", "task_id": tid, "thread_key": tid, "expected_revision": 1,
                             "round": 0, "idempotency_key": "claim-1"}, PM)
    assert again.status == "replayed"
    assert (again.task_id, again.revision, again.round) == (first.task_id, first.revision, first.round)
    assert_no_effect(h, ev, rc)
    assert len(h.effect_calls) == 0 and calls == 2


def test_10_same_key_different_content_conflicts(h: Harness) -> None:
    h.create(key="same", subject="one")
    ev, rc = snapshot(h)
    assert h.create(key="same", subject="two").reason == "idempotency_conflict"
    assert_no_effect(h, ev, rc)


def test_11_same_key_for_another_command_type_conflicts(h: Harness) -> None:
    tid = h.create().task_id
    h.cmd("claim", tid, PM, key="shared")
    h.report(tid, PM)
    ev, rc = snapshot(h)
    assert h.cmd("submit", tid, PM, key="shared").reason == "idempotency_conflict"
    assert_no_effect(h, ev, rc)


def test_12_digest_ignores_expected_revision_round_and_transport(h: Harness) -> None:
    tid = h.create().task_id
    h.cmd("claim", tid, PM, key="c")
    r = h.cmd("claim", tid, PM, key="c", expected_revision=7, round=3, transport={"via": "mcp"})
    assert r.status == "replayed" and r.revision == 2


def test_13_receipts_survive_a_restart(any_url: str) -> None:
    h1 = Harness(Database(any_url))
    tid = h1.create(key="boot").task_id
    h1.db.dispose()
    h2 = Harness(Database(any_url))
    r = h2.create(key="boot")
    assert r.status == "replayed" and r.task_id == tid
    assert h2.event_count() == 1
    h2.db.dispose()


def test_14_concurrent_distinct_decisions_exactly_one_commits(h: Harness) -> None:
    from concurrent.futures import ThreadPoolExecutor

    tid = h.create().task_id
    h.drive_to(tid, "review")
    doc = h.kernel.task(tid)
    cmds = [{"type": kind, "task_id": tid, "thread_key": tid, "expected_revision": doc["revision"], "round": 1,
             "idempotency_key": f"decide-{i}", "payload": payload}
            for i, (kind, payload) in enumerate([("approve", {}), ("reject", {"reason": "no"})] * 4)]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda c: h.kernel.submit(c, ADMIN), cmds))
    assert sum(r.status == "accepted" for r in results) == 1
    assert {r.reason for r in results if r.status == "rejected"} == {"stale_task_revision"}


def test_15_decision_after_another_decision_on_same_revision_is_stale(h: Harness) -> None:
    tid = h.create().task_id
    h.drive_to(tid, "review")
    rev = h.kernel.task(tid)["revision"]
    assert h.cmd("approve", tid, ADMIN, expected_revision=rev).status == "accepted"
    r = h.cmd("reject", tid, ADMIN, expected_revision=rev, payload={"reason": "late"})
    assert r.reason == "stale_task_revision"
    assert h.kernel.task(tid)["state"] == "done"


def test_16_offer_again_with_same_key_effects_run_once(h: Harness) -> None:
    tid = h.create().task_id
    h.run_effects()
    h.effect_calls.clear()
    for _ in range(3):
        h.cmd("claim", tid, PM, key="dispatch-1", expected_revision=1, round=0)
    h.run_effects()
    h.run_effects()
    assert [p["event_type"] for _, p in h.effect_calls] == ["task_claimed"]


def test_17_second_claimer_loses_first_reclaims_idempotently(h: Harness) -> None:
    tid = h.create(recipient="DEV", driver="DEV").task_id
    assert h.cmd("claim", tid, DEV, key="a-claim").status == "accepted"
    assert h.cmd("claim", tid, QA, expected_revision=1, round=0).reason == "stale_task_revision"
    assert h.cmd("claim", tid, QA).reason == "role_not_authorized"
    assert h.cmd("claim", tid, DEV).reason == "illegal_transition"
    assert h.cmd("claim", tid, DEV, key="a-claim", expected_revision=1, round=0).status == "replayed"


# --- role and scope authorization ------------------------------------------------------------
def test_18_pm_cannot_approve_mainline_admin_can(h: Harness) -> None:
    tid = h.create().task_id
    h.drive_to(tid, "review")
    ev, rc = snapshot(h)
    assert h.cmd("approve", tid, PM).reason == "role_not_authorized"
    assert_no_effect(h, ev, rc)
    assert h.cmd("approve", tid, ADMIN).status == "accepted"


def test_19_delegated_done_authority_does_not_grant_archive(h: Harness) -> None:
    tid = h.create(done_authority="PM").task_id
    h.drive_to(tid, "done", reviewer=PM)
    assert h.cmd("archive", tid, PM, payload={"reason": "x"}).reason == "role_not_authorized"
    assert h.cmd("archive", tid, ADMIN, payload={"reason": "x"}).status == "accepted"


def test_20_branch_authority_is_the_leader_not_the_worker(h: Harness) -> None:
    root = h.create().task_id
    h.cmd("claim", root, PM)
    child = h.create(sender=PM, recipient="OPS", parent=root).task_id
    h.drive_to(child, "review", driver=OPS, reviewer=PM)
    assert h.cmd("approve", child, OPS).reason == "role_not_authorized"
    assert h.cmd("approve", child, PM).status == "accepted"
    assert h.cmd("archive", child, OPS, payload={"reason": "x"}).reason == "role_not_authorized"
    assert h.cmd("archive", child, PM, payload={"reason": "x"}).status == "accepted"


def test_21_legacy_event_without_authority_gets_route_defaults(h: Harness) -> None:
    """A v1 task_created (before authority fields) is upcast on read: main line -> ADMIN, branch -> sender."""
    from taskkernel.kernel.canonical import canonical_json
    from taskkernel.kernel.projections import rebuild_tasks
    from taskkernel.kernel.store.events import chain_hash

    data = {"task_id": "TASK-20200101-001", "thread_key": "legacy", "parent": None, "root": "TASK-20200101-001",
            "sender": "PM", "recipient": "DEV", "subject": "old", "body": "", "priority": "P2", "references": []}
    with h.db.write() as uow:
        text, meta, at = canonical_json(data), canonical_json({}), "2020-01-01T00:00:00.000000Z"
        uow.sql("INSERT INTO events VALUES (1, 'task:TASK-20200101-001', 1, 'task_created', 1, ?, ?, ?, ?)",
                (text, meta, at, chain_hash("0" * 64, 1, "task:TASK-20200101-001", 1, "task_created", 1, text,
                                            meta, at)))
    with h.db.read() as conn:
        docs, _ = rebuild_tasks(h.kernel.store, conn)
    doc = docs["TASK-20200101-001"]
    assert doc["authority"] == {"driver": "DEV", "done_authority": "PM", "archive_authority": "PM"}
    assert doc["risk_level"] == "low"
    assert verify(h.db, h.kernel.store, repair=True).repaired == 1
    assert h.cmd("claim", "TASK-20200101-001", DEV).status == "accepted"


def test_22_only_the_driver_submits(h: Harness) -> None:
    tid = h.create(recipient="PM").task_id
    h.cmd("claim", tid, PM)
    h.report(tid, PM)
    assert h.cmd("submit", tid, DEV).reason == "role_not_authorized"
    assert h.cmd("submit", tid, PM).status == "accepted"


def test_23_command_outside_the_role_capabilities_is_denied(h: Harness) -> None:
    # a new task judged by a role that may not approve is refused at the door, even ADMIN's
    refused = h.create(recipient="DEV", done_authority="DEV")
    assert refused.reason == "role_not_authorized" and "done_authority DEV may not approve" in refused.message
    assert refused.message.endswith("name a done_authority that may: ADMIN or PM"), refused.message
    tid = "TASK-20260101-002"  # imported history is taken as it was, and judged when it is acted on
    assert h.kernel.submit({"type": "adopt_task", "task_id": tid, "idempotency_key": "a23", "payload": {
        "sender": "ADMIN", "recipient": "DEV", "subject": "old", "done_authority": "DEV", "state": "review",
        "round": 1, "source": f"_lifecycle/review/{tid}-ADMIN-to-DEV.md"}}, ADMIN).status == "accepted"
    # explicit authority names DEV, but a worker role module may not approve at all
    r = h.cmd("approve", tid, DEV)
    assert r.reason == "role_not_authorized" and "may not issue approve" in r.message


def test_24_unknown_role_gets_least_privilege(h: Harness) -> None:
    stranger = Principal("AUDITOR", "x")
    assert h.kernel.submit({"type": "create_task", "idempotency_key": "u1", "payload": {
        "sender": "AUDITOR", "recipient": "PM", "subject": "hi"}}, stranger).reason == "role_not_authorized"
    refused = h.create(recipient="AUDITOR")  # a new task is only for a role of the team: nothing would run it
    assert refused.reason == "unknown_role" and "AUDITOR is not a role of the team" in refused.message
    tid = "TASK-20260101-001"  # history names whom it names: an imported task for AUDITOR is kept as it was
    assert h.kernel.submit({"type": "adopt_task", "task_id": tid, "idempotency_key": "a1", "payload": {
        "sender": "ADMIN", "recipient": "AUDITOR", "subject": "old", "state": "inbox", "round": 0,
        "source": f"_lifecycle/inbox/{tid}-ADMIN-to-AUDITOR.md"}}, ADMIN).status == "accepted"
    assert h.cmd("claim", tid, stranger).status == "accepted"  # it may drive what is addressed to it


def test_25_worker_may_address_only_the_leader(h: Harness) -> None:
    assert h.create(sender=QA, recipient="DEV").reason == "role_not_authorized"
    assert h.create(sender=QA, recipient="PM", done_authority="ADMIN").status == "accepted"
    # its default done authority is itself, and a worker may not approve: nobody could decide the task
    undecided = h.create(sender=QA, recipient="PM")
    assert undecided.reason == "role_not_authorized" and undecided.message.endswith(
        "done_authority QA (by default, the sender) may not approve (its role module does not issue approve): "
        "nobody could decide the task; name a done_authority that may: ADMIN"), undecided.message


def test_26_direct_writes_that_bypass_the_kernel_are_detected(h: Harness) -> None:
    tid = h.create().task_id
    with h.db.write() as uow:
        uow.conn.exec_driver_sql(f"UPDATE tasks SET state = 'done' WHERE task_id = '{tid}'")
    report = verify(h.db, h.kernel.store)
    assert not report.ok and report.first_broken_position == 1
    assert verify(h.db, h.kernel.store, repair=True).repaired == 1
    assert verify(h.db, h.kernel.store).ok


# --- lifecycle and preconditions -------------------------------------------------------------
@pytest.mark.parametrize("state,kind", [("active", "approve"), ("review", "archive"), ("inbox", "submit"),
                                        ("done", "submit"), ("active", "archive"), ("inbox", "reject")])
def test_27_illegal_edges_are_rejected(h: Harness, state: str, kind: str) -> None:
    tid = h.create().task_id
    if state != "inbox":
        h.drive_to(tid, state)
    ev, rc = snapshot(h)
    r = h.cmd(kind, tid, ADMIN, payload={"reason": "x"} if kind in ("archive", "reject") else {})
    assert r.reason in ("illegal_transition", "report_required")
    assert r.reason == "illegal_transition" or kind == "submit"
    assert_no_effect(h, ev, rc)


@pytest.mark.parametrize("state", ["inbox", "active", "review"])
def test_27b_force_archive_only_from_open_states(h: Harness, state: str) -> None:
    tid = h.create().task_id
    if state != "inbox":
        h.drive_to(tid, state)
    assert h.cmd("force_archive", tid, PM, payload={"reason": "x"}).reason == "role_not_authorized"
    assert h.cmd("force_archive", tid, ADMIN, payload={}).reason == "invalid_command"
    assert h.cmd("force_archive", tid, ADMIN, payload={"reason": "cancelled"}).status == "accepted"
    assert h.kernel.task(tid)["state"] == "archive"


def test_27c_force_archive_from_done_is_illegal(h: Harness) -> None:
    tid = h.create().task_id
    h.drive_to(tid, "done")
    assert h.cmd("force_archive", tid, ADMIN, payload={"reason": "x"}).reason == "illegal_transition"


def test_28_open_child_blocks_archive_references_do_not(h: Harness) -> None:
    root = h.create().task_id
    h.cmd("claim", root, PM)
    child = h.create(sender=PM, recipient="DEV", parent=root).task_id
    grandchild_parent = h.create(sender=PM, recipient="QA", parent=root).task_id
    h.create(references=[root], subject="only a reference")
    for t, who in ((root, PM),):
        h.report(t, who)
        h.cmd("submit", t, who)
        h.cmd("approve", t, ADMIN)
    ev, rc = snapshot(h)
    r = h.cmd("archive", root, ADMIN, payload={"reason": "x"})
    assert r.reason == "child_tasks_open" and child in r.message
    assert_no_effect(h, ev, rc)
    h.drive_to(child, "done", driver=DEV, reviewer=PM)
    assert h.cmd("archive", root, ADMIN, payload={"reason": "x"}).reason == "child_tasks_open"
    h.cmd("force_archive", grandchild_parent, PM, payload={"reason": "dropped"})
    assert h.cmd("archive", root, ADMIN, payload={"reason": "x"}).status == "accepted"


def test_29_submit_needs_a_done_report_blocked_is_not_enough(h: Harness) -> None:
    tid = h.create().task_id
    h.cmd("claim", tid, PM)
    h.report(tid, PM, status="blocked")
    h.report(tid, PM, status="in_progress")
    ev, rc = snapshot(h)
    assert h.cmd("submit", tid, PM).reason == "report_required"
    assert_no_effect(h, ev, rc)


def test_30_older_round_report_does_not_satisfy_submit(h: Harness) -> None:
    tid = h.create().task_id
    h.drive_to(tid, "review")
    h.cmd("reject", tid, ADMIN, payload={"reason": "again"})
    assert h.kernel.task(tid)["round"] == 2
    assert h.cmd("submit", tid, PM).reason == "report_required"
    h.report(tid, PM)
    assert h.cmd("submit", tid, PM).status == "accepted"
    show = h.kernel.task(tid)
    assert [(r["round"], r["status"]) for r in show["reports"]] == [(1, "done"), (2, "done")]


def test_31_the_same_transition_twice_is_applied_once(h: Harness) -> None:
    tid = h.create().task_id
    assert h.cmd("claim", tid, PM, expected_revision=1, round=0).status == "accepted"
    ev, rc = snapshot(h)
    assert h.cmd("claim", tid, PM, expected_revision=1, round=0).reason == "stale_task_revision"
    assert h.cmd("claim", tid, PM).reason == "illegal_transition"
    assert_no_effect(h, ev, rc)
    assert [e.type for e in h.kernel.history(tid)] == ["task_created", "task_claimed"]


def test_kernel_revision_and_round_counting(h: Harness) -> None:
    """revision = stream version (every accepted event); round = times the task entered active."""
    tid = h.create().task_id
    assert (h.kernel.task(tid)["revision"], h.kernel.task(tid)["round"]) == (1, 0)
    h.drive_to(tid, "done")
    h.cmd("reopen", tid, ADMIN)
    h.cmd("amend", tid, ADMIN, payload={"subject": "renamed", "priority": "P0"})
    doc = h.kernel.task(tid)
    assert (doc["revision"], doc["round"], doc["subject"], doc["priority"]) == (7, 2, "renamed", "P0")
    assert [e.stream_version for e in h.kernel.history(tid)] == list(range(1, 8))


def test_kernel_needs_its_dependencies_injected(any_db: Database) -> None:
    with pytest.raises(TypeError):
        TaskCommandKernel(any_db)  # type: ignore[call-arg]
