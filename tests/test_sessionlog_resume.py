"""Compaction-safe resume (seed 002): continue from the checkpoint, never re-run an instruction from history."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from taskkernel.kernel.sessionlog import SessionLog, SessionLogError, SessionReason, parse_lines, resume_from_records
from taskkernel.kernel.store.db import Database
from tests.sessionlog_support import cli

SENTINEL = "output FAILURE-SENTINEL"


def say(i: str, text: str, kind: str = "message") -> dict[str, Any]:
    return {"input_id": i, "kind": kind, "payload": {"text": text}}


def progress(i: str, text: str, calls: int, **extra: Any) -> dict[str, Any]:
    return {"input_id": i, "kind": "progress", "payload": {"text": text, "completed_tool_calls": calls, **extra}}


def compaction(i: str, covers: int) -> dict[str, Any]:
    summary = f"Earlier the user asked: '{SENTINEL}'. The agent reviewed the desktop page."
    return {"input_id": i, "kind": "compaction", "payload": {"summary": summary, "covers_to_seq": covers}}


def fill(log: SessionLog, session: str, inputs: list[dict[str, Any]]) -> None:
    for inp in inputs:
        log.accept(session, inp)


SENTINEL_LAST = [  # the last user instruction before the compaction is the sentinel
    say("u1", "stop adding download details; check the real desktop page"),
    progress("p2", "download details frozen", 3),
    progress("p3", "desktop page checked; next: fix the header layout", 7),
    say("u4", SENTINEL),
    compaction("c5", 4),
]
CHECKPOINT_LAST = [  # the sentinel came first, then the agent kept working and checkpointed
    say("u1", SENTINEL),
    progress("p2", "filled context, block 3 done; next: verify the compaction hook", 12),
    compaction("c3", 2),
]


@pytest.mark.parametrize(("inputs", "anchor_seq", "calls"), [(SENTINEL_LAST, 3, 7), (CHECKPOINT_LAST, 2, 12)])
def test_resume_returns_the_checkpoint_not_the_sentinel(
    any_db: Database, inputs: list[dict[str, Any]], anchor_seq: int, calls: int
) -> None:
    log = SessionLog(any_db)
    fill(log, "s", inputs)
    answer = log.resume("s")
    assert answer.status == "resume" and answer.reason is None
    assert answer.anchor is not None
    assert (answer.anchor.seq, answer.anchor.completed_tool_calls) == (anchor_seq, calls)
    assert "FAILURE-SENTINEL" not in answer.anchor.text
    assert answer.instructions == []  # instructions inside or before the summary are history
    assert answer.compaction is not None and answer.compaction.seq == len(inputs)

    log.accept("s", say("u-new", "now update the README", kind="steer"))
    after = log.resume("s")
    assert after.anchor == answer.anchor  # still the checkpoint before the compaction
    assert [(i.input_id, i.text) for i in after.instructions] == [("u-new", "now update the README")]
    assert all("FAILURE-SENTINEL" not in i.text for i in after.instructions)
    assert log.resume("s") == after  # deterministic: same log, same answer


def test_no_checkpoint_before_the_compaction_means_no_safe_anchor(sqlite_db: Database) -> None:
    log = SessionLog(sqlite_db)
    fill(log, "s", [say("u1", SENTINEL), compaction("c2", 1), progress("p3", "after", 1), say("u4", "go on")])
    answer = log.resume("s")
    assert (answer.status, answer.reason, answer.cause) == ("no_safe_anchor", SessionReason.NO_SAFE_ANCHOR,
                                                            SessionReason.NO_CHECKPOINT)
    assert answer.anchor is None
    assert [i.input_id for i in answer.instructions] == ["u4"]  # only what came after the compaction
    with pytest.raises(SessionLogError) as err:
        log.resume("nobody")
    assert err.value.reason == SessionReason.UNKNOWN_SESSION


def test_the_latest_compaction_decides_and_rollbacks_are_applied(sqlite_db: Database) -> None:
    log = SessionLog(sqlite_db)
    fill(log, "s", [progress("p1", "first", 1), compaction("c2", 1), say("u3", SENTINEL),
                    progress("p4", "second", 2), compaction("c5", 4)])
    answer = log.resume("s")
    assert answer.anchor is not None and answer.anchor.input_id == "p4" and answer.compaction.input_id == "c5"
    log.accept("s", {"input_id": "rb6", "kind": "rollback", "payload": {"to_seq": 2}})
    rewound = log.resume("s")  # c5, p4 and u3 were rolled back: c2 is the latest compaction again
    assert rewound.anchor is not None and rewound.anchor.input_id == "p1" and rewound.compaction.input_id == "c2"
    assert rewound.instructions == []


def test_without_compaction_resume_continues_after_the_last_checkpoint(sqlite_db: Database) -> None:
    log = SessionLog(sqlite_db)
    fill(log, "s", [say("u1", "build it"), progress("p2", "built", 4, done=True), say("u3", "and test it")])
    answer = log.resume("s")
    assert answer.status == "complete" and answer.anchor is not None and answer.anchor.done
    assert [i.input_id for i in answer.instructions] == ["u3"]


def test_reading_is_bounded(sqlite_db: Database) -> None:
    log = SessionLog(sqlite_db)
    fill(log, "s", [progress("p1", "x" * 5000, 1), compaction("c2", 1)])
    fill(log, "s", [say(f"u{i}", f"later {i}") for i in range(3, 9)])
    whole = log.resume("s")
    assert whole.anchor is not None and whole.anchor.text_truncated and len(whole.anchor.text) == 4000
    assert whole.read.complete and whole.read.inputs_read == 8
    short = log.resume("s", max_inputs=5)
    assert (short.anchor, short.cause) == (None, SessionReason.READ_BOUND_EXCEEDED)
    assert (short.read.inputs_read, short.read.from_seq, short.read.to_seq) == (5, 4, 8)
    tight = log.resume("s", max_bytes=200)
    assert tight.cause == SessionReason.READ_BOUND_EXCEEDED and tight.read.bytes_read <= 200


def test_file_resume_matches_the_database_and_damage_has_no_anchor(sqlite_db: Database) -> None:
    log = SessionLog(sqlite_db)
    fill(log, "s", SENTINEL_LAST)
    records = parse_lines(reversed(list(log.export("s"))))["s"]
    assert resume_from_records("s", records) == log.resume("s")
    damaged = resume_from_records("s", [r for r in records if r.seq != 3])
    assert (damaged.anchor, damaged.cause) == (None, SessionReason.MISSING_SEQUENCE)


def test_resume_cli_on_a_database_and_on_a_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'k.db'}"
    db = Database(url)
    fill(SessionLog(db), "s", SENTINEL_LAST)
    db.dispose()
    from_db = cli("--db", url, "session", "resume", "s", cwd=tmp_path)
    assert from_db.code == 0, from_db.err
    answer = from_db.json
    assert answer["anchor"]["seq"] == 3 and answer["anchor"]["completed_tool_calls"] == 7
    assert answer["instructions"] == [] and "FAILURE-SENTINEL" not in json.dumps(answer["anchor"])
    assert answer["read"]["max_inputs"] == 10_000

    log_file = tmp_path / "s.jsonl"
    log_file.write_text(cli("--db", url, "session", "export", "s", cwd=tmp_path).out, encoding="utf-8")
    assert cli("session", "resume", "--file", str(log_file), cwd=tmp_path).json == answer
    bounded = cli("--db", url, "session", "resume", "s", "--max-inputs", "1", cwd=tmp_path)
    assert bounded.code == 2 and bounded.json["anchor"] is None and bounded.json["reason"] == "no_safe_anchor"
