"""Issue 9, scheduler part: a schedule acts as its creator, never above it; forward clock jumps are clamped;
poison numbers are usage errors; one schedule that cannot be computed never stops the others.

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
from pydantic import ValidationError
from typer.testing import CliRunner

from taskkernel.coordinator.automations import max_clock_skew
from taskkernel.coordinator.cli import schedule as schedule_cli
from taskkernel.coordinator.cli.common import CliContext
from taskkernel.kernel.credentials import issue_token
from taskkernel.kernel.model.principal import Principal
from taskkernel.kernel.sessionlog import SessionLog
from taskkernel.kernel.store.db import Database
from taskkernel.scheduler import ActionContext, ActionRegistry, ActionSpec, Ledger, SchedulerRuntime, Schedules, install
from taskkernel.scheduler.clockjump import recent_clamps
from taskkernel.scheduler.models import (
    MAX_DURATION_S,
    ActionType,
    Creator,
    ScheduleError,
    SchedulerException,
    ScheduleSpec,
    parse_duration,
    parse_instant,
    spec_from_user,
)
from taskkernel.scheduler.runtime import SchedulesSetAside
from taskkernel.scheduler.simulate import sim_registry
from taskkernel.scheduler.tables import occurrence, schedule, schedule_fault
from taskkernel.scheduler.triggers import db_time, parse_calendar
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
    (root / "t.yaml").write_text("recipient: PM\nsubject: automated {dedup_key}\ndone_authority: ADMIN\n")
    t.open()
    return t


def create_task_spec(name: str, **user: Any) -> Any:
    return spec_from_user(user, name=name).model_copy(update={"action": ActionSpec(
        type=ActionType.CREATE_TASK, template={"recipient": "PM", "subject": "automated {dedup_key}"})})


@pytest.fixture(params=["sqlite", "postgresql"])
def team(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Team]:
    """Both backends where the store matters; ``above_the_store`` narrows it to SQLite for the refusals the CLI
    and kernel/delegation.py decide before anything is stored, by the same code on either."""
    env = {} if request.param == "sqlite" else {"TASKKERNEL_DB": str(request.getfixturevalue("pg_url"))}
    t = new_team(tmp_path / "ws", env)
    t.dev = issue_token(t.db, "DEV")
    t.scoped = issue_token(t.db, "DEV", task_id="TASK-20260101-001", round=0)
    t.schedules.add(create_task_spec("admin-job", every="1h"), datetime.now(UTC), by=OWNER)
    yield t
    t.db.dispose()


above_the_store = pytest.mark.parametrize("team", ["sqlite"], indirect=True)


def refused(r: Run, reason: str) -> None:
    assert r.code == 2, (r.out, r.err)
    assert (r.json["status"], r.json["reason"]) == ("rejected", reason), r.out


@above_the_store  # refused before anything is written
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


@above_the_store  # the template is judged before the store
def test_a_schedule_cannot_hand_a_tasks_powers_beyond_its_owners_reach(team: Team) -> None:
    """Its fires would be refused for ever: the template is judged by kernel/delegation.py at `schedule add`."""
    (team.root / "judge.yaml").write_text("recipient: PM\nsubject: s\ndriver: PM\ndone_authority: PM\n")
    (team.root / "peer.yaml").write_text("recipient: PM\nsubject: s\ndone_authority: QA\n")
    for template in ("judge.yaml", "peer.yaml"):
        added, = team.run(as_(team.dev, "schedule", "add", "j", "--every", "1h", "--action", "create_task",
                              "--template", template))
        refused(added, "role_not_authorized")
        assert "nobody judges its own work" in added.out or "may not name QA" in added.out, added.out
    assert [job.name for job in team.schedules.all()] == ["admin-job"]


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


@above_the_store  # credential and role checks come first
def test_every_schedule_verb_checks_the_credential_and_every_change_the_role(team: Team) -> None:
    for verb in VERBS:
        for token in (BOGUS, ""):
            refused(in_process(team, token, *verb), "actor_unverified")
    for verb in VERBS[4:]:  # pause, resume, remove, backfill: ADMIN's, or its creator's role
        refused(in_process(team, team.dev, *verb), "role_not_authorized")
    [job] = team.schedules.all()
    assert (job.name, job.revision) == ("admin-job", 0)
    assert in_process(team, team.dev, "show", "admin-job").json["created_by"]["role"] == "ADMIN"  # reads are open


# both stores: the creator is stored with the schedule and read back when it fires
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


# -- poison numbers: a usage error or a coded refusal, never a traceback; one bad schedule never stops the others --

BIG = str(2**64)
INT64 = "9223372036854775807s"
EVERY = ("--every", "1h")
POISON_ADDS = [  # (flags, the flag the message must name)
    (("--every", "99999999999999999999999h"), "--every"),
    (("--every", INT64), "--every"),
    (("--calendar", "months=99999999999999999999"), "--calendar"),
    (("--start", "0001-01-01T00:00:00Z", *EVERY), "--start"),
    (("--max-attempts", "-1", *EVERY), "--max-attempts"),
    *[((flag, BIG, *EVERY), flag) for flag in ("--catchup-max", "--fuse", "--max-attempts", "--jitter",
                                               "--catchup-window", "--grace")],
    *[((flag, INT64, *EVERY), flag) for flag in ("--jitter", "--grace")],
    (("--catchup-window", INT64, "--misfire", "all", *EVERY), "--catchup-window"),
]


def test_poison_numbers_are_usage_errors_and_write_nothing(tmp_path: Path) -> None:
    t = new_team(tmp_path / "ws", {})
    dev = issue_token(t.db, "DEV")
    dev_principal = Principal("DEV", "dev")
    t.schedules.add(create_task_spec("j4", cron="0 * * * *", owner_role="DEV"), datetime.now(UTC), by=dev_principal)
    tpl = ("--action", "create_task", "--template", "t.yaml")
    calls = [as_(dev, "schedule", "add", f"p{i}", *flags, *tpl) for i, (flags, _) in enumerate(POISON_ADDS)]
    calls += [as_(dev, "schedule", "backfill", "j4", "--from", "0001-01-01T00:00:00Z", "--to", "2026-01-01T00:00:00Z"),
              as_(dev, "schedule", "backfill", "j4", *PAST, "--max", BIG)]
    results = t.run(*calls)
    for (args, _), r in zip(calls, results, strict=True):
        assert r.code == 64, (args, r.code, r.out, r.err)
        assert "Traceback" not in r.err, (args, r.err)
        doc = r.json
        assert doc["status"] == "error" and doc["code"] == "usage" and doc["reason"].startswith("invalid_"), doc
        assert "pydantic" not in doc["message"], doc
    for (flags, flag), r in zip(POISON_ADDS, results, strict=False):
        assert r.json["message"].startswith(f"{flag}:"), (flags, r.json)
    assert [s.name for s in t.schedules.all()] == ["j4"]  # nothing written
    [j4] = t.schedules.all()
    assert (j4.revision, t.schedules.outcomes(j4)) == (0, [])
    t.db.dispose()


def poison(db: Database, name: str, **patch: Any) -> None:
    """Rewrite a stored definition past the API's checks, as a hand edit or an older release could."""
    with db.write() as uow:
        text = uow.conn.execute(sa.select(schedule.c.definition).where(schedule.c.name == name)).scalar_one()
        definition = {**json.loads(text), **patch}
        uow.conn.execute(schedule.update().where(schedule.c.name == name).values(definition=json.dumps(definition)))


