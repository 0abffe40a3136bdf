"""``SessionLog``: the durable, acceptance-sequenced record of what each session was told.

Every write runs in one ``db.write()`` transaction (SQLite ``BEGIN IMMEDIATE`` / PostgreSQL
advisory lock): the counter row is incremented with ``UPDATE ... RETURNING`` and the input is
stored in the same transaction, so a sequence exists exactly when its input does. Methods
return only after commit, which is when a host may report "accepted".
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from pydantic import ValidationError
from sqlalchemy.engine import Connection

from taskkernel.kernel.canonical import canonical_json, digest, utc_now_iso
from taskkernel.kernel.model.principal import ADMIN, Principal
from taskkernel.kernel.sessionlog.authority import DEFAULT_ADMIN_SESSIONS, check_read, check_write, initial_owner
from taskkernel.kernel.sessionlog.grants import check_grant
from taskkernel.kernel.sessionlog.interchange import dump_lines
from taskkernel.kernel.sessionlog.models import (
    AcceptResult,
    PermissionDecision,
    Rec,
    SessionInput,
    SessionLogError,
    SessionReason,
    TurnResult,
    check_boundary,
    validate_payload,
)
from taskkernel.kernel.sessionlog.reducers import PermissionReducer
from taskkernel.kernel.sessionlog.replay import Order, ReplayResult, replay
from taskkernel.kernel.sessionlog.resume import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_INPUTS,
    ResumeAnswer,
    Window,
    damaged,
    decide,
)
from taskkernel.kernel.sessionlog.tables import install, session_counter, session_input, session_owner
from taskkernel.kernel.store.db import Database

C = session_counter.c
I = session_input.c  # noqa: E741 - column namespace, read as "input"

# Built once: accept runs these on every call, and prebuilt statements skip SQLAlchemy's per-call construction.
_PRIOR = sa.select(I.seq, I.content_digest, I.accepted, I.refusal).where(
    I.session_id == sa.bindparam("sid"), I.input_id == sa.bindparam("iid"))
_BUMP_SEQ = (sa.update(session_counter).where(C.session_id == sa.bindparam("sid"))
             .values(last_seq=C.last_seq + 1, last_record=C.last_record + 1).returning(C.last_seq, C.last_record))
_BUMP_RECORD = (sa.update(session_counter).where(C.session_id == sa.bindparam("sid"))
                .values(last_record=C.last_record + 1).returning(C.last_seq, C.last_record))
_NEW_COUNTER = sa.insert(session_counter)
_INSERT_INPUT = sa.insert(session_input)
_OWNER = sa.select(session_owner.c.owner).where(session_owner.c.session_id == sa.bindparam("sid"))


def content_digest(kind: str, payload: Mapping[str, Any]) -> str:
    return digest({"kind": kind, "payload": payload})


def coerce_input(inp: SessionInput | Mapping[str, Any]) -> SessionInput:
    if isinstance(inp, SessionInput):
        si = inp
    else:
        try:
            si = SessionInput.model_validate(inp)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "input"
            raise SessionLogError(SessionReason.INVALID_INPUT, f"{where}: {first['msg']}") from None
    validate_payload(si.kind, si.payload)
    return si


class SessionLog:
    def __init__(self, db: Database, admin_sessions: frozenset[str] = DEFAULT_ADMIN_SESSIONS) -> None:
        self.db = db
        self.admin_sessions = admin_sessions
        install(db)

    # --- writing ---------------------------------------------------------------------------------

    def accept(self, session: str, inp: SessionInput | Mapping[str, Any], *, accepted_by: str | None = None,
               writer: Principal | None = None) -> AcceptResult:
        """Store the input with the session's next acceptance sequence (or return its original one).

        ``accepted_by`` is the principal the host accepted the input from (from its credential, never
        from the payload); the execution gate derives trust from it. With ``writer``, the session's
        write rules (authority.py) are checked and the owner claimed in the same transaction, and
        ``accepted_by`` is the writer. An ``allow``/``revoke`` whose permission and scope no consumer reads is
        refused ``invalid_grant`` before anything is written (grants.py).
        """
        si = coerce_input(inp)
        with self.db.write() as uow:
            if writer is not None:
                self._authorize(uow.conn, session, writer, si.kind.value)
                accepted_by = writer.provenance
            check_grant(si.kind, si.payload)  # every surface's door: a grant nothing could read is never stored
            return self.accept_in(uow.conn, session, si, accepted_by=accepted_by)

    def accept_in(self, conn: Connection, session: str, inp: SessionInput | Mapping[str, Any], *,
                  accepted_by: str | None = None) -> AcceptResult:
        """``accept`` inside the caller's write transaction (the kernel consuming a single-use grant)."""
        si = coerce_input(inp)
        dig = content_digest(si.kind.value, si.payload)
        prior = self._prior(conn, session, si.input_id, dig)
        if prior is not None:
            return prior
        seq, record_no = self._bump(conn, session, seq=True)
        check_boundary(si.kind, si.payload, seq)  # raising rolls the increment back: no gap
        self._insert(conn, session, record_no, seq, si, dig, accepted=True, accepted_by=accepted_by)
        return AcceptResult(session=session, input_id=si.input_id, accept_seq=seq, status="accepted")

    def accept_for(self, conn: Connection, session: str, inp: SessionInput | Mapping[str, Any], *,
                   owner: Principal, by: Principal) -> AcceptResult:
        """Accept, in the caller's transaction, an instruction ``by`` gives into ``owner``'s session (a task's run
        session: the caller checked that ``by`` may instruct that task, kernel/instructions.py). The session is
        claimed for its owner as the owner's own write would; the giver is recorded as ``accepted_by``."""
        si = coerce_input(inp)
        current = self.owner(session, conn)
        if current is None:
            conn.execute(sa.insert(session_owner).values(session_id=session, owner=owner.provenance,
                                                         claimed_at=utc_now_iso()))
        elif current != owner.provenance:
            raise SessionLogError(SessionReason.NOT_AUTHORIZED, f"session {session!r} belongs to {current}, not "
                                  f"to {owner.provenance}")
        return self.accept_in(conn, session, si, accepted_by=by.provenance)

    def checkpoint(self, session: str, payload: Mapping[str, Any], *, writer: Principal) -> AcceptResult:
        """Accept a ``progress`` input whose id the log derives: a checkpoint retried while it is still the
        session's newest accepted input replays it; the same text after other inputs is a new checkpoint (its id
        names the head it followed), so a repeated "tests pass" later in a session is never swallowed."""
        with self.db.write() as uow:
            self._authorize(uow.conn, session, writer, "progress")
            head = uow.conn.execute(
                sa.select(I.seq, I.input_id, I.content_digest)
                .where(I.session_id == session, I.seq.is_not(None)).order_by(I.seq.desc()).limit(1)).first()
            si = coerce_input({"input_id": "progress-", "kind": "progress", "payload": dict(payload)})
            dig = content_digest(si.kind.value, si.payload)
            if head is not None and head.content_digest == dig and head.input_id.startswith("progress-"):
                input_id = head.input_id
            else:
                input_id = f"progress-{head.seq if head is not None else 0}-{dig[:24]}"
            si = si.model_copy(update={"input_id": input_id})
            return self.accept_in(uow.conn, session, si, accepted_by=writer.provenance)

    def refuse(self, session: str, inp: SessionInput | Mapping[str, Any], reason: str, *,
               writer: Principal | None = None) -> AcceptResult:
        """Record an input that was received but not accepted: no sequence, never replayed."""
        si = _loose_input(inp)
        dig = content_digest(si.kind.value, si.payload)
        with self.db.write() as uow:
            if writer is not None:
                self._authorize(uow.conn, session, writer, None)
            prior = self._prior(uow.conn, session, si.input_id, dig)
            if prior is not None:
                return prior
            _, record_no = self._bump(uow.conn, session, seq=False)
            self._insert(uow.conn, session, record_no, None, si, dig, accepted=False, refusal=reason)
        return AcceptResult(session=session, input_id=si.input_id, accept_seq=None, status="refused", reason=reason)

    def consume(self, session: str, through_seq: int, *, writer: Principal | None = None) -> int:
        """Mark every accepted input up to ``through_seq`` consumed; returns last_consumed_seq."""
        with self.db.write() as uow:
            if writer is not None:
                self._authorize(uow.conn, session, writer, None)
            last_seq, consumed, _ = self._counter(uow.conn, session, for_update=True)
            if not 0 <= through_seq <= last_seq:
                raise SessionLogError(
                    SessionReason.INVALID_INPUT, f"cannot consume through {through_seq}: last accepted is {last_seq}"
                )
            consumed = max(consumed, through_seq)
            uow.conn.execute(
                sa.update(session_counter).where(C.session_id == session).values(last_consumed_seq=consumed)
            )
        return consumed

    def complete_turn(self, session: str, *, writer: Principal | None = None) -> TurnResult:
        """Complete the turn only if every accepted input was consumed (one transaction)."""
        with self.db.write() as uow:
            if writer is not None:
                self._authorize(uow.conn, session, writer, None)
            last_seq, consumed, turns = self._counter(uow.conn, session, for_update=True)
            done = consumed == last_seq
            if done:
                turns += 1
                uow.conn.execute(
                    sa.update(session_counter).where(C.session_id == session).values(turns_completed=turns)
                )
        return TurnResult(
            session=session, status="completed" if done else "continue",
            reason=None if done else SessionReason.TURN_INCOMPLETE, last_seq=last_seq,
            last_consumed_seq=consumed, pending=list(range(consumed + 1, last_seq + 1)), turns_completed=turns,
        )

    def import_records(self, by_session: Mapping[str, Sequence[Rec]]) -> dict[str, dict[str, int]]:
        """Import interchange records, keeping and verifying their sequences; all or nothing.

        Each session's records must replay as ``known``. Records already stored must match
        (same content, same sequence, same accepted flag); new sequenced records must continue
        after the stored log. Unsequenced accepted records are stored as legacy records.
        """
        for session, recs in by_session.items():
            verdict = replay(recs)
            if not verdict.known:
                raise SessionLogError(verdict.reason, f"session {session!r}: {verdict.detail}")  # type: ignore[arg-type]
        summary: dict[str, dict[str, int]] = {}
        with self.db.write() as uow:
            for session, recs in by_session.items():
                summary[session] = self._import_session(uow.conn, session, recs)
        return summary

    # --- authority (authority.py) ----------------------------------------------------------------

    def owner(self, session: str, conn: Connection | None = None) -> str | None:
        """The session's owner; a session stored before owners were recorded is ADMIN's."""
        with self._reading(conn) as c:
            row = c.execute(_OWNER, {"sid": session}).first()
            if row is not None:
                return str(row[0])
            exists = c.execute(sa.select(C.session_id).where(C.session_id == session)).first()
        return ADMIN if exists is not None else None

    def sessions(self, reader: Principal) -> list[dict[str, Any]]:
        """The sessions ``reader`` may read (all for ADMIN), with their owner and counters, by id."""
        q = sa.select(C.session_id, C.last_seq, C.last_consumed_seq, C.turns_completed, session_owner.c.owner
                      ).select_from(session_counter.outerjoin(session_owner, session_owner.c.session_id == C.session_id)
                                    ).order_by(C.session_id)
        with self._reading(None) as c:
            rows = c.execute(q).all()
        out = []
        for sid, last_seq, consumed, turns, owner in rows:
            try:
                check_read(sid, owner or ADMIN, reader, self.admin_sessions)
            except SessionLogError:
                continue
            out.append({"session": sid, "owner": owner or ADMIN, "last_seq": last_seq,
                        "last_consumed_seq": consumed, "turns_completed": turns})
        return out

    def check_read(self, session: str, reader: Principal) -> None:
        check_read(session, self.owner(session), reader, self.admin_sessions)

    def _authorize(self, conn: Connection, session: str, writer: Principal, kind: str | None) -> None:
        owner = self.owner(session, conn)
        check_write(session, owner, writer, kind, self.admin_sessions)
        if owner is None:
            conn.execute(sa.insert(session_owner).values(
                session_id=session, owner=initial_owner(session, writer, self.admin_sessions),
                claimed_at=utc_now_iso()))

    # --- reading ---------------------------------------------------------------------------------

    def records(self, session: str, conn: Connection | None = None) -> list[Rec]:
        """All records in storage order; ``log_last_seq`` carries the counter, so a lost tail shows."""
        with self._reading(conn) as c:
            row = c.execute(sa.select(C.last_seq).where(C.session_id == session)).first()
            if row is None:
                return []
            last = row[0]
            rows = c.execute(
                sa.select(I.seq, I.input_id, I.kind, I.payload, I.accepted, I.legacy, I.received_at, I.refusal,
                          I.accepted_by)
                .where(I.session_id == session)
                .order_by(I.record_no)
            ).all()
        return [Rec(s, i, k, json.loads(p), bool(a), bool(lg), last, ra, rf, by)
                for s, i, k, p, a, lg, ra, rf, by in rows]

    def exists(self, session: str) -> bool:
        with self.db.read() as c:
            return c.execute(sa.select(C.session_id).where(C.session_id == session)).first() is not None

    def replay(
        self, session: str, *, order: Order | str = Order.ACCEPTANCE, as_of: int | None = None,
        reducer: str = "inputs",
    ) -> ReplayResult:
        return replay(self.records(session), order=order, as_of=as_of, reducer=reducer)

    def export(self, session: str, signing_key: bytes | None = None) -> Iterator[str]:
        """The session as interchange lines, in storage order (signed when given the workspace's key)."""
        return dump_lines(session, self.records(session), signing_key)

    def permission_decision(
        self, session: str, permission: str, scope: str, as_of: int | None = None, conn: Connection | None = None,
        records: Sequence[Rec] | None = None,
    ) -> PermissionDecision:
        """allow/deny for one permission and scope at the current sequence (or as of ``as_of``).

        Pass the caller's ``conn`` to decide inside its own transaction, so the cutoff is the
        sequence visible to the command being checked (or hand in ``records`` already read from it).
        A log that does not replay as ``known`` denies (fail closed) and says why.
        """
        result = replay(self.records(session, conn) if records is None else records, as_of=as_of,
                        reducer="permission")
        if not result.known:
            return PermissionDecision("deny", None, None, result.reason)
        decision, seq, input_id = PermissionReducer.lookup(result.state, permission, scope)
        return PermissionDecision(decision, seq, input_id, None)

    def resume(
        self, session: str, *, max_inputs: int = DEFAULT_MAX_INPUTS, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> ResumeAnswer:
        """Where to continue after a compaction; reads at most the newest ``max_inputs`` inputs."""
        bound = Window(max_inputs, max_bytes)
        with self.db.read() as c:
            row = c.execute(sa.select(C.last_seq).where(C.session_id == session)).first()
            if row is None:
                raise SessionLogError(SessionReason.UNKNOWN_SESSION, f"no session {session!r}")
            last_seq = row[0]
            cols = (I.seq, I.input_id, I.kind, I.payload)
            newest = c.execute(
                sa.select(*cols).where(I.session_id == session, I.accepted, I.seq.is_not(None))
                .order_by(I.seq.desc()).limit(max_inputs + 1)
            )
            bound.take(Rec(s, i, k, json.loads(p)) for s, i, k, p in newest)
            window = bound.ordered()
            reaches_start = not bound.full
            if reaches_start:
                legacy = c.execute(
                    sa.select(*cols).where(I.session_id == session, I.accepted, I.seq.is_(None))
                    .order_by(I.record_no.desc())
                )
                bound.take(Rec(s, i, k, json.loads(p), True, True) for s, i, k, p in legacy)
        first = last_seq - len(window) + 1
        if [r.seq for r in window] != list(range(first, last_seq + 1)) or (reaches_start and first != 1):
            return damaged(session, SessionReason.MISSING_SEQUENCE, bound, window)
        legacy_read = [r for r in bound.ordered() if r.seq is None]
        return decide(session, legacy_read, window, bound, complete=not bound.full)

    # --- internals -------------------------------------------------------------------------------

    @contextmanager
    def _reading(self, conn: Connection | None) -> Iterator[Connection]:
        if conn is not None:
            yield conn
        else:
            with self.db.read() as c:
                yield c

    def _prior(self, conn: Connection, session: str, input_id: str, dig: str) -> AcceptResult | None:
        """The recorded outcome of a known input_id (idempotency), or None if it is new."""
        row = conn.execute(_PRIOR, {"sid": session, "iid": input_id}).first()
        if row is None:
            return None
        seq, stored, accepted, refusal = row
        if stored != dig:
            raise SessionLogError(
                SessionReason.IDEMPOTENCY_CONFLICT,
                f"input_id {input_id!r} of session {session!r} was recorded with different content",
            )
        if not accepted:
            return AcceptResult(session=session, input_id=input_id, accept_seq=None, status="refused", reason=refusal)
        return AcceptResult(session=session, input_id=input_id, accept_seq=seq, status="replayed")

    @staticmethod
    def _bump(conn: Connection, session: str, *, seq: bool) -> tuple[int, int]:
        """Increment the counter row (created at 0 if missing); returns (last_seq, last_record).

        No upsert is needed: every writer holds the database write lock (``db.write()``).
        """
        stmt = _BUMP_SEQ if seq else _BUMP_RECORD
        row = conn.execute(stmt, {"sid": session}).first()
        if row is None:
            conn.execute(_NEW_COUNTER, {"session_id": session, "last_seq": 0, "last_record": 0,
                                        "last_consumed_seq": 0, "turns_completed": 0})
            row = conn.execute(stmt, {"sid": session}).one()
        return int(row[0]), int(row[1])

    @staticmethod
    def _counter(conn: Connection, session: str, *, for_update: bool = False) -> tuple[int, int, int]:
        q = sa.select(C.last_seq, C.last_consumed_seq, C.turns_completed).where(C.session_id == session)
        row = conn.execute(q.with_for_update() if for_update else q).first()
        if row is None:
            raise SessionLogError(SessionReason.UNKNOWN_SESSION, f"no session {session!r}")
        return int(row[0]), int(row[1]), int(row[2])

    @staticmethod
    def _insert(
        conn: Connection, session: str, record_no: int, seq: int | None, si: SessionInput, dig: str, *,
        accepted: bool, legacy: bool = False, refusal: str | None = None, received_at: str | None = None,
        accepted_by: str | None = None,
    ) -> None:
        conn.execute(_INSERT_INPUT, {
            "session_id": session, "record_no": record_no, "seq": seq, "input_id": si.input_id, "kind": si.kind.value,
            "payload": canonical_json(si.payload), "content_digest": dig, "accepted": accepted, "legacy": legacy,
            "refusal": refusal, "received_at": received_at or utc_now_iso(), "accepted_by": accepted_by,
        })

    def _import_session(self, conn: Connection, session: str, recs: Sequence[Rec]) -> dict[str, int]:
        row = conn.execute(sa.select(C.last_seq).where(C.session_id == session)).first()
        stored_last = int(row[0]) if row else 0
        imported = present = 0
        top = stored_last
        for r in recs:
            si = _loose_input({"input_id": r.input_id, "kind": r.kind, "payload": r.payload})
            dig = content_digest(r.kind, r.payload)
            seq = r.seq if r.accepted else None
            known = conn.execute(
                sa.select(I.seq, I.content_digest, I.accepted).where(I.session_id == session, I.input_id == r.input_id)
            ).first()
            if known is not None:
                if known[1] != dig:
                    raise SessionLogError(
                        SessionReason.IDEMPOTENCY_CONFLICT, f"{session}/{r.input_id}: stored with different content"
                    )
                if bool(known[2]) != r.accepted or (seq is not None and known[0] != seq):
                    raise SessionLogError(
                        SessionReason.SEQUENCE_CONFLICT,
                        f"{session}/{r.input_id}: stored as accepted={bool(known[2])} seq={known[0]}, "
                        f"file says accepted={r.accepted} seq={seq}",
                    )
                present += 1
                continue
            if seq is not None and seq <= stored_last:
                raise SessionLogError(
                    SessionReason.SEQUENCE_CONFLICT,
                    f"{session}/{r.input_id}: sequence {seq} is already taken by another input",
                )
            _, record_no = self._bump(conn, session, seq=False)
            self._insert(
                conn, session, record_no, seq, si, dig, accepted=r.accepted, legacy=r.accepted and seq is None,
                refusal=r.refusal, received_at=r.received_at, accepted_by=r.accepted_by,
            )
            imported += 1
            top = max(top, seq or 0, r.log_last_seq or 0)
        if top > stored_last:
            conn.execute(sa.update(session_counter).where(C.session_id == session).values(last_seq=top))
        return {"imported": imported, "already_present": present, "last_seq": top}


def _loose_input(inp: SessionInput | Mapping[str, Any]) -> SessionInput:
    """Shape-check an input without its kind's payload rules: refused input may be malformed."""
    try:
        return inp if isinstance(inp, SessionInput) else SessionInput.model_validate(inp)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise SessionLogError(SessionReason.INVALID_INPUT, f"{first['loc']}: {first['msg']}") from None

