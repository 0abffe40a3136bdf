"""Background jobs: single flight, debounce, and stale results discarded at commit."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from taskkernel.kernel.background import BackgroundJobs, BackgroundOutcome
from taskkernel.kernel.store.db import Database
from tests.kernel_harness import PM, Harness

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def setup(db: Database) -> tuple[Harness, BackgroundJobs, str]:
    h = Harness(db)
    tid = h.create().task_id
    return h, BackgroundJobs(db, debounce=2, max_wait=10), tid


def test_a_burst_of_requests_is_one_run_after_the_quiet_period(any_db: Database) -> None:
    _, bg, tid = setup(any_db)
    for s in range(5):
        bg.request(f"summary:{tid}", tid, now=T0 + timedelta(seconds=s))
    assert bg.claim_due(now=T0 + timedelta(seconds=5)) == []  # last request at +4, quiet until +6
    assert len(bg.claim_due(now=T0 + timedelta(seconds=6))) == 1


def test_debounce_never_starves_a_busy_subject(any_db: Database) -> None:
    _, bg, tid = setup(any_db)
    for s in range(0, 20):
        bg.request(f"summary:{tid}", tid, now=T0 + timedelta(seconds=s))
    assert len(bg.claim_due(now=T0 + timedelta(seconds=10))) == 1  # capped at first request + max_wait


def test_single_flight_per_subject(any_db: Database) -> None:
    _, bg, tid = setup(any_db)
    subject = f"summary:{tid}"
    bg.request(subject, tid, now=T0)
    [job] = bg.claim_due(now=T0 + timedelta(seconds=3))
    bg.request(subject, tid, now=T0 + timedelta(seconds=4))  # arrives while running
    assert bg.claim_due(now=T0 + timedelta(seconds=30)) == []
    assert bg.commit(job, {"summary": "v1"}) is BackgroundOutcome.STORED
    assert len(bg.claim_due(now=datetime.now(UTC) + timedelta(seconds=1))) == 1, "the queued request runs next"


def test_result_for_an_older_revision_is_discarded(any_db: Database) -> None:
    h, bg, tid = setup(any_db)
    subject = f"summary:{tid}"
    bg.request(subject, tid, now=T0)
    [job] = bg.claim_due(now=T0 + timedelta(seconds=3))
    assert job.based_on_revision == 1
    h.cmd("claim", tid, PM)  # the task moves on while the summary is computed
    assert bg.commit(job, {"summary": "stale"}) is BackgroundOutcome.STALE_RESULT
    assert bg.result(subject) == (None, None)
    [again] = bg.claim_due(now=datetime.now(UTC) + timedelta(seconds=1))
    assert again.based_on_revision == 2
    assert bg.commit(again, {"summary": "fresh"}) is BackgroundOutcome.STORED
    assert bg.result(subject) == ({"summary": "fresh"}, 2)


def test_a_holder_whose_lease_expired_cannot_commit(any_db: Database) -> None:
    _, bg, tid = setup(any_db)
    bg.request("s", tid, now=T0)
    [first] = bg.claim_due(now=T0 + timedelta(seconds=3))
    [second] = bg.claim_due(now=T0 + timedelta(hours=1))
    assert bg.commit(first, "old") is BackgroundOutcome.LEASE_LOST
    assert bg.commit(second, "new") is BackgroundOutcome.STORED
