"""Hosts of a team on one store (issue 30, docs/hosts.md): `up --host NAME` runs agents only for the roles its
[hosts.NAME] table lists, each coordinator keeps its heartbeat in the store, `taskkernel hosts` lists them; a host
name the file lacks, a malformed one, and [hosts] tables naming roles without a runner are refused."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest
import sqlalchemy as sa

from taskkernel.coordinator.hosts import HostRegistry
from tests.cli_support import CLI, append_config, cli_env, new_workspace, run, stop_server
from tests.coord_support import admin_task, coordinator, make_workspace
from tests.test_web_security import reads_as_signed_in
from tests.web_support import board, issue, sign_in

HOSTS = """
[hosts.alpha]
roles = ["DEV"]

[hosts.beta]
roles = ["QA"]
slots = { QA = 2 }
"""


def agent_script(tmp_path: Path) -> Path:
    """A command agent that reports its task done with its run's token."""
    agent = tmp_path / "agent.py"
    agent.write_text(textwrap.dedent("""
        import os, subprocess, sys
        subprocess.run([sys.executable, "-m", "taskkernel", "task", "report", os.environ["TASKKERNEL_TASK_ID"],
                        "--status", "done", "--body", "ok"], check=True, capture_output=True)
    """), encoding="utf-8")
    return agent


def reported(doc: dict[str, Any] | None) -> bool:
    return doc is not None and any(r["status"] == "done" for r in doc["reports"])


def test_two_hosts_on_one_postgres_store_each_run_their_own_roles(pg_url: str, tmp_path: Path) -> None:
    """Two long-running `up --host` on one PostgreSQL store: every DEV task runs on alpha, every QA task on beta
    (two at once there), each once; `taskkernel hosts` lists both live, with their roles, slots and heartbeat."""
    argv = [sys.executable, str(agent_script(tmp_path))]
    ws = make_workspace(tmp_path / "ws", {"DEV": {"runner": "command", "argv": argv},
                                          "QA": {"runner": "command", "argv": argv}}, database=pg_url)
    append_config(ws.root, HOSTS)
    c = coordinator(ws)
    made = {admin_task(c, subject=f"job {i}", recipient=("DEV", "QA")[i % 2]): ("DEV", "QA")[i % 2]
            for i in range(10)}
    logs = {name: (tmp_path / f"{name}.log").open("w") for name in ("alpha", "beta")}
    procs = {name: subprocess.Popen([*CLI, "up", str(ws.root), "--host", name], cwd=tmp_path, env=cli_env(),
                                    stdout=log, stderr=subprocess.STDOUT, text=True) for name, log in logs.items()}
    try:
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            if all(reported(c.kernel.task(t)) for t in made):
                break
            assert all(p.poll() is None for p in procs.values()), [p.returncode for p in procs.values()]
            time.sleep(0.3)
        listed = run("hosts", "--json", cwd=ws.root)
    finally:
        for p in procs.values():
            p.send_signal(signal.SIGTERM)
        for name, p in procs.items():
            assert p.wait(timeout=60) == 0, (tmp_path / f"{name}.log").read_text()[-3000:]
            logs[name].close()
    assert all(reported(c.kernel.task(t)) for t in made), "every task ran and reported"
    started = {name: [json.loads(line)["task_id"] for line in (tmp_path / f"{name}.log").read_text().splitlines()
                      if '"run_started"' in line] for name in procs}
    assert sorted(started["alpha"]) == sorted(t for t, role in made.items() if role == "DEV")
    assert sorted(started["beta"]) == sorted(t for t, role in made.items() if role == "QA")
    assert listed.code == 0, listed.err
    hosts = {h["host"]: h for h in listed.json["hosts"]}
    assert set(hosts) == {"alpha", "beta"}
    assert (hosts["alpha"]["roles"], hosts["alpha"]["slots"]) == (["DEV"], {"DEV": 1})
    assert (hosts["beta"]["roles"], hosts["beta"]["slots"]) == (["QA"], {"QA": 2})
    assert all(h["live"] and h["heartbeat_age_s"] < 30 and h["owner"].startswith(f"{name}:")
               for name, h in hosts.items())


