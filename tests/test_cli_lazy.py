"""The CLI's edges (issue 11, items 1 and 3): only the command a call names is imported, completion answers
in every shell, `--json` works wherever it is put, and infrastructure faults are one line plus the error
envelope, never a traceback. Issue 29 goal 4: what `task show`, `up` and `mcp` (before `initialize`) do not
import, asserted on the modules a real call loaded, never on its time."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import typer
import typer.main

from taskkernel.coordinator.cli import groups
from tests.cli_support import cli_env, run, run_tty, stop_server, taskkernel, taskkernel_bg

# Prints, at exit, which of the watched modules (TASKKERNEL_WATCHED, comma-separated) the call imported.
PROBE = ("import atexit, os, sys\n"
         "watched = os.environ['TASKKERNEL_WATCHED'].split(',')\n"
         "atexit.register(lambda: print(sorted(m for m in watched if m in sys.modules), file=sys.stderr))\n"
         "from taskkernel.coordinator.cli.app import main\n"
         "main(sys.argv[1:])\n")
HEAVY = ("sqlalchemy", "taskkernel.scheduler", "taskkernel.coordinator.loop", "taskkernel.coordinator.cli.demo")
# What no command needs before it does its own work: the board, the MCP server, the scheduler, the live view
SERVERS = ("fastapi", "jinja2", "starlette", "uvicorn", "mcp", "taskkernel.coordinator.web",
           "taskkernel.coordinator.mcp.server")
SCHEDULER = ("apscheduler", "taskkernel.scheduler", "taskkernel.coordinator.automations")


def loaded_by(*args: str, cwd: Path, watched: tuple[str, ...] = HEAVY) -> list[str]:
    """Which of the ``watched`` modules a call imported (printed by the probe at exit, the last line on stderr)."""
    done = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=cwd, capture_output=True, text=True,
                          env=cli_env(TASKKERNEL_WATCHED=",".join(watched)), timeout=60)
    return json.loads(done.stderr.strip().splitlines()[-1].replace("'", '"'))


def test_help_and_version_import_no_command(tmp_path: Path) -> None:
    assert loaded_by("--help", cwd=tmp_path) == []
    task_help = loaded_by("task", "--help", cwd=tmp_path)
    assert not {"taskkernel.scheduler", "taskkernel.coordinator.loop", "taskkernel.coordinator.cli.demo"} & set(
        task_help), "only the task group's own libraries"


def test_a_command_imports_only_its_own_group(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    assert run("init", str(ws), cwd=tmp_path).code == 0
    assert "taskkernel.coordinator.cli.demo" not in loaded_by("task", "list", cwd=ws)
    assert "taskkernel.scheduler" not in loaded_by("token", "list", cwd=ws)


def test_task_show_imports_only_its_read(tmp_path: Path) -> None:
    """Issue 29 goal 4a: `task show` reads the task's document (kernel/queries.py): no command kernel, no
    composition, no runner, no terminal rendering, logging or YAML when its output is JSON; the command and
    session-log enums from kinds.py, never their pydantic models, nor the session log itself; taskkernel.toml's
    values from the cache `init` wrote (no TOML parser, no model of the file, no FCoP layer); of the task group,
    only `show` is built; no PostgreSQL dialect for a SQLite store (the partial indexes' PostgreSQL options are
    named only when a PostgreSQL schema is built); no pydantic at all: its arguments are converted by
    coordinator/cli/params.py, not by typer's pydantic adapters."""
    ws = tmp_path / "ws"
    assert run("init", str(ws), cwd=tmp_path).code == 0
    made = run("task", "create", "--to", "PM", "--subject", "shown", cwd=ws)
    assert made.code == 0, made.err
    not_needed = (*SERVERS, *SCHEDULER, "taskkernel.kernel.commands", "taskkernel.coordinator.compose",
                  "taskkernel.coordinator.runners", "taskkernel.coordinator.worktrees", "taskkernel.kernel.gate",
                  "taskkernel.coordinator.folders", "sqlalchemy.orm", "rich", "structlog", "yaml",
                  "taskkernel.kernel.model.commands", "taskkernel.kernel.sessionlog.models",
                  "taskkernel.kernel.sessionlog.log", "tomllib", "taskkernel.coordinator.config_tables",
                  "taskkernel.coordinator.agent_profiles", "taskkernel.coordinator.fcop.detect",
                  "taskkernel.coordinator.fcop.filenames", "sqlalchemy.dialects.postgresql", "typer._adapters",
                  "pydantic")
    assert loaded_by("task", "show", made.json["task_id"], cwd=ws, watched=("sqlalchemy", *not_needed)) == [
        "sqlalchemy"]


