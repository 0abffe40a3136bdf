"""Logging set-up (kernel/logging.py): structlog is configured before the first log line, once, even when many
threads log for the first time together; lines go to stderr, filtered by the asked level, never to stdout."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from tests.cli_support import cli_env

RACE = textwrap.dedent("""
    import threading
    from taskkernel.kernel.logging import configure_logging, get_logger

    configure_logging()
    start = threading.Barrier(8)

    def first_lines(n):
        log = get_logger(f"t{n}")
        start.wait()
        log.info("should_be_filtered", n=n)
        log.warning("kept", n=n)

    threads = [threading.Thread(target=first_lines, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
""")


def test_threads_logging_first_together_all_get_the_configured_logger() -> None:
    for _ in range(6):  # the race needs luck to show: the unlocked set-up leaked lines in about a third of runs
        proc = subprocess.run([sys.executable, "-c", RACE], capture_output=True, text=True, timeout=60,
                              env=cli_env(TASKKERNEL_LOG_LEVEL="WARNING"))
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == ""
        lines = [json.loads(line) for line in proc.stderr.splitlines()]
        assert sorted(line["n"] for line in lines) == list(range(8))
        assert {line["event"] for line in lines} == {"kept"}


def test_the_level_is_read_when_asked_for() -> None:
    code = "from taskkernel.kernel.logging import configure_logging, get_logger\n" \
           "configure_logging()\nget_logger('x').debug('deep', a=1)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=cli_env(TASKKERNEL_LOG_LEVEL="DEBUG"))
    assert proc.stdout == "" and json.loads(proc.stderr)["event"] == "deep"
