"""What people and leader agents tell a task's agent, from acceptance to consumption (docs/people-in-the-loop.md).

`task say` (the board's message box, MCP ``say_to_task``) accepts an instruction into the task's run session
(kernel/instructions.py: who may, and where) with that session's acceptance sequence. It is then:

- **accepted**: stored with its sequence; when no run of the task is queued or running and the task is active, a
  follow-up run is queued in the same transaction, so an idle agent is woken;
- **delivered to run N**: in that run's prompt (the resume section, runners/prompt.py), or by MCP ``read_inputs``
  after a tool result's pending-inputs notice — always in acceptance order, after a check that the session replays
  (a gap or a duplicate delivers nothing: unknown, never a guess);
- **consumed**: the session's ``last_consumed_seq`` passed it (a run's prompt consumes what it delivers as the run
  starts; ``read_inputs`` what it returns).

A run that ends with instructions accepted and not consumed is followed by a run that delivers exactly those
(``follow_up``). `task interrupt` asks the coordinator holding the running run to stop it (TERM, grace, KILL; the
worktree is kept): the request is a row the supervisor reads once a second (``interrupted_by``), and the run that
follows resumes with the interrupt's message as its newest instruction.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from taskkernel.coordinator.config import TaskkernelConfig
from taskkernel.coordinator.runners.config import RunnerKind, RunnerSpec
from taskkernel.coordinator.runners.ledger import Purpose, RunLedger, RunState
from taskkernel.coordinator.runners.prompt import Resumption, Told
from taskkernel.coordinator.tables import agent_sessions, input_deliveries, loop_metadata, run_interrupts, runs
from taskkernel.kernel.canonical import utc_now_iso
from taskkernel.kernel.instructions import (
    INSTRUCTION_KIND_NAMES,
    check_in_work,
    check_instructor,
    driver_sessions,
    pending_count,
    pending_kinds,
    run_session,
)
from taskkernel.kernel.model.principal import Principal
from taskkernel.kernel.model.task import TaskState
from taskkernel.kernel.queries import task_document
from taskkernel.kernel.reasons import KernelError, ReasonCode
from taskkernel.kernel.sessionlog import SessionLog, SessionLogError
from taskkernel.kernel.sessionlog.models import SessionReason
from taskkernel.kernel.sessionlog.replay import replay
from taskkernel.kernel.sessionlog.tables import session_counter, session_input
from taskkernel.kernel.store.db import Database
from taskkernel.kernel.store.schema import tasks

MAX_TEXT = 16 << 10  # characters of one instruction: a person's message, not a file
KINDS = {"message": "message", "steer": "steer", "queue": "queued", "answer": "answer"}  # CLI mode -> input kind
LIVE = (RunState.PENDING.value, RunState.RUNNING.value)
FOLLOW_UP = "in"  # a follow-up run's id ends `:in<seq>`: the newest instruction it was queued for
PROMPT, QUEUED = "prompt", "queued"
NO_RUN = "(no run)"  # the run a delivery is recorded to when the reader's run is not one the coordinator runs


def role_specs(config: TaskkernelConfig) -> dict[str, RunnerSpec]:
    """The runners of a workspace's roles by role code (its `[roles.x]` tables name roles in any case)."""
    return {code.upper(): spec for code, spec in config.roles.items()}


def agent_name(specs: Mapping[str, RunnerSpec], role: str) -> str:
    """The agent name a role's runs act as (its `agent`, else ``<role>-agent``): part of their session's name."""
    spec = specs.get(role)
    return spec.agent if spec is not None and spec.agent else f"{role.lower()}-agent"


def run_session_of(specs: Mapping[str, RunnerSpec]) -> Callable[[Mapping[str, Any]], str]:
    """The run session of a task's driver, by the agent name its runner gives it."""
    def session_of(doc: Mapping[str, Any]) -> str:
        driver = doc["authority"]["driver"]
        return run_session(driver, agent_name(specs, driver), doc["task_id"])
    return session_of