def test_a_group_call_builds_only_the_command_it_names() -> None:
    from taskkernel.coordinator.cli.kernel_cmds import task_app

    shown = groups.only(task_app, "show")
    assert [c.name for c in shown.registered_commands] == ["show"] and len(task_app.registered_commands) > 10
    assert groups.only(task_app, "sho") is task_app and groups.only(task_app, None) is task_app


def test_up_imports_only_what_its_stages_use(tmp_path: Path) -> None:
    """Issue 29 goal 4b: `up --once` on a workspace with no schedule and no agent runs the folders, the outbox
    and the dispatcher, and imports neither the scheduler (APScheduler) nor a server nor the live view; the first
    schedule loads the scheduler."""
    ws = tmp_path / "ws"
    assert run("init", str(ws), cwd=tmp_path).code == 0
    not_needed = (*SERVERS, *SCHEDULER, "rich.live", "taskkernel.coordinator.cli.live", "taskkernel.coordinator.inbox",
                  "taskkernel.coordinator.fcop4.adapter", "watchfiles", "taskkernel.coordinator.runners.launch",
                  "taskkernel.coordinator.runners.live", "taskkernel.coordinator.runners.scripted")
    assert loaded_by("up", "--once", cwd=ws, watched=("taskkernel.coordinator.loop", *not_needed)) == [
        "taskkernel.coordinator.loop"]
    add_schedule(ws, "nightly", "--cron", "0 3 * * *")
    assert "taskkernel.scheduler" in loaded_by("up", "--once", cwd=ws, watched=SCHEDULER)


def add_schedule(ws: Path, name: str, *when: str) -> None:
    """A schedule that creates a task for PM named after it."""
    template = ws.parent / f"{name}.json"
    template.write_text(json.dumps({"recipient": "PM", "subject": name}))
    added = run("schedule", "add", name, *when, "--action", "create_task", "--template", str(template), cwd=ws)
    assert added.code == 0, (added.out, added.err)


def test_a_running_up_starts_the_scheduler_with_the_first_schedule(tmp_path: Path) -> None:
    """`up` started on a workspace without schedules loads no scheduler; a schedule added while it runs is found
    and fires."""
    ws = tmp_path / "ws"
    assert run("init", str(ws), cwd=tmp_path).code == 0
    up = taskkernel_bg("up", cwd=ws)
    try:
        assert up.stderr is not None
        while "coordinator up" not in (line := up.stderr.readline()):  # its loop (and the scheduler's watch) runs
            assert line, "up ended before it ran"
        time.sleep(2)  # a poll or two finding no schedule
        start = (datetime.now(UTC) - timedelta(minutes=3)).strftime("%Y-%m-%dT%H:%M:%SZ")  # one occurrence due now
        add_schedule(ws, "minutely", "--every", "1m", "--start", start)
        deadline = time.monotonic() + 60
        while not any(t["subject"] == "minutely" for t in run("task", "list", cwd=ws).json):
            assert time.monotonic() < deadline and up.poll() is None, "the schedule never fired"
            time.sleep(0.5)
    finally:
        stop_server(up)


