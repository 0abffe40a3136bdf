"""Accepting inputs on both backends: gapless sequences, idempotency, refusals, turns, permission checks."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import sqlalchemy as sa

from taskkernel.kernel.sessionlog import SessionLog, SessionLogError, SessionReason
from taskkernel.kernel.sessionlog.tables import session_counter, session_input
from taskkernel.kernel.store.db import Database

PERM = {"permission": "deploy", "scope": "env:staging"}


def msg(input_id: str, text: str | None = None) -> dict[str, Any]:
    return {"input_id": input_id, "kind": "message", "payload": {"text": text or input_id}}


def perm(input_id: str, kind: str, **payload: str) -> dict[str, Any]:
    return {"input_id": input_id, "kind": kind, "payload": {**PERM, **payload}}


def stored(db: Database, session: str) -> list[tuple[Any, ...]]:
    with db.read() as c:
        rows = c.execute(sa.select(session_input.c.seq, session_input.c.input_id, session_input.c.accepted)
                         .where(session_input.c.session_id == session).order_by(session_input.c.record_no))
        return [tuple(r) for r in rows]


def test_sequences_start_at_one_per_session_and_are_gapless(any_db: Database) -> None:
    log = SessionLog(any_db)
    assert [log.accept("a", msg(f"m{i}")).accept_seq for i in range(3)] == [1, 2, 3]
    assert log.accept("b", msg("m0")).accept_seq == 1  # input ids and sequences are per session
    assert stored(any_db, "a") == [(1, "m0", True), (2, "m1", True), (3, "m2", True)]


def test_same_input_id_returns_the_original_sequence_and_different_content_conflicts(any_db: Database) -> None:
    log = SessionLog(any_db)
    first = log.accept("s", msg("i1", "hello"))
    log.accept("s", msg("i2"))
    again = log.accept("s", msg("i1", "hello"))
    assert (first.status, again.status, again.accept_seq) == ("accepted", "replayed", 1)
    with pytest.raises(SessionLogError) as err:
        log.accept("s", msg("i1", "something else"))
    assert err.value.reason == SessionReason.IDEMPOTENCY_CONFLICT
    assert log.accept("s", msg("i3")).accept_seq == 3  # neither the retry nor the conflict used a number


def test_a_rejected_accept_leaves_no_gap(any_db: Database) -> None:
    log = SessionLog(any_db)
    log.accept("s", msg("m1"))
    with pytest.raises(SessionLogError) as err:  # rejected after the counter moved: rolled back with it
        log.accept("s", {"input_id": "rb", "kind": "rollback", "payload": {"to_seq": 2}})
    assert err.value.reason == SessionReason.INVALID_INPUT
    with pytest.raises(SessionLogError):
        log.accept("s", {"input_id": "bad", "kind": "allow", "payload": {"permission": "deploy"}})
    assert log.accept("s", msg("m2")).accept_seq == 2
    assert log.replay("s").known


def test_refused_input_is_recorded_without_a_sequence_and_never_replayed(any_db: Database) -> None:
    log = SessionLog(any_db)
    log.accept("s", perm("a1", "revoke"))
    refused = log.refuse("s", perm("a2", "allow"), "policy:no-self-grant")
    assert (refused.status, refused.accept_seq, refused.reason) == ("refused", None, "policy:no-self-grant")
    assert log.accept("s", perm("a2", "allow")).status == "refused"  # the id's outcome sticks
    assert log.accept("s", msg("m3")).accept_seq == 2
    result = log.replay("s", reducer="permission")
    assert result.excluded == ["a2"] and result.order == ["a1", "m3"]
    assert log.permission_decision("s", "deploy", "env:staging").decision == "deny"
    exported = list(log.export("s"))
    assert '"accepted": false' in exported[1] and '"reason": "policy:no-self-grant"' in exported[1]


def test_turn_completes_only_when_every_accepted_input_was_consumed(any_db: Database) -> None:
    log = SessionLog(any_db)
    log.accept("s", msg("m1"))
    log.accept("s", msg("m2"))
    assert log.consume("s", 1) == 1
    log.accept("s", {"input_id": "q3", "kind": "queued", "payload": {"text": "also do this"}})
    pending = log.complete_turn("s")
    assert (pending.status, pending.reason, pending.pending) == ("continue", SessionReason.TURN_INCOMPLETE, [2, 3])
    assert log.consume("s", 3) == 3
    assert log.consume("s", 2) == 3  # consumption never moves back
    done = log.complete_turn("s")
    assert (done.status, done.reason, done.pending, done.turns_completed) == ("completed", None, [], 1)
    with pytest.raises(SessionLogError) as err:
        log.consume("s", 4)
    assert err.value.reason == SessionReason.INVALID_INPUT
    with pytest.raises(SessionLogError) as err:
        log.complete_turn("nobody")
    assert err.value.reason == SessionReason.UNKNOWN_SESSION


def test_a_queued_input_accepted_concurrently_with_turn_completion_is_not_dropped(sqlite_db: Database) -> None:
    log = SessionLog(sqlite_db)
    log.accept("s", msg("m1"))
    log.consume("s", 1)
    barrier = threading.Barrier(2)

    def accept_queued() -> None:
        barrier.wait()
        log.accept("s", {"input_id": "q", "kind": "queued", "payload": {"text": "late"}})

    t = threading.Thread(target=accept_queued)
    t.start()
    barrier.wait()
    first = log.complete_turn("s")
    t.join()
    # Whichever transaction committed first, the queued input was never swallowed by a completed turn.
    assert first.status in ("completed", "continue")
    final = log.complete_turn("s")
    assert (final.status, final.pending) == ("continue", [2])
    assert first.status == "continue" or first.turns_completed == 1


def test_permission_decision_uses_the_current_sequence_or_the_cutoff(any_db: Database) -> None:
    log = SessionLog(any_db)
    assert log.permission_decision("s", "deploy", "env:staging") == ("deny", None, None, None)
    log.accept("s", perm("g1", "allow"))
    assert log.permission_decision("s", "deploy", "env:staging")[:2] == ("allow", 1)
    assert log.permission_decision("s", "deploy", "prod").decision == "deny"
    log.accept("s", perm("r2", "revoke"))
    assert log.permission_decision("s", "deploy", "env:staging")[:2] == ("deny", 2)  # revoked grants do not count
    assert log.permission_decision("s", "deploy", "env:staging", as_of=1)[:2] == ("allow", 1)
    log.accept("s", perm("g3", "allow"))
    assert log.permission_decision("s", "deploy", "env:staging", as_of=2).decision == "deny"  # granted too late
    log.accept("s", {"input_id": "rb4", "kind": "rollback", "payload": {"to_seq": 2}})
    assert log.permission_decision("s", "deploy", "env:staging")[:2] == ("deny", 2)  # g3 rolled back
    with any_db.write() as uow:  # inside the caller's transaction: sees what that transaction sees
        uow.conn.execute(sa.update(session_counter).where(session_counter.c.session_id == "s").values(last_seq=5))
        inside = log.permission_decision("s", "deploy", "env:staging", conn=uow.conn)
        uow.conn.rollback()
    assert inside == ("deny", None, None, SessionReason.MISSING_SEQUENCE)  # counter ahead of the rows: fail closed


def test_a_damaged_log_replays_unknown_and_denies(any_db: Database) -> None:
    log = SessionLog(any_db)
    for i, kind in enumerate(("allow", "revoke", "allow"), 1):
        log.accept("s", perm(f"p{i}", kind))
    with any_db.write() as uow:
        uow.conn.execute(sa.delete(session_input).where(session_input.c.seq == 2))
    result = log.replay("s", reducer="permission")
    assert (result.status, result.reason) == ("unknown", SessionReason.MISSING_SEQUENCE)
    assert log.replay("s", as_of=1).known
    assert log.permission_decision("s", "deploy", "env:staging") == ("deny", None, None,
                                                                     SessionReason.MISSING_SEQUENCE)
    with any_db.write() as uow:  # the lost tail is visible through the counter row too
        uow.conn.execute(sa.delete(session_input).where(session_input.c.seq == 3))
    assert log.replay("s").reason == SessionReason.MISSING_SEQUENCE


def test_export_import_round_trip_between_databases(any_db: Database, tmp_path: Any) -> None:
    from taskkernel.kernel.sessionlog import parse_lines

    src = SessionLog(any_db)
    src.accept("s", perm("a1", "allow"))
    src.refuse("s", msg("x"), "policy")
    src.accept("s", perm("r2", "revoke"))
    lines = list(src.export("s"))
    dst_db = Database(f"sqlite:///{tmp_path / 'dst.db'}")
    dst = SessionLog(dst_db)
    assert dst.import_records(parse_lines(reversed(lines))) == {"s": {"imported": 3, "already_present": 0,
                                                                      "last_seq": 2}}
    assert dst.replay("s", reducer="permission").to_json() == src.replay("s", reducer="permission").to_json()
    with pytest.raises(SessionLogError) as err:  # a different input claiming a stored sequence
        dst.import_records(parse_lines([lines[0], lines[2].replace('"r2"', '"zz"')]))
    assert err.value.reason == SessionReason.SEQUENCE_CONFLICT
    with pytest.raises(SessionLogError) as err:
        dst.import_records(parse_lines([lines[0].replace("env:staging", "prod"), lines[2]]))
    assert err.value.reason == SessionReason.IDEMPOTENCY_CONFLICT
    assert dst.accept("s", msg("m3")).accept_seq == 3
    dst_db.dispose()


def test_legacy_import_then_new_accepts(sqlite_db: Database) -> None:
    from taskkernel.kernel.sessionlog import parse_lines

    log = SessionLog(sqlite_db)
    legacy = ['{"session": "s", "input_id": "old2", "kind": "message", "payload": {"text": "b"}}',
              '{"session": "s", "input_id": "old1", "kind": "message", "payload": {"text": "a"}}']
    log.import_records(parse_lines(legacy))
    result = log.replay("s")
    assert result.known and result.legacy and result.order == ["old2", "old1"]
    assert log.accept("s", msg("new")).accept_seq == 1
    after = log.replay("s")
    assert after.known and after.legacy and after.order == ["old2", "old1", "new"]
    assert all('"legacy": true' in x for x in list(log.export("s"))[:2])
