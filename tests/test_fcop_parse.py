"""Lenient reading (aliases, CRLF, BOM, unknown keys) and a stable reason for every refusal."""

from __future__ import annotations

import pytest

from taskkernel.coordinator.fcop import (
    FcopError,
    FcopReason,
    FcopWarning,
    IssueEnvelope,
    ReportEnvelope,
    ReviewEnvelope,
    TaskEnvelope,
    parse_envelope,
)

TASK = "TASK-20260101-001-ADMIN-to-PM.md"
REPORT = "REPORT-20260101-001-PM-to-ADMIN.md"


def doc(front: str, body: str = "\nBody") -> bytes:
    return f"---\n{front}---\n{body}".encode()


BASE = "protocol: fcop\nversion: 1\nsender: ADMIN\nrecipient: PM\n"


def test_minimal_task_defaults() -> None:
    env = parse_envelope(TASK, doc(BASE))
    assert isinstance(env, TaskEnvelope)
    assert (env.priority.value, env.subject, env.references, env.transitions, env.body) == ("P2", None, (), (), "Body")
    assert env.id == "TASK-20260101-001" and env.warnings == ()


@pytest.mark.parametrize("alias", ["fcop", "FCoP", "agent_bridge", "agent-bridge", "file-coordination",
                                   "file_coordination"])
def test_protocol_aliases(alias: str) -> None:
    assert parse_envelope(TASK, doc(BASE.replace("fcop", alias))).protocol == "fcop"


@pytest.mark.parametrize(("alias", "canonical"), [("urgent", "P0"), ("critical", "P0"), ("high", "P1"),
                                                  ("normal", "P2"), ("medium", "P2"), ("low", "P3"), ("p1", "P1")])
def test_priority_aliases(alias: str, canonical: str) -> None:
    env = parse_envelope(TASK, doc(BASE + f"priority: {alias}\n"))
    assert isinstance(env, TaskEnvelope) and env.priority.value == canonical


def test_unknown_keys_are_kept_in_order_and_version_forms_accepted() -> None:
    fm = BASE.replace("version: 1", "version: '1.0'") + "zeta: 1\nbatch: b1\nkind: task\nsession_id: s\n"
    env = parse_envelope(TASK, doc(fm))
    assert env.extra == {"zeta": 1, "batch": "b1", "kind": "task", "session_id": "s"}
    assert list(env.front_matter) == ["protocol", "version", "sender", "recipient", "zeta", "batch", "kind",
                                      "session_id"]


def test_timestamps_stay_strings_and_scalars_coerce() -> None:
    env = parse_envelope(TASK, doc(BASE + "subject: 42\ncreated_at: 2026-01-01T10:00:00\n"))
    assert isinstance(env, TaskEnvelope) and env.subject == "42"
    assert env.extra["created_at"] == "2026-01-01T10:00:00"


def test_crlf_bom_and_no_trailing_newline() -> None:
    raw = b"\xef\xbb\xbf" + doc(BASE, "\nline1\nline2").replace(b"\n", b"\r\n")
    env = parse_envelope(TASK, raw)
    assert env.body == "line1\nline2" and FcopWarning.BOM_STRIPPED in env.warnings


def test_warnings_for_routing_type_and_authority_words() -> None:
    env = parse_envelope(TASK, doc("protocol: fcop\nversion: 1\nsender: BOSS\nrecipient: PM\ntype: REPORT\n"))
    assert set(env.warnings) == {FcopWarning.ROUTING_MISMATCH, FcopWarning.TYPE_MISMATCH, FcopWarning.AUTHORITY_WORD}
    slot = parse_envelope("TASK-20260101-001-ADMIN-to-PM.LEAD.md", doc(BASE.replace("PM", "PM.LEAD")))
    assert slot.warnings == ()


