"""`taskkernel up` on a real terminal: the live view a supervisor watches (coordinator/cli/live.py).

The process runs on a pseudo-terminal; what it writes is played onto a small screen model (carriage return, line
feed, cursor up, erase in line: what rich's Live uses to redraw itself), so the test sees the screen as a person
would, not the stream: a log line the next refresh painted over is gone from it, as it would be from a terminal.
"""

from __future__ import annotations

import fcntl
import io
import os
import re
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from taskkernel.coordinator.cli.live import live_view, watching_notices
from taskkernel.coordinator.loop import Coordinator, StageFailure
from taskkernel.kernel.logging import get_logger
from taskkernel.kernel.model.principal import Principal
from tests.cli_support import CLI, cli_env
from tests.coord_support import admin_task, coordinator, make_workspace

WAIT_THEN_EXIT = """
import os, sys, time
while not os.path.exists(sys.argv[1]):  # hangs until the test lets it go
    time.sleep(0.05)
sys.exit(int(sys.argv[2]))
"""
CSI = re.compile(r"\x1b\[([0-9;?]*)([A-Za-z])")
OSC = re.compile(r"\x1b\][^\x07\x1b]*(\x07|\x1b\\)")


class Screen:
    """A terminal of ``height`` rows and ``width`` columns with unlimited scrollback. A line longer than the width
    wraps (rich wraps its own output; a line written around it would not be)."""

    def __init__(self, height: int, width: int) -> None:
        self.height, self.width = height, width
        self.lines: list[list[str]] = [[]]
        self.row = self.col = 0

    def feed(self, text: str) -> None:
        text = OSC.sub("", text)
        i = 0
        while i < len(text):
            m = CSI.match(text, i)
            if m:
                self._csi(m.group(1), m.group(2))
                i = m.end()
                continue
            ch = text[i]
            i += 1
            if ch == "\r":
                self.col = 0
            elif ch == "\n":
                self.row += 1
                while len(self.lines) <= self.row:
                    self.lines.append([])
            elif ch == "\x1b" or ch < " ":
                continue  # another escape or control: nothing that moves text
            else:
                if self.col >= self.width:  # the last column was written: the next character wraps
                    self.feed("\n")
                    self.col = 0
                line = self.lines[self.row]
                line.extend(" " * (self.col - len(line) + 1))
                line[self.col] = ch
                self.col += 1

    def _csi(self, params: str, final: str) -> None:
        n = int(params) if params.isdigit() else (0 if final == "K" else 1)
        line = self.lines[self.row]
        if final == "A":  # never above the top of the screen
            self.row = max(self.row - n, len(self.lines) - self.height, 0)
        elif final == "B":
            self.row += n
            while len(self.lines) <= self.row:
                self.lines.append([])
        elif final == "G":
            self.col = max(n - 1, 0)
        elif final == "K":
            if n == 2:
                line.clear()
            elif n == 0:
                del line[self.col:]
            else:
                line[:self.col + 1] = " " * min(len(line), self.col + 1)

    def text(self) -> list[str]:
        return ["".join(line).rstrip() for line in self.lines]


class Terminal:
    """A process on a pseudo-terminal (stdin, stdout and stderr), its output read as it comes."""

    def __init__(self, args: list[str], cwd: Path, rows: int = 60, cols: int = 160) -> None:
        leader, follower = os.openpty()
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        env = cli_env(TERM="xterm-256color", COLUMNS=str(cols), LINES=str(rows))
        for name in ("NO_COLOR", "FORCE_COLOR", "TASKKERNEL_LOG_LEVEL"):
            env.pop(name, None)
        self.proc = subprocess.Popen(args, cwd=cwd, stdin=follower, stdout=follower, stderr=follower, env=env,
                                     start_new_session=True)
        os.close(follower)
        self.rows, self.cols, self._leader, self._out = rows, cols, leader, bytearray()
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self._leader, 65536)
            except OSError:  # EIO: the terminal closed with the process
                break
            if not chunk:
                break
            with self._lock:
                self._out.extend(chunk)

    def raw(self) -> str:
        with self._lock:
            return self._out.decode("utf-8", errors="replace")

    def screen(self) -> list[str]:
        screen = Screen(self.rows, self.cols)
        screen.feed(self.raw())
        return screen.text()

    def wait_for(self, what: Callable[[list[str]], object], timeout: float = 60.0) -> object:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = what(self.screen())
            if found:
                return found
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise AssertionError(f"not on the screen within {timeout}s:\n" + "\n".join(self.screen()[-80:]))

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self._reader.join(10)
        os.close(self._leader)


