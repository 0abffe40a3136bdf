"""Live agent output as typed run events (issue 28, item 1; docs/live-output.md).

The parsers read what the REAL CLIs printed (tests/fixtures/run-streams, captured from `taskkernel up --once`
against the stand-in model servers; README.md there says how), so a shape here is a shape a CLI prints. Then what a
person following a run relies on: no secret the agent was handed reaches the stored events, nothing stored can
drive a terminal, chunk boundaries change nothing, a run's events are bounded, a storage failure never breaks the
run, and `runs follow` (a real `taskkernel` process) prints each event once, as it is stored, and ends by itself
when the run ends.
"""

from __future__ import annotations

import json
import random
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from taskkernel.coordinator.agent_profiles import OutputKind
from taskkernel.coordinator.runners import stream
from taskkernel.coordinator.runners.ledger import ClaimedRun, Purpose, RunLedger
from taskkernel.coordinator.runners.live import (
    HEAD_EVENTS,
    MAX_EVENTS_PER_RUN,
    MAX_LINE_BYTES,
    RunOutput,
    latest_events,
    read_events,
)
from taskkernel.coordinator.runners.stream import (
    EVENT_KINDS,
    SUMMARY_CHARS,
    TEXT_CHARS,
    LineParser,
    RunEvent,
    finished,
    redact,
)
from taskkernel.coordinator.schema import metadatas
from taskkernel.coordinator.tables import run_events
from taskkernel.kernel.store.db import Database
from tests.cli_support import new_workspace, run, run_tty
from tests.real_clis import json_lines, require_cli
from tests.test_follow import DEADLINE, Follower
from tests.test_real_clis import CLIS as REAL_CLIS
from tests.test_real_clis import KEYS, team_of, work

FIXTURES = Path(__file__).parent / "fixtures" / "run-streams"
DONE = "Done: hello.txt written, reported and submitted."
TOKEN = "tk_" + "Qx7-" * 10 + "abc"  # the shape kernel/credentials.py issue_token gives a run

# runner -> (fixture name, its profile's parser, the tools it called in order, its last usage event)
CLIS: dict[str, tuple[str, OutputKind, list[str], str | None]] = {
    "claude-code": ("claude-code-2.1.332", OutputKind.CLAUDE_RESULT,
                    ["ToolSearch", "mcp__taskkernel__get_task", "Write", "mcp__taskkernel__report",
                     "mcp__taskkernel__submit_task"], "tokens in 6000, out 300, cost $0.0300"),
    "codex": ("codex-0.171.0", OutputKind.CODEX_EVENTS, ["get_task", "file_change", "report", "submit_task"],
              "tokens in 5000, out 250"),
    "gemini-cli": ("gemini-cli-0.61.0", OutputKind.GEMINI_JSON,
                   ["mcp_taskkernel_get_task", "write_file", "mcp_taskkernel_report", "mcp_taskkernel_submit_task"],
                   "tokens in 5010, out 251"),
    "qwen-code": ("qwen-code-0.24.4", OutputKind.CLAUDE_RESULT,
                  ["mcp__taskkernel__get_task", "write_file", "mcp__taskkernel__report",
                   "mcp__taskkernel__submit_task"], "tokens in 5000, out 250"),
    "opencode": ("opencode-1.18.33", OutputKind.OPENCODE_EVENTS,
                 ["taskkernel_get_task", "write", "taskkernel_report", "taskkernel_submit_task"],
                 "tokens in 1000, out 50, cost $0.0037"),  # one per step
    "copilot": ("copilot-1.0.102", OutputKind.COPILOT_EVENTS,
                ["taskkernel-get_task", "create", "taskkernel-report", "taskkernel-submit_task"], None),
    "droid": ("droid-0.225.2", OutputKind.DROID_EVENTS,
              ["ToolSearch", "taskkernel___get_task", "Create", "taskkernel___report", "taskkernel___submit_task"],
              "tokens in 6000, out 300"),
}


def fixture(runner: str, scenario: str) -> bytes:
    return (FIXTURES / f"{CLIS[runner][0]}.{scenario}.jsonl").read_bytes()


def parsed(runner: str, scenario: str, secrets: tuple[str, ...] = ()) -> list[RunEvent]:
    """The events of a whole captured run, read line by line as a run reads them."""
    parser = LineParser(CLIS[runner][1])
    events = [e for line in fixture(runner, scenario).decode().splitlines() for e in parser.parse(line)]
    return [finished(e, secrets) for e in [*events, *parser.finish()]]