@dataclass(frozen=True)
class Pending:
    """An instruction accepted and not yet consumed."""

    seq: int
    input_id: str
    kind: str
    text: str
    question_id: str | None
    by: str | None
    anchor: str | None = None  # `path:line` of the change it is about (an inline comment on the diff)


class RunInputs:
    """Instructions to a task's agent over one database, with the roles' runners (``specs``, by role) this
    process knows (their agent names and attempts)."""

    def __init__(self, db: Database, log: SessionLog, specs: Mapping[str, RunnerSpec]) -> None:
        self.db, self.log, self.specs = db, log, dict(specs)
        db.create_schema(loop_metadata)

    def session_of(self, doc: Mapping[str, Any]) -> str:
        """The task's run session: named by its driver's runner here; a process that does not know that runner
        (`--db` without the workspace) takes the session the task's runs already have, if they have one."""
        if doc["authority"]["driver"] not in self.specs:
            with self.db.read() as conn:
                known = conn.execute(sa.select(session_counter.c.session_id).where(
                    driver_sessions(doc["task_id"], doc["authority"]["driver"]))).scalars().all()
            if len(known) == 1:
                return str(known[0])
        return run_session_of(self.specs)(doc)

    def _owner(self, session: str, doc: Mapping[str, Any]) -> Principal:
        """The run principal whose session ``session`` is (``RUN:ROLE:agent@TASK``)."""
        role, _, agent = session.removeprefix("RUN:").rsplit("@", 1)[0].partition(":")
        return Principal(role, agent, doc["task_id"])

    # -- giving ------------------------------------------------------------------------------------------------------
    def say(self, principal: Principal, task_id: str, text: str, mode: str = "message", *,
            question_id: str | None = None, input_id: str | None = None, anchor: str | None = None
            ) -> dict[str, Any]:
        """Accept ``text`` for the task's agent (``mode``: message, steer, queue, answer) and, when nothing runs
        the task, queue the run that delivers it. Raises KernelError/SessionLogError with the reason."""
        doc = self.task(task_id)
        check_instructor(principal, doc)
        check_in_work(doc)
        self._check_listens(doc)
        payload = _payload(text, mode, question_id, anchor)
        session = self.session_of(doc)
        with self.db.write() as uow:
            now = uow.conn.execute(sa.select(tasks.c.state, tasks.c.round).where(
                tasks.c.task_id == doc["task_id"])).one()  # where it is in this transaction, not a moment ago
            doc = {**doc, "state": now.state, "round": now.round}
            check_in_work(doc)
            res = self.log.accept_for(uow.conn, session, {"input_id": input_id or f"say-{uuid.uuid4().hex}",
                                                          "kind": KINDS[mode], "payload": payload},
                                      owner=self._owner(session, doc), by=principal)
            run_id = self._wake(uow.conn, doc, res.accept_seq) if res.status == "accepted" else None
        return {"status": res.status, "task_id": doc["task_id"], "session": session, "input_id": res.input_id,
                "accept_seq": res.accept_seq, "kind": KINDS[mode], "queued_run": run_id}

    def interrupt(self, principal: Principal, task_id: str, message: str | None = None) -> dict[str, Any]:
        """Ask the coordinator running the task's run to stop it; ``message`` becomes the resumed run's newest
        instruction. Refused ``no_running_run`` when none runs."""
        doc = self.task(task_id)
        check_instructor(principal, doc)
        payload = _payload(message, "queue", None) if message is not None else None
        session = self.session_of(doc)
        with self.db.write() as uow:
            found = uow.conn.execute(sa.select(runs.c.run_id, runs.c.attempt).where(
                runs.c.task_id == doc["task_id"], runs.c.role == doc["authority"]["driver"],
                runs.c.state == RunState.RUNNING.value)
                .order_by(runs.c.created_at)).first()
            running, attempt = (found.run_id, found.attempt) if found is not None else (None, 0)
            if running is None:
                raise KernelError(ReasonCode.NO_RUNNING_RUN, f"no run of {doc['task_id']} is running: "
                                  f"`taskkernel task say {doc['task_id']} …` tells its agent at its next run")
            asked = uow.conn.execute(sa.select(run_interrupts.c.requested_by, run_interrupts.c.message_seq).where(
                run_interrupts.c.run_id == running, run_interrupts.c.attempt == attempt)).first()
            if asked is not None:  # one stop per run: a second request changes nothing
                return {"status": "replayed", "task_id": doc["task_id"], "run_id": running,
                        "requested_by": asked.requested_by, "message_seq": asked.message_seq}
            seq = None
            if payload is not None:
                # queued: the agent being stopped must not read it first; the resumed run's prompt delivers it
                seq = self.log.accept_for(uow.conn, session, {"input_id": f"interrupt-{uuid.uuid4().hex}",
                                                              "kind": QUEUED, "payload": payload},
                                          owner=self._owner(session, doc), by=principal).accept_seq
            uow.conn.execute(run_interrupts.insert().values(
                task_id=doc["task_id"], run_id=running, attempt=attempt, requested_by=principal.id,
                requested_at=utc_now_iso(), message_seq=seq))
        return {"status": "requested", "task_id": doc["task_id"], "run_id": running, "requested_by": principal.id,
                "message_seq": seq}

    # -- the coordinator's side --------------------------------------------------------------------------------
    def interrupted_by(self, run_id: str, attempt: int) -> str | None:
        """Who asked to stop this attempt of ``run_id`` (None: nobody). A request for an earlier attempt (its
        coordinator died before it was handled) never stops a later one."""
        with self.db.read() as conn:
            return conn.execute(sa.select(run_interrupts.c.requested_by).where(
                run_interrupts.c.run_id == run_id, run_interrupts.c.attempt == attempt,
                run_interrupts.c.handled_at.is_(None))).scalars().first()

    def interrupt_handled(self, run_id: str, attempt: int) -> tuple[bool, int | None]:
        """The attempt ended: its stop request (if any) is handled. Returns whether there was one, and the
        sequence of its message (None: it had none)."""
        with self.db.write() as uow:
            row = uow.conn.execute(sa.select(run_interrupts.c.message_seq).where(
                run_interrupts.c.run_id == run_id, run_interrupts.c.attempt == attempt,
                run_interrupts.c.handled_at.is_(None))).first()
            if row is None:
                return False, None
            uow.conn.execute(run_interrupts.update().where(
                run_interrupts.c.run_id == run_id, run_interrupts.c.attempt == attempt).values(
                handled_at=utc_now_iso()))
        return True, row.message_seq

    def follow_up(self, task_id: str) -> str | None:
        """After a run of the task ended: queue the run that delivers what it left unconsumed (None: nothing
        pending, the task is not active, or a run is already queued or running)."""
        doc = task_document(self.db, task_id)
        if doc is None or doc["state"] != TaskState.ACTIVE.value:
            return None
        with self.db.write() as uow:
            if not pending_count(uow.conn, session_counter.c.session_id == self.session_of(doc)):
                return None
            head = uow.conn.execute(sa.select(session_counter.c.last_seq).where(
                session_counter.c.session_id == self.session_of(doc))).scalar_one()
            return self._wake(uow.conn, doc, head)

    def deliver(self, session: str, run_id: str, attempt: int, via: str,
                fits: Callable[[list[Pending]], int] | None = None) -> list[Pending]:
        """The session's pending instructions, in acceptance order, marked delivered to the run and consumed
        (one transaction); ``fits`` says how many of them one answer holds (decided before anything is
        consumed), the rest stay pending. A session that does not replay (a gap, a duplicate) delivers nothing:
        ``unknown``."""
        with self.db.write() as uow:
            records = self.log.records(session, uow.conn)
            if not records:
                return []
            verdict = replay(records)
            if not verdict.known:
                raise SessionLogError(verdict.reason or SessionReason.MISSING_SEQUENCE,
                                      f"session {session!r} does not replay ({verdict.detail}): nothing delivered")
            consumed = uow.conn.execute(sa.select(session_counter.c.last_consumed_seq).where(
                session_counter.c.session_id == session)).scalar_one()
            pending = sorted((Pending(r.seq, r.input_id, r.kind, r.payload["text"], r.payload.get("question_id"),
                                      r.accepted_by, anchor_text(r.payload))
                              for r in records if r.accepted and r.seq is not None and r.seq > consumed
                              and r.kind in INSTRUCTION_KIND_NAMES), key=lambda p: p.seq)
            if via != PROMPT:  # a queued instruction waits for the next run, and nothing after it goes first
                pending = pending[:next((n for n, p in enumerate(pending) if p.kind == QUEUED), len(pending))]
            if fits is not None and pending:
                pending = pending[:fits(pending)]
            if not pending:
                return []
            now = utc_now_iso()
            task_id = session.rsplit("@", 1)[-1]
            for p in pending:
                uow.conn.execute(input_deliveries.insert().values(
                    session_id=session, seq=p.seq, task_id=task_id, run_id=run_id, attempt=attempt, via=via,
                    delivered_at=now))
            mark = session_counter.c.last_consumed_seq
            uow.conn.execute(session_counter.update().where(session_counter.c.session_id == session).values(
                last_consumed_seq=sa.case((mark < pending[-1].seq, pending[-1].seq), else_=mark)))
        return pending

    def resumption(self, doc: Mapping[str, Any], run_id: str, attempt: int, *, first: bool) -> Resumption | None:
        """What the prompt of a driver's run says of the runs before it, built from the session's resume answer
        (seed 002), delivering (and consuming) the pending instructions as the new ones. None for a task's first
        run with nothing told (``first``: no run of the task ran before this one)."""
        session = self.session_of(doc)
        if not self.log.exists(session):
            return None if first else Resumption(None, None, 0, "no progress was recorded", [], [], [])
        undeliverable = None
        try:
            new = [Told(p.seq, p.kind, p.text, p.by, p.question_id, p.anchor)
                   for p in self.deliver(session, run_id, attempt, PROMPT)]
        except SessionLogError as exc:
            new, undeliverable = [], exc.message
        answer = self.log.resume(session)
        if first and not new and answer.anchor is None and not answer.instructions:
            return None
        fresh = {t.seq for t in new}
        after = [Told(i.seq, i.kind, i.text) for i in answer.instructions if i.seq not in fresh]
        told_after = fresh | {t.seq for t in after}
        history = [Told(r.seq, r.kind, r.payload["text"]) for r in self.log.records(session)
                   if r.accepted and r.seq is not None and r.kind in INSTRUCTION_KIND_NAMES
                   and r.seq not in told_after]
        history.sort(key=lambda t: t.seq or 0)
        if answer.anchor is None:  # nothing says how far the earlier runs got: what they were told is history
            why = (answer.cause.value if answer.cause else "none") if undeliverable is None else "the log is damaged"
            return Resumption(None, None, 0, why.replace("_", " "), new, [], after, undeliverable)
        return Resumption(answer.anchor.text, answer.anchor.seq, answer.anchor.completed_tool_calls, None, new,
                          after, history, undeliverable)

    def cli_session(self, task_id: str, role: str, runner: str) -> str | None:
        """The CLI conversation the task's last run by ``role`` left, when the same runner printed it."""
        with self.db.read() as conn:
            row = conn.execute(sa.select(agent_sessions.c.session_id, agent_sessions.c.runner).where(
                agent_sessions.c.task_id == task_id, agent_sessions.c.role == role)).first()
        return row.session_id if row is not None and row.runner == runner else None

    def keep_cli_session(self, task_id: str, role: str, runner: str, session_id: str | None, run_id: str) -> None:
        """Record the conversation a run's CLI printed (None: forget it, so the next run starts cold)."""
        with self.db.write() as uow:
            uow.conn.execute(agent_sessions.delete().where(agent_sessions.c.task_id == task_id,
                                                           agent_sessions.c.role == role))
            if session_id is not None:
                uow.conn.execute(agent_sessions.insert().values(task_id=task_id, role=role, runner=runner,
                                                                session_id=session_id, run_id=run_id,
                                                                recorded_at=utc_now_iso()))

    def undeliver(self, run_id: str, attempt: int) -> None:
        """The attempt's agent never started: what its prompt delivered is pending again (its deliveries removed,
        the consumed mark set back), for the next attempt to deliver."""
        d = input_deliveries.c
        with self.db.write() as uow:
            rows = uow.conn.execute(sa.select(d.session_id, d.seq).where(
                d.run_id == run_id, d.attempt == attempt, d.via == PROMPT)).all()
            if not rows:
                return
            session, first, last = rows[0].session_id, min(r.seq for r in rows), max(r.seq for r in rows)
            uow.conn.execute(input_deliveries.delete().where(d.run_id == run_id, d.attempt == attempt,
                                                             d.via == PROMPT))
            uow.conn.execute(session_counter.update().where(  # only while nothing was consumed since
                session_counter.c.session_id == session, session_counter.c.last_consumed_seq == last).values(
                last_consumed_seq=first - 1))

    def pending_in(self, session: str) -> int:
        """How many instructions wait in ``session`` for a tool call to read them (the notice every MCP result of
        a run carries): those before the first queued one, which waits for the next run."""
        with self.db.read() as conn:
            kinds = pending_kinds(conn, session)
        return next((n for n, kind in enumerate(kinds) if kind == QUEUED), len(kinds))

    def running_run(self, task_id: str) -> tuple[str, int] | None:
        """The run of the task that is running now and its attempt (a tool call's delivery is recorded to it)."""
        with self.db.read() as conn:
            row = conn.execute(sa.select(runs.c.run_id, runs.c.attempt).where(
                runs.c.task_id == task_id, runs.c.state == RunState.RUNNING.value)
                .order_by(runs.c.created_at)).first()
        return (row.run_id, row.attempt) if row is not None else None

    # -- reading -------------------------------------------------------------------------------------------------
    def timeline(self, task_id: str) -> list[dict[str, Any]]:
        """Every instruction given to the task's driver, in acceptance order, with its delivery state:
        ``accepted``, ``delivered`` (to a run, how) or ``consumed``."""
        doc = self.task(task_id)
        i, c, d = session_input.c, session_counter.c, input_deliveries.c
        q = (sa.select(i.session_id, i.seq, i.input_id, i.kind, i.payload, i.accepted_by, i.received_at,
                       c.last_consumed_seq, d.run_id, d.attempt, d.via, d.delivered_at)
             .select_from(session_input.join(session_counter, c.session_id == i.session_id)
                          .outerjoin(input_deliveries, sa.and_(d.session_id == i.session_id, d.seq == i.seq)))
             .where(driver_sessions(doc["task_id"], doc["authority"]["driver"]), i.accepted.is_(True),
                    i.seq.is_not(None), i.kind.in_(INSTRUCTION_KIND_NAMES))
             .order_by(i.session_id, i.seq))
        with self.db.read() as conn:
            rows = conn.execute(q).all()
        out = []
        for r in rows:
            payload = json.loads(r.payload)
            state = "consumed" if r.seq <= r.last_consumed_seq else "delivered" if r.run_id else "accepted"
            out.append({"session": r.session_id, "accept_seq": r.seq, "input_id": r.input_id, "kind": r.kind,
                        "text": payload.get("text"), "question_id": payload.get("question_id"),
                        "anchor": anchor_text(payload), "by": r.accepted_by,
                        "received_at": r.received_at, "state": state,
                        "delivered": {"run_id": r.run_id, "attempt": r.attempt, "via": r.via, "at": r.delivered_at}
                        if r.run_id else None})
        return out

    # -- internals -----------------------------------------------------------------------------------------------
    def _check_listens(self, doc: Mapping[str, Any]) -> None:
        """Refuse ``no_agent_to_tell`` when the driver's agent is the built-in scripted one, which reads nothing."""
        spec = self.specs.get(doc["authority"]["driver"])
        if spec is not None and spec.runner == RunnerKind.SCRIPTED:
            raise KernelError(ReasonCode.NO_AGENT_TO_TELL, f"{doc['task_id']}'s driver {doc['authority']['driver']} "
                              "runs the built-in scripted agent, which reads no instructions: give it to a role "
                              "with an agent CLI, or work it by hand")

    def task(self, task_id: str) -> dict[str, Any]:
        doc = task_document(self.db, task_id)
        if doc is None:
            raise KernelError(ReasonCode.TASK_NOT_FOUND, f"{task_id} does not exist (see `taskkernel task list`)")
        return doc

    def _wake(self, conn: Connection, doc: Mapping[str, Any], seq: int | None) -> str | None:
        """Queue the driver's follow-up run when the task is active and none of its runs is queued or running
        (one run at a time per task: a running one gets the instruction at its next tool call)."""
        driver = doc["authority"]["driver"]
        spec = self.specs.get(driver)
        if doc["state"] != TaskState.ACTIVE.value or spec is None:  # no runner: a person works it by hand
            return None
        if conn.execute(sa.select(runs.c.run_id).where(runs.c.task_id == doc["task_id"],
                                                       runs.c.state.in_(LIVE))).first() is not None:
            return None
        run_id = f"{doc['task_id']}:r{doc['round']}:{Purpose.EXECUTE.value}:{FOLLOW_UP}{seq}"
        queued = RunLedger.insert(conn, run_id, doc["task_id"], doc["round"], driver, Purpose.EXECUTE,
                                  spec.max_attempts)
        return run_id if queued else None


