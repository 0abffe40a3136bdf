"""Runner least privilege and crash safety, through the real CLI in separate processes (issue 9, items 3 and 6).

An agent sees only the allowlisted environment and what its role's config adds; `run_as` starts it
as another OS user; a coordinator killed with -9 mid-run leaves an orphan that the next coordinator
terminates and fences out (`stale_lease`) before it runs the task again: one agent, one done report.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from taskkernel.coordinator.runners.config import runner_specs
from taskkernel.coordinator.runners.ledger import RunLedger
from taskkernel.kernel.store.db import Database
from tests.cli_support import taskkernel, taskkernel_bg
from tests.coord_support import admin_task, coordinator, make_workspace

PY = sys.executable
CLI = f"[{PY!r}, '-m', 'taskkernel']"
ALLOWED = {"PATH", "HOME", "LANG", "TERM", "TZ", "TMPDIR", "USER", "LOGNAME"}
RUN_VARS = {"TASKKERNEL_TOKEN", "TASKKERNEL_TASK_ID", "TASKKERNEL_ROUND", "TASKKERNEL_TASK_FILE",
            "TASKKERNEL_WORKSPACE", "TASKKERNEL_PURPOSE", "TASKKERNEL_ROLE", "TASKKERNEL_WORKDIR"}
# An agent reports done through the CLI with nothing but its environment.
REPORT_DONE = f"""
    def cli(*args, stdin=None):
        return subprocess.run({CLI} + list(args), input=stdin, capture_output=True, text=True)
    def report_done():
        task = json.loads(cli("task", "show", os.environ["TASKKERNEL_TASK_ID"]).stdout)
        r = json.loads(cli("submit", stdin=json.dumps({{"type": "submit_report", "task_id": task["task_id"],
            "thread_key": task["thread_key"], "round": task["round"], "expected_revision": task["revision"],
            "idempotency_key": "rep-" + task["task_id"], "payload": {{"status": "done", "body": "did it"}}}})).stdout)
        assert r["status"] == "accepted", r
"""


def agent_script(path: Path, body: str) -> Path:
    path.write_text("import json, os, subprocess, sys, time\n" + textwrap.dedent(REPORT_DONE)
                    + textwrap.dedent(body), encoding="utf-8")
    return path


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest) -> str | None:
    """None: the workspace's own SQLite file; else a fresh PostgreSQL schema named in taskkernel.toml."""
    return None if request.param == "sqlite" else str(request.getfixturevalue("pg_url"))


def test_agent_environment_is_the_allowlist_plus_what_the_role_adds(tmp_path: Path, database: str | None) -> None:
    dump = tmp_path / "env.json"
    agent = agent_script(tmp_path / "agent.py", f"""
        # no database URL: the CLI finds the kernel through TASKKERNEL_WORKSPACE's config
        shown = cli("task", "show", os.environ["TASKKERNEL_TASK_ID"])
        open({str(dump)!r}, "w").write(json.dumps({{"env": dict(os.environ), "show": shown.stdout}}))
    """)
    ws = make_workspace(tmp_path / "ws", {"DEV": {"runner": "command", "argv": [PY, str(agent)], "max_attempts": 1,
                                                 "env": {"MODEL": "small"}, "pass_env": ["KEEP_ME", "ABSENT"]}},
                        database=database)
    c = coordinator(ws)
    tid = admin_task(c, recipient="DEV")
    c.db.dispose()
    url = database or ws.database_url
    planted = {"TASKKERNEL_DB": url, "PGPASSWORD": "secret-pg-password", "OPENAI_API_KEY": "secret-api-key",
               "AWS_SECRET_ACCESS_KEY": "secret-aws", "KEEP_ME": "forwarded", "LC_ALL": "C.UTF-8"}
    up = taskkernel("up", str(ws.root), "--once", cwd=tmp_path, env=planted)
    assert up.returncode == 0, up.stderr
    seen = json.loads(dump.read_text())
    env = seen["env"]
    assert "TASKKERNEL_DB" not in env and not any("secret" in v for v in env.values()), env
    assert url not in env.values()
    assert set(env) - ALLOWED - {k for k in env if k.startswith("LC_")} == RUN_VARS | {"MODEL", "KEEP_ME"}
    assert (env["MODEL"], env["KEEP_ME"], env["LC_ALL"], env["TASKKERNEL_WORKSPACE"]) == (
        "small", "forwarded", "C.UTF-8", str(ws.root))
    assert json.loads(seen["show"])["task_id"] == tid, "the agent reached the kernel without the database URL"
    [log_dir] = (ws.root / ".taskkernel" / "runs").glob("*/attempt-1")
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in (log_dir, *log_dir.iterdir())} == {
        "attempt-1": "0o700", "stdout.log": "0o600", "stderr.log": "0o600",  # agents' output may echo secrets
        "prompt.md": "0o600", "mcp.json": "0o600"}  # the run's token file is gone: removed when the run ended