def test_a_stored_poison_schedule_is_set_aside_and_the_others_fire_through_up_once(tmp_path: Path) -> None:
    t = new_team(tmp_path / "ws", {})
    created = datetime.now(UTC) - timedelta(minutes=3)  # so an occurrence of each is due now
    t.schedules.add(create_task_spec("adm", every="1m"), created, by=OWNER)
    for name in ("evil", "evil-window"):
        t.schedules.add(create_task_spec(name, every="1m", owner_role="DEV"), created, by=Principal("DEV", "dev"))
    poison(t.db, "evil", grace=2**63 - 1)
    poison(t.db, "evil-window", catchup_window=2**63 - 1, misfire="all")
    up = t.owner("up", "--once")
    assert up.code == 1 and up.json["status"] == "degraded", (up.out, up.err)  # the pass ran to its end
    [failed] = up.json["failed_stages"]
    assert failed["stage"] == "automations" and "evil" in failed["message"], failed
    [fired] = [o for o in t.schedules.outcomes(t.schedules.get("adm")) if o["state"] != "missed"]
    assert fired["state"] == "done" and fired["run_ref"].startswith("TASK-"), fired
    listed = t.owner("schedule", "list")  # the list still reads, with the reason
    assert listed.code == 0, listed.out
    views = {v["name"]: v for v in listed.json["schedules"]}
    for name in ("evil", "evil-window"):
        assert (views[name]["paused"], views[name]["pause_reason"], views[name]["next_due"]) == (True, "invalid", None)
        assert "must be at most 315360000" in views[name]["error"]
    assert views["adm"]["paused"] is False and "error" not in views["adm"]
    again = t.owner("up", "--once")  # set aside durably: the next pass is clean, the good one keeps firing
    assert again.code == 0, again.out
    t.db.dispose()