ANCHOR = re.compile(r"(?P<path>[^\s:][^\n\r]{0,299}):(?P<line>[1-9][0-9]{0,8})")


def anchor_text(payload: Mapping[str, Any]) -> str | None:
    """An instruction's anchor as `path:line` (None: it is about no line)."""
    anchor = payload.get("anchor")
    return f"{anchor['path']}:{anchor['line']}" if isinstance(anchor, dict) else None


def _payload(text: str | None, mode: str, question_id: str | None, anchor: str | None = None) -> dict[str, Any]:
    if mode not in KINDS:
        raise SessionLogError(SessionReason.INVALID_INPUT, f"mode {mode!r} is not one of {', '.join(KINDS)}")
    if text is None or not text.strip():
        raise SessionLogError(SessionReason.INVALID_INPUT, "an instruction needs text")
    if len(text) > MAX_TEXT:
        raise SessionLogError(SessionReason.INVALID_INPUT, f"an instruction holds at most {MAX_TEXT} characters, "
                              f"not {len(text)}: put long material in a file the task names")
    if (mode == "answer") != (question_id is not None):
        raise SessionLogError(SessionReason.INVALID_INPUT, "--answer Q names the question an answer answers, and "
                              "only an answer names one")
    out: dict[str, Any] = {"text": text, **({"question_id": question_id} if question_id is not None else {})}
    if anchor is not None:
        if (found := ANCHOR.fullmatch(anchor)) is None:
            raise SessionLogError(SessionReason.INVALID_INPUT, f"--at {anchor!r} is not PATH:LINE (a file of the "
                                  "change and a line number from 1)")
        out["anchor"] = {"path": found["path"], "line": int(found["line"])}
    return out
