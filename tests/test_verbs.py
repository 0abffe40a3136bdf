"""Task verbs (kernel/verbs.py): one call per action, the task's revision and round read by the verb, default
idempotency keys that make a retry replay and a different action a new command (issue 12)."""

from __future__ import annotations

import pytest

from taskkernel.coordinator.compose import build_kernel
from taskkernel.kernel.store.db import Database
from taskkernel.kernel.verbs import KEY_VERSION, TaskVerbs, derive_key
from tests.kernel_harness import ADMIN, DEV, PM, Harness


@pytest.fixture
def h(sqlite_db: Database) -> Harness:
    return Harness(sqlite_db)


@pytest.fixture
def verbs(h: Harness) -> TaskVerbs:
    return TaskVerbs(h.kernel)


def new_task(verbs: TaskVerbs, **extra: object) -> str:
    made = verbs.create(ADMIN, {"recipient": "DEV", "subject": "build it", **extra})
    assert made.result.status == "accepted", made
    assert made.result.task_id is not None
    return made.result.task_id


def test_a_task_walks_its_whole_life_in_single_calls(h: Harness, verbs: TaskVerbs) -> None:
    tid = new_task(verbs)
    steps = [(DEV, "claim", {}), (DEV, "report", {"status": "done", "body": "built", "artifacts": ["dist/x.whl"]}),
             (DEV, "submit", {}), (ADMIN, "approve", {}), (ADMIN, "archive", {"reason": "shipped"})]
    for who, verb, payload in steps:
        outcome = verbs.act(who, verb, tid, payload)
        assert outcome.result.status == "accepted", (verb, outcome)
        assert outcome.key.startswith(f"{KEY_VERSION}:{verb}:{tid}:r")
    doc = h.kernel.task(tid)
    assert doc is not None and doc["state"] == "archive"
    assert doc["reports"][0]["artifacts"] == ["dist/x.whl"]


def test_a_retried_verb_replays_and_a_different_report_is_new(h: Harness, verbs: TaskVerbs) -> None:
    tid = new_task(verbs)
    assert verbs.act(DEV, "claim", tid).result.status == "accepted"
    again = verbs.act(DEV, "claim", tid)  # the task is one round on: the claim's own key is found again
    assert again.result.status == "replayed", again
    report = {"status": "in_progress", "body": "half way"}
    first = verbs.act(DEV, "report", tid, report)
    assert (first.result.status, verbs.act(DEV, "report", tid, report).result.status) == ("accepted", "replayed")
    other = verbs.act(DEV, "report", tid, {"status": "done", "body": "all of it"})
    assert other.result.status == "accepted" and other.key != first.key
    doc = h.kernel.task(tid)
    assert doc is not None and len(doc["reports"]) == 2 and doc["revision"] == 4  # created, claimed, 2 reports


def test_a_round_starting_verb_is_new_once_the_task_moved_on(h: Harness, verbs: TaskVerbs) -> None:
    tid = new_task(verbs)
    for who, verb, payload in [(DEV, "claim", {}), (DEV, "report", {"status": "done"}), (DEV, "submit", {}),
                               (ADMIN, "reject", {"reason": "tests missing"}), (DEV, "report", {"status": "done"}),
                               (DEV, "submit", {})]:
        assert verbs.act(who, verb, tid, payload).result.status == "accepted", verb
    second = verbs.act(ADMIN, "reject", tid, {"reason": "tests missing"})  # same words, a later round
    assert second.result.status == "accepted", second
    doc = h.kernel.task(tid)
    assert doc is not None and doc["round"] == 3