def test_a_host_serves_only_its_roles_and_says_which_it_is(tmp_path: Path) -> None:
    """`up --once --host beta` leaves DEV's run pending for alpha; a host name the file lacks is refused with the
    hosts it has (exit 64, unknown_host), a malformed one too (invalid_host_name); without [hosts] every
    coordinator runs every role and is listed under the machine's name."""
    root = new_workspace(tmp_path)
    append_config(root, '[roles.DEV]\nrunner = "scripted"\n[roles.QA]\nrunner = "scripted"\n' + HOSTS)
    created = {role: json.loads(run("task", "create", "--to", role, "--subject", f"{role} job", "--json",
                                    cwd=root).out)["task_id"] for role in ("DEV", "QA")}
    beta = run("up", "--once", "--host", "beta", "--json", cwd=root)
    assert beta.code == 0, beta.err
    assert [r["task_id"] for r in beta.json["pending"]] == [created["DEV"]], "DEV's run waits for alpha"
    unknown = run("up", "--once", "--host", "gamma", "--json", cwd=root)
    assert unknown.code == 64 and unknown.json["code"] == "unknown_host"
    assert "alpha, beta" in unknown.json["message"]
    bad = run("up", "--once", "--host", "no such/host", "--json", cwd=root)
    assert bad.code == 64 and bad.json["code"] == "invalid_host_name"
    alpha = run("up", "--once", "--host", "alpha", "--json", cwd=root)
    assert alpha.code == 0 and alpha.json["pending"] == [], alpha.err
    listed = run("hosts", "--json", cwd=root).json["hosts"]
    assert [h["host"] for h in listed] == ["alpha", "beta"]
    with board(root) as url:  # the board lists them as the CLI does, on the Runs page too
        shown = httpx2.get(url + "api/hosts").json()
        page = httpx2.get(url + "runs").text
    assert [(h["host"], h["roles"], h["slots"]) for h in shown] == [(h["host"], h["roles"], h["slots"])
                                                                    for h in listed]
    assert '<tr class="host-live"><td>alpha</td>' in page and "QA 2" in page


@pytest.mark.parametrize(("table", "problem"), [
    ('[hosts.alpha]\nroles = ["OPS"]\n', "OPS has no [roles.OPS] table"),
    ('[hosts.alpha]\nroles = ["DEV"]\nslots = { QA = 1 }\n', "QA is not one of this host's roles"),
    ('[hosts."al pha"]\nroles = ["DEV"]\n', "is not a host name"),
    ('[hosts.alpha]\nroles = []\n', "roles"),
])
def test_a_hosts_table_that_cannot_work_is_refused(tmp_path: Path, table: str, problem: str) -> None:
    ws = make_workspace(tmp_path / "ws", {"DEV": {"runner": "scripted"}, "QA": {"runner": "scripted"}})
    append_config(ws.root, table)
    doctor = run("doctor", "--json", cwd=ws.root)
    assert doctor.code != 0 and problem in doctor.out, doctor.out


