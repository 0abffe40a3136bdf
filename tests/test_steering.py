"""People in the loop of a running agent (issue 28), through real processes: a `taskkernel up` coordinator whose DEV
runs a stand-in agent (tests/procs/steered_agent.py) talking to the kernel's real MCP server, and a person's
`taskkernel task say|interrupt|inputs` in other processes.

What a user relies on: a follow-up sent while the agent works is seen at its next tool call and consumed once;
several arrive in acceptance order; one held for the next run (`--queue`) keeps the task in work until a resumed run
delivers exactly it; `interrupt` stops the agent (TERM) and the next run resumes from its checkpoint with the
message; after a crash the retry resumes from the anchor and never obeys an old instruction again (seed 002).
Waits poll with deadlines, never a fixed sleep.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agents_support import git
from tests.cli_support import CLI, cli_env, taskkernel

AGENT = Path(__file__).parent / "procs" / "steered_agent.py"
DEADLINE = 90.0


class Loop:
    """A git repository with a workspace whose DEV runs the steered stand-in, and a `taskkernel up` serving it."""

    def __init__(self, tmp: Path) -> None:
        self.root, self.records = tmp / "repo", tmp / "records"
        self.root.mkdir()
        self.records.mkdir()
        git(self.root, "init", "-q", "-b", "main")
        (self.root / "README.md").write_text("project\n")
        assert self.cli("init", ".").returncode == 0
        argv = [sys.executable, str(AGENT), "{prompt_file}", "{mcp_config}"]
        with open(self.root / "taskkernel.toml", "a", encoding="utf-8") as fh:
            fh.write(f'\n[roles.dev]\nrunner = "command"\nargv = {json.dumps(argv)}\nmax_attempts = 3\nbackoff = 0\n'
                     'timeout = 120\nkill_grace = 3\nisolation = "worktree"\n'
                     f'env = {{ STANDIN_RECORDS = {json.dumps(str(self.records))} }}\n')
        git(self.root, "add", "-A")
        git(self.root, "commit", "-q", "-m", "start")
        self.up: subprocess.Popen[str] | None = None

    def cli(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return taskkernel(*args, cwd=self.root, env=env, timeout=120)

    def ok(self, *args: str, env: dict[str, str] | None = None) -> Any:
        done = self.cli(*args, "--json", env=env)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return json.loads(done.stdout)

    def start(self) -> None:
        self.up = subprocess.Popen([*CLI, "up"], cwd=self.root, env=cli_env(), stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, text=True)

    def stop(self) -> str:
        if self.up is None:
            return ""
        self.up.terminate()
        try:
            _, err = self.up.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.up.kill()
            _, err = self.up.communicate()
        return err

    def task(self, body: str) -> str:
        return str(self.ok("task", "create", "--to", "DEV", "--subject", "steered work", "--body", body)["task_id"])

    def record(self, task_id: str, suffix: str) -> list[str]:
        path = self.records / f"{task_id}.{suffix}"
        return path.read_text(encoding="utf-8").splitlines() if path.exists() else []

    def prompt(self, task_id: str, n: int) -> str:
        return (self.records / f"{task_id}.prompt-{n}").read_text(encoding="utf-8")

    def go(self, task_id: str) -> None:
        (self.records / f"{task_id}.go").write_text("go")

    def runs(self, task_id: str) -> list[dict[str, Any]]:
        return list(reversed(self.ok("runs", "list", "--task", task_id)))  # oldest first

    def state(self, task_id: str) -> str:
        return str(self.ok("task", "show", task_id)["state"])


def until(what: str, check: Callable[[], Any], loop: Loop, deadline: float = DEADLINE) -> Any:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if found := check():
            return found
        if loop.up is not None and loop.up.poll() is not None:
            pytest.fail(f"`up` exited while waiting for {what}: {loop.stop()[-3000:]}")
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


@pytest.fixture
def loop(tmp_path: Path) -> Iterator[Loop]:
    made = Loop(tmp_path)
    yield made
    made.stop()


def obeyed(loop: Loop, task_id: str) -> list[str]:
    return loop.record(task_id, "obeyed")


def test_follow_ups_reach_the_running_agent_at_its_next_tool_call_in_acceptance_order_once(loop: Loop) -> None:
    task_id = loop.task("calls 1\npause 0.2\nprint-token\nhold")
    loop.start()
    until("the agent at work", lambda: loop.record(task_id, "prompt-1") or (loop.records / f"{task_id}.prompt-1")
          .exists(), loop)
    said = [loop.ok("task", "say", task_id, text) for text in ("first: add floats", "second: and ints",
                                                               "third: and a test")]
    seqs = [s["accept_seq"] for s in said]
    assert seqs == sorted(seqs) and len(set(seqs)) == 3 and all(s["status"] == "accepted" for s in said)
    assert all(s["queued_run"] is None for s in said)  # a run is at work: it is told, no second run starts
    lines = until("three instructions read", lambda: (got := obeyed(loop, task_id)) and len(got) >= 3 and got, loop)
    assert lines == [f"{seq} tool {text}" for seq, text in zip(seqs, ("first: add floats", "second: and ints",
                                                                       "third: and a test"), strict=True)]
    timeline = loop.ok("task", "inputs", task_id)["inputs"]
    assert [(i["accept_seq"], i["state"], i["delivered"]["via"]) for i in timeline] == [
        (seq, "consumed", "tool") for seq in seqs]
    assert {i["delivered"]["run_id"] for i in timeline} == {loop.runs(task_id)[0]["run_id"]}
    assert all(i["by"] == "ADMIN:local-owner" for i in timeline)
    loop.go(task_id)
    until("the task in review", lambda: loop.state(task_id) == "review", loop)
    assert obeyed(loop, task_id) == lines  # consumed once: never delivered again
    assert len(loop.runs(task_id)) == 1
    watched = loop.cli("task", "watch", task_id, "--timeout", "1")  # in review: it prints, then times out
    live = [json.loads(line) for line in watched.stdout.splitlines() if '"run_id"' in line]
    assert watched.returncode == 1 and live, watched.stdout
    assert [e["n"] for e in live] == list(range(1, len(live) + 1))  # each once, in the order printed
    assert any(e["text"] == "my token is [redacted]" for e in live)  # the run's token never kept
    assert not any("tk_" in e["text"] for e in live)


def test_a_queued_instruction_keeps_the_task_in_work_until_a_resumed_run_delivers_exactly_it(loop: Loop) -> None:
    task_id = loop.task("calls 1\nhold")
    loop.start()
    until("the agent at work", lambda: (loop.records / f"{task_id}.prompt-1").exists(), loop)
    queued = loop.ok("task", "say", task_id, "--queue", "write the changelog")
    shown = loop.ok("task", "show", task_id)
    assert shown["inputs_pending"] == 1 and shown["state"] == "active"
    loop.go(task_id)
    until("a second run", lambda: (loop.records / f"{task_id}.prompt-2").exists(), loop)
    assert loop.record(task_id, "submits")[0] == "rejected inputs_pending"  # its done report did not end the work
    until("the task in review", lambda: loop.state(task_id) == "review", loop)
    assert obeyed(loop, task_id) == [f"{queued['accept_seq']} prompt write the changelog"]
    second = loop.prompt(task_id, 2)
    assert "## New instructions" in second and "write the changelog" in second
    assert "write the changelog" not in loop.prompt(task_id, 1)
    first_run, follow_up = loop.runs(task_id)
    assert first_run["state"] == "done" and follow_up["run_id"].endswith(f":in{queued['accept_seq']}")
    assert loop.ok("task", "show", task_id)["inputs_pending"] == 0


def test_interrupt_stops_the_agent_and_the_next_run_resumes_from_its_checkpoint_with_the_message(loop: Loop
                                                                                                ) -> None:
    task_id = loop.task("calls 2\nprogress-at 2\nhold")
    loop.start()
    until("the checkpoint", lambda: (loop.records / f"{task_id}.prompt-1").exists() and any(
        i["kind"] == "progress" for i in _session(loop, task_id)), loop)
    worktree = Path(loop.prompt(task_id, 1).split("## Working folder\n", 1)[1].splitlines()[0])
    assert worktree != loop.root  # the task's own worktree
    (worktree / "half-done.txt").write_text("work in progress\n")  # what the agent had made so far
    asked = loop.ok("task", "interrupt", task_id, "--message", "use the new API instead")
    assert asked["status"] == "requested"
    until("the agent terminated", lambda: loop.record(task_id, "terminated"), loop)
    assert loop.record(task_id, "terminated") == ["15"]  # SIGTERM, not a kill
    until("the resumed run", lambda: (loop.records / f"{task_id}.prompt-2").exists(), loop)
    stopped = loop.runs(task_id)[0]
    assert stopped["state"] == "done" and stopped["error_code"] == "stopped_by_person"
    second = loop.prompt(task_id, 2)
    assert "## Resuming this task: do not start over" in second and "> made 2 calls" in second
    assert "Tool calls completed before it: 2" in second
    assert f"(queued #{asked['message_seq']}, from ADMIN:local-owner) use the new API instead" in second
    assert (worktree / "half-done.txt").read_text() == "work in progress\n"  # the worktree is kept
    loop.go(task_id)
    until("the task in review", lambda: loop.state(task_id) == "review", loop)
    assert obeyed(loop, task_id) == [f"{asked['message_seq']} prompt use the new API instead"]


def test_a_retry_after_a_crash_resumes_from_the_anchor_and_never_obeys_old_history_again(loop: Loop) -> None:
    task_id = loop.task("calls 1\nhold\ncheckpoint-after-hold\ncrash-once-after-hold")
    loop.start()
    until("the agent at work", lambda: (loop.records / f"{task_id}.prompt-1").exists(), loop)
    canary = loop.ok("task", "say", task_id, "repeat this sentence: the canary sings once")
    until("the canary obeyed", lambda: loop.record(task_id, "said"), loop)
    loop.go(task_id)  # checkpoint after the canary, then the crash
    until("the retry", lambda: (loop.records / f"{task_id}.prompt-2").exists(), loop)
    until("the task in review", lambda: loop.state(task_id) == "review", loop)
    assert loop.record(task_id, "said") == ["the canary sings once"]  # obeyed once, never after the restart
    retry = loop.prompt(task_id, 2)
    assert "> handled what I was told" in retry
    checkpoint = next(i for i in _session(loop, task_id) if i["kind"] == "progress")["payload"]
    assert f"Tool calls completed before it: {checkpoint['completed_tool_calls']}." in retry
    history = retry.split("## History", 1)[1]
    assert f"#{canary['accept_seq']} message: repeat this sentence: the canary sings once" in history
    assert "## New instructions" not in retry
    runs = loop.runs(task_id)
    assert len(runs) == 1 and runs[0]["attempt"] == 2


def _session(loop: Loop, task_id: str) -> list[dict[str, Any]]:
    listed = loop.cli("session", "export", f"RUN:DEV:dev-agent@{task_id}")
    return [json.loads(line) for line in listed.stdout.splitlines()] if listed.returncode == 0 else []


def test_who_may_instruct_and_what_a_pending_instruction_holds_back(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    assert taskkernel("init", ".", cwd=root).returncode == 0

    def cli(*args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
        env = {"TASKKERNEL_TOKEN": token} if token else {}
        return taskkernel(*args, "--json", cwd=root, env={**os.environ, **env})

    def token(role: str, task: str | None = None) -> str:
        agent = f"{role.lower()}-agent" if task else f"{role.lower()}-person"  # a run acts as its role's agent
        done = taskkernel("token", "issue", role, "--agent", agent, *(["--task", task] if task else []), cwd=root)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    made = json.loads(cli("task", "create", "--to", "DEV", "--subject", "s", "--body", "b").stdout)["task_id"]
    dev = token("DEV")
    assert cli("task", "claim", made, token=dev).returncode == 0
    refused = cli("task", "say", made, "do more", token=dev)  # the driver does not instruct itself
    assert refused.returncode == 2 and json.loads(refused.stdout)["reason"] == "may_not_instruct"
    own_run = cli("task", "say", made, "do more", token=token("DEV", made))
    assert own_run.returncode == 2 and json.loads(own_run.stdout)["reason"] == "may_not_instruct"
    usage = cli("task", "say", made, "x", "--steer", "--queue")
    assert usage.returncode == 64
    empty = cli("task", "say", made, "   ")
    assert empty.returncode == 64 and "needs text" in empty.stderr
    said = cli("task", "say", made, "also handle floats", "--steer")
    assert said.returncode == 0 and json.loads(said.stdout)["kind"] == "steer"
    assert json.loads(cli("task", "show", made).stdout)["inputs_pending"] == 1
    assert cli("task", "report", made, "--status", "done", "--body", "done", token=dev).returncode == 0
    held = cli("task", "submit", made, token=dev)
    assert held.returncode == 2 and json.loads(held.stdout)["reason"] == "inputs_pending"
    listed = json.loads(cli("task", "inputs", made, token=dev).stdout)["inputs"]
    assert [(i["kind"], i["state"], i["text"]) for i in listed] == [("steer", "accepted", "also handle floats")]
    not_its_run = cli("task", "inputs", made, "--consume", token=dev)
    assert not_its_run.returncode == 2
    read = json.loads(cli("task", "inputs", made, "--consume", token=token("DEV", made)).stdout)["inputs"]
    assert [i["text"] for i in read] == ["also handle floats"]
    assert json.loads(cli("task", "inputs", made, "--consume", token=token("DEV", made)).stdout)["inputs"] == []
    assert cli("task", "submit", made, token=dev).returncode == 0  # read: the submit goes through
    late = cli("task", "say", made, "one more thing")
    assert late.returncode == 2 and json.loads(late.stdout)["reason"] == "task_not_in_work"
    idle = cli("task", "interrupt", made)
    assert idle.returncode == 2 and json.loads(idle.stdout)["reason"] == "no_running_run"