def test_config_refuses_database_variables_and_users_it_cannot_become(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(table: dict[str, Any]) -> str:
        with pytest.raises(ValueError) as exc:
            runner_specs({"roles": {"dev": {"runner": "command", "argv": ["true"], **table}}})
        assert "[roles.dev]" in str(exc.value)
        return str(exc.value)

    assert "never the database URL" in refused({"env": {"TASKKERNEL_DB": "sqlite:///x"}})
    assert "never the database URL" in refused({"pass_env": ["TASKKERNEL_DB"]})
    assert "not an environment variable name" in refused({"pass_env": ["A=B"]})
    assert "no such OS user" in refused({"run_as": f"no-such-user-{uuid.uuid4().hex[:8]}"})
    other = next(p for p in pwd.getpwall() if p.pw_uid != os.geteuid())
    monkeypatch.setattr(os, "geteuid", lambda: 54321)
    assert "cannot switch" in refused({"run_as": other.pw_name})
    monkeypatch.undo()
    ws = make_workspace(tmp_path / "ws", {"DEV": {"runner": "command", "argv": ["true"],
                                                 "run_as": f"no-such-user-{uuid.uuid4().hex[:8]}"}})
    up = taskkernel("up", str(ws.root), "--once", cwd=tmp_path)
    assert up.returncode == 64 and "[roles.DEV]" in up.stdout, up.stdout


@pytest.fixture
def throwaway_user() -> Iterator[pwd.struct_passwd]:
    """A system user created for this test and deleted after it."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("run_as needs root and useradd to create a throwaway user")
    name = f"tk{uuid.uuid4().hex[:10]}"
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], check=False)


def test_run_as_starts_the_agent_as_that_user(throwaway_user: pwd.struct_passwd) -> None:
    base = Path(tempfile.mkdtemp(prefix="tk-run-as-"))  # not under pytest's 0700 tree: the user must traverse it
    try:
        base.chmod(0o755)
        secret = base / "ws" / "root-only.txt"
        probe = 'id -u; echo "HOME=$HOME USER=$USER"; for f in .taskkernel/owner.token root-only.txt; do ' \
                'if cat "$f" >/dev/null 2>&1; then echo "read $f"; else echo "denied $f"; fi; done'
        ws = make_workspace(base / "ws", {"DEV": {"runner": "command", "argv": ["/bin/sh", "-c", probe],
                                                  "run_as": throwaway_user.pw_name, "max_attempts": 1}})
        for path in (secret, ws.root / ".taskkernel" / "owner.token"):  # init via the CLI writes the latter
            if not path.exists():
                path.write_text("root's secret")
            path.chmod(0o600)
        c = coordinator(ws)
        admin_task(c, recipient="DEV")
        c.db.dispose()
        up = taskkernel("up", str(ws.root), "--once", cwd=base)
        assert up.returncode == 0, up.stderr
        [log] = (ws.root / ".taskkernel" / "runs").glob("*/attempt-1/stdout.log")
        assert log.read_text().split("\n")[:4] == [
            str(throwaway_user.pw_uid), f"HOME={throwaway_user.pw_dir} USER={throwaway_user.pw_name}",
            "denied .taskkernel/owner.token", "denied root-only.txt"]
    finally:
        shutil.rmtree(base)


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def wait_for(predicate: Any, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_kill_9_mid_run_terminates_the_orphan_fences_its_token_and_runs_once(
        tmp_path: Path, database: str | None) -> None:
    box = tmp_path / "box"
    box.mkdir()
    # The first agent holds the run; its shell parent dies with the coordinator (parent-death signal), the
    # agent itself lives on in the process group: only the ledger's takeover can stop it.
    agent = agent_script(tmp_path / "agent.py", f"""
        box = {str(box)!r}
        def alive(pid):
            try:
                return open(f"/proc/{{pid}}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
            except OSError:
                return False
        earlier = [int(n.split("-")[1]) for n in os.listdir(box) if n.startswith("started-")]
        with open(f"{{box}}/started-{{os.getpid()}}", "w") as fh:
            fh.write(json.dumps({{"token": os.environ["TASKKERNEL_TOKEN"], "shell": os.getppid()}}))
        if not earlier:
            time.sleep(120)
        open(f"{{box}}/alive-at-rerun-{{os.getpid()}}", "w").write(json.dumps([p for p in earlier if alive(p)]))
        report_done()
        open(f"{{box}}/finished-{{os.getpid()}}", "w").close()
    """)
    lease = 1.0
    argv = ["/bin/sh", "-c", f"{PY} {agent} & wait"]
    ws = make_workspace(tmp_path / "ws", {"DEV": {"runner": "command", "argv": argv, "lease": lease}},
                        database=database)
    c = coordinator(ws)
    tid = admin_task(c, recipient="DEV")
    c.db.dispose()
    first = taskkernel_bg("up", str(ws.root), cwd=tmp_path)
    orphan = 0
    try:
        assert wait_for(lambda: any(box.glob("started-*"))), first.stderr
        [started] = box.glob("started-*")
        orphan = int(started.name.split("-")[1])
        record = json.loads(started.read_text())
        # mid-run: once the ledger holds the agent's process group (docs/security.md, Known limits: a coordinator
        # killed between starting an agent and recording it leaves one the ledger cannot stop)
        watcher = coordinator(ws)
        assert wait_for(lambda: any(r["agent_pgid"] for r in watcher.dispatcher.ledger.all_runs()), 10)
        watcher.db.dispose()
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        assert wait_for(lambda: not alive(record["shell"]), 5), "the agent's direct child dies with the coordinator"
        assert alive(orphan), "the agent itself outlived the coordinator (the case the ledger must handle)"
        time.sleep(lease + 0.2)  # the dead coordinator's lease lapses
        second = taskkernel("up", str(ws.root), "--once", cwd=tmp_path)
        assert second.returncode == 0, second.stderr
    finally:
        first.kill()
        for name in box.glob("started-*"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(name.name.split("-")[1]), signal.SIGKILL)
    assert not alive(orphan)
    [rerun] = box.glob("alive-at-rerun-*")
    assert json.loads(rerun.read_text()) == [], "the orphan was gone before the re-run started"
    assert len(list(box.glob("started-*"))) == 2 and len(list(box.glob("finished-*"))) == 1
    c = coordinator(ws)
    [run] = c.dispatcher.ledger.all_runs()
    assert (run["state"], run["attempt"], run["agent_pgid"], run["token_hash"]) == ("succeeded", 2, None, None)
    task = c.kernel.task(tid)
    assert task is not None
    assert [r["status"] for r in task["reports"] if r["round"] == task["round"]] == ["done"]
    c.db.dispose()
    stale = taskkernel("submit", cwd=ws.root, env={"TASKKERNEL_TOKEN": record["token"]}, stdin=json.dumps({
        "type": "submit_report", "task_id": tid, "thread_key": task["thread_key"], "round": task["round"],
        "expected_revision": task["revision"], "idempotency_key": "late-orphan",
        "payload": {"status": "done", "body": "me too"}}))
    assert stale.returncode == 2 and json.loads(stale.stdout)["reason"] == "stale_lease", stale.stdout


def test_a_holder_whose_lease_was_taken_over_stops_its_agent(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    sleeper = tmp_path / "sleep.py"
    sleeper.write_text(f"import os, time\nopen({str(pidfile)!r}, 'w').write(str(os.getpid()))\ntime.sleep(60)\n")
    ws = make_workspace(tmp_path / "ws", {"DEV": {"runner": "command", "argv": [PY, str(sleeper)], "lease": 0.6}})
    c = coordinator(ws)
    admin_task(c, recipient="DEV")
    other = RunLedger(c.db, "other-coordinator", lease_seconds=60)

    def take_over() -> None:  # what a coordinator that believes this one dead does
        assert wait_for(pidfile.exists)
        other.claim_due(now=datetime.now(UTC) + timedelta(hours=1))

    thief = threading.Thread(target=take_over)
    thief.start()
    started = time.monotonic()
    c.run_once()
    thief.join()
    assert time.monotonic() - started < 15, "the agent was stopped at the next renewal, not at its timeout"
    assert not alive(int(pidfile.read_text()))
    [run] = c.dispatcher.ledger.all_runs()
    assert (run["state"], run["lease_owner"], run["fencing"]) == ("running", "other-coordinator", 2)


def test_a_ledger_from_before_the_agent_columns_gets_them(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'old.db'}")
    with db.write() as uow:
        uow.conn.exec_driver_sql("CREATE TABLE runs (run_id TEXT PRIMARY KEY, task_id TEXT NOT NULL, round INTEGER "
                                 "NOT NULL, role TEXT NOT NULL, purpose TEXT NOT NULL, state TEXT NOT NULL, attempt "
                                 "INTEGER NOT NULL DEFAULT 0, max_attempts INTEGER NOT NULL, fencing INTEGER NOT NULL "
                                 "DEFAULT 0, lease_owner TEXT, lease_until TEXT, not_before TEXT NOT NULL, exit_code "
                                 "INTEGER, last_error TEXT, created_at TEXT NOT NULL, ended_at TEXT)")
    RunLedger(db, "a")
    RunLedger(db, "b")  # a second coordinator finds them present
    with db.read() as conn:
        columns = {c["name"] for c in sa.inspect(conn).get_columns("runs")}
    assert {"token_hash", "agent_host", "agent_pgid", "agent_start"} <= columns
    db.dispose()