@pytest.mark.parametrize("runner", list(CLIS))
def test_a_real_cli_run_reads_as_its_tool_calls_their_results_its_answer_and_its_usage(runner: str) -> None:
    """The agent read the task, wrote hello.txt, reported and submitted: a follower sees each call by the tool's
    name with its arguments, each result named by its call, the model's last words and what the run cost."""
    _, _, calls, usage = CLIS[runner]
    events = parsed(runner, "work")
    assert all(e.kind in EVENT_KINDS for e in events)
    assert [e.tool for e in events if e.kind == "tool_call"] == calls
    assert [e.tool for e in events if e.kind == "tool_result"] == calls, "every result named by its call's tool"
    [report] = [e for e in events if e.kind == "tool_call" and e.tool == calls[-2]]
    assert report.text.startswith(f"{calls[-2]}(") and '"body":"wrote hello.txt"' in report.text
    assert any(e.kind == "tool_result" and "submit accepted" in e.text for e in events), "the kernel's answer"
    assert [e.text for e in events if e.kind == "text"][-1] == DONE
    assert [e.text for e in events if e.kind == "usage"][-1:] == ([usage] if usage else [])
    assert not [e for e in events if e.kind == "error"]
    assert all(len(e.text) <= SUMMARY_CHARS for e in events if e.kind in ("tool_call", "tool_result"))


@pytest.mark.parametrize("runner", list(CLIS))
def test_a_provider_error_reads_as_an_error_event_with_the_providers_reason(runner: str) -> None:
    """The provider answered 400 to every request: whatever shape the CLI prints it in, an error event says so."""
    errors = [e.text for e in parsed(runner, "error") if e.kind == "error"]
    assert any("stand-in error 400" in text for text in errors), errors


def test_the_generic_command_runner_shows_each_line_and_reads_its_usage_lines() -> None:
    parser = LineParser(None)
    assert parser.parse("compiling…") == [RunEvent("output", "compiling…")]
    assert parser.parse('{"usage": {"tokens_in": 1200, "tokens_out": 300, "cost_usd": 0.0125}}') == [
        RunEvent("usage", "tokens in 1200, out 300, cost $0.0125")]
    assert parser.parse('{"step": 3}') == [RunEvent("output", '{"step": 3}')]
    assert parser.parse("taskkernel:heartbeat") == [] and parser.parse("   ") == []


def _mutations(value: Any) -> Iterator[Any]:
    """``value`` with one of its values (at any depth) replaced by a value of another type."""
    if isinstance(value, dict):
        for key, inner in value.items():
            for other in (None, 7, "x", [], {}, [None]):
                yield {**value, key: other}
            for changed in _mutations(inner):
                yield {**value, key: changed}
    elif isinstance(value, list):
        for i, inner in enumerate(value[:3]):
            for changed in _mutations(inner):
                yield [*value[:i], changed, *value[i + 1:]]


