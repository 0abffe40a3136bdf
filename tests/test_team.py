"""`up` runs a team (issue 13): agents in parallel within their limits, time limits that let an agent flush,
retries only where a retry can help, and a shutdown that loses nothing. Real `taskkernel up` processes, real
agent processes (small shell scripts that log their start and end to a file)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.cli_support import taskkernel, taskkernel_bg
from tests.coord_support import admin_task, coordinator, make_workspace
from tests.test_up import wait_for


def agent(tmp: Path, name: str, body: str) -> str:
    """A shell agent that logs `start|end <role> <task> <epoch>` to tmp/runs.log around ``body``."""
    path = tmp / f"{name}.sh"
    log = tmp / "runs.log"
    path.write_text(f'#!/bin/sh\necho "start $TASKKERNEL_ROLE $TASKKERNEL_TASK_ID $(date +%s.%N)" >> {log}\n'
                    f'{body}\necho "end $TASKKERNEL_ROLE $TASKKERNEL_TASK_ID $(date +%s.%N)" >> {log}\n',
                    encoding="utf-8")
    path.chmod(0o755)
    return str(path)


# what an agent does to end its run with an outcome: a run that exits 0 without a report failed `no_report`
REPORT_DONE = f'{sys.executable} -m taskkernel task report "$TASKKERNEL_TASK_ID" --status done --body ok > /dev/null'


def runner(script: str, **extra: Any) -> dict[str, Any]:
    return {"runner": "command", "argv": [script], "max_attempts": 1, **extra}


def set_kernel(ws_root: Path, **keys: Any) -> None:
    path = ws_root / "taskkernel.toml"
    lines = "".join(f"{k} = {json.dumps(v)}\n" for k, v in keys.items())
    path.write_text(path.read_text().replace("[kernel]\n", "[kernel]\n" + lines, 1))


def log_lines(tmp: Path) -> list[tuple[str, str, str, float]]:
    path = tmp / "runs.log"
    if not path.exists():
        return []
    return [(w[0], w[1], w[2], float(w[3])) for w in (line.split() for line in path.read_text().splitlines())]


def runs(ws_root: Path) -> dict[str, dict[str, Any]]:
    listed = taskkernel("runs", "list", "--json", "--limit", "1000", cwd=ws_root)
    assert listed.returncode == 0, listed.stderr
    return {r["task_id"]: r for r in json.loads(listed.stdout)}


def test_a_hung_agent_does_not_hold_up_another_role_and_a_stop_loses_nothing(tmp_path: Path) -> None:
    """OPS hangs; a DEV task created after it finishes meanwhile. SIGTERM: `up` stops dispatching, waits its
    grace, then stops the hung agent (exit 130, status interrupted, the run named); the next start runs it
    again exactly once."""
    hung = agent(tmp_path, "hung", f'if [ ! -e {tmp_path}/second ]; then touch {tmp_path}/second; sleep 60; fi\n'
                                   + REPORT_DONE)
    fast = agent(tmp_path, "fast", REPORT_DONE)
    ws = make_workspace(tmp_path / "ws", {"OPS": runner(hung, timeout=120, max_attempts=2), "DEV": runner(fast)})
    set_kernel(ws.root, shutdown_grace=1)
    c = coordinator(ws)
    ops_task = admin_task(c, subject="hangs", recipient="OPS")
    proc = taskkernel_bg("up", str(ws.root), cwd=tmp_path)
    try:
        assert wait_for(lambda: any(e[:2] == ("start", "OPS") for e in log_lines(tmp_path)), 30), "OPS never started"
        dev_task = admin_task(c, subject="quick", recipient="DEV")
        assert wait_for(lambda: ("end", "DEV", dev_task) in [e[:3] for e in log_lines(tmp_path)], 30)
        assert runs(ws.root)[ops_task]["state"] == "running"  # the DEV run did not wait for it
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    stopped = json.loads(out.strip().splitlines()[-1])
    assert stopped["status"] == "interrupted"
    assert [r["task_id"] for r in stopped["running_at_stop"]] == [ops_task]
    interrupted = runs(ws.root)[ops_task]
    assert (interrupted["state"], interrupted["error_code"], interrupted["attempt"]) == ("retrying", "interrupted", 1)
    assert interrupted["max_attempts"] == 3  # the attempt a person's stop took is given back
    again = taskkernel("up", str(ws.root), "--once", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    starts = [e[2] for e in log_lines(tmp_path) if e[:2] == ("start", "OPS")]
    assert starts == [ops_task, ops_task]  # interrupted once, retried once at the next start
    assert runs(ws.root)[ops_task]["state"] == "done"


def test_the_global_and_per_role_limits_hold_and_are_used(tmp_path: Path) -> None:
    work = agent(tmp_path, "work", "sleep 0.6")
    ws = make_workspace(tmp_path / "ws", {"DEV": runner(work, concurrency=2), "QA": runner(work, concurrency=2),
                                          "OPS": runner(work)})
    set_kernel(ws.root, max_runs=3)
    c = coordinator(ws)
    for role in ("DEV", "QA", "OPS"):  # oldest first: DEV's four would take every slot without its limit
        for i in range(4):
            admin_task(c, subject=f"{role} {i}", recipient=role)
    done = taskkernel("up", str(ws.root), "--once", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    events = sorted(log_lines(tmp_path), key=lambda e: (e[3], e[0] == "start"))  # an end before a start at a tie
    assert len(events) == 24
    peak: dict[str, int] = {}
    now: dict[str, int] = {}
    for kind, role, _, _ in events:
        for key in (role, "all"):
            now[key] = now.get(key, 0) + (1 if kind == "start" else -1)
            peak[key] = max(peak.get(key, 0), now[key])
    assert peak["all"] == 3 and peak["DEV"] == 2 and peak["QA"] == 2 and peak["OPS"] == 1, peak


def test_timeouts_terminate_then_kill_and_a_silent_agent_is_stopped_by_its_heartbeat(tmp_path: Path) -> None:
    """At the timeout the agent gets SIGTERM (it can flush: the marker), then SIGKILL after kill_grace if it
    ignores it; heartbeats stop a silent agent long before its timeout."""
    stubborn = agent(tmp_path, "stubborn", f"trap 'echo $TASKKERNEL_TASK_ID >> {tmp_path}/term' TERM\n"
                                           "while true; do sleep 0.1; done")
    polite = agent(tmp_path, "polite", f"trap 'echo $TASKKERNEL_TASK_ID >> {tmp_path}/term; exit 0' TERM\n"
                                       "while true; do sleep 0.1; done")
    silent = agent(tmp_path, "silent", "for i in 1 2 3; do echo taskkernel:heartbeat; sleep 0.3; done; sleep 60")
    ws = make_workspace(tmp_path / "ws", {"DEV": runner(stubborn, timeout=1, kill_grace=1.5),
                                          "QA": runner(polite, timeout=1, kill_grace=10),
                                          "OPS": runner(silent, timeout=60, heartbeat_timeout=1.5)})
    c = coordinator(ws)
    dev, qa, ops = (admin_task(c, subject=role, recipient=role) for role in ("DEV", "QA", "OPS"))
    started = time.monotonic()
    done = taskkernel("up", str(ws.root), "--once", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 30  # not the OPS agent's 60 s
    ended = runs(ws.root)
    assert "timeout after 1s (killed)" in ended[dev]["last_error"]
    assert "timeout after 1s (terminated)" in ended[qa]["last_error"]
    assert "no heartbeat for 1.5s" in ended[ops]["last_error"]
    assert sorted((tmp_path / "term").read_text().split()) == sorted([dev, qa])  # both could flush
    shown = json.loads(taskkernel("runs", "show", ended[dev]["run_id"], "--json", cwd=ws.root).stdout)
    assert shown["attempts"][0]["wall_ms"] >= 2400  # the timeout, then the whole grace before SIGKILL


def test_errors_no_retry_can_fix_block_at_once_and_once_waits_for_due_retries(tmp_path: Path) -> None:
    failing = agent(tmp_path, "failing", "exit 7")
    flaky = agent(tmp_path, "flaky", f'if [ ! -e {tmp_path}/flaked ]; then touch {tmp_path}/flaked; exit 1; fi\n'
                                     + REPORT_DONE)
    ws = make_workspace(tmp_path / "ws", {
        "DEV": {"runner": "command", "argv": [str(tmp_path / "missing-{task_id}")], "max_attempts": 3},
        "QA": runner(failing, max_attempts=3, non_retryable_exit_codes=[7]),
        "OPS": runner(flaky, max_attempts=2, backoff=1)})
    c = coordinator(ws)
    dev, qa, ops = (admin_task(c, subject=role, recipient=role) for role in ("DEV", "QA", "OPS"))
    done = taskkernel("up", str(ws.root), "--once", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["pending"] == []  # the OPS retry fell due within the wait and ran
    logged = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    by_event = {(e["event"], e.get("task_id")) for e in logged}  # off a terminal: one JSON line per step
    assert {("run_started", ops), ("run_retry", ops), ("run_finished", ops), ("run_blocked", dev),
            ("run_blocked", qa)} <= by_event, sorted(by_event)
    ended = runs(ws.root)
    assert (ended[dev]["state"], ended[dev]["error_code"], ended[dev]["attempt"]) == ("blocked", "binary_missing", 1)
    assert (ended[qa]["state"], ended[qa]["error_code"], ended[qa]["attempt"]) == (
        "blocked", "non_retryable_exit", 1)
    assert (ended[ops]["state"], ended[ops]["attempt"]) == ("done", 2)
    blocked = json.loads(taskkernel("task", "list", "--state", "blocked", "--json", cwd=ws.root).stdout)
    assert sorted(t["task_id"] for t in blocked) == sorted([dev, qa])
    assert "binary_missing" in blocked[[t["task_id"] for t in blocked].index(dev)]["blocked"]["reason"]


def test_up_once_says_which_retries_are_still_pending(tmp_path: Path) -> None:
    flaky = agent(tmp_path, "flaky", "exit 1")
    ws = make_workspace(tmp_path / "ws", {"DEV": runner(flaky, max_attempts=2, backoff=30)})
    task = admin_task(coordinator(ws), subject="later", recipient="DEV")
    started = time.monotonic()
    done = taskkernel("up", str(ws.root), "--once", "--once-wait", "0", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 25  # it did not wait the 30 s backoff
    [pending] = json.loads(done.stdout)["pending"]
    assert (pending["task_id"], pending["attempt"], pending["error_code"]) == (task, 1, "exit_code")


def test_a_second_ctrl_c_interrupts_what_the_first_waits_for(tmp_path: Path) -> None:
    hung = agent(tmp_path, "hung", "sleep 60")
    ws = make_workspace(tmp_path / "ws", {"DEV": runner(hung, timeout=120, kill_grace=1)})
    set_kernel(ws.root, shutdown_grace=120)
    task = admin_task(coordinator(ws), subject="hangs", recipient="DEV")
    proc = taskkernel_bg("up", str(ws.root), cwd=tmp_path)
    try:
        assert wait_for(lambda: any(e[:2] == ("start", "DEV") for e in log_lines(tmp_path)), 30)
        proc.send_signal(signal.SIGINT)
        time.sleep(1.0)
        assert proc.poll() is None, "the first Ctrl-C waits for the running agent"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "1 run(s) still running" in err and task in err
    assert json.loads(out.strip().splitlines()[-1])["status"] == "interrupted"
    assert subprocess.run(["pgrep", "-f", f"{tmp_path}/hung.sh"], capture_output=True).returncode == 1


def test_cli_verbs_with_the_run_token_are_heartbeats(tmp_path: Path) -> None:
    """An agent that reports progress through the CLI (its run's token) is alive to its supervisor: it works
    well past heartbeat_timeout without printing a heartbeat line and is not stopped."""
    cli = f"{sys.executable} -m taskkernel"
    # each step is a second's work and a CLI call (about a second on a busy 2-core machine); the supervisor reads
    # other processes' heartbeats once a second: 5 s of silence is well clear of one step
    steps = agent(tmp_path, "steps", "for i in 1 2 3 4 5 6; do sleep 1; "
                                     f'{cli} task report "$TASKKERNEL_TASK_ID" --status in_progress --body "step $i" '
                                     "> /dev/null || exit 9; done\n" + REPORT_DONE)
    ws = make_workspace(tmp_path / "ws", {"DEV": runner(steps, timeout=120, heartbeat_timeout=5)})
    task = admin_task(coordinator(ws), subject="long", recipient="DEV")
    done = taskkernel("up", str(ws.root), "--once", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    ended = runs(ws.root)[task]
    assert ended["state"] == "done", ended
    [(_, _, _, start), (_, _, _, end)] = log_lines(tmp_path)
    assert end - start > 6  # it outlived heartbeat_timeout, alive through its reports
    shown = json.loads(taskkernel("runs", "show", ended["run_id"], "--json", cwd=ws.root).stdout)
    assert shown["heartbeat_at"] is not None  # recorded by the agent's CLI calls, not by a stdout line


# -- regressions from the review of this change -------------------------------------------------------------------

def test_once_waits_for_a_retry_scheduled_after_a_long_attempt(tmp_path: Path) -> None:
    """--once-wait counts from when nothing runs any more, not from the start: an attempt longer than the wait
    still gets its retry."""
    slow = agent(tmp_path, "slow", f'if [ ! -e {tmp_path}/tried ]; then touch {tmp_path}/tried; sleep 3; exit 1; fi\n'
                                   + REPORT_DONE)
    ws = make_workspace(tmp_path / "ws", {"DEV": runner(slow, max_attempts=2, backoff=1)})
    task = admin_task(coordinator(ws), subject="slow", recipient="DEV")
    done = taskkernel("up", str(ws.root), "--once", "--once-wait", "2", cwd=tmp_path)
    assert done.returncode == 0 and json.loads(done.stdout)["pending"] == [], done.stdout
    assert (runs(ws.root)[task]["state"], runs(ws.root)[task]["attempt"]) == ("done", 2)


def test_once_ends_when_what_is_due_belongs_to_a_role_without_a_runner_now(tmp_path: Path) -> None:
    failing = agent(tmp_path, "failing", "exit 1")
    ws = make_workspace(tmp_path / "ws", {"DEV": runner(failing, max_attempts=3, backoff=0.5)})
    task = admin_task(coordinator(ws), subject="orphaned retry", recipient="DEV")
    assert taskkernel("up", str(ws.root), "--once", "--once-wait", "0", cwd=tmp_path).returncode == 0
    config = ws.root / "taskkernel.toml"
    config.write_text(config.read_text().split("[roles.DEV]")[0])  # the runner is gone; its retry stays
    time.sleep(0.6)
    started = time.monotonic()
    done = taskkernel("up", str(ws.root), "--once", "--once-wait", "5", cwd=tmp_path)
    assert done.returncode == 0 and time.monotonic() - started < 20, done.stderr[-500:]
    assert [p["task_id"] for p in json.loads(done.stdout)["pending"]] == [task]


def test_helpers_get_the_grace_and_none_outlives_its_run(tmp_path: Path) -> None:
    """The whole process group gets kill_grace (a helper that flushes on SIGTERM does), and a helper left
    behind by an agent that exited normally is stopped with it."""
    flushing = agent(tmp_path, "flushing", f"(trap 'sleep 1; echo flushed >> {tmp_path}/flushed; exit 0' TERM; "
                                           "while true; do sleep 0.1; done) &\nsleep 60")
    leaving = agent(tmp_path, "leaving", "(sleep 31.75 &)\ntrue")
    ws = make_workspace(tmp_path / "ws", {"DEV": runner(flushing, timeout=1, kill_grace=5),
                                          "QA": runner(leaving)})
    c = coordinator(ws)
    admin_task(c, subject="flush", recipient="DEV")
    admin_task(c, subject="leave", recipient="QA")
    assert taskkernel("up", str(ws.root), "--once", cwd=tmp_path).returncode == 0
    assert (tmp_path / "flushed").read_text().strip() == "flushed"
    assert subprocess.run(["pgrep", "-f", "sleep 31.75"], capture_output=True).returncode == 1


def test_a_signal_stops_up_once_and_its_runs_run_again_later(tmp_path: Path) -> None:
    hung = agent(tmp_path, "hung", "sleep 60")
    ws = make_workspace(tmp_path / "ws", {"DEV": runner(hung, timeout=120, kill_grace=1)})
    task = admin_task(coordinator(ws), subject="hangs", recipient="DEV")
    proc = taskkernel_bg("up", str(ws.root), "--once", cwd=tmp_path)
    try:
        assert wait_for(lambda: any(e[:2] == ("start", "DEV") for e in log_lines(tmp_path)), 30)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    stopped = json.loads(out)
    assert stopped["status"] == "interrupted" and [r["task_id"] for r in stopped["running_at_stop"]] == [task]
    assert (runs(ws.root)[task]["state"], runs(ws.root)[task]["error_code"]) == ("retrying", "interrupted")


def test_a_long_scripted_run_is_never_taken_over_by_its_own_coordinator(tmp_path: Path) -> None:
    """A scripted agent cannot renew its lease while it works: the coordinator running it must not claim it
    again when the lease lapses (it did, and ran the agent three times at once)."""
    ws = make_workspace(tmp_path / "ws", {"DEV": {"runner": "scripted", "lease": 1, "concurrency": 2}})
    c = coordinator(ws)
    calls: list[float] = []

    def slow(ctx: Any) -> str:
        calls.append(time.time())
        time.sleep(2.5)
        ctx.submit("submit_report", status="done", body="slept")
        return "slept"

    c.dispatcher.handlers["DEV"] = slow
    task = admin_task(c, subject="slow", recipient="DEV")
    c.run_once()
    assert len(calls) == 1
    [run] = [r for r in c.dispatcher.ledger.all_runs() if r["task_id"] == task]
    assert (run["state"], run["attempt"]) == ("succeeded", 1)


def test_a_draining_coordinator_claims_nothing_new(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "ws", {"DEV": {"runner": "scripted"}})
    c = coordinator(ws)
    c.dispatcher.drain()
    task = admin_task(c, subject="late", recipient="DEV")
    c.pass_once()
    assert c.kernel.task(task)["state"] == "inbox"  # type: ignore[index]