def test_up_on_a_terminal_shows_runs_retries_and_keeps_log_lines_above_the_view(tmp_path: Path) -> None:
    agent = tmp_path / "agent.py"
    agent.write_text(WAIT_THEN_EXIT, encoding="utf-8")
    release, fail = tmp_path / "release", tmp_path / "fail"
    ws = make_workspace(tmp_path / "ws", {
        "DEV": {"runner": "command", "argv": [sys.executable, str(agent), str(release), "0"], "timeout": 120},
        "QA": {"runner": "command", "argv": [sys.executable, str(agent), str(fail), "3"], "timeout": 60,
               "max_attempts": 3, "backoff": 45}})
    config = ws.root / "taskkernel.toml"
    config.write_text(config.read_text().replace("[kernel]\n", "[kernel]\nshutdown_grace = 30\n", 1))
    c = coordinator(ws)
    dev = admin_task(c, "Hang on", recipient="DEV")
    qa = admin_task(c, "Fail fast", recipient="QA")
    pm = admin_task(c, "Nobody runs PM", recipient="PM")
    c.db.dispose()

    term = Terminal([*CLI, "up", str(ws.root)], cwd=tmp_path)
    try:
        def row(task_id: str, *cells: str) -> re.Pattern[str]:
            return re.compile(rf"^\s*{task_id}\s+" + r"\s+".join(cells) + r"\s*$")

        dev_running = row(dev, "DEV", "dev-agent", "1/3", r"(\d+)s / 2m00s")
        waiting = row(pm, "inbox", "PM", "Nobody runs PM", "no runner")
        term.wait_for(lambda s: all(any(r.match(line) for line in s) for r in (
            dev_running, row(qa, "QA", "qa-agent", "1/3", r"\d+s / 1m00s"), waiting)))

        # The QA agent fails while the view is up: its retry shows with its due time, and structlog's line for it
        # lands above the view (rich wraps it at the terminal's width, as a terminal would).
        fail.touch()
        retry = row(qa, "QA", "1/3", r"in (\d+)s", "exit_code")
        logged = re.compile(r"^\S+\s+\[warning\s*\]\s+run_retry\s+attempt=1 .*error_code=exit_code")

        def log_lines(screen: list[str]) -> list[int]:
            return [i for i, line in enumerate(screen)
                    if logged.match(line) and f"task_id={qa}" in " ".join(screen[i:i + 2])]

        term.wait_for(lambda s: any(retry.match(line) for line in s) and log_lines(s))
        first = term.screen()
        assert 30 <= int(next(m for line in first if (m := retry.match(line))).group(1)) <= 45, first
        [log_line] = log_lines(first)
        title = max(i for i, line in enumerate(first) if line.startswith("taskkernel up: "))
        assert log_line < title, "the log line is above the view, never inside it"

        # Later refreshes (the elapsed time grows) leave the log line where it was, whole.
        elapsed = int(next(m for line in first if (m := dev_running.match(line))).group(1))
        term.wait_for(lambda s: any((m := dev_running.match(line)) and int(m.group(1)) >= elapsed + 2 for line in s))
        later = term.screen()
        assert later[log_line:log_line + 2] == first[log_line:log_line + 2]
        assert log_lines(later) == [log_line], "one line, printed once"

        term.proc.send_signal(signal.SIGTERM)  # drains: the running DEV agent gets the grace to finish
        term.wait_for(lambda s: any(line.startswith(f"stopping: 1 run(s) still running ({dev})") for line in s))
        release.touch()
        assert term.proc.wait(30) == 0, "\n".join(term.screen()[-40:])
    finally:
        term.close()
    screen = term.screen()
    # it exited 0 without a report: finished within the grace (not interrupted), and judged `no_report`
    assert any(re.match(r"^\S+\s+\[info\s*\]\s+run_finished\s", line) and dev in (whole := " ".join(screen[i:i + 3]))
               and "error_code=no_report" in whole for i, line in enumerate(screen)), "finished within the grace"


