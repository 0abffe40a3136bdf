"""payload_too_large: `submit` refuses what the folder projection could not write, and takes what it can.

The CLI tests run `taskkernel` in separate processes; the render tests prove the limits themselves: a TASK,
REPORT and REVIEW file written with every field at its limit, in the characters that grow the most, still
reads back (and a TASK at its limit still takes a long history of transitions).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from taskkernel.coordinator.fcop import (
    FcopWorkspace,
    TaskDraft,
    Transition,
    append_transition,
    open_workspace,
    read_envelope,
)
from taskkernel.coordinator.fcop.parse import DEFAULT_MAX_BYTES, parse_envelope
from taskkernel.coordinator.fcop.writer import render_task, write_report, write_review
from taskkernel.kernel.model.commands import Command
from taskkernel.kernel.model.limits import (
    MAX_BODY_BYTES,
    MAX_REASON_BYTES,
    MAX_REFERENCE_BYTES,
    MAX_REFERENCES,
    MAX_THREAD_KEY_BYTES,
)
from tests.cli_support import taskkernel

TASK_ID = "TASK-20261130-001"
AT_LIMIT_BODY = "é" * (MAX_BODY_BYTES // 2)  # exactly MAX_BODY_BYTES in UTF-8, half as many characters
AT_LIMIT_REFS = [f"ref-{i:02d}-" + "r" * (MAX_REFERENCE_BYTES - 7) for i in range(MAX_REFERENCES)]


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    r = taskkernel("init", str(tmp_path / "ws"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    return tmp_path / "ws"


def submit(ws: Path, command: dict[str, Any], token: str | None = None) -> tuple[int, dict[str, Any]]:
    r = taskkernel("submit", cwd=ws, stdin=json.dumps(command), env={"TASKKERNEL_TOKEN": token} if token else None)
    return r.returncode, json.loads(r.stdout)


def create(key: str = "c1", thread_key: str | None = None, **payload: Any) -> dict[str, Any]:
    return {"type": "create_task", "task_id": TASK_ID, "idempotency_key": key,
            **({"thread_key": thread_key} if thread_key is not None else {}),
            "payload": {"sender": "ADMIN", "recipient": "PM", "subject": "Limits", **payload}}


def show(ws: Path) -> tuple[int, dict[str, Any]]:
    r = taskkernel("task", "show", TASK_ID, cwd=ws)
    return r.returncode, json.loads(r.stdout)


@pytest.mark.parametrize(("command", "field", "size", "limit"), [
    (create(body=AT_LIMIT_BODY + "x"), "body", MAX_BODY_BYTES + 1, MAX_BODY_BYTES),
    (create(references=[*AT_LIMIT_REFS, "one-more"]), "references", MAX_REFERENCES + 1, MAX_REFERENCES),
    (create(references=["TASK-20261130-002", "é" * MAX_REFERENCE_BYTES]), "references.1", 2 * MAX_REFERENCE_BYTES,
     MAX_REFERENCE_BYTES),
    (create(thread_key="t" * (MAX_THREAD_KEY_BYTES + 1)), "thread_key", MAX_THREAD_KEY_BYTES + 1,
     MAX_THREAD_KEY_BYTES),
], ids=["body", "reference-count", "reference-length", "thread-key"])
def test_an_oversized_task_is_refused_and_nothing_is_stored(ws: Path, command: dict[str, Any], field: str,
                                                            size: int, limit: int) -> None:
    code, out = submit(ws, command)
    assert (code, out["status"], out["reason"]) == (2, "rejected", "payload_too_large"), out
    assert out["message"].startswith(f"{field}: {size} ") and f"limit of {limit} " in out["message"], out
    assert show(ws) == (2, {"status": "rejected", "reason": "task_not_found",
                            "message": f"{TASK_ID} does not exist (see `taskkernel task list`)"})
    assert taskkernel("log", cwd=ws).stdout == "", "a refused command appends no event"


def test_oversized_report_and_reason_are_refused_before_any_other_check(ws: Path) -> None:
    assert submit(ws, create())[1]["status"] == "accepted"
    pm = taskkernel("token", "issue", "PM", cwd=ws).stdout.strip()
    target = {"task_id": TASK_ID, "thread_key": TASK_ID, "expected_revision": 1, "round": 0}
    assert submit(ws, {"type": "claim", **target, "idempotency_key": "claim", "payload": {}}, pm)[1]["revision"] == 2
    active = {**target, "expected_revision": 2, "round": 1}
    report = {"type": "submit_report", **active, "idempotency_key": "r1",
              "payload": {"status": "done", "body": AT_LIMIT_BODY + "!"}}
    code, out = submit(ws, report, pm)
    assert (code, out["reason"]) == (2, "payload_too_large"), out
    assert f"body: {MAX_BODY_BYTES + 1} bytes, over the limit of {MAX_BODY_BYTES} bytes" in out["message"]
    # A reject is not even allowed on an active task: the shape check comes first and names the size.
    reject = {"type": "reject", **active, "idempotency_key": "j1", "payload": {"reason": "n" * (MAX_REASON_BYTES + 1)}}
    code, out = submit(ws, reject)
    assert (code, out["reason"]) == (2, "payload_too_large") and "reason: " in out["message"], out
    _, doc = show(ws)
    assert (doc["revision"], doc["reports"]) == (2, []), "nothing was stored"
    code, out = submit(ws, {**report, "idempotency_key": "r2", "payload": {"status": "done", "body": AT_LIMIT_BODY}},
                       pm)
    assert (code, out["status"], out["revision"]) == (0, "accepted", 3), out
    last = json.loads(taskkernel("log", "--stream", f"task:{TASK_ID}", cwd=ws).stdout.splitlines()[-1])
    assert (last["type"], last["data"]["body"]) == ("report_submitted", AT_LIMIT_BODY)


def test_a_task_at_every_limit_is_accepted_and_its_file_reads_back(ws: Path) -> None:
    thread = "t" * MAX_THREAD_KEY_BYTES
    code, out = submit(ws, create(thread_key=thread, body=AT_LIMIT_BODY, references=AT_LIMIT_REFS))
    assert (code, out["status"]) == (0, "accepted"), out
    up = taskkernel("up", "--once", cwd=ws)
    assert up.returncode == 0, up.stdout + up.stderr
    [path] = (ws / "fcop" / "_lifecycle").rglob(f"{TASK_ID}-*.md")
    env = read_envelope(path)
    assert (env.body.strip(), list(env.references), env.thread_key) == (AT_LIMIT_BODY, AT_LIMIT_REFS, thread)
    assert taskkernel("verify", cwd=ws).returncode == 0


# -- the limits themselves: files rendered at every limit read back ---------------------------------------

WORST_SHORT = "\x01"  # escaped by YAML as four characters: the most front matter per byte
WORST_WIDE = "\U0010ffff"  # escaped as ten characters: the most front matter per character (subject)
BY = "ADMIN:local-owner"


def _accepted_by_the_kernel(thread_key: str, **payload: Any) -> None:
    """The values really pass the shape check (so the files below are ones the kernel can be asked to write)."""
    Command.model_validate({"type": "create_task", "idempotency_key": "k", "thread_key": thread_key,
                            "payload": {"sender": "ADMIN", "recipient": "PM", **payload}}).validated_payload()


def test_a_task_file_at_every_limit_reads_back_and_keeps_room_for_its_history(tmp_path: Path) -> None:
    subject, thread = WORST_WIDE * 500, WORST_SHORT * MAX_THREAD_KEY_BYTES
    refs = tuple(f"{i:02d}" + WORST_SHORT * (MAX_REFERENCE_BYTES - 2) for i in range(MAX_REFERENCES))
    body = "\U0001f600" * (MAX_BODY_BYTES // 4)
    _accepted_by_the_kernel(thread, subject=subject, body=body, references=list(refs), parent="TASK-20261130-999999999")
    draft = TaskDraft(sender="ADMIN", recipient="PM", subject=subject, body=body + "\n", priority="P0",
                      thread_key=thread, parent="TASK-20261130-999999999", references=refs,
                      extra={"risk_level": "irreversible"}, by=BY)
    data = render_task(draft)
    assert len(data) <= DEFAULT_MAX_BYTES
    name = "TASK-20261130-001-ADMIN-to-PM.md"
    env = parse_envelope(name, data)
    assert (env.subject, env.thread_key, tuple(env.references), env.body.strip()) == (subject, thread, refs, body)
    path = tmp_path / name
    path.write_bytes(data)
    stages = ["inbox", *["active", "review"] * 100]  # a hundred rounds of claim (or reject) and submit
    for before, after in zip(stages, stages[1:], strict=False):
        append_transition(path, Transition.model_validate(
            {"at": "2026-11-30T00:00:00+00:00", "from": before, "to": after, "by": BY, "tool": "task_rejected"}))
    assert len(read_envelope(path).transitions) == len(stages)  # type: ignore[union-attr]


@pytest.fixture
def fcop(tmp_path: Path) -> FcopWorkspace:
    return open_workspace(tmp_path, create=True)


def test_report_and_review_files_at_every_limit_read_back(fcop: FcopWorkspace) -> None:
    body = "\U0001f600" * (MAX_BODY_BYTES // 4)
    Command.model_validate({"type": "submit_report", "task_id": "TASK-20261130-001", "thread_key": "t",
                            "expected_revision": 2, "round": 1, "idempotency_key": "k",
                            "payload": {"status": "done", "body": body}}).validated_payload()
    report = write_report(fcop, sender="PM", recipient="ADMIN", task_id="TASK-20261130-001", body=body + "\n")
    assert read_envelope(report.path).body.strip() == body
    reason = WORST_SHORT * MAX_REASON_BYTES
    Command.model_validate({"type": "reject", "task_id": "TASK-20261130-001", "thread_key": "t",
                            "expected_revision": 3, "round": 1, "idempotency_key": "k",
                            "payload": {"reason": reason}}).validated_payload()
    review = write_review(fcop, reviewer="ADMIN", subject_ref="TASK-20261130-001", decision="rejected",
                          body=body + "\n", rationale=reason)
    env = read_envelope(review.path)
    assert (env.rationale, env.body.strip()) == (reason, body)  # type: ignore[union-attr]
