"""What people (and leader agents) tell a task's running agent: who may, where it goes, and the submit it holds back.

An instruction (`task say`, the board's message box, MCP ``say_to_task``) is a session-log input (``message``,
``steer``, ``queued``, ``answer``) accepted into the task's **run session**, ``RUN:DRIVER:agent@TASK`` (the
provenance of the driver's run credential: the session its `add_progress` writes and a resumed run reads), so it
gets that session's acceptance sequence and is delivered and replayed in that order (docs/people-in-the-loop.md).

Who may instruct a task (``check_instructor``): an unscoped ADMIN; a principal whose role is the task's done
authority or its sender (whoever decides the task, or asked for it); a task-scoped credential (a run's token) only
when it is scoped to the task's parent (the leader driving the parent), never the task's own run (an agent
instructing itself would turn its wishes into a person's orders).

A done task is not submitted while instructions are pending (``PendingInputsGuard``): an agent that reports done
before it read what it was told has not finished its work.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from taskkernel.kernel.model.kinds import CommandType
from taskkernel.kernel.model.principal import RUN_PREFIX, Principal
from taskkernel.kernel.model.task import TaskState
from taskkernel.kernel.reasons import KernelError, ReasonCode
from taskkernel.kernel.sessionlog.kinds import INSTRUCTION_KIND_NAMES, InputKind
from taskkernel.kernel.sessionlog.tables import install, session_counter, session_input
from taskkernel.kernel.store.db import Database, UnitOfWork

if TYPE_CHECKING:  # the pydantic wire format: the guard's annotation only (a read counts without it)
    from taskkernel.kernel.model.commands import Command

IN_WORK = frozenset({TaskState.INBOX.value, TaskState.ACTIVE.value})  # a driver has work to be told about


def run_session(role: str, agent: str, task_id: str) -> str:
    """The session of a task's runs by ``role`` (``Principal.provenance`` of their task-scoped credential)."""
    return Principal(role, agent, task_id).provenance


def check_instructor(principal: Principal, doc: dict[str, Any]) -> None:
    """Raise ``may_not_instruct`` unless ``principal`` may tell ``doc``'s agent something (module docstring)."""
    if principal.is_admin:
        return
    authority = doc["authority"]
    if principal.task_id is not None:
        if principal.task_id == doc.get("parent") and principal.role in (authority["done_authority"], doc["sender"]):
            return
        raise KernelError(ReasonCode.MAY_NOT_INSTRUCT, f"{principal.provenance} may not instruct {doc['task_id']}: "
                          "a run's credential instructs only the children of the task it works on")
    if principal.role in (authority["done_authority"], doc["sender"]):
        return
    raise KernelError(ReasonCode.MAY_NOT_INSTRUCT, f"{principal.id} may not instruct {doc['task_id']}: ADMIN, its "
                      f"done authority ({authority['done_authority']}) or its sender ({doc['sender']}) may")


def check_reader(principal: Principal, doc: dict[str, Any]) -> None:
    """Raise ``may_not_instruct`` unless ``principal`` may list what the task's agent was told: whoever may
    instruct it, its driver's role (unscoped) and the task's own run."""
    if principal.task_id == doc["task_id"] or (principal.task_id is None
                                               and principal.role == doc["authority"]["driver"]):
        return
    check_instructor(principal, doc)


def check_in_work(doc: dict[str, Any]) -> None:
    """Raise ``task_not_in_work`` unless the task is in the inbox or active (a driver is or will be at work)."""
    if doc["state"] not in IN_WORK:
        hint = ("reject it with the reason instead" if doc["state"] == TaskState.REVIEW.value
                else "reopen it to work on it again")
        raise KernelError(ReasonCode.TASK_NOT_IN_WORK,
                          f"{doc['task_id']} is {doc['state']}: no agent is at work on it to be told; {hint}")


def driver_sessions(task_id: str, driver: str) -> sa.ColumnElement[bool]:
    """Every run session of the task's driver, whatever its agent's name (``RUN:DRIVER:*@TASK``): a range of the
    session key (``RUN:DRIVER:`` up to ``RUN:DRIVER;``, read through its index), then the task."""
    sid, prefix = session_counter.c.session_id, f"{RUN_PREFIX}{driver}:"
    return sa.and_(sid >= prefix, sid < prefix[:-1] + chr(ord(":") + 1), sid.endswith(f"@{task_id}", autoescape=True))


def pending_count(conn: Connection, sessions: sa.ColumnElement[bool]) -> int:
    """Instructions accepted into ``sessions`` past each one's consumed mark (``last_consumed_seq``)."""
    c, i = session_counter.c, session_input.c
    q = (sa.select(sa.func.count()).select_from(session_input.join(session_counter, c.session_id == i.session_id))
         .where(sessions, i.accepted.is_(True), i.seq > c.last_consumed_seq, i.kind.in_(INSTRUCTION_KIND_NAMES)))
    return int(conn.execute(q).scalar_one())


def pending_kinds(conn: Connection, session: str) -> list[str]:
    """The kinds of the instructions waiting in ``session``, in acceptance order (a queued one holds back what
    follows it)."""
    c, i = session_counter.c, session_input.c
    return list(conn.execute(
        sa.select(i.kind).select_from(session_input.join(session_counter, c.session_id == i.session_id))
        .where(c.session_id == session, i.accepted.is_(True), i.seq > c.last_consumed_seq,
               i.kind.in_(INSTRUCTION_KIND_NAMES)).order_by(i.seq)).scalars())


def pending_for_task(db: Database, doc: dict[str, Any]) -> int:
    """Instructions the task's driver has not consumed (0 on a database without the session log's tables)."""
    with db.read() as conn:
        if not sa.inspect(conn).has_table(session_input.name):
            return 0
        return pending_count(conn, driver_sessions(doc["task_id"], doc["authority"]["driver"]))


class PendingInputsGuard:
    """A submit (by anyone but ADMIN) waits while the driver's run session holds instructions not yet consumed:
    ``inputs_pending``, whose message says how the agent reads them. ``session_of`` names a task's run session
    (the coordinator knows its driver's agent name), so the check reads one session by its key."""

    def __init__(self, db: Database, session_of: Callable[[dict[str, Any]], str]) -> None:
        install(db)
        self.session_of = session_of

    def __call__(self, uow: UnitOfWork, cmd: Command, doc: dict[str, Any] | None, principal: Principal) -> None:
        if cmd.type is not CommandType.SUBMIT or doc is None or principal.is_admin:
            return
        kinds = pending_kinds(uow.conn, self.session_of(doc))
        if not kinds:
            return
        if kinds[0] == InputKind.QUEUED.value:  # held for the next run: reading now returns nothing
            raise KernelError(ReasonCode.INPUTS_PENDING, f"{doc['task_id']} has {len(kinds)} instruction(s) held "
                              "for its next run: end this run with your done report; the run that follows "
                              "delivers them")
        raise KernelError(ReasonCode.INPUTS_PENDING, f"{doc['task_id']} has {len(kinds)} instruction(s) its agent "
                          "has not read yet: read them (MCP `read_inputs`, or `taskkernel task inputs "
                          f"{doc['task_id']} --consume`), act on them, then submit")