def test_report_issue_review() -> None:
    r = parse_envelope(REPORT, doc("protocol: fcop\nversion: 1\nsender: PM\nrecipient: ADMIN\n"
                                   "references: TASK-20260101-001-ADMIN-to-PM.md\nstatus: blocked\n"))
    assert isinstance(r, ReportEnvelope) and (r.task_id, r.status) == ("TASK-20260101-001", "blocked")
    i = parse_envelope("ISSUE-20260101-001-QA.md", doc("protocol: fcop\nversion: 1\nseverity: crit\n"
                                                       "summary: boom\nstatus: resolved\n"))
    assert isinstance(i, IssueEnvelope) and (i.reporter, i.severity, i.status) == ("QA", "critical", "resolved")
    v = parse_envelope("REVIEW-20260101-001-PM-on-task-20260101-001.md",
                       doc("protocol: fcop\nversion: 1\ntype: REVIEW\nsubject_ref: TASK-20260101-001\n"
                           "decision: rejected\nrequired_changes: [a, b]\n"))
    assert isinstance(v, ReviewEnvelope)
    assert (v.reviewer, v.subject_task_id, v.decision, v.required_changes) == ("PM", "TASK-20260101-001",
                                                                              "rejected", ("a", "b"))


BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: [*b, *b, *b, *b, *b]\n"


@pytest.mark.parametrize(("name", "raw", "reason"), [
    (TASK, b"", FcopReason.EMPTY_FILE),
    (TASK, b"---\nprotocol: fcop\x00\n---\n", FcopReason.BINARY_FILE),
    (TASK, b"---\nsubject: \xff\xfe\n---\n", FcopReason.INVALID_ENCODING),
    (TASK, b"# just markdown\n", FcopReason.MISSING_FRONT_MATTER),
    (TASK, b"---\nprotocol: fcop\nversion: 1\n", FcopReason.MISSING_FRONT_MATTER),  # no closing fence yet
    (TASK, doc("protocol: [fcop\n"), FcopReason.MALFORMED_FRONT_MATTER),
    (TASK, doc("- a list\n- not a mapping\n"), FcopReason.MALFORMED_FRONT_MATTER),
    (TASK, doc("just a string\n"), FcopReason.MALFORMED_FRONT_MATTER),
    (TASK, doc(BASE + BOMB), FcopReason.MALFORMED_FRONT_MATTER),
    (TASK, doc(BASE + "x: !!binary aGVsbG8=\n"), FcopReason.MALFORMED_FRONT_MATTER),
    (TASK, doc(BASE + "x: !!python/object:os.system {}\n"), FcopReason.MALFORMED_FRONT_MATTER),
    (TASK, doc(BASE + "? [a, b]\n: c\n"), FcopReason.MALFORMED_FRONT_MATTER),
    (TASK, doc(BASE + "x: " + "[" * 2000 + "]" * 2000 + "\n"), FcopReason.MALFORMED_FRONT_MATTER),
    (TASK, doc(BASE + "x: " + "9" * 5000 + "\n"), FcopReason.MALFORMED_FRONT_MATTER),
    (TASK, doc(BASE + "y: '" + "z" * 70_000 + "'\n"), FcopReason.MALFORMED_FRONT_MATTER),
    (TASK, doc(BASE + "sender: DEV\n"), FcopReason.DUPLICATE_KEY),
    (TASK, doc("version: 1\nsender: A\nrecipient: B\n"), FcopReason.MISSING_REQUIRED_FIELD),
    (TASK, doc("protocol: fcop\nsender: A\nrecipient: B\n"), FcopReason.MISSING_REQUIRED_FIELD),
    (TASK, doc("protocol: fcop\nversion: 1\nrecipient: B\n"), FcopReason.MISSING_REQUIRED_FIELD),
    (TASK, doc("protocol: fcop\nversion: 1\nsender: ''\nrecipient: B\n"), FcopReason.MISSING_REQUIRED_FIELD),
    (TASK, doc("protocol: http\nversion: 1\nsender: A\nrecipient: B\n"), FcopReason.UNSUPPORTED_PROTOCOL),
    (TASK, doc("protocol: fcop\nversion: 4\nsender: A\nrecipient: B\n"), FcopReason.UNSUPPORTED_ENVELOPE_VERSION),
    (TASK, doc("protocol: fcop\nversion: one\nsender: A\nrecipient: B\n"), FcopReason.INVALID_FIELD_TYPE),
    (TASK, doc("protocol: fcop\nversion: true\nsender: A\nrecipient: B\n"), FcopReason.INVALID_FIELD_TYPE),
    (TASK, doc("protocol: fcop\nversion: 1\nsender: [A]\nrecipient: B\n"), FcopReason.INVALID_FIELD_TYPE),
    (TASK, doc("protocol: fcop\nversion: 1\nsender: dev\nrecipient: B\n"), FcopReason.INVALID_FIELD_VALUE),
    (TASK, doc(BASE + "priority: P9\n"), FcopReason.INVALID_FIELD_VALUE),
    (TASK, doc(BASE + "references: {a: 1}\n"), FcopReason.INVALID_FIELD_TYPE),
    (TASK, doc(BASE + "transitions: nope\n"), FcopReason.INVALID_FIELD_TYPE),
    (TASK, doc(BASE + "transitions:\n- {at: x, to: inbox}\n"), FcopReason.MISSING_REQUIRED_FIELD),
    (REPORT, doc("protocol: fcop\nversion: 1\nsender: PM\nrecipient: ADMIN\n"), FcopReason.MISSING_REQUIRED_FIELD),
    (REPORT, doc("protocol: fcop\nversion: 1\nsender: PM\nrecipient: ADMIN\nreferences: [TASK-20260101-001]\n"
                 "status: finished\n"), FcopReason.INVALID_FIELD_VALUE),
    ("REVIEW-20260101-001-PM-on-x.md", doc("protocol: fcop\nversion: 1\nsubject_ref: x\n"),
     FcopReason.MISSING_REQUIRED_FIELD),
    ("TASK-20260101-001.md", doc(BASE), FcopReason.BAD_FILENAME),
    ("../../etc/passwd", doc(BASE), FcopReason.BAD_FILENAME),
])
def test_refusals_carry_stable_reasons(name: str, raw: bytes, reason: FcopReason) -> None:
    with pytest.raises(FcopError) as exc:
        parse_envelope(name, raw)
    assert exc.value.reason is reason, exc.value.message
    assert exc.value.message