def test_a_host_joins_the_store_with_a_bundle_never_through_the_database(pg_url: str, tmp_path: Path) -> None:
    """`invite` (the owner) writes the chain key and owner credential into a 0600 bundle; `join` in another host's
    workspace (a clone's taskkernel.toml, no .taskkernel/) writes them 0600, after which that host acts on the
    shared store and `verify` proves it. A bundle others can read, one that is not a bundle, a workspace holding
    another store's key, and a caller without the owner's credential are refused."""
    first = tmp_path / "first"
    assert run("--db", pg_url, "init", str(first), cwd=tmp_path).code == 0
    made = run("task", "create", "--to", "DEV", "--subject", "from the first host", "--json", cwd=first)
    assert made.code == 0, made.err
    worker = issue(first, "DEV", "dev-1")
    refused = subprocess.run([*CLI, "invite", "--out", str(tmp_path / "x.json"), "--json"], cwd=first,
                             env=cli_env(TASKKERNEL_TOKEN=worker), capture_output=True, text=True)
    assert refused.returncode == 2 and json.loads(refused.stdout)["reason"] == "role_not_authorized"
    bundle = tmp_path / "bundle.json"
    invited = run("invite", "--out", str(bundle), "--json", cwd=first)
    assert invited.code == 0 and bundle.stat().st_mode & 0o777 == 0o600, invited.err
    assert run("invite", "--out", str(bundle), "--json", cwd=first).json["code"] == "bundle_exists"

    second = tmp_path / "second"
    second.mkdir()
    (second / "taskkernel.toml").write_bytes((first / "taskkernel.toml").read_bytes())  # as a clone has it
    bundle.chmod(0o644)
    assert run("join", str(bundle), "--json", cwd=second).json["code"] == "bundle_exposed"
    bundle.chmod(0o600)
    joined = run("join", str(bundle), "--json", cwd=second)
    assert joined.code == 0 and joined.json["wrote"] == ["chain.key", "owner.token"], joined.err
    for name in ("chain.key", "owner.token"):
        assert (second / ".taskkernel" / name).read_bytes() == (first / ".taskkernel" / name).read_bytes()
        assert (second / ".taskkernel" / name).stat().st_mode & 0o777 == 0o600
    assert run("join", str(bundle), "--json", cwd=second).json["wrote"] == [], "joining again changes nothing"
    there = run("task", "create", "--to", "DEV", "--subject", "from the second host", "--json", cwd=second)
    assert there.code == 0, there.err
    listed = {t["subject"] for t in json.loads(run("task", "list", "--json", cwd=first).out)}
    assert listed == {"from the first host", "from the second host"}
    assert run("verify", cwd=second).code == 0 and run("verify", cwd=first).code == 0

    (tmp_path / "junk.json").write_text('{"format": "taskkernel-join/1"}')
    (tmp_path / "junk.json").chmod(0o600)
    assert run("join", str(tmp_path / "junk.json"), "--json", cwd=second).json["code"] == "invalid_bundle"
    other = tmp_path / "other"
    other.mkdir()
    (other / "taskkernel.toml").write_bytes((first / "taskkernel.toml").read_bytes())
    (other / ".taskkernel").mkdir(mode=0o700)
    (other / ".taskkernel" / "chain.key").write_text("ab" * 32 + "\n")
    conflict = run("join", str(bundle), "--json", cwd=other)
    assert conflict.code == 2 and conflict.json["reason"] == "join_conflict"
    assert (other / ".taskkernel" / "chain.key").read_text() == "ab" * 32 + "\n", "another store's key is kept"
    (other / ".taskkernel" / "chain.key").unlink()
    (other / ".taskkernel" / "owner.token").write_text("tk_" + "x" * 40 + "\n")
    half = run("join", str(bundle), "--json", cwd=other)
    assert half.code == 2 and half.json["reason"] == "join_conflict"
    assert not (other / ".taskkernel" / "chain.key").exists(), "a refused join writes nothing"
    default = run("invite", "--json", cwd=first)
    assert default.code == 0 and default.json["bundle"] == str(first / ".taskkernel" / "join-bundle.json")


def test_hosts_lists_the_runs_a_host_holds_while_they_run(tmp_path: Path) -> None:
    """While a DEV agent works on alpha, `taskkernel hosts` lists its run under alpha (and nothing under beta);
    once it reported, nothing."""
    go = tmp_path / "go"
    agent = tmp_path / "waiting_agent.py"
    agent.write_text(textwrap.dedent(f"""
        import os, pathlib, subprocess, sys, time
        deadline = time.time() + 60
        while not pathlib.Path({str(go)!r}).exists() and time.time() < deadline:
            time.sleep(0.1)
        subprocess.run([sys.executable, "-m", "taskkernel", "task", "report", os.environ["TASKKERNEL_TASK_ID"],
                        "--status", "done", "--body", "ok"], check=True, capture_output=True)
    """), encoding="utf-8")
    argv = [sys.executable, str(agent)]
    ws = make_workspace(tmp_path / "ws", {"DEV": {"runner": "command", "argv": argv},
                                          "QA": {"runner": "command", "argv": argv}})
    append_config(ws.root, HOSTS)
    c = coordinator(ws)
    task = admin_task(c, subject="slow job", recipient="DEV")
    with (tmp_path / "alpha.log").open("w") as log:
        alpha = subprocess.Popen([*CLI, "up", str(ws.root), "--host", "alpha"], cwd=tmp_path, env=cli_env(),
                                 stdout=log, stderr=subprocess.STDOUT, text=True)
        try:
            deadline, held = time.monotonic() + 60, []
            while time.monotonic() < deadline and not held:
                listed = {h["host"]: h for h in run("hosts", "--json", cwd=ws.root).json["hosts"]}
                held = listed.get("alpha", {}).get("running", [])
                time.sleep(0.2)
            assert [(r["task_id"], r["role"]) for r in held] == [(task, "DEV")]
            go.touch()
            while time.monotonic() < deadline and not reported(c.kernel.task(task)):
                time.sleep(0.2)
            assert reported(c.kernel.task(task))
        finally:
            alpha.send_signal(signal.SIGTERM)
            assert alpha.wait(timeout=60) == 0, (tmp_path / "alpha.log").read_text()[-3000:]
    assert run("hosts", "--json", cwd=ws.root).json["hosts"][0]["running"] == []


