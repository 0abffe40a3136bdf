"""Data never drives the terminal (docs/cli.md, "Data on a terminal"): a subject, a body, a report, an agent's name,
a schedule's template, a session input, a run's output or a planted reason note that holds terminal control
sequences (window title, erase line, cursor up, an OSC 52 clipboard write, a C1 CSI, DEL, bidi overrides) is shown
escaped by every command that prints it for a person, and the JSON documents carry it as JSON escapes.

Every command runs in its own process on a pseudo-terminal (tests/cli_support.py ``run_tty``), as a person at a
terminal sees it; stderr is a pipe and is held to the same rule."""

from __future__ import annotations

import io
import json
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from taskkernel.coordinator.cli.live import live_view
from taskkernel.coordinator.workspace import Workspace
from taskkernel.kernel.private import read_secret
from taskkernel.kernel.sessionlog import parse_lines
from taskkernel.kernel.sessionlog.interchange import signing_key
from taskkernel.kernel.text import terminal_text
from taskkernel.kernel.usage import Feature, UsageRecord, record_usage
from taskkernel.kernel.usage import install as install_usage
from tests.cli_support import Run, append_config, new_workspace, run_tty, taskkernel
from tests.coord_support import coordinator, workspace_database

# Window title (OSC 0), erase line, cursor up, clipboard write (OSC 52), a one-character C1 CSI, bidi override and
# isolate, DEL: one of each kind of thing a terminal would act on.
EVIL = "x\x1b]0;T\x07\x1b[2K\x1b[1A\x1b]52;c;QQ==\x07\x9b1m\u202e\u2066\x7fy"
SHOWN = ("\\x1b]0;T\\x07", "\\x1b[2K", "\\x1b[1A", "\\x1b]52;c;QQ==\\x07", "\\x9b1m", "\\u202e", "\\u2066", "\\x7f")
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")  # what must never reach a terminal
WIDE = "400"  # columns: no escaped sequence is cut by a table's wrapping


def ok(*args: str, cwd: Path, token: str | None = None) -> Any:
    proc = taskkernel(*args, cwd=cwd, env={"TASKKERNEL_TOKEN": token} if token else None)
    assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1]) if proc.stdout.strip() else None


def assert_escaped(r: Run, *, shown: bool = True) -> None:
    """No raw control, C1 or bidi character in stdout or stderr; every escaped form is there (``shown``)."""
    for stream in (r.out, r.err):
        raw = RAW.search(stream)
        assert raw is None, (hex(ord(raw.group())), stream[max(0, raw.start() - 80):raw.end() + 80])
    assert "Traceback" not in r.err, r.err
    if shown:  # in any case (a role is upper-cased before it is quoted); inside JSON as JSON escapes (\u001b)
        text = (r.out + r.err).lower()
        missing = [s for s in SHOWN if s.lower() not in text and s.replace("\\x", "\\u00").lower() not in text]
        assert not missing, (missing, r.out, r.err)


