"""Run an agent as an external command (codex, claude, any script) with a timeout and captured logs.

The agent gets least privilege: an allowlisted environment (never the database URL or the
coordinator's secrets), optionally another OS user, and a parent-death signal so it does not
outlive a crashed coordinator where the OS allows. The guarantee against a surviving agent is the
run ledger: a takeover terminates the recorded process group (`terminate_group`) before re-running.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from taskkernel.coordinator.runners.config import RunnerSpec, os_user
from taskkernel.coordinator.runners.presets import read_safely
from taskkernel.kernel.private import private_dir

if TYPE_CHECKING:
    from taskkernel.coordinator.runners.launch import Launch

BASE_ENV = ("PATH", "HOME", "LANG", "TERM", "TZ", "TMPDIR", "USER", "LOGNAME")  # plus every LC_*
_PR_SET_PDEATHSIG = 1


OUTPUT_READ_LIMIT = 8 << 20  # bytes of the end of an agent's stdout its usage and failure are read from
HEARTBEAT_LINE = "taskkernel:heartbeat"  # a line an agent prints on stdout to say it is alive
TICK_S = 0.1  # how often a running agent is looked at (exit, deadlines, a shutdown's stop)
READ_CHUNK = 1 << 20  # bytes of the agent's stdout read at one look
DRAIN_LIMIT = 64 << 20  # bytes read after it ended, at most
EXTERNAL_BEAT_EVERY_S = 1.0  # how often heartbeats recorded by other processes (CLI, MCP) are read


class ErrorCode(StrEnum):
    """Why an attempt failed (runs.error_code, docs/runs.md). Those in NON_RETRYABLE cannot succeed by trying
    again: the task is blocked at once with the reason."""

    TIMEOUT = "timeout"
    HEARTBEAT_TIMEOUT = "heartbeat_timeout"
    EXIT_CODE = "exit_code"
    NON_RETRYABLE_EXIT = "non_retryable_exit"
    BINARY_MISSING = "binary_missing"
    PLACEHOLDER_UNKNOWN = "placeholder_unknown"
    CONFIG_INVALID = "config_invalid"
    SPAWN_FAILED = "spawn_failed"
    AGENT_RAISED = "agent_raised"
    AGENT_ERROR = "agent_error"  # the agent CLI exited 0 but its own JSON output reports a failure
    INTERRUPTED = "interrupted"
    LEASE_LOST = "lease_lost"
    INTERNAL_ERROR = "internal_error"
    ATTEMPTS_EXHAUSTED = "attempts_exhausted"
    GOAL_ENDED = "goal_ended"  # the task's goal was cancelled or ran out of budget: no run starts
    NO_REPORT = "no_report"  # an execute run ended (even exit 0) with its task still active and nothing reported
    NO_DECISION = "no_decision"  # a review run ended with its task still in review, neither approved nor rejected
    STOPPED_BY_PERSON = "stopped_by_person"  # `task interrupt`: stopped on purpose; a resumed run follows


NON_RETRYABLE = frozenset({ErrorCode.NON_RETRYABLE_EXIT, ErrorCode.BINARY_MISSING, ErrorCode.PLACEHOLDER_UNKNOWN,
                           ErrorCode.CONFIG_INVALID})


@dataclass
class Outcome:
    ok: bool
    exit_code: int | None
    wall_ms: int
    error: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    summary: str = ""
    fenced: bool = False  # our lease was lost while the agent ran: the run is someone else's now
    code: ErrorCode | None = None  # why it failed (None when ok)
    session: str | None = None  # the CLI's own conversation id, where its output named one

    @property
    def retryable(self) -> bool:
        return self.code not in NON_RETRYABLE


@dataclass(frozen=True)
class Supervision:
    """The dispatcher's hooks into a command run: record the agent once it exists, renew the lease while it
    runs (False: the run was taken over, and the agent is stopped), record the agent's own heartbeats and read
    those other processes recorded, and ``stop``: a shutdown asks for the agent to be terminated now. ``output``
    gets the agent's stdout as it grows (its live events); ``interrupted`` says who asked to stop it (a person's
    `task interrupt`), looked at once a second."""

    on_start: Callable[[int, int | None], bool]  # (process group, start time)
    heartbeat: Callable[[], bool]
    every_s: float
    beat: Callable[[], bool] = lambda: True  # the agent printed HEARTBEAT_LINE
    since_beat: Callable[[], float | None] = lambda: None  # seconds since the last recorded heartbeat (store clock)
    stop: threading.Event = field(default_factory=threading.Event)
    output: Callable[[bytes], None] | None = None
    interrupted: Callable[[], str | None] = lambda: None


def agent_env(spec: RunnerSpec, run_vars: dict[str, str], source: dict[str, str] | None = None, *,
              credentials: tuple[str, ...] = ()) -> dict[str, str]:
    """The allowlist, then the agent's own identity (run_as), its preset's ``credentials`` (the provider's key:
    docs/agents.md), the owner's `pass_env` and `env`, then the run's TASKKERNEL_* variables. Nothing else of the
    coordinator's environment reaches the agent."""
    source = dict(os.environ) if source is None else source
    env = {k: v for k, v in source.items() if k in BASE_ENV or k.startswith("LC_")}
    if spec.run_as is not None:
        user = os_user(spec.run_as)
        env.update(HOME=user.pw_dir, USER=user.pw_name, LOGNAME=user.pw_name)
    env.update({k: source[k] for k in (*credentials, *spec.pass_env) if k in source})
    return {**env, **spec.env, **run_vars}