def _act(c: Coordinator, task_id: str, role: str, kind: str, **payload: object) -> None:
    doc = c.kernel.task(task_id)
    assert doc is not None
    command: dict[str, object] = {"type": kind, "task_id": task_id, "thread_key": doc["thread_key"],
                                  "expected_revision": doc["revision"], "round": doc["round"],
                                  "idempotency_key": f"{kind}:{task_id}"}
    if payload:
        command["payload"] = payload
    r = c.kernel.submit(command, Principal(role, f"{role.lower()}-agent"))
    assert r.status == "accepted", r


def test_the_view_lists_blocked_tasks_waiting_reviews_refusals_and_failing_stages_within_bounds(
        tmp_path: Path) -> None:
    c = coordinator(make_workspace(tmp_path / "ws", {"QA": {"runner": "scripted"}}))  # only QA has a runner
    stuck, judged = admin_task(c, "Stuck", recipient="DEV"), admin_task(c, "Judge me", recipient="DEV")
    for tid in (stuck, judged):
        _act(c, tid, "DEV", "claim")
    _act(c, stuck, "DEV", "submit_report", status="blocked", body="need the API key\nmore")
    _act(c, judged, "DEV", "submit_report", status="done", body="did it")
    _act(c, judged, "DEV", "submit")
    inbox = [admin_task(c, f"Plan {n}", recipient="PM") for n in range(3)]
    c.failing["ingest"] = StageFailure("ingest", "OSError", "disk full")
    console = Console(width=160, record=True, file=io.StringIO())
    with watching_notices() as notices:
        get_logger("tests.live").warning("dispatch_refused", task_id=inbox[0], reason="role_not_authorized")
        get_logger("tests.live").info("run_started", task_id=inbox[0])  # not a refusal: not kept
        console.print(live_view(c, {"passes": 3}, notices, rows=2))
    get_logger("tests.live").warning("dispatch_refused", task_id=inbox[1], reason="after the view")
    assert len(notices.recent()) == 1, "the processor is gone with the view"
    lines = [line.rstrip() for line in console.export_text().splitlines()]
    text = "\n".join(lines)
    assert lines[0].endswith("(degraded)")
    assert "inbox 3 · active 0 · blocked 1 · review 1 · done 0 · archive 0   passes 3" in lines
    assert "Running: nothing" in lines
    assert re.search(rf"^{stuck}\s+DEV\s+need the API key$", text, re.M), text
    assert "Waiting for a human (4)" in lines  # the review ADMIN decides, three PM tasks (no runner for either)
    assert re.search(rf"^{judged}\s+review\s+ADMIN\s+Judge me\s+a person's$", text, re.M), text
    assert re.search(rf"^{inbox[0]}\s+inbox\s+PM\s+Plan 0\s+no runner$", text, re.M), text
    assert "+2 more" in lines and inbox[1] not in text
    assert re.search(rf"^\d\d:\d\d:\d\d\s+dispatch_refused\s+{inbox[0]}\s+role_not_authorized$", text, re.M), text
    assert "failing ingest: OSError: disk full" in lines
