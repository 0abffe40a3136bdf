"""Configuration is one validated model, and inputs are checked at the door (issue 11, item 2): every mistake a
new user makes in taskkernel.toml, a grant, a task or a schedule gets a specific, fixable message naming where it
is and the near miss — through the real CLI, in its own process, never a traceback."""

from __future__ import annotations

import json
import re
import sys
import tomllib
from pathlib import Path

import pytest

from taskkernel.coordinator.config import TABLES, parse_config
from taskkernel.coordinator.config_template import config_template
from tests.cli_support import Run, new_workspace, run
from tests.cli_support import append_config as append


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    return new_workspace(tmp_path)


def refused_config(r: Run) -> str:
    """A configuration error: exit 64, the error envelope on stdout, one line on stderr, no traceback."""
    assert r.code == 64, (r.code, r.out, r.err)
    assert "Traceback" not in r.err and "Traceback" not in r.out
    assert r.json["status"] == "error", r.out
    assert r.json["code"] in ("config_invalid", "config_unreadable", "runner_unavailable"), r.out  # never "usage"
    assert len(r.err.strip().splitlines()) == 1, r.err
    message: str = r.json["message"]
    assert message in r.err
    return message


def line_of(ws: Path, text: str) -> int:
    return next(n for n, line in enumerate((ws / "taskkernel.toml").read_text().splitlines(), 1) if line == text)


@pytest.mark.parametrize(("table", "body", "named", "suggestion"), [
    ("[rols.PM]", 'runner = "scripted"', "[rols.PM] is not a table taskkernel knows", "did you mean [roles.PM]?"),
    ("[folder]", "enabled = false", "[folder] is not a table taskkernel knows", "did you mean [folders]?"),
    ("[roles.DEV]", 'runner = "scripted"\ntimout = 5', "[roles.DEV] in taskkernel.toml",
     "timout is not a key taskkernel knows; did you mean timeout?"),
    ("[kernel2]", 'durability = "full"', "[kernel2] is not a table", "did you mean [kernel]?"),
])
def test_a_misspelled_table_or_key_is_named_with_its_line_and_the_near_miss(
        ws: Path, table: str, body: str, named: str, suggestion: str) -> None:
    append(ws, f"\n{table}\n{body}\n")
    for args in (("task", "list"), ("up", "--once"), ("submit",)):
        message = refused_config(run(*args, cwd=ws, stdin="{}"))
        assert named in message and suggestion in message, message
    bad_line = line_of(ws, body.splitlines()[-1]) if "timout" in body else line_of(ws, table)
    assert f"line {bad_line}" in message, message


def test_a_broken_config_is_its_own_error_code_even_with_db(ws: Path) -> None:
    """A workspace whose taskkernel.toml cannot be used is config_invalid, with the file, key and line; --db does
    not make the CLI quietly run without the workspace's team, roles and grants."""
    append(ws, "\n[rols.PM]\nx = 1\n")
    url = f"sqlite:///{ws / '.taskkernel' / 'kernel.db'}"
    for args in (("task", "list"), ("--db", url, "task", "list"), ("log",)):
        r = run(*args, cwd=ws)
        refused_config(r)
        assert r.json["code"] == "config_invalid" and r.json["key"] == "rols", r.out
        assert r.json["file"] == str(ws / "taskkernel.toml") and r.json["line"] == line_of(ws, "[rols.PM]")


def test_a_config_error_no_command_caught_still_has_its_code() -> None:
    from taskkernel.coordinator.cli.faults import classify
    from taskkernel.coordinator.cli.output import Exit
    from taskkernel.coordinator.config import ConfigError

    assert classify(ConfigError("taskkernel.toml, line 3: bad", code="config_unreadable")) == (
        "config_unreadable", "taskkernel.toml, line 3: bad", Exit.USAGE)