SKEWED = """
import datetime as _dt, runpy, sys

class _Skewed(_dt.datetime):  # this host's clock is off by SKEW seconds from the others'
    @classmethod
    def now(cls, tz=None):
        return super().now(tz) + _dt.timedelta(seconds=SKEW)

_dt.datetime = _Skewed
sys.argv = ["taskkernel", *sys.argv[1:]]
runpy.run_module("taskkernel", run_name="__main__")
"""


def skewed(seconds: float) -> list[str]:
    """The CLI in a process whose clock runs ``seconds`` ahead (negative: behind)."""
    return [sys.executable, "-c", SKEWED.replace("SKEW", repr(seconds))]


def test_a_host_whose_clock_runs_behind_keeps_its_runs(pg_url: str, tmp_path: Path) -> None:
    """Leases are written and compared by the store's clock: a host an hour behind claims a run whose lease the
    other host reads as live, so the other never takes it over while it runs (by the hosts' own clocks the lease
    had ended an hour before it began: the run was taken over and the agent ran twice)."""
    journal = tmp_path / "journal.log"
    agent = tmp_path / "slow_agent.py"
    agent.write_text(textwrap.dedent(f"""
        import os, subprocess, sys, time
        with open({str(journal)!r}, "a") as fh:
            fh.write(os.environ["TASKKERNEL_TASK_ID"] + "\\n")
        time.sleep(6)
        subprocess.run([sys.executable, "-m", "taskkernel", "task", "report", os.environ["TASKKERNEL_TASK_ID"],
                        "--status", "done", "--body", "ok"], check=True, capture_output=True)
    """), encoding="utf-8")
    ws = make_workspace(tmp_path / "ws", {"DEV": {"runner": "command", "argv": [sys.executable, str(agent)],
                                                  "timeout": 60, "lease": 30}}, database=pg_url)
    c = coordinator(ws)
    task = admin_task(c, subject="long job", recipient="DEV")
    procs, logs = {}, {}
    try:
        for name, argv in (("behind", skewed(-3600)), ("fine", CLI)):
            logs[name] = (tmp_path / f"{name}.log").open("w")
            procs[name] = subprocess.Popen([*argv, "up", str(ws.root), "--host", name], cwd=tmp_path, env=cli_env(),
                                           stdout=logs[name], stderr=subprocess.STDOUT, text=True)
            deadline = time.monotonic() + 60
            while name == "behind" and not journal.exists() and time.monotonic() < deadline:
                time.sleep(0.1)  # the late host holds the run before the other starts
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not reported(c.kernel.task(task)):
            time.sleep(0.2)
    finally:
        for p in procs.values():
            p.send_signal(signal.SIGTERM)
        for name, p in procs.items():
            p.wait(timeout=60)
            logs[name].close()
    assert reported(c.kernel.task(task))
    assert journal.read_text().split() == [task], "the agent ran once"
    assert '"run_started"' not in (tmp_path / "fine.log").read_text(), "the other host took the run over"
    with c.db.read() as conn:
        assert conn.exec_driver_sql("SELECT attempt FROM runs").scalars().all() == [1]


