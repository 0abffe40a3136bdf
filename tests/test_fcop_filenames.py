"""The §3 filename grammar: the digest's examples, field-data oddities, and agreement with fcop's parser."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from taskkernel.coordinator.fcop import EnvelopeKind, normalize_reference, parse_filename
from taskkernel.coordinator.fcop.filenames import subject_short_for

fcop_filename = pytest.importorskip("fcop.core.filename")


@pytest.mark.parametrize(("name", "expected"), [
    ("TASK-20260429-003-PLANNER-to-CODER.md", ("PLANNER", "CODER", None, None)),
    ("TASK-20260101-001-LEAD-QA-to-AUTO-TESTER.md", ("LEAD-QA", "AUTO-TESTER", None, None)),
    ("TASK-20260101-002-PM-to-OPS-001-fix.md", ("PM", "OPS-001", None, "fix")),
    ("TASK-20260101-003-PM-to-DEV.BACKEND.md", ("PM", "DEV", "BACKEND", None)),
    ("TASK-20260101-004-PM-to-DEV.BACKEND-phase-a-fix.md", ("PM", "DEV", "BACKEND", "phase-a-fix")),
])
def test_task_names(name: str, expected: tuple[str | None, ...]) -> None:
    fn = parse_filename(name)
    assert fn is not None and fn.kind is EnvelopeKind.TASK
    assert (fn.sender, fn.recipient, fn.slot, fn.slug) == expected
    assert fn.render() == name and fn.id == name[:17]


def test_team_broadcast_and_other_kinds() -> None:
    fn = parse_filename("TASK-20260101-005-PM-to-TEAM.md")
    assert fn is not None and fn.is_broadcast
    report = parse_filename("REPORT-20260429-001-ME-to-ADMIN.md")
    assert report is not None and (report.kind, report.id) == (EnvelopeKind.REPORT, "REPORT-20260429-001")
    issue = parse_filename("ISSUE-20261130-001-QA.md")
    assert issue is not None and (issue.sender, issue.recipient) == ("QA", None)
    routed = parse_filename("ISSUE-20261130-002-QA-to-PM.md")  # the spec's form; fcop's regex rejects it
    assert routed is not None and (routed.sender, routed.recipient) == ("QA", "PM")
    summary = parse_filename("ISSUE-20261130-003-login-broken.md")
    assert summary is not None and (summary.sender, summary.slug) == (None, "login-broken")
    review = parse_filename("REVIEW-20261130-001-ADMIN-on-task-20261130-001-pm-to-dev.md")
    assert review is not None and review.id == "REVIEW-20261130-001-ADMIN-on-task-20261130-001-pm-to-dev"
    assert review.render() == "REVIEW-20261130-001-ADMIN-on-task-20261130-001-pm-to-dev.md"


@pytest.mark.parametrize("name", [
    "REPORT-20260509-Z01-ME-to-ADMIN.md",            # non-numeric sequence (field data)
    "TASK-20260418-143000-001-PM-to-DEV-PENDING.md",  # 0.x time + status suffix
    "TASK-20260101-001-PM-to-assignee.D1.md",         # lowercase slot: the regex rejects it
    "INSPECTION-20260101-001.md", "role-switch-20260429T033843Z.md", "README.md",
    "TASK-20260101-001-PM-to-DEV.txt", "TASK-2026011-001-PM-to-DEV.md", "TASK-20260101-001-pm-to-DEV.md",
    "TASK-20260101-001-PM-to-DEV-.md", "TASK-20260101-001-PM-to-DEV-1fix.md",
])
def test_non_conforming_names_are_not_envelopes(name: str) -> None:
    assert parse_filename(name) is None


def test_sequences_beyond_999_are_read_and_rendered() -> None:
    fn = parse_filename("TASK-20260101-1000-PM-to-DEV.md")
    assert fn is not None and fn.sequence == 1000 and fn.id == "TASK-20260101-1000"


@pytest.mark.parametrize(("raw", "norm"), [
    ("TASK-20260429-001", "TASK-20260429-001"),
    ("TASK-20260429-002-ADMIN-to-PLANNER.md", "TASK-20260429-002"),
    ("  TASK-20260429-003-PLANNER-to-CODER  ", "TASK-20260429-003"),
    ("docs/agents/tasks/TASK-20260429-006-PLANNER-to-CODER.md", "TASK-20260429-006"),
    ("TASK-20260429-006.md", "TASK-20260429-006"),
    ("REVIEW-20261130-001-ADMIN-on-x", "REVIEW-20261130-001-ADMIN-on-x"),
    ("https://example.com/spec", "spec"),
])
def test_reference_normalisation(raw: str, norm: str) -> None:
    assert normalize_reference(raw) == norm


def test_review_subject_short_matches_fcop() -> None:
    from fcop.compatibility.v3.project import _derive_review_subject_short

    for ref in ("TASK-20261130-001-PM-to-DEV", "fcop/tasks/TASK-20260601-001-PM-to-DEV.md", "commit:3c35e0e",
                "adr/ADR-0017-review-file-type-minimal.md"):
        assert subject_short_for(ref) == _derive_review_subject_short(ref)


_roles = st.from_regex(r"\A[A-Z][A-Z0-9_]{0,5}(-[A-Z0-9_]{1,4}){0,2}\Z")
_slugs = st.none() | st.from_regex(r"\A[a-z]([a-z0-9-]{0,6}[a-z0-9])?\Z")


@given(sender=_roles, recipient=_roles, slot=st.none() | _roles, slug=_slugs, seq=st.integers(1, 999))
def test_agrees_with_fcop_on_every_name_fcop_builds(sender: str, recipient: str, slot: str | None,
                                                     slug: str | None, seq: int) -> None:
    name = fcop_filename.build_task_filename(sender=sender, recipient=recipient, date="20260101", sequence=seq,
                                             slot=slot, slug=slug)
    theirs = fcop_filename.parse_task_filename(name)
    ours = parse_filename(name)
    assert theirs is not None and ours is not None
    assert (ours.sender, ours.recipient, ours.slot, ours.slug, ours.id) == (
        theirs.sender, theirs.recipient, theirs.slot, theirs.slug, theirs.task_id)
    assert ours.render() == name