@pytest.mark.parametrize("runner", list(CLIS))
def test_shapes_a_cli_never_printed_are_read_without_a_parser_failure(
        runner: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every real line with any one value of another type, and lines that are no JSON object: each is read as
    some events or none, and none of them makes the parser fail (a failure would lose the line)."""
    failures: list[str] = []
    monkeypatch.setattr(stream.log, "exception", lambda event, **kw: failures.append(event))
    parser = LineParser(CLIS[runner][1])
    lines = ["", "plain text", "{", "[1, 2]", '{"type": 5}', "{" * 5000 + "}" * 5000, '{"n": 1' + "0" * 5000 + "}"]
    for line in fixture(runner, "work").decode().splitlines()[:12]:
        lines += [json.dumps(m) for m in _mutations(json.loads(line))]
    for line in lines:
        assert all(isinstance(e, RunEvent) and e.kind in EVENT_KINDS for e in parser.parse(line))
    assert failures == []


def test_a_parser_defect_loses_its_line_not_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = LineParser(OutputKind.CODEX_EVENTS)
    monkeypatch.setitem(stream._READERS, OutputKind.CODEX_EVENTS, lambda obj, run: 1 / 0)
    assert parser.parse('{"type": "turn.started"}') == []


# -- redaction ---------------------------------------------------------------------------------------------------


def test_secrets_and_well_known_key_shapes_are_redacted() -> None:
    given = "sk-standin-openai-key"  # a value the run was handed, whatever its shape
    shapes = ["sk-ant-api03-" + "x" * 40, "sk-proj-" + "Y" * 30, "ghp_" + "a" * 36, "github_pat_" + "b" * 40,
              "xoxb-1234567890-abcdefghij", "AKIAIOSFODNN7EXAMPLE", "AIza" + "c" * 35, "tk_" + "Z" * 43]
    text = f"run token {TOKEN}; key {given}; short one stays; " + "; ".join(shapes)
    out = redact(text + "; Authorization: Bearer abc.def-ghi_jkl", [TOKEN, given, "short"])
    for secret in [TOKEN, given, *shapes, "abc.def-ghi_jkl"]:
        assert secret not in out
    assert "short one stays" in out, "a value under 8 characters would redact ordinary words"
    assert "Bearer [redacted]" in out and out.count("[redacted]") == 11


def test_control_characters_and_bidi_overrides_are_escaped_newlines_kept() -> None:
    assert redact("red \x1b[31mtext\x07\u202eevil\x9b\r\n\tnext", []) == (
        "red \\x1b[31mtext\\x07\\u202eevil\\x9b\\r\n\tnext")


def test_a_secret_at_the_cut_leaves_no_part_of_itself() -> None:
    """Redacted before it is cut: a token that straddles the bound is not half kept."""
    event = finished(RunEvent("tool_result", "x" * (SUMMARY_CHARS - 20) + TOKEN, "get_task"), [TOKEN])
    assert TOKEN[:12] not in event.text and len(event.text) <= SUMMARY_CHARS


def test_long_text_is_cut_to_its_bound() -> None:
    assert len(finished(RunEvent("text", "y" * 10_000), []).text) == TEXT_CHARS
    assert finished(RunEvent("tool_call", "z" * 1000, "t"), []).text.endswith("…")


# -- RunOutput: stored as it comes ---------------------------------------------------------------------------------


@pytest.fixture
def db(sqlite_db: Database) -> Database:
    sqlite_db.create_schema(*metadatas())
    return sqlite_db


@pytest.fixture
def both_db(any_db: Database) -> Database:
    any_db.create_schema(*metadatas())
    return any_db


def output(db: Database, kind: OutputKind | None = None, run_id: str = "TASK-20990101-001:r1:execute:1",
           attempt: int = 1, secrets: tuple[str, ...] = ()) -> RunOutput:
    return RunOutput(db, run_id=run_id, task_id=run_id.split(":")[0], attempt=attempt, output_kind=kind,
                     secrets=secrets)


def stored(db: Database, run_id: str = "TASK-20990101-001:r1:execute:1") -> list[dict[str, Any]]:
    return read_events(db, run_id=run_id, limit=1000) + read_events(db, run_id=run_id, after=1000, limit=1000)


def test_a_token_the_agent_prints_never_reaches_the_stored_events(db: Database) -> None:
    """Claude Code's own lines (as it printed them), the model echoing the run's token and a provider key in its
    text, in a tool's arguments and in a tool's result."""
    lines = fixture("claude-code", "work").decode().splitlines()
    said = json.loads(next(line for line in lines if DONE in line and '"assistant"' in line))
    said["message"]["content"][0]["text"] = f"my token is {TOKEN} and the key sk-standin-anthropic-key"
    call = json.loads(next(line for line in lines if '"name":"Write"' in line))
    call["message"]["content"][0]["input"]["content"] = f"TASKKERNEL_TOKEN={TOKEN}\n"
    result = json.loads(next(line for line in lines if "File created successfully" in line))
    result["message"]["content"][0]["content"] = f"export TASKKERNEL_TOKEN={TOKEN}"
    run = output(db, OutputKind.CLAUDE_RESULT, secrets=(TOKEN, "sk-standin-anthropic-key"))
    run.feed("".join(json.dumps(o) + "\n" for o in (said, call, result)).encode())
    run.close()
    events = stored(db)
    assert [e["kind"] for e in events] == ["text", "tool_call", "tool_result"]
    assert TOKEN not in json.dumps(events) and "anthropic-key" not in json.dumps(events)
    assert events[0]["text"] == "my token is [redacted] and the key [redacted]"


def test_a_streamed_answer_is_one_event_and_a_secret_split_over_its_pieces_is_redacted(db: Database) -> None:
    """Gemini CLI's stream-json sends the model's answer in pieces (``delta``): stored as one text event, given
    when the next event comes, and the run's token, cut across two pieces, is found whole."""
    lines = fixture("gemini-cli", "work").decode().splitlines()
    answer = json.loads(next(line for line in lines if '"role":"assistant"' in line))
    pieces = ["Done. My token: ", TOKEN[:20], TOKEN[20:] + " (do not share)"]
    run = output(db, OutputKind.GEMINI_JSON, secrets=(TOKEN,))
    run.feed("".join(json.dumps({**answer, "content": p}) + "\n" for p in pieces).encode())
    run.feed(lines[-1].encode() + b"\n")  # the result
    run.close()
    assert [(e["kind"], e["text"]) for e in stored(db)] == [
        ("text", "Done. My token: [redacted] (do not share)"), ("usage", "tokens in 5010, out 251")]


def test_chunk_boundaries_and_split_characters_change_nothing(db: Database) -> None:
    """A real run's stdout handed over in pieces of 1 to 9 bytes (cutting lines and the UTF-8 of its "—") is
    stored exactly as the whole of it read at once."""
    data = fixture("claude-code", "work")
    assert "—".encode() in data, "the capture holds a character of several bytes"
    run = output(db, OutputKind.CLAUDE_RESULT)
    rng, at = random.Random(28), 0
    while at < len(data):
        step = rng.randint(1, 9)
        run.feed(data[at:at + step])
        at += step
    run.close()
    assert [(e["kind"], e["tool"], e["text"]) for e in stored(db)] == [
        (e.kind, e.tool, e.text) for e in parsed("claude-code", "work")]
    assert [e["n"] for e in stored(db)] == list(range(1, len(parsed("claude-code", "work")) + 1))


def test_a_last_line_without_a_newline_is_stored_at_close_and_a_split_character_decodes(db: Database) -> None:
    run = output(db)
    run.feed(b"caf\xc3")
    run.feed(b"\xa9 ok\nno newline at the end")
    run.close()
    assert [e["text"] for e in stored(db)] == ["café ok", "no newline at the end"]


def test_a_huge_line_is_read_up_to_its_bound_and_the_next_line_is_read_whole(db: Database) -> None:
    run = output(db)
    block = b"x" * (64 << 10)
    for _ in range(MAX_LINE_BYTES // len(block) + 8):
        run.feed(block)
    run.feed(b"\nnext\n")
    run.close()
    [huge, nxt] = stored(db)
    assert len(huge["text"]) == TEXT_CHARS and huge["text"].endswith("…") and nxt["text"] == "next"


def test_an_event_is_stored_within_a_fraction_of_a_second_while_the_agent_runs(db: Database) -> None:
    """Two lines a moment apart: the second is stored by the flush timer, not only when the run ends."""
    run = output(db)
    run.feed(b"first\n")
    run.feed(b"second\n")
    end = time.monotonic() + 5
    while len(stored(db)) < 2 and time.monotonic() < end:
        time.sleep(0.05)
    assert [e["text"] for e in stored(db)] == ["first", "second"]
    run.close()


def test_a_run_keeps_its_first_and_latest_events_and_counts_the_rest(both_db: Database) -> None:
    """2,600 lines over two attempts: the first 1,000 and the latest 999 are kept, one event between them says 601
    were not, and the later attempt is what the run shows last. The same when all 2,600 come before the database
    takes any (they are dropped before they are written: memory stays bounded)."""
    db = both_db
    lines = [f"line {i}\n".encode() for i in range(1, 2601)]
    for attempt, part in ((1, lines[:1500]), (2, lines[1500:])):
        run = output(db, attempt=attempt)
        run.feed(b"".join(part))
        run.close()
    at_once = "TASK-20990101-001:r1:execute:2"
    run = output(db, run_id=at_once)
    run.feed(b"".join(lines))
    run.close()
    for run_id, last_attempt in (("TASK-20990101-001:r1:execute:1", 2), (at_once, 1)):
        events = stored(db, run_id)
        assert len(events) == MAX_EVENTS_PER_RUN
        texts = [e["text"] for e in events]
        assert texts[:HEAD_EVENTS] == [f"line {i}" for i in range(1, HEAD_EVENTS + 1)]
        assert texts[HEAD_EVENTS].startswith("… 601 more events not kept")
        assert texts[HEAD_EVENTS + 1:] == [f"line {i}" for i in range(1602, 2601)]
        assert (events[-1]["n"], events[-1]["attempt"]) == (2600, last_attempt)
        assert [e["at"] for e in events] == sorted(e["at"] for e in events), "the notice sorts where it stands"
    # a reader of the task whose last event was trimmed away since goes on after it, repeating nothing
    resumed = read_events(db, task_id="TASK-20990101-001", after=("TASK-20990101-001:r1:execute:1", 1500), limit=3)
    assert [e["n"] for e in resumed] == [1602, 1603, 1604]


def test_a_storage_failure_loses_the_events_never_the_run(db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any) -> Any:
        raise sa.exc.OperationalError("INSERT", None, Exception("disk I/O error"))

    monkeypatch.setattr(db, "write", broken)
    monkeypatch.setattr(db, "create_schema", broken)
    run = output(db)
    run.feed(b"one\n")
    run.feed(b"two\n")
    run.close()
    monkeypatch.undo()
    assert stored(db) == []


def test_a_tasks_events_read_in_the_order_they_were_printed_across_its_runs(both_db: Database) -> None:
    """Its execute run, then its review run (whose id sorts first): `after` a read's last event continues it."""
    db = both_db
    task = "TASK-20990101-001"
    for run_id, lines in ((f"{task}:r1:execute:2", b"exec 1\nexec 2\n"), (f"{task}:r1:a-review:3", b"review 1\n"),
                          ("TASK-20990101-002:r1:execute:4", b"another task\n")):
        run = output(db, run_id=run_id)
        run.feed(lines)
        run.close()
    first = read_events(db, task_id=task, limit=2)
    assert [e["text"] for e in first] == ["exec 1", "exec 2"]
    assert set(first[0]) == {"run_id", "n", "task_id", "attempt", "at", "kind", "tool", "text"}
    rest = read_events(db, task_id=task, after=(first[-1]["run_id"], first[-1]["n"]))
    assert [e["text"] for e in rest] == ["review 1"]
    assert [e["text"] for e in latest_events(db, task, 2)] == ["exec 2", "review 1"]
    assert [e["text"] for e in read_events(db, run_id=f"{task}:r1:execute:2", after=1)] == ["exec 2"]
    with pytest.raises(ValueError, match="run_id"):
        read_events(db, task_id=task, after=1)


# -- `taskkernel runs follow` --------------------------------------------------------------------------------------


def running(ws: Path, run_id: str) -> tuple[Database, RunLedger, ClaimedRun]:
    """The workspace's database with ``run_id`` running, as the dispatcher leaves a run it started."""
    db = Database(f"sqlite:///{ws / '.taskkernel' / 'kernel.db'}")
    ledger = RunLedger(db, "test-owner", lease_seconds=3600)
    with db.write() as uow:
        ledger.enqueue(uow, run_id, run_id.split(":")[0], 1, "DEV", Purpose.EXECUTE, 3)
    [claimed] = ledger.claim_due(limit=1)
    return db, ledger, claimed


def test_runs_follow_prints_each_event_once_as_it_is_stored_and_ends_when_the_run_is_done(tmp_path: Path) -> None:
    ws = new_workspace(tmp_path)
    run_id = "TASK-20990101-001:r1:execute:1"
    db, ledger, claimed = running(ws, run_id)
    lines = fixture("claude-code", "work").splitlines(keepends=True)
    agent = output(db, OutputKind.CLAUDE_RESULT, run_id=run_id)
    agent.feed(b"".join(lines[:2]))  # started; the first tool call
    follower = Follower("runs", "follow", run_id, cwd=ws)
    try:
        follower.until(lambda e: e["kind"] == "tool_call", "the event stored before the follow began")
        agent.feed(b"".join(lines[2:]))
        follower.until(lambda e: e["kind"] == "usage", "the events stored while following")
        agent.close()
        assert ledger.succeed(claimed, 0)
        assert follower.proc.wait(DEADLINE) == 0
    finally:
        if follower.proc.poll() is None:
            follower.proc.kill()
    while not follower.lines.empty():
        follower.seen.append(json.loads(follower.lines.get()))
    assert [e["n"] for e in follower.seen] == list(range(1, len(stored(db, run_id)) + 1)), "each once, in order"
    assert follower.seen == stored(db, run_id)
    assert f"{run_id} is done" in follower.stderr()


def test_runs_follow_refuses_an_unknown_run_gives_up_at_its_timeout_and_stops_quietly(tmp_path: Path) -> None:
    ws = new_workspace(tmp_path)
    run_id = "TASK-20990101-001:r1:execute:1"
    db, _, _ = running(ws, run_id)
    unknown = run("runs", "follow", "no-such-run", cwd=ws)
    assert unknown.code == 2 and unknown.json["reason"] == "run_not_found"
    late = run("runs", "follow", run_id, "--timeout", "0.5", cwd=ws)
    assert late.code == 1, late.err
    assert (late.json["code"], late.json["state"], late.json["run_id"]) == ("timeout", "running", run_id)
    agent = output(db, run_id=run_id)
    agent.feed(b"still working\n")
    agent.close()
    follower = Follower("runs", "follow", run_id, cwd=ws)
    follower.until(lambda e: e["text"] == "still working", "the run's event")  # under way, polling
    assert follower.stop(signal.SIGINT) == 0


def test_runs_follow_on_a_terminal_shows_readable_lines_that_cannot_drive_it(tmp_path: Path) -> None:
    """A row written raw (ESC, a bidi override, a newline in it: a writer that did not escape) still reaches the
    terminal escaped, on one line per event."""
    ws = new_workspace(tmp_path)
    run_id = "TASK-20990101-001:r1:execute:1"
    db, ledger, claimed = running(ws, run_id)
    with db.write() as uow:
        uow.conn.execute(run_events.insert(), [
            {"run_id": run_id, "n": 1, "task_id": "TASK-20990101-001", "attempt": 1, "at": "2099-01-01T10:00:01Z",
             "kind": "tool_call", "tool": "get_task", "text": 'get_task({"task_id":"TASK-20990101-001"})'},
            {"run_id": run_id, "n": 2, "task_id": "TASK-20990101-001", "attempt": 1, "at": "2099-01-01T10:00:02Z",
             "kind": "text", "tool": None, "text": "red \x1b[31mtext\u202e\nsecond line"}])
    assert ledger.succeed(claimed, 0)
    shown = run_tty("runs", "follow", run_id, cwd=ws)
    assert shown.code == 0, shown.err
    assert "\x1b" not in shown.out and "\u202e" not in shown.out
    out = shown.out.splitlines()
    assert out[0].split() == ["10:00:01", "tool_call", 'get_task({"task_id":"TASK-20990101-001"})']
    assert out[1] == "10:00:02 text        red \\x1b[31mtext\\u202e\\nsecond line"
    assert f"{run_id} is done" in out[2]



# The agent is given its provider's key in a variable (Droid's is in the user's own settings file: not the run's)
KEY_IN_ENV = {"claude-code", "codex", "qwen-code", "opencode", "copilot"}


@pytest.mark.agent_clis
@pytest.mark.parametrize("runner", [r for r in CLIS if r != "gemini-cli"])  # its profile prints no stream
def test_a_real_cli_runs_events_are_stored_and_runs_follow_prints_them(tmp_path: Path, runner: str) -> None:
    """The real CLI through `taskkernel up --once`: its run's events are stored while it works (each tool call by
    its name, in order), the provider key the model repeats is redacted, and `runs follow` of the finished run
    prints them all and exits 0."""
    binary, server_class = REAL_CLIS[runner]
    require_cli(binary)
    with server_class() as model:
        team = team_of(tmp_path, runner, model, DEV={})
        task_id = team.task("DEV", "Greeting", "Add a greeting.")
        model.load([*work(task_id, team.worktree(task_id), "hello\n", "wrote hello.txt")[:-1],
                    {"text": f"Done, with the key {KEYS[runner]} in hand."}])
        team.up()
    [run_doc] = team.runs(task_id)
    assert run_doc["state"] == "done", run_doc
    followed = team.cli("runs", "follow", run_doc["run_id"], "--json", timeout=60)
    assert followed.returncode == 0, followed.stderr
    events = json_lines(followed.stdout)
    assert [e["tool"] for e in events if e["kind"] == "tool_call"] == CLIS[runner][2]
    assert [e["n"] for e in events] == list(range(1, len(events) + 1))
    [said] = [e["text"] for e in events if e["kind"] == "text" and "in hand" in e["text"]]
    if runner in KEY_IN_ENV:
        assert KEYS[runner] not in followed.stdout
        if runner != "copilot":  # Copilot CLI masks the key itself ("******") before it prints it
            assert said == "Done, with the key [redacted] in hand."