def host_identity() -> str:
    """Host name and boot id: a recorded pid is only meaningful on the same machine in the same boot."""
    boot = ""
    with contextlib.suppress(OSError):
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return f"{socket.gethostname()}/{boot}"


def run_command(spec: RunnerSpec, launch: Launch, log_dir: Path, supervision: Supervision | None = None) -> Outcome:
    """Run the agent in its own session (one process group to signal), in ``launch.workdir`` with exactly
    ``launch.env``, the prompt on stdin when its CLI reads it there. While the coordinator lives, the agent
    never outlives this call. An error no retry can fix (a missing program, an OS user that cannot be used, an
    exit code the role lists as non-retryable) says so in ``code``; usage and a failure the CLI reported in its
    own JSON are read from stdout by the launch's preset."""
    started = time.monotonic()
    cwd = launch.workdir
    if not cwd.is_dir():
        return Outcome(False, None, 0, f"working folder {cwd} does not exist", code=ErrorCode.CONFIG_INVALID)
    try:
        private_dir(log_dir)  # agents' output may echo secrets: readable by the workspace owner only
        out = open(log_dir / "stdout.log", "w", encoding="utf-8", errors="replace", opener=_private)  # noqa: SIM115
        err = open(log_dir / "stderr.log", "w", encoding="utf-8", opener=_private)  # noqa: SIM115
        stdin = open(launch.stdin, "rb") if launch.stdin else subprocess.DEVNULL  # noqa: SIM115
    except OSError as exc:  # our own log folder (a full disk, a permission): may pass
        return Outcome(False, None, 0, f"could not open the run's logs: {exc}", code=ErrorCode.SPAWN_FAILED)
    with out, err, (stdin if not isinstance(stdin, int) else contextlib.nullcontext()):
        try:
            proc = subprocess.Popen(launch.argv, cwd=cwd, env=launch.env, stdout=out, stderr=err, stdin=stdin,
                                    start_new_session=True, preexec_fn=_die_with_parent(os.getpid()),
                                    **_identity(spec))
        except (KeyError, ValueError) as exc:  # run_as: the user vanished or cannot be used
            return Outcome(False, None, _ms(started), f"runner unavailable: {exc}", code=ErrorCode.CONFIG_INVALID)
        except OSError as exc:
            return Outcome(False, None, _ms(started), f"runner unavailable: {exc}", code=_spawn_error(exc, cwd))
        except subprocess.SubprocessError as exc:
            return Outcome(False, None, _ms(started), f"could not start the agent: {exc}",
                           code=ErrorCode.SPAWN_FAILED)
        stopped: _Stopped | None = None
        try:
            code = _supervise(proc, spec, supervision, log_dir / "stdout.log")
        except _Stopped as stop:
            stopped, code = stop, None
        finally:
            if proc.poll() is None:  # lost lease, or an error while supervising
                _kill_group(proc.pid)
                proc.wait()
            elif group_alive(proc.pid):  # the agent exited and left helpers behind: they end with it
                _stop_group(proc.pid, spec.kill_grace)
    stdout = _tail(log_dir / "stdout.log", OUTPUT_READ_LIMIT)  # a runaway agent's gigabytes are never read whole
    stderr = _tail(log_dir / "stderr.log")
    said = read_safely(launch.preset, stdout, stderr, _tail(launch.usage_file) if launch.usage_file else "")
    if stopped is not None:  # what the CLI was struggling with when it was stopped (a provider's 429) is the why
        why = stopped.error + (f"; the CLI said: {said.error}" if said.error else "")
        return Outcome(False, None, _ms(started), why, said.usage, fenced=stopped.fenced, code=stopped.code,
                       session=said.session)
    if code != 0:
        kind = ErrorCode.NON_RETRYABLE_EXIT if code in spec.non_retryable_exit_codes else ErrorCode.EXIT_CODE
        last_words = next((line.strip() for line in reversed(stderr.splitlines()) if line.strip()), "")
        why = f"exit code {code}" + (f" ({said.error})" if said.error else f": {last_words[:300]}" if last_words
                                     else "")
        return Outcome(False, code, _ms(started), why, said.usage, code=kind, session=said.session)
    if said.error:
        return Outcome(False, 0, _ms(started), said.error, said.usage, code=ErrorCode.AGENT_ERROR,
                       session=said.session)
    last = stdout.strip().splitlines()[-1][:200] if stdout.strip() else ""
    return Outcome(True, 0, _ms(started), None, said.usage, last, session=said.session)


