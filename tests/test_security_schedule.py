"""Issue 9, scheduler part: a schedule acts as its creator, never above it; forward clock jumps are clamped.

The attacker is another `taskkernel` process holding a DEV token, a run's task-scoped token, or a bogus
or empty one; the owner's CLI reads its credential file. Processes are costly (about a second of CPU
each on a shared machine), so setup and checks go through the library, independent attackers run
concurrently, and the every-verb credential sweep runs the real schedule commands in process. The
clock jump is tested on the virtual clock (exact counts, both backends) and through `up --once` on a
watermark written years ahead.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import typer
from typer.testing import CliRunner

from kernel.automations import max_clock_skew
from kernel.cli import schedule as schedule_cli
from kernel.cli.common import CliContext
from kernel.credentials import issue_token
from kernel.model.principal import Principal
from kernel.sessionlog import SessionLog
from kernel.store.db import Database
from scheduler import ActionContext, ActionRegistry, ActionSpec, Ledger, SchedulerRuntime, Schedules, install
from scheduler.clockjump import recent_clamps
from scheduler.models import ActionType, Creator, SchedulerException, spec_from_user
from scheduler.simulate import sim_registry
from scheduler.tables import occurrence, schedule
from scheduler.triggers import db_time
from tests.cli_support import CLI, Run, cli_env

OWNER = Principal("ADMIN", "local-owner")  # the principal of the credential `init` writes for the owner
BOGUS = "tk_" + "A" * 40  # well formed, never issued
PAST = ("--from", "2020-01-01T00:00:00Z", "--to", "2020-01-01T00:00:00Z")
VERBS = [("add", "x", "--every", "1h", "--action", "call", "--callable", "f"), ("list",), ("show", "admin-job"),
         ("next", "admin-job"), ("pause", "admin-job"), ("resume", "admin-job"), ("remove", "admin-job"),
         ("backfill", "admin-job", *PAST)]
Call = tuple[tuple[str, ...], dict[str, str]]


@dataclass
class Team:
    """A workspace made by the real `init`, its database, and credentials its owner minted."""

    root: Path
    env: dict[str, str]
    dev: str = ""
    scoped: str = ""
    db: Database = field(init=False)
    schedules: Schedules = field(init=False)

    def run(self, *calls: Call) -> list[Run]:
        """Run CLI invocations concurrently, each as its own process."""
        procs = [subprocess.Popen([*CLI, *args], cwd=self.root, env=cli_env(**self.env, **extra),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for args, extra in calls]
        outs = [p.communicate(timeout=180) for p in procs]
        return [Run(p.returncode, out, err) for p, (out, err) in zip(procs, outs, strict=True)]

    def owner(self, *args: str) -> Run:
        return self.run((args, {}))[0]

    def open(self) -> None:
        self.db = Database(self.env.get("TASKKERNEL_DB") or f"sqlite:///{self.root / '.taskkernel' / 'kernel.db'}")
        install(self.db)
        self.schedules = Schedules(Ledger(self.db))


def as_(token: str, *args: str) -> Call:
    return args, {"TASKKERNEL_TOKEN": token}


def new_team(root: Path, env: dict[str, str]) -> Team:
    t = Team(root, env)
    root.mkdir()
    init = t.owner("init", ".")
    assert init.code == 0, init.err
    (root / "t.yaml").write_text("recipient: PM\nsubject: automated {dedup_key}\n")
    t.open()
    return t


def create_task_spec(name: str, **user: Any) -> Any:
    return spec_from_user(user, name=name).model_copy(update={"action": ActionSpec(
        type=ActionType.CREATE_TASK, template={"recipient": "PM", "subject": "automated {dedup_key}"})})


@pytest.fixture(params=["sqlite", "postgresql"])
def team(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Team]:
    env = {} if request.param == "sqlite" else {"TASKKERNEL_DB": str(request.getfixturevalue("pg_url"))}
    t = new_team(tmp_path / "ws", env)
    t.dev = issue_token(t.db, "DEV")
    t.scoped = issue_token(t.db, "DEV", task_id="TASK-20260101-001", round=0)
    t.schedules.add(create_task_spec("admin-job", every="1h"), datetime.now(UTC), by=OWNER)
    yield t
    t.db.dispose()


def refused(r: Run, reason: str) -> None:
    assert r.code == 2, (r.out, r.err)
    assert (r.json["status"], r.json["reason"]) == ("rejected", reason), r.out


def test_dev_cannot_act_above_its_role_or_touch_admins_schedule(team: Team) -> None:
    tpl = ("--action", "create_task", "--template", "t.yaml")
    results = team.run(
        as_(team.dev, "schedule", "add", "escalate", "--every", "1h", "--owner", "ADMIN", *tpl),
        as_(team.scoped, "schedule", "add", "outlives-run", "--every", "1h", *tpl),
        as_(team.dev, "schedule", "backfill", "admin-job", *PAST),
        as_("", "schedule", *VERBS[0]),
    )
    for r in results[:3]:
        refused(r, "role_not_authorized")
    refused(results[3], "actor_unverified")
    [job] = team.schedules.all()  # nothing written
    assert (job.name, job.revision, job.paused, team.schedules.outcomes(job)) == ("admin-job", 0, False, [])


def in_process(team: Team, token: str, *args: str) -> Run:
    """One real `schedule` command in this process, as a caller holding ``token``."""
    holder = CliContext(workspace_path=str(team.root), db_url=team.env.get("TASKKERNEL_DB"), token=token)
    root = typer.Typer()

    @root.callback()
    def _global(ctx: typer.Context) -> None:
        ctx.obj = holder

    root.add_typer(schedule_cli.app, name="schedule")
    res = CliRunner().invoke(root, ["schedule", *args])
    holder.database().dispose()
    return Run(res.exit_code, res.stdout, "")


def test_every_schedule_verb_checks_the_credential_and_every_change_the_role(team: Team) -> None:
    for verb in VERBS:
        for token in (BOGUS, ""):
            refused(in_process(team, token, *verb), "actor_unverified")
    for verb in VERBS[4:]:  # pause, resume, remove, backfill: ADMIN's, or its creator's role
        refused(in_process(team, team.dev, *verb), "role_not_authorized")
    [job] = team.schedules.all()
    assert (job.name, job.revision) == ("admin-job", 0)
    assert in_process(team, team.dev, "show", "admin-job").json["created_by"]["role"] == "ADMIN"  # reads are open


def test_a_dev_schedule_creates_its_tasks_as_dev(team: Team) -> None:
    added, = team.run(as_(team.dev, "schedule", "add", "dev-job", "--every", "1h", "--start", "2020-01-01T00:00:00Z",
                          "--action", "create_task", "--template", "t.yaml"))
    assert added.code == 0, added.out
    assert added.json["schedule"]["owner_role"] == "DEV"
    assert added.json["schedule"]["created_by"] == {"role": "DEV", "agent": "dev", "task_id": None, "round": None}
    # Its creator's role may change it: queue a past occurrence, so it fires without waiting.
    queued, = team.run(as_(team.dev, "schedule", "backfill", "dev-job", *PAST))
    assert queued.json["queued"] == ["2020-01-01T00:00:00Z"], queued.out
    up = team.owner("up", "--once")
    assert up.code == 0, up.out
    [fired] = team.schedules.outcomes(team.schedules.get("dev-job"))
    assert fired["state"] == "done", fired
    doc = team.owner("task", "show", fired["run_ref"]).json
    assert doc["sender"] == "DEV" and doc["subject"] == "automated 2020-01-01T00:00:00Z"
    assert doc["history"][0]["type"] == "task_created" and doc["history"][0]["by"] == "DEV:scheduler:dev-job"


def test_forward_clock_jump_through_up_once_is_clamped_and_shown(tmp_path: Path) -> None:
    t = new_team(tmp_path / "ws", {})
    t.schedules.add(create_task_spec("beat", every="2s"), datetime.now(UTC), by=OWNER)
    ahead = datetime.now(UTC) + timedelta(days=3 * 365)
    with t.db.write() as uow:  # what a coordinator whose clock ran years ahead leaves behind
        uow.conn.execute(schedule.update().values(watermark_utc=db_time(ahead), next_due_utc=db_time(ahead)))
    up = t.owner("up", "--once")
    assert up.code == 0, up.out
    logged = [json.loads(line) for line in up.err.splitlines() if "schedule_clock_jump" in line]
    assert logged and logged[0]["reason"] == "clock_jump" and logged[0]["schedule"] == "beat"
    time.sleep(2.2)
    assert t.owner("up", "--once").code == 0
    shown = t.owner("schedule", "show", "beat").json
    assert [j["reason"] for j in shown["clock_jumps"]] == ["clock_jump"]
    assert shown["clock_jumps"][0]["watermark_from"].startswith(str(ahead.year))
    assert datetime.fromisoformat(shown["watermark"]) < datetime.now(UTC)  # on real time again
    fired = [o for o in shown["outcomes"] if o["state"] != "missed"]
    assert fired and {o["state"] for o in fired} == {"done"}
    assert len({o["dedup_key"] for o in fired}) == len(fired)
    t.db.dispose()


# -- in process: the rules at the scheduler's API, the virtual clock ----------------------------------------


T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _spec(name: str, **user: Any) -> Any:
    return spec_from_user({"every": "1d", "start": T0.isoformat(), **user}, name=name).model_copy(
        update={"action": ActionSpec(callable="simulate")})


def test_forward_clock_jump_is_clamped_recorded_and_fires_once_per_key(any_db: Database) -> None:
    install(any_db)
    keys: Counter[str] = Counter()

    def record(ctx: ActionContext) -> None:
        keys[ctx.claim.key] += 1

    rt = SchedulerRuntime(any_db, sim_registry(record), clock=lambda: T0, owner="c1")
    row = Schedules(rt.ledger).add(_spec("daily"), T0)
    day = timedelta(days=1)
    assert rt.tick(T0 + day).claimed == 1
    jumped = T0 + 2 * 365 * day  # the clock runs two years ahead: that one decides ~730 occurrences
    assert rt.tick(jumped).claimed == 1  # latest_once: the newest fires, the rest are missed
    back = rt.tick(T0 + day + timedelta(hours=1))  # the clock is right again
    assert [j.name for j in back.clock_jumps] == ["daily"] and back.claimed == 0
    [clamp] = recent_clamps(rt.ledger, row.id)
    assert clamp["reason"] == "clock_jump" and clamp["watermark_to"] == "2026-01-02T01:00:00Z"
    assert clamp["reopened"] == 728  # missed on the wrong clock, decided again when they come due
    assert rt.tick(T0 + 2 * day).claimed == 1 and rt.tick(T0 + 2 * day).claimed == 0
    assert rt.tick(T0 + 3 * day).claimed == 1
    assert rt.tick(jumped + timedelta(hours=1)).claimed == 0  # the key fired early is a duplicate now
    assert max(keys.values()) == 1 and len(keys) == 4
    with any_db.read() as conn:
        states = Counter(conn.execute(sa.select(occurrence.c.state).where(occurrence.c.schedule_id == row.id))
                         .scalars())
    assert states["done"] == 4


def test_skew_within_the_limit_is_left_alone_and_the_limit_is_configurable(sqlite_db: Database) -> None:
    install(sqlite_db)
    rt = SchedulerRuntime(sqlite_db, sim_registry(), clock=lambda: T0, owner="c1", max_clock_skew=timedelta(hours=1))
    Schedules(rt.ledger).add(_spec("hourly", every="1h"), T0)
    rt.tick(T0 + timedelta(minutes=150))  # watermark: the 02:00 occurrence
    assert rt.tick(T0 + timedelta(minutes=70)).clock_jumps == []  # 50 min ahead: within the hour
    assert [j.name for j in rt.tick(T0 + timedelta(minutes=50)).clock_jumps] == ["hourly"]


def test_max_clock_skew_config() -> None:
    assert max_clock_skew({}) == timedelta(days=1)
    assert max_clock_skew({"max_clock_skew": "6h"}) == timedelta(hours=6)
    with pytest.raises(ValueError, match=r"\[scheduler\] max_clock_skew"):
        max_clock_skew({"max_clock_skew": "soon"})


def test_a_definition_above_its_creator_never_fires(sqlite_db: Database) -> None:
    install(sqlite_db)
    rt = SchedulerRuntime(sqlite_db, sim_registry(), clock=lambda: T0, owner="c1")
    forged = _spec("forged", owner_role="ADMIN").model_copy(update={"created_by": Creator(role="DEV", agent="dev")})
    Schedules(rt.ledger).add(forged, T0)  # written without a caller to check, as a hand edit would be
    [outcome] = rt.tick(T0 + timedelta(days=1)).outcomes
    assert outcome.state.value == "failed" and (outcome.detail or "").startswith("role_not_authorized")


def test_management_rules_and_schedules_from_before_creators_were_recorded(sqlite_db: Database) -> None:
    install(sqlite_db)
    admin = Schedules(Ledger(sqlite_db))
    admin.add(_spec("legacy-dev", owner_role="DEV"), T0)  # no creator recorded: stands for its owner role
    dev, qa = Principal("DEV", "dev"), Principal("QA", "qa")
    with pytest.raises(SchedulerException, match="role_not_authorized"):
        admin.pause("legacy-dev", T0, by=qa)
    assert admin.pause("legacy-dev", T0, by=dev).paused
    with pytest.raises(SchedulerException, match="task-scoped"):
        admin.remove("legacy-dev", T0, by=Principal("ADMIN", "run", task_id="TASK-20260101-001", round=0))
    assert admin.remove("legacy-dev", T0, by=Principal("ADMIN", "owner")).removed


def test_an_agents_schedule_speaks_with_its_own_role_in_sessions(sqlite_db: Database) -> None:
    install(sqlite_db)
    log = SessionLog(sqlite_db)
    rt = SchedulerRuntime(sqlite_db, ActionRegistry(session_log=log), clock=lambda: T0, owner="c1")
    admin, dev = Schedules(rt.ledger), Principal("DEV", "dev")
    grant = ActionSpec(type=ActionType.ACCEPT_INPUT, session="admin", kind="allow", payload={"permission": "approve"})
    with pytest.raises(SchedulerException, match="role_not_authorized"):
        admin.add(_spec("grant", owner_role="DEV").model_copy(update={"action": grant}), T0, by=dev)
    for name, session, owner, by in (("note", "dev-notes", "DEV", dev), ("owner-note", "notes", "ADMIN", OWNER)):
        note = ActionSpec(type=ActionType.ACCEPT_INPUT, session=session, kind="message",
                          payload={"text": "{dedup_key}"})
        admin.add(_spec(name, owner_role=owner).model_copy(update={"action": note}), T0, by=by)
    rt.tick(T0 + timedelta(days=1))
    assert [r.accepted_by for r in log.records("dev-notes")] == ["DEV:scheduler:note"]  # an agent's trust
    assert [r.accepted_by for r in log.records("notes")] == ["SYSTEM:scheduler"]
    assert log.owner("dev-notes") == "DEV:scheduler:note"