@pytest.mark.parametrize("entry", groups.ENTRIES, ids=lambda e: e.name)
def test_the_listed_help_is_the_commands_own(entry: groups.Entry) -> None:
    real, placeholder = typer.Typer(), typer.Typer()
    groups.attach(real, entry)
    groups.attach_placeholder(placeholder, entry)
    for app in (real, placeholder):
        app.command("other")(lambda: None)  # two commands: typer builds a group, as the root app is
    short = [typer.main.get_command(app).commands[entry.name].get_short_help_str(limit=500)  # type: ignore[attr-defined]
             for app in (real, placeholder)]
    assert short[0] == short[1]


def complete(env: dict[str, str], tmp_path: Path) -> str:
    done = subprocess.run([sys.executable, "-m", "taskkernel"], cwd=tmp_path, capture_output=True, text=True,
                          env=cli_env(**env), timeout=60)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    return done.stdout


def test_shell_completion(tmp_path: Path) -> None:
    bash = {"_TASKKERNEL_COMPLETE": "complete_bash", "COMP_WORDS": "taskkernel ta", "COMP_CWORD": "1"}
    assert complete(bash, tmp_path).split() == ["task"]
    bash_sub = {**bash, "COMP_WORDS": "taskkernel task ", "COMP_CWORD": "2"}
    assert set(complete(bash_sub, tmp_path).split()) == {"show", "list", "create", "claim", "report", "submit",
                                                         "approve", "reject", "reopen", "archive", "amend", "watch",
                                                         "diff", "retry", "merge", "say", "interrupt", "inputs"}
    zsh = {"_TASKKERNEL_COMPLETE": "complete_zsh", "_TYPER_COMPLETE_ARGS": "taskkernel session li"}
    assert '"list"' in complete(zsh, tmp_path)
    # --show-completion detects the shell it runs under (its parent process): run it from bash, as a user would
    script = subprocess.run(["bash", "-c", f"{sys.executable} -m taskkernel --show-completion; exit $?"], cwd=tmp_path,
                            capture_output=True, text=True, env=cli_env(), timeout=120)
    assert script.returncode == 0 and "_TASKKERNEL_COMPLETE" in script.stdout, script.stderr