def _tail(path: Path, limit: int = 1 << 16) -> str:
    """The end of an output file (a CLI's error is its last words)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - limit))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


class _Stopped(Exception):
    def __init__(self, error: str, code: ErrorCode, fenced: bool = False) -> None:
        super().__init__(error)
        self.error, self.code, self.fenced = error, code, fenced


class _StdoutTail:
    """What the agent printed on stdout since the last look (its log file, read from where we stopped): handed to
    ``output`` whole, and searched for heartbeat lines."""

    def __init__(self, path: Path, output: Callable[[bytes], None] | None) -> None:
        self.path, self.offset, self.partial, self.output = path, 0, b"", output
        self.last_read = 0

    def drain(self) -> None:
        """The agent ended: what it printed last, up to DRAIN_LIMIT past where the last look stopped (its final
        result and last words are at the end of a chatty run)."""
        for _ in range(DRAIN_LIMIT // READ_CHUNK):
            self.seen()
            if self.last_read < READ_CHUNK:
                return

    def seen(self) -> bool:
        """Read what is new (at most READ_CHUNK); True when it holds a heartbeat line."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read(READ_CHUNK)
        except OSError:
            return False
        self.offset += len(chunk)
        self.last_read = len(chunk)
        if chunk and self.output is not None:
            self.output(chunk)
        lines = (self.partial + chunk).split(b"\n")
        self.partial = lines.pop()[-4096:]
        return any(line.strip() == HEARTBEAT_LINE.encode() for line in lines)


def _supervise(proc: subprocess.Popen[bytes], spec: RunnerSpec, supervision: Supervision | None,
               stdout: Path) -> int:
    """The agent's exit code. Meanwhile: the lease renewed, heartbeats watched, and the agent stopped (SIGTERM
    to its group, ``kill_grace``, SIGKILL) at its timeout, when its heartbeats stop, when a shutdown asks, or when a
    person interrupts it; its stdout handed to ``supervision.output`` as it grows."""
    if supervision is not None and not supervision.on_start(proc.pid, process_start(proc.pid)):
        raise _Stopped("lease lost: the run was taken over", ErrorCode.LEASE_LOST, fenced=True)
    started = time.monotonic()
    deadline, renew_at, beat_at, read_beats_at = started + spec.timeout, started, started, started
    ask_at = started
    output = supervision.output if supervision is not None else None
    tail = _StdoutTail(stdout, output) if spec.heartbeat_timeout is not None or output is not None else None
    try:
        with _ExitWatch(proc) as watch:
            while (code := watch.wait(TICK_S)) is None:
                now = time.monotonic()
                if supervision is not None and supervision.stop.is_set():
                    raise _Stopped(f"interrupted by a shutdown ({_terminate(proc, spec.kill_grace)})",
                                   ErrorCode.INTERRUPTED)
                if now >= deadline:
                    raise _Stopped(f"timeout after {spec.timeout:g}s ({_terminate(proc, spec.kill_grace)})",
                                   ErrorCode.TIMEOUT)
                if supervision is not None and now >= ask_at:
                    ask_at = now + EXTERNAL_BEAT_EVERY_S
                    if (who := supervision.interrupted()) is not None:
                        raise _Stopped(f"stopped by {who} ({_terminate(proc, spec.kill_grace)})",
                                       ErrorCode.STOPPED_BY_PERSON)
                beaten = tail.seen() if tail is not None else False
                if spec.heartbeat_timeout is not None:
                    if beaten:
                        beat_at = now
                        if supervision is not None:
                            supervision.beat()
                    elif supervision is not None and now >= read_beats_at:
                        read_beats_at = now + EXTERNAL_BEAT_EVERY_S
                        since = supervision.since_beat()
                        if since is not None:
                            beat_at = max(beat_at, now - max(0.0, since))
                    if now - beat_at > spec.heartbeat_timeout:
                        raise _Stopped(f"no heartbeat for {spec.heartbeat_timeout:g}s "
                                       f"({_terminate(proc, spec.kill_grace)})", ErrorCode.HEARTBEAT_TIMEOUT)
                if supervision is not None and now >= renew_at:
                    renew_at = now + supervision.every_s
                    if not supervision.heartbeat():
                        raise _Stopped("lease lost: the run was taken over", ErrorCode.LEASE_LOST, fenced=True)
    finally:
        if tail is not None:  # what it printed last (its final result, its last words when stopped)
            tail.drain()
    return code