def test_a_key_outside_any_table_says_which_table_it_belongs_to(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    assert run("init", str(root), cwd=tmp_path).code == 0
    text = (root / "taskkernel.toml").read_text()
    (root / "taskkernel.toml").write_text('durability = "process"\n' + text)
    message = refused_config(run("task", "list", cwd=root))
    assert message.startswith("taskkernel.toml, line 1: durability is outside any table; did you mean to put it "
                              "under [kernel]?"), message


def test_a_toml_syntax_error_is_one_line_and_the_error_envelope(ws: Path) -> None:
    append(ws, '\n[roles.DEV\nrunner = "scripted"\n')
    message = refused_config(run("task", "list", cwd=ws))
    assert "taskkernel.toml is not valid TOML" in message and f"line {line_of(ws, '[roles.DEV')}" in message


@pytest.mark.parametrize(("body", "expected"), [
    ('runner = "command"\nargv = ["agent", "{taskfile}"]', "{taskfile} in \"{taskfile}\" is not a placeholder "
     "taskkernel fills; did you mean {task_file}?"),
    ('runner = "command"\nargv = ["agent", "--round={round:03}"]', "placeholders take no conversion or format spec"),
    ('runner = "command"\nargv = ["agent", "{"]', "write {{ and }} for literal braces"),
    ('runner = "comand"\nargv = ["agent"]', 'runner = "comand" is not a runner taskkernel knows (command, scripted, '
     'claude-code, codex, gemini-cli'),
    ('runner = "command"\nargv = ["agent"]\ntimeout = "600"', 'timeout must be a number (got "600")'),
    ('runner = "command"\nargv = ["agent"]\nenv = { TASKKERNEL_DB = "x" }', "env: TASKKERNEL_DB is set by the runner"),
    ('runner = "scripted"\nargv = ["agent"]', "argv applies to runners that start a program only"),
    ('runner = "command"', 'a command runner needs argv = ["program", …]'),
])
def test_a_runner_table_is_checked_when_the_file_loads(ws: Path, body: str, expected: str) -> None:
    append(ws, f"\n[roles.DEV]\n{body}\n")
    message = refused_config(run("task", "list", cwd=ws))
    assert message.startswith("[roles.DEV] in taskkernel.toml, line ") and expected in message, message


@pytest.mark.parametrize(("text", "expected"), [
    ('[kernel]\ndurability = "fsync"\n', '[kernel] in taskkernel.toml, line 2: durability must be "full" or "process"'),
    ('[kernel]\nrequire_token = "yes"\n', "require_token must be true or false"),
    ('[kernel]\ndatabase = "not a url"\n', "database: not a database URL"),
    ('[team]\nleader = "PMM"\nroles = ["PM", "DEV"]\n', "leader must be one of its roles ['PM', 'DEV'], not \"PMM\"; "
     "did you mean PM?"),
    ('[gate]\nprotected = { critical = ["deploy"] }\n', "protected: critical is not a risk level"),
    ('[gate]\nsesion = "grants"\n', "sesion is not a key taskkernel knows; did you mean session?"),
    ('[scheduler]\nmax_clock_skew = "soon"\n', "max_clock_skew: not a duration"),
    ('[roles.ADMIN]\nrunner = "scripted"\n', "ADMIN is not a team role"),
])
def test_every_table_is_typed(tmp_path: Path, text: str, expected: str) -> None:
    root = tmp_path / "ws"
    assert run("init", str(root), cwd=tmp_path).code == 0
    (root / "fcop" / "fcop.json").unlink()  # so [team] is the team
    (root / "taskkernel.toml").write_text(text)
    assert expected in refused_config(run("task", "list", cwd=root))


def test_a_missing_binary_or_a_runner_for_a_role_the_team_lacks_stops_up(ws: Path) -> None:
    append(ws, '\n[roles.DEV]\nrunner = "command"\nargv = ["no-such-agent-binary", "{task_file}"]\n')
    assert run("task", "list", cwd=ws).code == 0  # only `up` runs agents: other commands never need the program
    refused = run("up", "--once", cwd=ws)
    message = refused_config(refused)
    assert refused.json["code"] == "runner_unavailable"
    line = line_of(ws, 'argv = ["no-such-agent-binary", "{task_file}"]')
    assert message == (f"[roles.DEV] in taskkernel.toml, line {line}: argv[0] 'no-such-agent-binary' is not on the "
                       "agent's PATH; install it or give its full path")
    text = (ws / "taskkernel.toml").read_text().replace("[roles.DEV]", "[roles.DEVV]")
    (ws / "taskkernel.toml").write_text(text.replace("no-such-agent-binary", sys.executable))
    refused = run("up", "--once", cwd=ws)
    message = refused_config(refused)
    assert refused.json["code"] == "config_invalid" and refused.json["table"] == "roles.DEVV", refused.out
    assert "[roles.DEVV] in taskkernel.toml" in message and "DEVV is not a role of the team" in message
    assert "did you mean [roles.DEV]?" in message


def uncommented(text: str) -> str:
    """The template with every example line turned on ("# [table]" and "# key = value")."""
    example = re.compile(r"^# (\[[A-Za-z.-]+\]|[a-z_]+ = )")
    return "\n".join(line[2:] if example.match(line) else line for line in text.splitlines())


def test_init_writes_every_table_and_key_as_a_commented_example_that_validates(ws: Path) -> None:
    written = (ws / "taskkernel.toml").read_text()
    assert tomllib.loads(written) == {"kernel": {"durability": "full", "require_token": True}}
    full = uncommented(written)
    config = parse_config(full)  # every example, turned on, is valid
    assert config.team is not None and config.team.leader == "PM"
    assert config.roles["DEV"].runner == "claude-code" and config.roles["DEV"].model == "sonnet"
    assert config.roles["QA"].argv == ["my-agent", "--task", "{task_file}"] and config.roles["OPS"].runner == "scripted"
    document = tomllib.loads(full)
    for table, model in TABLES.items():
        assert re.search(rf"^# \[{table}[.\]]", written, re.M) or table == "kernel", table
        keys = ({k for each in document[table].values() for k in each} if table in ("roles", "profiles", "hosts")
                else set(document[table]))
        assert set(model.model_fields) == keys, (table, set(model.model_fields) ^ keys)
    assert 'database = "sqlite:///x.db"' in config_template("sqlite:///x.db")
    assert "# [team]" not in config_template(team="\n[team]\nleader = \"ME\"\nroles = [\"ME\"]\n")


def submit(ws: Path, recipient: str, key: str, **extra: str) -> Run:
    return run("submit", cwd=ws, stdin=json.dumps({"type": "create_task", "idempotency_key": key, "payload": {
        "sender": "ADMIN", "recipient": recipient, "subject": "s", **extra}}))


def test_a_task_for_a_role_the_team_lacks_is_refused(ws: Path) -> None:
    r = submit(ws, "DEVV", "k1")
    assert r.code == 2 and r.json["reason"] == "unknown_role", r.out
    assert "recipient DEVV is not a role of the team" in r.json["message"] and "did you mean DEV?" in r.json["message"]
    assert submit(ws, "DEV", "k2", driver="QAA").json["reason"] == "unknown_role"
    assert run("task", "list", cwd=ws).json == []
    assert submit(ws, "DEV", "k3").code == 0 and submit(ws, "ADMIN", "k4").code == 0  # ADMIN is the owner's


def test_a_task_file_for_a_role_the_team_lacks_is_refused_with_its_reason_beside_it(ws: Path) -> None:
    assert run("up", "--once", cwd=ws).code == 0  # the import: files from now on are live input
    inbox = ws / "fcop" / "_lifecycle" / "inbox"
    (inbox / "TASK-20260101-001-ADMIN-to-DEVV.md").write_text(
        "---\nprotocol: fcop\nversion: 1\nsender: ADMIN\nrecipient: DEVV\npriority: P2\nsubject: typo\n---\nbody\n")
    assert run("up", "--once", cwd=ws).code == 0
    note = (inbox / "_reason.TASK-20260101-001-ADMIN-to-DEVV.md.txt").read_text()
    assert "unknown_role" in note and "did you mean DEV?" in note
    assert run("task", "list", cwd=ws).json == []


def test_history_naming_a_role_the_team_lacks_is_imported_as_it_was(tmp_path: Path) -> None:
    project = tmp_path / "project"
    active = project / "fcop" / "_lifecycle" / "active"
    active.mkdir(parents=True)
    (project / "fcop" / "fcop.json").write_text(json.dumps({"team": "dev-team", "leader": "PM",
                                                            "roles": ["PM", "DEV"]}))
    (active / "TASK-20250101-001-ADMIN-to-GHOST.md").write_text(
        "---\nprotocol: fcop\nversion: 1\nsender: ADMIN\nrecipient: GHOST\npriority: P2\nsubject: old\n---\nbody\n")
    assert run("init", str(project), cwd=tmp_path).code == 0
    assert run("up", "--once", cwd=project).code == 0
    shown = run("task", "show", "TASK-20250101-001", cwd=project)
    assert shown.code == 0 and shown.json["recipient"] == "GHOST" and shown.json["state"] == "active", shown.out


@pytest.mark.parametrize(("payload", "expected"), [
    ({"permission": "aprove", "scope": "task:TASK-20260101-001"}, "permission 'aprove' is not a task command; did "
     "you mean 'approve'?"),
    ({"permission": "approve", "scope": "TASK-20260101-001"}, "did you mean 'task:TASK-20260101-001'?"),
    ({"permission": "approve", "scope": "tsk:TASK-20260101-001"}, "did you mean 'task:TASK-20260101-001'?"),
    ({"permission": "approve", "scope": "task:*"}, "a task grant names one task, task:<TASK-ID>"),
    ({"permission": "approve", "scope": "file:deploy.yaml"}, "its scope is the task, task:<TASK-ID>"),
    ({"permission": "deploy now", "scope": "env:production"}, "is not an operation name"),
])
def test_a_grant_nothing_could_read_is_refused_and_never_stored(ws: Path, payload: dict[str, str],
                                                                 expected: str) -> None:
    r = run("session", "accept", "admin", "--kind", "allow", "--input-id", "g1", "--payload", json.dumps(payload),
            cwd=ws)
    assert r.code == 2 and r.json["reason"] == "invalid_grant" and expected in r.json["message"], r.out
    assert "Traceback" not in r.err
    assert run("session", "export", "admin", cwd=ws).json["reason"] == "unknown_session"  # not even the session


def test_grants_both_consumers_read_are_accepted(ws: Path) -> None:
    for n, payload in enumerate(({"permission": "approve", "scope": "task:TASK-20260101-001"},
                                 {"permission": "deploy", "scope": "env:production"},
                                 {"permission": "*", "scope": "file:config/*"})):
        r = run("session", "accept", "admin", "--kind", "allow", "--input-id", f"g{n}", "--payload",
                json.dumps(payload), cwd=ws)
        assert r.code == 0 and r.json["status"] == "accepted", r.out


def schedule(ws: Path, name: str, template: str, *extra: str) -> Run:
    (ws / f"{name}.yaml").write_text(template)
    return run("schedule", "add", name, "--every", "1m", "--action", "create_task", "--template",
               str(ws / f"{name}.yaml"), *extra, cwd=ws)


def test_a_schedule_for_a_role_the_team_lacks_is_refused_when_it_is_added(ws: Path) -> None:
    r = schedule(ws, "orphans", "recipient: NOPE\nsubject: every minute\n")
    assert r.code == 2 and r.json["reason"] == "unknown_role", r.out
    assert "template recipient NOPE is not a role of the team" in r.json["message"]
    r = schedule(ws, "typo", "recipient: DEV\nsubject: s\ndone_authority: PMM\n")
    assert r.json["reason"] == "unknown_role" and "did you mean PM?" in r.json["message"], r.out
    r = schedule(ws, "owner", "recipient: DEV\nsubject: s\n", "--owner", "DEVV")
    assert r.json["reason"] == "unknown_role" and "owner DEVV" in r.json["message"], r.out
    r = schedule(ws, "shape", "recipient: DEV\nsubjct: s\nsubject: s\n")
    assert r.code == 65 and r.json["reason"] == "invalid_template" and "subjct" in r.json["message"], r.out
    assert run("schedule", "list", cwd=ws).json == {"schedules": []}
    assert schedule(ws, "good", "recipient: DEV\nsubject: every minute\n").code == 0


def test_a_scheduled_grant_follows_the_grant_grammar(ws: Path) -> None:
    r = run("schedule", "add", "g", "--every", "1h", "--action", "accept_input", "--session", "admin", "--kind",
            "allow", "--payload", json.dumps({"permission": "aprove", "scope": "task:TASK-20260101-001"}), cwd=ws)
    assert r.code == 2 and r.json["reason"] == "invalid_grant" and "did you mean 'approve'?" in r.json["message"]