def test_size_cap() -> None:
    with pytest.raises(FcopError) as exc:
        parse_envelope(TASK, doc(BASE, "\n" + "x" * 2000), max_bytes=1000)
    assert exc.value.reason is FcopReason.FILE_TOO_LARGE


# -- review of 84a5775: typed scalars and merge bombs ----------------------------------------------

@pytest.mark.parametrize("value", ["!!bool maybe", "!!int ''", "!!float ''", "!!int '-'", "!!int '0x'"])
def test_a_typed_scalar_pyyaml_cannot_build_is_malformed_front_matter(value: str) -> None:
    """PyYAML's scalar constructors raise KeyError/IndexError on these: a refusal, never an escaping error."""
    from taskkernel.coordinator.fcop.frontmatter import load_mapping

    with pytest.raises(FcopError) as info:
        load_mapping(f"x: {value}\n")
    assert info.value.reason is FcopReason.MALFORMED_FRONT_MATTER
    with pytest.raises(FcopError) as info:
        parse_envelope(TASK, f"---\nprotocol: fcop\nversion: 1\nsender: ADMIN\nrecipient: PM\nx: {value}\n---\n"
                       .encode())
    assert info.value.reason is FcopReason.MALFORMED_FRONT_MATTER


def test_nested_merges_of_aliases_are_refused_before_any_merge_is_flattened(monkeypatch) -> None:  # noqa: ANN001
    """`x: &a25 {<<: [&a24 {<<: [...]}, *a24]}` doubles per level while PyYAML (< 6.0.4) flattens it: the composed
    graph is checked (a node reached twice is refused) before a merge is flattened at all."""
    from taskkernel.coordinator.fcop import frontmatter

    doc = "&a0 {k0: v}"
    for i in range(1, 26):
        doc = f"&a{i} {{<<: [{doc}, *a{i - 1}]}}"

    def never(node):  # noqa: ANN001, ANN202
        raise AssertionError("a merge was flattened before the aliases were refused")

    monkeypatch.setattr(frontmatter._SAFE, "flatten_mapping", never)
    with pytest.raises(FcopError) as info:
        frontmatter.load_mapping(f"x: {doc}\n")
    assert info.value.reason is FcopReason.MALFORMED_FRONT_MATTER and "alias" in info.value.message
    monkeypatch.undo()
    assert frontmatter.load_mapping("a: {<<: {k: 1}, j: 2}\n") == {"a": {"k": 1, "j": 2}}  # merges in place still work


def test_a_cycle_through_an_alias_is_refused() -> None:
    from taskkernel.coordinator.fcop.frontmatter import load_mapping

    with pytest.raises(FcopError) as info:
        load_mapping("x: &a [*a]\n")
    assert info.value.reason is FcopReason.MALFORMED_FRONT_MATTER