class _ExitWatch:
    """The agent's exit code as soon as it exits (a pidfd wakes us on Linux; elsewhere Popen's polling wait,
    which notices an exit up to 50 ms late), or None when the timeout passed."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        try:
            self.fd: int | None = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):
            self.fd = None

    def __enter__(self) -> _ExitWatch:
        return self

    def __exit__(self, *_: object) -> None:
        if self.fd is not None:
            os.close(self.fd)

    def wait(self, timeout: float) -> int | None:
        if self.fd is not None:
            ready, _, _ = select.select([self.fd], [], [], timeout)
            return self.proc.wait() if ready else None
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None


def _terminate(proc: subprocess.Popen[bytes], grace_s: float) -> str:
    """Stop a running agent: its whole process group (see ``_stop_group``); the leader is reaped."""
    result = _stop_group(proc.pid, grace_s, proc)
    proc.wait()
    return result


def _stop_group(pgid: int, grace_s: float, leader: subprocess.Popen[bytes] | None = None) -> str:
    """SIGTERM to the process group, up to ``grace_s`` for every member (the leader and its helpers) to flush
    and exit, then SIGKILL to whatever is left. Says which it took: "terminated" or "killed"."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if leader is not None:
            leader.poll()  # reap the leader as it exits: a zombie leader keeps the group id taken
        if not group_alive(pgid):
            return "terminated"
        time.sleep(0.05)
    _kill_group(pgid)
    return "killed"


def _spawn_error(exc: OSError, cwd: Path) -> ErrorCode:
    """Why Popen failed: the program is missing or cannot be executed (no retry fixes it), the working folder
    vanished (configuration), or the machine is short of something (may pass)."""
    if exc.errno in (errno.ENOENT, errno.ENOTDIR) and not cwd.is_dir():
        return ErrorCode.CONFIG_INVALID
    if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.EACCES, errno.ENOEXEC, errno.EISDIR):
        return ErrorCode.BINARY_MISSING
    return ErrorCode.SPAWN_FAILED


def _identity(spec: RunnerSpec) -> dict[str, Any]:
    """Popen arguments that start the agent as `run_as` (with that user's groups, none of ours)."""
    if spec.run_as is None:
        return {}
    user = os_user(spec.run_as)
    if user.pw_uid == os.geteuid():
        return {}
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": os.getgrouplist(user.pw_name, user.pw_gid)}


def _die_with_parent(parent: int) -> Callable[[], None] | None:
    """A preexec hook asking Linux to SIGKILL the agent when the thread that started it dies. It runs
    after the switch to `run_as` (a credential change clears the setting). Defence in depth only: the
    agent's own children do not inherit it, so the ledger's takeover remains the guarantee."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = _prctl()  # resolved before the fork: the child only calls it

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the coordinator died before the request took effect
            os.kill(os.getpid(), signal.SIGKILL)
    return hook


@functools.cache
def _prctl() -> Any:
    import ctypes  # only a coordinator that spawns agents needs it

    return ctypes.CDLL(None, use_errno=True).prctl


def process_start(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (/proc/<pid>/stat field 22); None if unknown."""
    stat = _stat(pid)
    return stat[1] if stat else None


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, start time, process group) of a live process from /proc, or None."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    fields = raw[raw.rindex(")") + 2:].split()  # the name may hold spaces and parentheses
    return fields[0], int(fields[19]), int(fields[2])


def group_alive(pgid: int) -> bool:
    """Whether any process of the group still runs (zombies waiting for a reaper count as gone). One signal-0
    probe answers the common case (no process left) without reading /proc."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member runs as another user (run_as): it exists
        pass
    if not Path("/proc").is_dir():
        return True
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat and stat[2] == pgid and stat[0] != "Z":
                return True
    return False


def terminate_group(pgid: int, start: int | None, grace_s: float) -> str:
    """Stop an orphaned agent's process group: SIGTERM, ``grace_s`` to exit, then SIGKILL.

    Its leader is identified by pid and start time, so a recycled pid is never signalled. A leaderless
    group (the leader died, helpers live on) is still ours: a pid is not reused while a group of that
    id exists. Returns what happened: unverifiable, recycled, gone, terminated or killed."""
    if start is None:  # recorded without /proc: nothing tells our agent from a stranger
        return "unverifiable"
    leader = _stat(pgid)
    if leader is not None and leader[1] != start:
        return "recycled"
    if not group_alive(pgid):
        return "gone"
    for sig, wait_s, result in ((signal.SIGTERM, grace_s, "terminated"), (signal.SIGKILL, 5.0, "killed")):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not group_alive(pgid):
                return result
            time.sleep(0.05)
    raise OSError(f"process group {pgid} survived SIGKILL")


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)  # the whole group: agents spawn helpers


def _private(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW, 0o600)


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)
