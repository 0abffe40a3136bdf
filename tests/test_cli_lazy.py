"""The CLI's edges (issue 11, items 1 and 3): only the command a call names is imported, completion answers
in every shell, `--json` works wherever it is put, and infrastructure faults are one line plus the error
envelope, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer
import typer.main

from taskkernel.coordinator.cli import groups
from tests.cli_support import cli_env, run, run_tty, taskkernel

PROBE = ("import atexit, sys\n"
         "atexit.register(lambda: print(sorted(m for m in ('sqlalchemy', 'taskkernel.scheduler', "
         "'taskkernel.coordinator.loop', 'taskkernel.coordinator.cli.demo') if m in sys.modules), file=sys.stderr))\n"
         "from taskkernel.coordinator.cli.app import main\n"
         "main(sys.argv[1:])\n")


def loaded_by(*args: str, cwd: Path) -> list[str]:
    """Which heavy modules a call imported (printed by the probe at exit, the last line on stderr)."""
    done = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=cwd, capture_output=True, text=True,
                          env=cli_env(), timeout=60)
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
