"""`log --follow` and `task watch` (issue 13, item 6), each a real `taskkernel` process read line by line while other
processes write: every event once, in commit order, as it commits; a watch ends by itself when the task is done; a
signal ends either quietly with exit 0. Waits poll with deadlines, never a fixed sleep."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.cli_support import CLI, cli_env, new_workspace, run

DEADLINE = 60.0


class Follower:
    """A `taskkernel` process whose stdout lines are collected by a thread as they come."""

    def __init__(self, *args: str, cwd: Path) -> None:
        self.proc = subprocess.Popen([*CLI, *args], cwd=cwd, env=cli_env(), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        assert self.proc.stdout is not None
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            self.lines.put(line)

    def until(self, predicate: Any, what: str) -> list[dict[str, Any]]:
        """Collect events until one satisfies ``predicate``; fail at the deadline."""
        end = time.monotonic() + DEADLINE
        while time.monotonic() < end:
            try:
                line = self.lines.get(timeout=0.1)
            except queue.Empty:
                assert self.proc.poll() is None, f"exited {self.proc.returncode} before {what}: {self.stderr()}"
                continue
            event = json.loads(line)
            self.seen.append(event)
            if predicate(event):
                return self.seen
        raise AssertionError(f"no {what} within {DEADLINE} s; saw {[e['type'] for e in self.seen]}")

    def stop(self, sig: int) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(DEADLINE)

    def stderr(self) -> str:
        return self.proc.stderr.read() if self.proc.stderr and self.proc.poll() is not None else ""


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    return new_workspace(tmp_path)


def create(ws: Path, subject: str) -> str:
    made = run("task", "create", "--to", "dev", "--subject", subject, cwd=ws)
    assert made.code == 0, made.out + made.err
    return str(made.json["task_id"])


def test_log_follow_sees_commands_from_other_processes_once_each_then_stops_on_sigterm(ws: Path) -> None:
    first = create(ws, "before the follow")
    follower = Follower("log", "--follow", cwd=ws)
    follower.until(lambda e: e["stream"] == f"task:{first}", "the event already in the log")
    second = create(ws, "while following")  # another process commits
    follower.until(lambda e: e["stream"] == f"task:{second}", "the new task's event")
    assert run("task", "claim", second, cwd=ws).code == 0
    follower.until(lambda e: e["type"] == "task_claimed", "the claim")
    assert follower.stop(signal.SIGTERM) == 0
    err = follower.stderr()
    assert "Traceback" not in err and "error" not in err, err
    positions = [e["global_pos"] for e in follower.seen]
    assert positions == list(range(1, len(positions) + 1)) and len(positions) == 3  # every event, once, in order
    everything = [json.loads(line) for line in run("log", cwd=ws).out.splitlines()]
    assert [e["hash"] for e in everything] == [e["hash"] for e in follower.seen]


def test_log_follow_of_one_stream_from_a_position_and_sigint(ws: Path) -> None:
    watched = create(ws, "watched")
    follower = Follower("log", "--follow", "--stream", watched, cwd=ws)
    follower.until(lambda e: e["type"] == "task_created", "the stream's first event")
    create(ws, "another task: not in this stream")
    assert run("task", "claim", watched, cwd=ws).code == 0
    follower.until(lambda e: e["type"] == "task_claimed", "the claim")
    assert {e["stream"] for e in follower.seen} == {f"task:{watched}"}
    assert [e["version"] for e in follower.seen] == [1, 2]
    assert follower.stop(signal.SIGINT) == 0  # not 130: stopping a follow is how it ends


def test_task_watch_follows_a_task_driven_by_other_processes_until_it_is_done(ws: Path) -> None:
    tid = create(ws, "to watch")
    watch = Follower("task", "watch", tid, cwd=ws)
    watch.until(lambda e: e["type"] == "task_created", "the task's history")
    create(ws, "noise in another stream")
    for verb in (["claim", tid], ["report", tid, "--status", "done", "--submit"]):
        assert run("task", *verb, cwd=ws).code == 0
    watch.until(lambda e: e["type"] == "task_submitted", "the submit")
    assert watch.proc.poll() is None  # in review: not there yet
    assert run("task", "approve", tid, cwd=ws).code == 0
    watch.until(lambda e: e["type"] == "task_approved", "the approval")
    assert watch.proc.wait(DEADLINE) == 0  # done: the watch ends by itself
    assert [e["type"] for e in watch.seen] == ["task_created", "task_claimed", "report_submitted", "task_submitted",
                                               "task_approved"]
    assert f"{tid} is done" in watch.stderr()
    again = run("task", "watch", tid, cwd=ws)  # a task already done: its history, then exit 0 at once
    assert again.code == 0 and len(again.out.splitlines()) == 5


def test_task_watch_unknown_timeout_and_signal(ws: Path) -> None:
    missing = run("task", "watch", "TASK-20260101-999", cwd=ws)
    assert (missing.code, missing.json["reason"]) == (2, "task_not_found")
    tid = create(ws, "stays in the inbox")
    started = time.monotonic()
    late = run("task", "watch", tid, "--timeout", "0.5", cwd=ws)
    assert (late.code, late.json["code"], late.json["state"]) == (1, "timeout", "inbox"), late.out
    assert time.monotonic() - started < DEADLINE
    watch = Follower("task", "watch", tid, cwd=ws)
    watch.until(lambda e: e["type"] == "task_created", "the task's history")
    assert watch.stop(signal.SIGTERM) == 0
    assert "Traceback" not in watch.stderr()