def test_up_once_on_a_host_whose_clock_runs_ahead_waits_for_a_retry_due_within_its_wait(pg_url: str,
                                                                                      tmp_path: Path) -> None:
    """`up --once` measures a retry's time by the store's clock, which wrote it: a host 60 s ahead still waits for a
    retry due in 2 s (it took it as due, found nothing to claim and left it pending; review of 7a13e9d)."""
    agent = tmp_path / "fails.py"
    agent.write_text("import sys; sys.exit(3)\n", encoding="utf-8")
    ws = make_workspace(tmp_path / "ws", {"DEV": {"runner": "command", "argv": [sys.executable, str(agent)],
                                                  "backoff": 2, "max_attempts": 2}}, database=pg_url)
    c = coordinator(ws)
    admin_task(c, subject="flaky", recipient="DEV")
    done = subprocess.run([*skewed(60), "up", str(ws.root), "--once", "--once-wait", "30", "--json"], cwd=tmp_path,
                          env=cli_env(), capture_output=True, text=True, timeout=120)
    assert json.loads(done.stdout.splitlines()[-1])["pending"] == [], done.stdout
    with c.db.read() as conn:
        assert conn.exec_driver_sql("SELECT state, attempt FROM runs").all() == [("blocked", 2)]


def test_a_host_whose_clock_runs_behind_is_listed_live(pg_url: str, tmp_path: Path) -> None:
    """Heartbeats are written and judged by the store's clock: a host two minutes behind, heard from just now, is
    live (it was listed silent for 120 s)."""
    ws = make_workspace(tmp_path / "ws", {"DEV": {"runner": "scripted"}}, database=pg_url)
    done = subprocess.run([*skewed(-120), "up", str(ws.root), "--once", "--host", "late", "--json"], cwd=tmp_path,
                          env=cli_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    [late] = run("hosts", "--json", cwd=ws.root).json["hosts"]
    assert late["host"] == "late" and late["live"] and late["heartbeat_age_s"] < 30, late


def test_a_heartbeat_that_keeps_failing_stays_failed(tmp_path: Path) -> None:
    """A store that refuses the heartbeat fails the `host` stage at every pass until a beat succeeds: it never
    passes for recovered between two beats (each flip logged the failure again, with its traceback)."""
    ws = make_workspace(tmp_path / "ws", {})
    c = coordinator(ws)
    c.pass_once()
    with c.db.write() as uow:
        uow.conn.exec_driver_sql("DROP TABLE hosts")
    time.sleep(1.1)  # the next beat is due
    for _ in range(3):
        c.pass_once()
        assert "host" in {f.stage for f in c.failing.values()}
    beating = HostRegistry(c.db, c.host, c.owner)
    for _ in range(2):  # the second at once: a failed beat is not throttled like a done one
        with pytest.raises(sa.exc.OperationalError):
            beating.beat()


def test_a_board_whose_clock_runs_ahead_answers_the_sign_ins_of_the_others(pg_url: str, tmp_path: Path) -> None:
    """Sign-ins are timed by the store's clock: a board 13 hours ahead answers a person signed in on another
    board, and its own sign-ins end no one else's (it read theirs as ended and deleted them)."""
    root = tmp_path / "ws"
    assert run("--db", pg_url, "init", str(root), cwd=tmp_path).code == 0
    token = (root / ".taskkernel" / "owner.token").read_text().strip()
    ahead = subprocess.Popen([*skewed(13 * 3600), "serve", "--port", "0", "--json"], cwd=root, env=cli_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert ahead.stdout is not None
        url_ahead = json.loads(ahead.stdout.readline())["url"]
        with board(root) as url:
            on_time, _ = sign_in(url, token)
            cookie = on_time.cookies["tk_session"]
            assert reads_as_signed_in(url_ahead, cookie)
            later, _ = sign_in(url_ahead, token)
            assert reads_as_signed_in(url, cookie) and reads_as_signed_in(url, later.cookies["tk_session"])
            on_time.close()
            later.close()
    finally:
        stop_server(ahead)
