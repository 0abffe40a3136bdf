"""Run an agent as an external command (codex, claude, any script) with a timeout and captured logs."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel.runners.config import RunnerSpec

USAGE_KEYS = ("tokens_in", "tokens_out", "cost_usd")
USAGE_LIMIT = 1e12  # anything larger (or negative, NaN, infinite) is not a usage figure


@dataclass
class Outcome:
    ok: bool
    exit_code: int | None
    wall_ms: int
    error: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    summary: str = ""


def parse_usage(stdout: str) -> dict[str, Any]:
    """The last stdout line that is a JSON object with token/cost fields (top level or under "usage")."""
    for line in reversed(stdout.strip().splitlines()[-50:]):
        line = line.strip()
        if not (line.startswith("{") and line.endswith("}")):
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        found = obj.get("usage") if isinstance(obj.get("usage"), dict) else obj
        picked = {k: found[k] for k in USAGE_KEYS if _plausible(found.get(k))}
        if picked:
            return picked
    return {}


def run_command(spec: RunnerSpec, placeholders: dict[str, str], env: dict[str, str], workspace: Path,
                log_dir: Path) -> Outcome:
    argv = [part.format(**placeholders) for part in spec.argv]
    cwd = (workspace / spec.cwd) if spec.cwd else workspace
    log_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    try:
        with open(log_dir / "stdout.log", "w+", encoding="utf-8", errors="replace") as out, \
                open(log_dir / "stderr.log", "w", encoding="utf-8") as err:
            proc = subprocess.Popen(argv, cwd=cwd, env={**os.environ, **spec.env, **env}, stdout=out, stderr=err,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            try:
                code = proc.wait(timeout=spec.timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # the whole group: agents spawn helpers
                proc.wait()
                return Outcome(False, None, _ms(started), f"timeout after {spec.timeout:g}s")
            out.seek(0)
            stdout = out.read()
    except (OSError, ValueError, KeyError, IndexError) as exc:  # missing binary, bad cwd, bad placeholder
        return Outcome(False, None, _ms(started), f"runner unavailable: {exc}")
    usage = parse_usage(stdout)
    if code != 0:
        return Outcome(False, code, _ms(started), f"exit code {code}", usage)
    return Outcome(True, 0, _ms(started), None, usage, stdout.strip().splitlines()[-1][:200] if stdout.strip() else "")


def _plausible(value: Any) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
            and 0 <= value <= USAGE_LIMIT)


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)
