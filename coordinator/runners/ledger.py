"""Run ledger: one row per agent wake-up, claimed under a lease with a fencing token.

A row is created once per (task, round, purpose, source event), so relaying the same outbox
row twice cannot start a second run. Claiming bumps the fencing token; every later write by
the holder carries it, so a holder whose lease expired (crashed, hung) can change nothing.

A row also says what its holder started: the agent's host, process group and start time, and the
SHA-256 of the run's token. A coordinator taking over an expired lease gets that as an `Orphan`,
so it can terminate the agent and revoke its token before running the task again (exactly once).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum

import sqlalchemy as sa

from taskkernel.coordinator.tables import metadata, runs
from taskkernel.kernel.canonical import utc_now_iso
from taskkernel.kernel.credentials import authenticate_hashed, checked_hash
from taskkernel.kernel.model.principal import Principal
from taskkernel.kernel.store.clock import iso, store_now
from taskkernel.kernel.store.db import Database, UnitOfWork

HEARTBEAT_EVERY_S = 1.0  # an agent's calls record at most one heartbeat a second


class RunState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    BLOCKED = "blocked"  # attempts exhausted; the task got a blocked report


class Purpose(StrEnum):
    EXECUTE = "execute"  # the driver works on its task
    REVIEW = "review"  # the done authority judges a submitted task
    CHILDREN = "children"  # the parent's driver is told a child moved


AGENT_COLUMNS = ("token_hash", "agent_host", "agent_pgid", "agent_start")
_CLEARED = dict.fromkeys(AGENT_COLUMNS)


@dataclass(frozen=True)
class Orphan:
    """What a holder whose lease expired may have left running: its agent and its token."""

    token_hash: str | None
    host: str | None
    pgid: int | None
    start: int | None


@dataclass(frozen=True)
class ClaimedRun:
    run_id: str
    task_id: str
    round: int
    role: str
    purpose: Purpose
    attempt: int
    max_attempts: int
    fencing: int
    orphan: Orphan | None = None  # set when this claim took the run over from an expired lease

    @property
    def exhausted(self) -> bool:
        return self.attempt > self.max_attempts

    @property
    def source_pos(self) -> int | None:
        """The global position of the event that woke this run (the run id's last part), when it has one."""
        last = self.run_id.rsplit(":", 1)[-1]
        return int(last) if last.isdigit() else None


class RunLedger:
    def __init__(self, db: Database, owner: str, lease_seconds: float = 120.0,
                 role_leases: Mapping[str, float] | None = None) -> None:
        self.db = db
        self.owner = owner
        self.lease = timedelta(seconds=lease_seconds)
        self.role_leases = {role: timedelta(seconds=s) for role, s in (role_leases or {}).items()}
        db.create_schema(metadata)
        self._add_missing_columns()

    def _add_missing_columns(self) -> None:
        """A ledger created before the agent columns existed gets them (under the writer lock, so two
        coordinators starting together cannot both add one)."""
        with self.db.read() as conn:
            present = {c["name"] for c in sa.inspect(conn).get_columns("runs")}
        if present >= set(AGENT_COLUMNS):
            return
        with self.db.write() as uow:
            present = {c["name"] for c in sa.inspect(uow.conn).get_columns("runs")}
            for name in AGENT_COLUMNS:
                if name not in present:
                    column = runs.c[name]
                    kind = column.type.compile(dialect=uow.conn.dialect)
                    uow.conn.exec_driver_sql(f"ALTER TABLE runs ADD COLUMN {name} {kind}")

    def lease_for(self, role: str) -> timedelta:
        return self.role_leases.get(role, self.lease)

    def enqueue(self, uow: UnitOfWork, run_id: str, task_id: str, round_: int, role: str, purpose: Purpose,
                max_attempts: int) -> bool:
        return self.insert(uow.conn, run_id, task_id, round_, role, purpose, max_attempts)

    @staticmethod
    def insert(conn: sa.Connection, run_id: str, task_id: str, round_: int, role: str, purpose: Purpose,
               max_attempts: int) -> bool:
        """A run due now, in the caller's write transaction (False: a run of that id exists)."""
        if conn.execute(sa.select(runs.c.run_id).where(runs.c.run_id == run_id)).first():
            return False
        now = iso(store_now(conn))
        conn.execute(runs.insert().values(
            run_id=run_id, task_id=task_id, round=round_, role=role, purpose=purpose.value,
            state=RunState.PENDING.value, max_attempts=max_attempts, not_before=now, created_at=now))
        return True

    def claim_due(self, limit: int = 10, now: datetime | None = None,
                  slots: Mapping[str, int] | None = None, held: frozenset[str] = frozenset()) -> list[ClaimedRun]:
        """Take pending runs that are due, and running ones whose holder's lease expired (a crash counts
        as a spent attempt), oldest first: at most ``limit``, and with ``slots`` at most that many of each role
        (a role not in it gets none). Runs in ``held`` (running in this process) are never taken over."""
        free = dict(slots) if slots is not None else None
        if limit <= 0 or (free is not None and not any(n > 0 for n in free.values())):
            return []
        claimed: list[ClaimedRun] = []
        with self.db.write() as uow:
            t = now or store_now(uow.conn)  # one clock for every host's leases
            stamp = iso(t)
            due = sa.or_(sa.and_(runs.c.state == RunState.PENDING.value, runs.c.not_before <= stamp),
                         sa.and_(runs.c.state == RunState.RUNNING.value, runs.c.lease_until < stamp))
            query = sa.select(runs).where(due).order_by(runs.c.created_at, runs.c.run_id)
            if free is not None:
                query = query.where(runs.c.role.in_([role for role, n in free.items() if n > 0]))
            for r in uow.conn.execute(query.limit(limit if free is None else max(limit, 64))).all():
                if len(claimed) >= limit:
                    break
                if r.run_id in held:
                    continue
                if free is not None:
                    if free.get(r.role, 0) <= 0:
                        continue
                    free[r.role] -= 1
                attempt, fencing = r.attempt + 1, r.fencing + 1
                # The agent columns stay until the new holder starts its own agent: if it crashes before
                # dealing with the orphan, the next takeover still finds it.
                uow.conn.execute(runs.update().where(runs.c.run_id == r.run_id).values(
                    state=RunState.RUNNING.value, attempt=attempt, fencing=fencing, lease_owner=self.owner,
                    lease_until=iso(t + self.lease_for(r.role)), heartbeat_at=None))
                orphan = None
                if r.state == RunState.RUNNING.value and (r.token_hash or r.agent_pgid):
                    orphan = Orphan(r.token_hash, r.agent_host, r.agent_pgid, r.agent_start)
                claimed.append(ClaimedRun(r.run_id, r.task_id, r.round, r.role, Purpose(r.purpose), attempt,
                                          r.max_attempts, fencing, orphan))
        return claimed

    def next_due_in(self, roles: list[str]) -> float | None:
        """Seconds until the earliest pending run of these roles (those this host runs) is due, by the store's
        clock, which wrote it (<= 0: due now; None: none)."""
        with self.db.read() as conn:
            stamp = conn.execute(sa.select(sa.func.min(runs.c.not_before))
                                 .where(runs.c.state == RunState.PENDING.value, runs.c.role.in_(roles))).scalar()
            if not stamp:
                return None
            due = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
            return (due - store_now(conn)).total_seconds()

    def pending(self) -> list[dict[str, object]]:
        """Runs waiting to start (first attempts and retries), oldest first."""
        with self.db.read() as conn:
            return [dict(r._mapping) for r in conn.execute(
                sa.select(runs.c.run_id, runs.c.task_id, runs.c.role, runs.c.attempt, runs.c.not_before,
                          runs.c.last_error, runs.c.error_code)
                .where(runs.c.state == RunState.PENDING.value).order_by(runs.c.not_before))]

    def renew(self, run: ClaimedRun) -> bool:
        """The coordinator's own lease renewal while the agent runs (not a heartbeat of the agent)."""
        return self._fenced_at(run, lambda t: {"lease_until": iso(t + self.lease_for(run.role))})

    def attach_token(self, run: ClaimedRun, token_hash: str) -> bool:
        """Record the run's token before the agent can hold it (replacing whatever an orphan left)."""
        return self._fenced(run, **{**_CLEARED, "token_hash": token_hash})

    def attach_agent(self, run: ClaimedRun, host: str, pgid: int, start: int | None) -> bool:
        return self._fenced(run, agent_host=host, agent_pgid=pgid, agent_start=start)

    def beat(self, run: ClaimedRun) -> bool:
        """The agent said it is alive: recorded (heartbeat_timeout counts from it) and the lease renewed."""
        return self._fenced_at(run, lambda t: {"heartbeat_at": iso(t),
                                               "lease_until": iso(t + self.lease_for(run.role))})

    def since_beat(self, run: ClaimedRun) -> float | None:
        """Seconds since the run's last heartbeat, whoever recorded it, by the store's clock (which recorded it;
        None: none yet)."""
        with self.db.read() as conn:
            stamp = conn.execute(sa.select(runs.c.heartbeat_at).where(runs.c.run_id == run.run_id,
                                                                     runs.c.fencing == run.fencing)).scalar()
            if not stamp:
                return None
            beat = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
            return (store_now(conn) - beat).total_seconds()

    def succeed(self, run: ClaimedRun, exit_code: int | None) -> bool:
        return self._fenced(run, state=RunState.SUCCEEDED.value, exit_code=exit_code, ended_at=utc_now_iso(),
                            error_code=None, lease_owner=None, lease_until=None, **_CLEARED)

    def retry_later(self, run: ClaimedRun, delay_s: float, error: str, exit_code: int | None,
                    code: str | None = None) -> bool:
        return self._fenced_at(run, lambda t: {
            "state": RunState.PENDING.value, "not_before": iso(t + timedelta(seconds=delay_s)), "last_error": error,
            "exit_code": exit_code, "error_code": code, "lease_owner": None, "lease_until": None, **_CLEARED})

    def interrupt(self, run: ClaimedRun, error: str) -> bool:
        """A shutdown stopped the agent: the run is due again at the next start, and one more attempt is allowed
        (a person's stop says nothing of the agent). The attempt keeps its number: its usage and logs stay
        its own, beside the next attempt's."""
        return self._fenced_at(run, lambda t: {
            "state": RunState.PENDING.value, "not_before": iso(t), "last_error": error, "error_code": "interrupted",
            "max_attempts": run.max_attempts + 1, "lease_owner": None, "lease_until": None, **_CLEARED})

    def ran_before(self, run: ClaimedRun) -> bool:
        """Whether an attempt of this task by this role began before this one (an earlier attempt of this run, or
        another run): a resumed prompt says so even when nothing was recorded."""
        if run.attempt > 1:
            return True
        with self.db.read() as conn:
            return conn.execute(sa.select(runs.c.run_id).where(
                runs.c.task_id == run.task_id, runs.c.role == run.role, runs.c.run_id != run.run_id,
                runs.c.attempt > 0)).first() is not None

    def stopped(self, run: ClaimedRun, error: str) -> bool:
        """A person stopped the agent (`task interrupt`): this run is over, not failed (no attempt counts against
        it); the run that resumes the task follows it (runners/inputs.py)."""
        return self._fenced(run, state=RunState.SUCCEEDED.value, last_error=error, error_code="stopped_by_person",
                            ended_at=utc_now_iso(), lease_owner=None, lease_until=None, **_CLEARED)

    def block(self, run: ClaimedRun, error: str, code: str | None = None) -> bool:
        return self._fenced(run, state=RunState.BLOCKED.value, last_error=error, error_code=code,
                            ended_at=utc_now_iso(), lease_owner=None, lease_until=None, **_CLEARED)

    def _fenced(self, run: ClaimedRun, **values: object) -> bool:
        """Change the run only while this claim holds it (its fencing token) and it is still running: a run
        already ended (blocked, succeeded) is never moved again by a late write of its holder."""
        return self._fenced_at(run, lambda _: values)

    def _fenced_at(self, run: ClaimedRun, values: Callable[[datetime], Mapping[str, object]]) -> bool:
        """``_fenced`` with values computed from the store's clock (a lease, a retry's time) in its transaction."""
        with self.db.write() as uow:
            res = uow.conn.execute(runs.update().where(runs.c.run_id == run.run_id, runs.c.fencing == run.fencing,
                                                       runs.c.state == RunState.RUNNING.value)
                                   .values(**values(store_now(uow.conn))))
            return bool(res.rowcount)

    def all_runs(self) -> list[dict[str, object]]:
        with self.db.read() as conn:
            return [dict(r._mapping) for r in conn.execute(sa.select(runs).order_by(runs.c.created_at))]


def authenticate_agent(db: Database, token: str) -> Principal:
    """``authenticate``, and for a run's token a heartbeat of that run: any CLI verb or MCP call an agent makes
    says it is alive (its supervisor's heartbeat_timeout counts from the last one)."""
    return authenticate_agent_hashed(db, checked_hash(token))


def authenticate_agent_hashed(db: Database, hashed: str) -> Principal:
    """``authenticate_agent`` for a token known by its stored hash (a board's sign-in)."""
    principal = authenticate_hashed(db, hashed)
    if principal.task_id is not None:
        _heartbeat(db, hashed)
    return principal


def _heartbeat(db: Database, hashed: str) -> None:
    """Best effort and cheap: a read first, a write only for a running run last heard of over
    HEARTBEAT_EVERY_S ago; a store busy or failing never fails the agent's own call."""
    def stale(t: datetime) -> sa.ColumnElement[bool]:
        fresh = iso(t - timedelta(seconds=HEARTBEAT_EVERY_S))
        return sa.and_(runs.c.token_hash == hashed, runs.c.state == RunState.RUNNING.value,
                       sa.or_(runs.c.heartbeat_at.is_(None), runs.c.heartbeat_at < fresh))

    with contextlib.suppress(sa.exc.SQLAlchemyError):
        with db.read() as conn:
            if conn.execute(sa.select(runs.c.run_id).where(stale(store_now(conn)))).first() is None:
                return
        with db.write() as uow:
            t = store_now(uow.conn)
            uow.conn.execute(runs.update().where(stale(t)).values(heartbeat_at=iso(t)))