def test_retried_reject_and_reopen_replay_while_the_task_stays_where_they_left_it(h: Harness,
                                                                                  verbs: TaskVerbs) -> None:
    tid = new_task(verbs)
    for who, verb, payload in [(DEV, "claim", {}), (DEV, "report", {"status": "done"}), (DEV, "submit", {})]:
        assert verbs.act(who, verb, tid, payload).result.status == "accepted", verb
    assert verbs.act(ADMIN, "reject", tid, {"reason": "no"}).result.status == "accepted"
    assert verbs.act(ADMIN, "reject", tid, {"reason": "no"}).result.status == "replayed"
    for who, verb, payload in [(DEV, "report", {"status": "done"}), (DEV, "submit", {}), (ADMIN, "approve", {})]:
        assert verbs.act(who, verb, tid, payload).result.status == "accepted", verb
    assert verbs.act(ADMIN, "reopen", tid, {"reason": "regressed"}).result.status == "accepted"
    assert verbs.act(ADMIN, "reopen", tid, {"reason": "regressed"}).result.status == "replayed"
    doc = h.kernel.task(tid)
    assert doc is not None and (doc["round"], doc["state"]) == (3, "active")


def test_a_refusal_before_the_task_is_read_still_says_where_it_stands(verbs: TaskVerbs) -> None:
    tid = new_task(verbs)
    too_big = verbs.act(DEV, "reject", tid, {"reason": "x" * 100_000})
    assert too_big.result.reason == "payload_too_large"
    assert (too_big.result.task_id, too_big.result.revision, too_big.result.round) == (tid, 1, 0)


def test_expect_rev_turns_on_the_optimistic_check(verbs: TaskVerbs) -> None:
    tid = new_task(verbs)
    stale = verbs.act(DEV, "claim", tid, expect_rev=7)
    assert stale.result.reason == "stale_task_revision"
    assert verbs.act(DEV, "claim", tid, expect_rev=1).result.status == "accepted"


def test_an_identical_create_replays_and_an_explicit_key_makes_a_twin(verbs: TaskVerbs) -> None:
    first = verbs.create(ADMIN, {"recipient": "DEV", "subject": "same"})
    assert verbs.create(ADMIN, {"recipient": "DEV", "subject": "same"}).result.status == "replayed"
    twin = verbs.create(ADMIN, {"recipient": "DEV", "subject": "same"}, key="twin-1")
    assert twin.result.status == "accepted" and twin.result.task_id != first.result.task_id


def test_a_missing_task_and_a_wrong_role_are_refusals_with_their_codes(verbs: TaskVerbs) -> None:
    assert verbs.act(DEV, "claim", "TASK-20990101-001").result.reason == "task_not_found"
    tid = new_task(verbs)
    assert verbs.act(PM, "claim", tid).result.reason == "role_not_authorized"


def test_keys_differ_by_caller_verb_task_round_and_content() -> None:
    base = derive_key(DEV, "report", "TASK-20260101-001", 1, {"status": "done"})
    assert base == derive_key(DEV, "report", "TASK-20260101-001", 1, {"status": "done"})
    for other in (derive_key(PM, "report", "TASK-20260101-001", 1, {"status": "done"}),
                  derive_key(DEV, "claim", "TASK-20260101-001", 1, {"status": "done"}),
                  derive_key(DEV, "report", "TASK-20260101-002", 1, {"status": "done"}),
                  derive_key(DEV, "report", "TASK-20260101-001", 2, {"status": "done"}),
                  derive_key(DEV, "report", "TASK-20260101-001", 1, {"status": "blocked"})):
        assert other != base


def test_a_missing_grant_says_which_command_grants_it(sqlite_db: Database) -> None:
    kernel = build_kernel(sqlite_db, None)
    verbs = TaskVerbs(kernel)
    made = verbs.create(ADMIN, {"recipient": "DEV", "subject": "drop the table", "risk_level": "high"})
    tid = made.result.task_id
    assert tid is not None
    for who, verb, payload in [(DEV, "claim", {}), (DEV, "report", {"status": "done"}), (DEV, "submit", {})]:
        assert verbs.act(who, verb, tid, payload).result.status == "accepted", verb
    refused = verbs.act(ADMIN, "approve", tid)
    assert refused.result.reason == "permission_required"
    assert refused.hint == (f"taskkernel session accept admin --kind allow --input-id grant-approve-{tid} "
                            f"--payload '{{\"permission\": \"approve\", \"scope\": \"task:{tid}\"}}'")
    assert refused.wire()["hint"] == refused.hint