def test_json_wherever_it_is_put(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    assert run("init", str(ws), cwd=tmp_path).code == 0
    for args in (("--json", "task", "list"), ("task", "list", "--json"), ("token", "list", "--json")):
        r = run_tty(*args, cwd=ws)
        assert r.code == 0 and isinstance(json.loads(r.out), list), (args, r.out)
    human = run_tty("token", "list", cwd=ws)
    assert human.code == 0 and "ADMIN" in human.out and not human.out.lstrip().startswith("["), human.out


def assert_one_line_fault(r: subprocess.CompletedProcess[str], code: str, status: int) -> dict[str, str]:
    assert r.returncode == status, (r.stdout, r.stderr)
    doc = json.loads(r.stdout)
    assert (doc["status"], doc["code"]) == ("error", code), doc
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    return doc


def test_infrastructure_faults_are_one_line_and_the_envelope(tmp_path: Path) -> None:
    assert_one_line_fault(taskkernel("--db", "nope://x", "task", "list", cwd=tmp_path), "database_url_invalid", 64)
    stopped = "postgresql+psycopg://postgres@127.0.0.1:1/taskkernel"  # nothing listens on port 1
    assert_one_line_fault(taskkernel("--db", stopped, "task", "list", cwd=tmp_path), "database_unreachable", 1)
    missing = f"sqlite:///{tmp_path}/no/such/dir/k.db"
    assert_one_line_fault(taskkernel("--db", missing, "task", "list", cwd=tmp_path), "database_unreachable", 1)


def test_read_only_database_file_is_a_fault_not_a_traceback(tmp_path: Path) -> None:
    db = tmp_path / "k.db"
    url = f"sqlite:///{db}"
    assert taskkernel("--db", url, "task", "list", cwd=tmp_path).returncode == 0
    ro = f"sqlite:///file:{db}?mode=ro&uri=true"
    create = json.dumps({"type": "create_task", "idempotency_key": "k", "payload": {
        "sender": "ADMIN", "recipient": "PM", "subject": "s"}})
    r = taskkernel("--db", ro, "submit", cwd=tmp_path, stdin=create)
    doc = assert_one_line_fault(r, "not_writable", 1)
    assert "readonly" in doc["message"]


def test_an_unexpected_failure_leaves_its_traceback_in_the_log(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    assert run("init", str(ws), cwd=tmp_path).code == 0
    boom = ("import sys\n"
            "import taskkernel.coordinator.cli.kernel_cmds as k\n"
            "def broken(*a, **kw):\n    raise RuntimeError('boom [/b]')\n"
            "k.list_credentials = broken\n"
            "from taskkernel.coordinator.cli.app import main\nmain(sys.argv[1:])\n")
    r = subprocess.run([sys.executable, "-c", boom, "token", "list"], cwd=ws, capture_output=True, text=True,
                       env=cli_env(), timeout=60)
    doc = assert_one_line_fault(r, "internal_error", 1)
    log = ws / ".taskkernel" / "logs" / "cli.log"
    assert str(log) in doc["message"] and "boom [/b]" in doc["message"]
    assert "Traceback" in log.read_text() and oct(log.stat().st_mode & 0o777) == "0o600"


# `taskkernel mcp` with the modules loaded when the kernel starts to open (after `initialize` was answered) kept
MCP_PROBE = ("import atexit, os, sys\n"
             "import taskkernel.coordinator.mcp.startup as startup\n"
             "watched, seen = os.environ['TASKKERNEL_WATCHED'].split(','), []\n"
             "opening = startup.open_tools\n"
             "def open_tools(*args):\n"
             "    seen.append(sorted(m for m in watched if m in sys.modules))\n"
             "    return opening(*args)\n"
             "startup.open_tools = open_tools\n"
             "atexit.register(lambda: print(seen, file=sys.stderr))\n"
             "from taskkernel.coordinator.cli.app import main\n"
             "main(['mcp'])\n")


def test_mcp_answers_initialize_before_any_import_of_its_own(tmp_path: Path) -> None:
    """Issue 29 goal 4c: over stdio, `initialize` is answered from static data with only the SDK loaded: the
    workspace, its config, the database, the kernel and the tool catalogue (models and schemas) load after it, in
    the warm-up."""
    ws = tmp_path / "ws"
    assert run("init", str(ws), cwd=tmp_path).code == 0
    token = run("token", "issue", "DEV", cwd=ws).out.strip()
    not_yet = ("sqlalchemy", "taskkernel.coordinator.workspace", "taskkernel.coordinator.config",
               "taskkernel.kernel.store", "taskkernel.kernel.model.commands", "taskkernel.coordinator.compose",
               "taskkernel.coordinator.mcp.tools", "taskkernel.coordinator.mcp.catalog",
               "taskkernel.coordinator.mcp.schemas", "taskkernel.coordinator.web", *SCHEDULER)
    proc = subprocess.Popen([sys.executable, "-c", MCP_PROBE], cwd=ws, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=cli_env(TASKKERNEL_TOKEN=token,
                                                                TASKKERNEL_WATCHED=",".join(not_yet)))
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "probe", "version": "1"}}}
                                ).encode() + b"\n")
    proc.stdin.flush()
    answer = json.loads(proc.stdout.readline())
    assert answer["result"]["serverInfo"]["name"] == "taskkernel", answer
    _, err = proc.communicate(timeout=60)  # stdin closed: the warm-up opens the kernel, then the server exits
    assert proc.returncode == 0, err
    assert json.loads(err.decode().strip().splitlines()[-1].replace("'", '"')) == [[]], err