def _good(name: str) -> ScheduleSpec:
    return _spec(name, every="1h")


POISONS: dict[str, dict[str, Any]] = {
    "grace": {"grace": 2**63 - 1},
    "window": {"catchup_window": 2**63 - 1, "misfire": "all"},
    "jitter": {"jitter": 2**63 - 1},
    "catchup": {"catchup_max": 2**64},
    "interval": {"spec": "9" * 30},
    "start": {"start": "0001-01-01T00:00:00+09:00"},
    "action": {"action": {"type": "call", "callable": "simulate", "max_attempts": -1}},
}


def test_poison_definitions_are_set_aside_and_never_stop_the_others(any_db: Database) -> None:
    install(any_db)
    fired: Counter[str] = Counter()

    def record(ctx: ActionContext) -> None:
        fired[ctx.claim.name] += 1

    rt = SchedulerRuntime(any_db, sim_registry(record), clock=lambda: T0, owner="c1")
    admin = Schedules(rt.ledger)
    admin.add_many([_good("good"), *[_good(name) for name in POISONS]], T0)
    for name, patch in POISONS.items():
        poison(any_db, name, **patch)
    with any_db.write() as uow:  # not JSON at all
        uow.conn.execute(schedule.update().where(schedule.c.name == "grace").values(definition="{not json"))
    with pytest.raises(SchedulesSetAside) as caught:
        rt.tick(T0 + timedelta(hours=1))
    report = caught.value.report
    assert caught.value.code is ScheduleError.SCHEDULE_INVALID
    assert sorted(f.name for f in report.faults) == sorted(POISONS)
    assert fired == {"good": 1} and [o.state.value for o in report.outcomes] == ["done"]
    assert rt.tick(T0 + timedelta(hours=2)).claimed == 1 and fired == {"good": 2}  # set aside: a clean pass
    views = {s.name: s for s in admin.all()}  # listing reads every row, however broken
    for name in POISONS:
        row = views[name]
        assert (row.paused, row.pause_reason, row.next_due) == (True, "invalid", None), name
        assert admin.view(row)["pause_reason"] == "invalid"
        with pytest.raises(SchedulerException, match="schedule_invalid"):
            admin.resume(name, T0 + timedelta(hours=2), by=OWNER)
        with pytest.raises(SchedulerException, match="schedule_invalid"):
            admin.upcoming(row, T0, 5)
    assert "must be at most" in (views["catchup"].error or "") and views["good"].error is None
    with any_db.read() as conn:
        errors = dict(conn.execute(sa.select(schedule.c.name, schedule_fault.c.error)
                                   .join(schedule, schedule.c.id == schedule_fault.c.schedule_id)).all())
    assert set(errors) == set(POISONS) and "Invalid JSON" in errors["grace"] and "interval" in errors["interval"]
    # The creator's role still manages its broken schedule; nobody else does.
    with pytest.raises(SchedulerException, match="role_not_authorized"):
        admin.remove("window", T0, by=Principal("DEV", "dev"))
    assert admin.remove("window", T0, by=OWNER).removed


