"""The machines of a team on one shared store (docs/hosts.md): which roles this coordinator runs agents for, and
the ``hosts`` table every coordinator keeps its heartbeat in, which `taskkernel hosts` lists.

A host is named by `taskkernel up --host NAME` (else the machine's name). With ``[hosts.NAME]`` tables in
taskkernel.toml a host runs agents only for the roles its table lists, with its own slots; without them every
coordinator runs every role, as on one machine. Everything else a coordinator does (taking files in, projecting,
relaying wake-ups, claiming inbox tasks for any role) stays the same on every host: the kernel decides once."""

from __future__ import annotations

import json
import os
import re
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from taskkernel import __version__
from taskkernel.coordinator.config import ConfigError, Problem, TaskkernelConfig, near
from taskkernel.coordinator.runners.ledger import RunState
from taskkernel.coordinator.tables import hosts, runs
from taskkernel.kernel.store.clock import iso, store_now
from taskkernel.kernel.store.db import Database

BEAT_EVERY_S = 1.0  # a coordinator's passes write its heartbeat at most this often
LIVE_FOR_S = 30.0  # a host heard from within this is listed live (a pass may run long: a big import)
UNKNOWN_HOST = "unknown_host"


@dataclass(frozen=True)
class HostPlan:
    """What this coordinator runs: ``roles`` None means every role with a runner."""

    name: str
    roles: tuple[str, ...] | None
    slots: Mapping[str, int]  # per role served: runs at once on this host
    max_runs: int

    def serves(self, role: str) -> bool:
        return self.roles is None or role in self.roles


def default_name() -> str:
    """The machine's name, cut to a host name's shape."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname())[:63].lstrip("._-")
    return name or "host"


def plan_for(config: TaskkernelConfig, name: str | None, concurrency: Mapping[str, int]) -> HostPlan:
    """This host's plan from taskkernel.toml: ``[hosts.NAME]`` when the file has any (a name it lacks is refused,
    ConfigError ``unknown_host``), else every role in ``concurrency`` (role -> its runs at once)."""
    host = name or default_name()
    if not config.hosts:
        return HostPlan(host, None, dict(concurrency), config.kernel.max_runs)
    table = config.hosts.get(host)
    if table is None:
        known = sorted(config.hosts)
        guess = near(host, known)
        raise ConfigError.of([Problem("hosts", host, f"this coordinator is host {host!r}, which has no [hosts.{host}] "
                                      f"table (hosts: {', '.join(known)}); start it with --host NAME"
                                      + (f"; did you mean {guess}?" if guess else ""), config.line_of("hosts"),
                                      guess)], code=UNKNOWN_HOST)
    slots = {role: table.slots.get(role, concurrency.get(role, 1)) for role in table.roles}
    return HostPlan(host, tuple(table.roles), slots, table.max_runs or config.kernel.max_runs)


class HostRegistry:
    """This coordinator's row of ``hosts``: written when it starts and then by its passes (a stage), at most every
    BEAT_EVERY_S."""

    def __init__(self, db: Database, plan: HostPlan, owner: str) -> None:
        self.db, self.plan, self.owner = db, plan, owner
        self._next = float("-inf")
        self._started: str | None = None  # the first beat's time

    def beat(self) -> int:
        """A stage: the heartbeat, when it is due (by the store's clock, as every host's liveness is judged).
        Returns 0 (it moves no work). A beat that fails is tried again at the next pass, so a standing failure
        stays failed instead of passing for recovered between two beats."""
        now = time.monotonic()
        if now < self._next:
            return 0
        row = {"owner": self.owner, "pid": os.getpid(), "roles": json.dumps(self.plan.roles),
               "slots": json.dumps(dict(self.plan.slots), sort_keys=True), "max_runs": self.plan.max_runs,
               "version": __version__}
        with self.db.write() as uow:
            at = iso(store_now(uow.conn))
            self._started = self._started or at
            row.update(started_at=self._started, heartbeat_at=at)
            done = uow.conn.execute(hosts.update().where(hosts.c.name == self.plan.name).values(**row))
            if not done.rowcount:
                uow.conn.execute(hosts.insert().values(name=self.plan.name, **row))
        self._next = now + BEAT_EVERY_S
        return 0


def listing(db: Database, now: datetime | None = None) -> list[dict[str, Any]]:
    """Every host that ever beat: its last heartbeat and whether it is live, what it serves, the runs whose lease
    it holds now (a lapsed lease is no host's: the run waits to be taken over)."""
    with db.read() as conn:
        t = now or store_now(conn)  # the clock the heartbeats and leases were written by
        rows = conn.execute(sa.select(hosts).order_by(hosts.c.name)).all()
        running = conn.execute(sa.select(runs.c.run_id, runs.c.task_id, runs.c.role, runs.c.lease_owner,
                                         runs.c.lease_until)
                               .where(runs.c.state == RunState.RUNNING.value, runs.c.lease_until >= iso(t))
                               .order_by(runs.c.run_id)).all()
    out = []
    for r in rows:
        age = (t - datetime.strptime(r.heartbeat_at, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)).total_seconds()
        held = [{"run_id": x.run_id, "task_id": x.task_id, "role": x.role, "lease_until": x.lease_until}
                for x in running if x.lease_owner == r.owner or (x.lease_owner or "").rsplit(":", 1)[0] == r.name]
        out.append({"host": r.name, "owner": r.owner, "live": age <= LIVE_FOR_S, "heartbeat_at": r.heartbeat_at,
                    "heartbeat_age_s": round(age, 1), "started_at": r.started_at, "version": r.version,
                    "roles": json.loads(r.roles), "slots": json.loads(r.slots), "max_runs": r.max_runs,
                    "running": held})
    return out