@pytest.fixture(scope="module")
def evil(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A workspace where EVIL is everywhere a person's or an agent's text can go."""
    tmp = tmp_path_factory.mktemp("escaping")
    ws = new_workspace(tmp)
    agent = tmp / "agent.py"
    agent.write_text(textwrap.dedent(f"""
        import sys
        print({EVIL!r}, flush=True)
        print({EVIL!r}, file=sys.stderr, flush=True)
        sys.exit(3)
    """), encoding="utf-8")
    append_config(ws, f'\n[roles.QA]\nrunner = "command"\nargv = [{json.dumps(sys.executable)}, '
                      f'{json.dumps(str(agent))}]\nmax_attempts = 1\ntimeout = 60\n')
    proc = taskkernel("token", "issue", "DEV", "--agent", EVIL, cwd=ws)
    assert proc.returncode == 0, proc.stderr
    dev = proc.stdout.strip()
    blocked = ok("task", "create", "--to", "DEV", "--subject", EVIL, "--body", f"intro\n{EVIL}", "--risk", "high",
                 cwd=ws)["task_id"]
    ok("task", "claim", blocked, cwd=ws, token=dev)
    ok("task", "report", blocked, "--status", "blocked", "--body", EVIL, cwd=ws, token=dev)
    review = ok("task", "create", "--to", "DEV", "--subject", EVIL, "--risk", "high", cwd=ws)["task_id"]
    ok("task", "claim", review, cwd=ws, token=dev)
    ok("task", "report", review, "--status", "done", "--body", EVIL, "--submit", cwd=ws, token=dev)
    ran = ok("task", "create", "--to", "QA", "--subject", "run it", cwd=ws)["task_id"]
    up = taskkernel("up", "--once", cwd=ws)
    assert up.returncode == 0, (up.stdout, up.stderr)
    run_id = next(r["run_id"] for r in ok("runs", "list", cwd=ws) if r["task_id"] == ran)
    template = tmp / "template.json"
    template.write_text(json.dumps({"recipient": "DEV", "subject": EVIL}), encoding="utf-8")
    ok("schedule", "add", "nightly", "--every", "1h", "--action", "create_task", "--template", str(template), cwd=ws)
    ok("session", "accept", "notes", "--kind", "message", "--input-id", "i1", "--payload", json.dumps({"text": EVIL}),
       cwd=ws)
    db = workspace_database(Workspace.load(ws))
    install_usage(db)
    with db.write() as uow:
        record_usage(uow, UsageRecord(usage_id="u1", role="DEV", agent=EVIL, feature=Feature.FOREGROUND,
                                      root_task=review, task_id=review, tokens_in=10))
    db.dispose()
    note = ws / "fcop" / "_lifecycle" / "inbox" / "_reason.TASK-20261130-009-ADMIN-to-DEV.md.txt"
    note.write_text(f"reason: {EVIL}\n", encoding="utf-8")  # what an agent with the folder could plant
    return {"ws": ws, "blocked": blocked, "review": review, "run": run_id}


COMMANDS: dict[str, tuple[str, ...]] = {
    "task list": ("task", "list"),
    "task list --all": ("task", "list", "--all"),
    "task show (blocked)": ("task", "show", "{blocked}"),
    "task show (review)": ("task", "show", "{review}"),
    "inbox": ("inbox",),
    "log": ("log",),
    "token list": ("token", "list"),
    "schedule list": ("schedule", "list"),
    "schedule show": ("schedule", "show", "nightly"),
    "session replay": ("session", "replay", "notes"),
    "runs show": ("runs", "show", "{run}"),
    "usage": ("usage", "--by", "agent"),
    "doctor": ("doctor",),
    "an error quoting the input": ("task", "show", EVIL),
    "a refusal quoting the input": ("task", "create", "--to", EVIL, "--subject", "s"),
}


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_shows_data_escaped_on_a_terminal(evil: dict[str, Any], name: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", WIDE)
    monkeypatch.setenv("LINES", "50")  # rich takes a size from the environment only with both
    args = [a.format(**evil) if a.startswith("{") else a for a in COMMANDS[name]]
    assert_escaped(run_tty(*args, cwd=evil["ws"]))


def test_the_live_view_of_up_shows_data_escaped(evil: dict[str, Any]) -> None:
    c = coordinator(Workspace.load(evil["ws"]))
    screen = io.StringIO()
    Console(file=screen, force_terminal=True, color_system=None, width=int(WIDE)).print(live_view(c, {}))
    c.db.dispose()
    assert_escaped(Run(0, screen.getvalue(), ""))


def strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return [s for item in items for s in strings(item)]


@pytest.mark.parametrize("args", [("--json", "task", "show", "{blocked}"), ("--json", "task", "list", "--all"),
                                  ("--json", "log"), ("session", "export", "notes")])
def test_json_on_a_terminal_is_inert_and_keeps_the_data(evil: dict[str, Any], args: tuple[str, ...]) -> None:
    """JSON escapes C0 itself; DEL, C1 and bidi go out as \\u escapes too: the same value for a parser."""
    r = run_tty(*(a.format(**evil) if a.startswith("{") else a for a in args), cwd=evil["ws"])
    assert_escaped(r, shown=False)
    assert "\\u009b" in r.out and "\\u202e" in r.out and "\\u007f" in r.out
    docs = [json.loads(line) for line in r.out.splitlines() if line.startswith(("{", "["))]
    assert any(EVIL in s for s in strings(docs))


def test_an_export_on_a_terminal_still_proves_its_provenance(evil: dict[str, Any]) -> None:
    """The signature covers the values, not the spelling: the escaped lines import with their `accepted_by`."""
    r = run_tty("session", "export", "notes", cwd=evil["ws"])
    key = signing_key(read_secret(Workspace.load(evil["ws"]).chain_key_path))
    [record] = parse_lines(r.out.splitlines(), provenance_key=key, check_provenance=True)["notes"]
    assert record.payload["text"] == EVIL and record.accepted_by == "ADMIN:local-owner", record


def test_the_rule_keeps_a_body_s_lines_and_is_idempotent() -> None:
    body = f"first\n\tsecond {EVIL}\r"
    once = terminal_text(body, lines=True)
    assert once.splitlines()[0] == "first" and once.splitlines()[1].startswith("\tsecond x\\x1b]0;T")
    assert once.endswith("y\\r") and RAW.search(once) is None
    assert terminal_text(once, lines=True) == once and "\n" not in terminal_text(body)