def test_waiting_and_running_occurrences_of_a_poisoned_schedule_are_contained(sqlite_db: Database) -> None:
    install(sqlite_db)
    rt = SchedulerRuntime(sqlite_db, sim_registry(), clock=lambda: T0, owner="c1", lease_s=60)
    admin = Schedules(rt.ledger)
    admin.add_many([_good("good"), _good("queued"), _good("stuck")], T0)
    rt.ledger.claim_due("dead", T0 + timedelta(hours=1))  # a coordinator claims all three, then dies
    admin.backfill("queued", T0 + timedelta(hours=1), T0 + timedelta(hours=1), T0 + timedelta(hours=1))
    with sqlite_db.write() as uow:  # one waits to be started again, one holds an expired lease
        uow.conn.execute(occurrence.update().where(occurrence.c.schedule_id == admin.get("queued").id)
                         .values(state="claimed", lease_owner=None, lease_until=None))
    poison(sqlite_db, "queued", grace=2**63 - 1)
    poison(sqlite_db, "stuck", jitter=2**63 - 1)
    report = rt.tick(T0 + timedelta(hours=2), raise_set_aside=False)
    assert sorted(f.name for f in report.faults) == ["queued", "stuck"]
    assert [(o.claim.name, o.claim.key, o.state.value) for o in report.outcomes] == [
        ("good", "2026-01-01T02:00:00Z", "done")]
    with sqlite_db.read() as conn:
        states = {(name, key): (state, detail) for name, key, state, detail in conn.execute(
            sa.select(schedule.c.name, occurrence.c.occurrence_key, occurrence.c.state, occurrence.c.detail)
            .join(schedule, schedule.c.id == occurrence.c.schedule_id))}
    assert states["stuck", "2026-01-01T01:00:00Z"][0] == "abandoned"
    assert "definition is invalid" in states["stuck", "2026-01-01T01:00:00Z"][1]
    assert states["queued", "2026-01-01T01:00:00Z"][0] == "claimed"  # waits: a removal or a valid resume ends it
    assert {key for name, key in states if name != "good"} <= {"2026-01-01T00:00:00Z", "2026-01-01T01:00:00Z"}


def test_a_poisoned_schedule_far_ahead_is_set_aside_by_the_clock_check(sqlite_db: Database) -> None:
    install(sqlite_db)
    rt = SchedulerRuntime(sqlite_db, sim_registry(), clock=lambda: T0, owner="c1")
    Schedules(rt.ledger).add_many([_good("good"), _good("ahead")], T0)
    ahead = db_time(T0 + timedelta(days=3 * 365))
    with sqlite_db.write() as uow:
        uow.conn.execute(schedule.update().where(schedule.c.name == "ahead")
                         .values(watermark_utc=ahead, next_due_utc=ahead))
    poison(sqlite_db, "ahead", spec="0")
    report = rt.tick(T0 + timedelta(hours=1), raise_set_aside=False)
    assert [f.name for f in report.faults] == ["ahead"] and report.claimed == 1 and report.clock_jumps == []


def test_bounds() -> None:
    assert parse_duration("3650d") == MAX_DURATION_S == parse_duration(MAX_DURATION_S)
    for bad in ("3651d", MAX_DURATION_S + 1, "9" * 5000, float("inf"), float("nan"), "²", 2**64):
        with pytest.raises(SchedulerException, match="invalid_duration"):
            parse_duration(bad)  # type: ignore[arg-type]
    assert parse_calendar("years=10, hour=23") == {"years": 10, "hour": 23}
    for bad in ("years=11", "months=121", "days=3651", "hour=24", "months=" + "9" * 5000):
        with pytest.raises(SchedulerException, match="out of range"):
            parse_calendar(bad)
    for bad in ("1969-12-31T23:59:59Z", "9000-01-01T00:00:00Z", "0001-01-01T00:00:00"):
        with pytest.raises(SchedulerException, match="out of range"):
            parse_instant(bad, "Asia/Tokyo")
    with pytest.raises(SchedulerException, match="catchup_max: must be at most 1000"):
        spec_from_user({"every": "1h", "catchup_max": 1001})
    for key, value in (("grace", MAX_DURATION_S + 1), ("jitter", 2**64)):
        with pytest.raises(SchedulerException, match=f"invalid_duration: {key}: .* longer than ten years"):
            spec_from_user({"every": "1h", key: value})
        with pytest.raises(ValidationError, match="less than or equal to 315360000"):  # the model holds them too
            ScheduleSpec.model_validate({"name": "x", "kind": "interval", "spec": "60", key: value})
    with pytest.raises(SchedulerException, match=r"max_attempts: must be at most 100 \(got 101\)"):
        spec_from_user({"every": "1h", "action": {"callable": "f", "max_attempts": 101}})
    with pytest.raises(ValidationError, match="template.n: nan is not a JSON number"):
        ActionSpec(type=ActionType.CREATE_TASK, template={"recipient": "PM", "subject": "s", "n": float("nan")})
