"""``taskkernel schedule ...``: JSON contracts and exit codes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from taskkernel.coordinator.cli import schedule
from taskkernel.coordinator.cli.common import CliContext
from tests.cli_support import taskkernel

root = typer.Typer()


@root.callback()
def _global(ctx: typer.Context, db: str = typer.Option(None, "--db")) -> None:
    ctx.obj = CliContext(db_url=db)


root.add_typer(schedule.app, name="schedule")


@pytest.fixture
def cli(sqlite_url: str) -> Any:
    runner = CliRunner()

    def invoke(*args: str) -> tuple[int, dict[str, Any]]:
        res = runner.invoke(root, ["--db", sqlite_url, "schedule", *args])
        out = res.stdout.strip().splitlines()
        return res.exit_code, json.loads(out[-1]) if out else {}

    return invoke


def test_add_show_next_list_pause_resume_remove(cli: Any, tmp_path: Path) -> None:
    tpl = tmp_path / "t.yaml"
    tpl.write_text("recipient: PM\nsubject: weekly {dedup_key}\n")
    code, out = cli("add", "weekly", "--cron", "0 9 * * 0", "--tz", "Europe/Berlin", "--action", "create_task",
                    "--template", str(tpl))
    assert code == 0 and out["status"] == "added"
    assert out["schedule"]["misfire"] == "latest_once" and out["schedule"]["overlap"] == "skip"
    assert all(n["local"].endswith(("+01:00", "+02:00")) and n["dedup_key"].endswith("T09:00") for n in out["next"])

    code, out = cli("next", "weekly", "--count", "3")
    assert code == 0 and len(out["next"]) == 3
    from datetime import datetime
    assert {datetime.fromisoformat(n["local"]).strftime("%a") for n in out["next"]} == {"Sun"}

    code, out = cli("show", "weekly")
    assert code == 0 and len(out["next"]) == 5 and out["outcomes"] == [] and "watermark" in out

    assert cli("pause", "weekly")[1]["schedule"]["paused"] is True
    assert cli("resume", "weekly")[1]["schedule"]["paused"] is False
    code, out = cli("list")
    assert [s["name"] for s in out["schedules"]] == ["weekly"]
    assert cli("remove", "weekly")[1]["status"] == "removed"
    assert cli("list")[1] == {"schedules": []}


@pytest.mark.parametrize(("args", "code", "reason"), [
    (["add", "x", "--every", "30m", "--cron", "* * * * *", "--action", "call", "--callable", "f"], 64,
     "invalid_spec"),
    (["add", "x", "--every", "30q", "--action", "call", "--callable", "f"], 64, "invalid_duration"),
    (["add", "x", "--every", "30m", "--tz", "Mars/Olympus", "--action", "call", "--callable", "f"], 64,
     "invalid_timezone"),
    (["add", "x", "--every", "30m"], 64, "invalid_action"),
    (["add", "x", "--every", "30m", "--action", "create_task"], 64, "invalid_action"),
    (["add", "x", "--every", "30m", "--action", "create_task", "--template", "/nonexistent.yaml"], 65,
     "invalid_template"),
    (["add", "x", "--every", "30m", "--misfire", "never", "--action", "call", "--callable", "f"], 64,
     "invalid_spec"),
    (["show", "ghost"], 2, "schedule_not_found"),
    (["backfill", "ghost", "--from", "2026-01-01T00:00:00Z", "--to", "2026-01-02T00:00:00Z"], 2,
     "schedule_not_found"),
])
def test_errors_have_stable_reasons_and_exit_codes(cli: Any, args: list[str], code: int, reason: str) -> None:
    got, out = cli(*args)
    assert (got, out["status"], out["reason"]) == (code, "error", reason)
    assert out["message"]


def test_duplicate_name_and_backfill(cli: Any) -> None:
    assert cli("add", "beat", "--every", "1h", "--start", "2026-01-01T00:00:00Z", "--action", "call",
               "--callable", "f")[0] == 0
    assert cli("add", "beat", "--every", "1h", "--action", "call", "--callable", "f")[1]["reason"] == \
        "schedule_exists"
    code, out = cli("backfill", "beat", "--from", "2026-01-01T00:00:00Z", "--to", "2026-01-01T03:00:00Z")
    assert code == 0 and out["skipped"] == []
    assert out["queued"] == [f"2026-01-01T0{h}:00:00Z" for h in range(4)]
    code, out = cli("backfill", "beat", "--from", "2026-01-01T00:00:00Z", "--to", "2026-01-01T03:00:00Z")
    assert code == 0 and out["queued"] == []  # queued rows are reserved: never queued twice
    assert [s["state"] for s in out["skipped"]] == ["claimed"] * 4
    code, out = cli("backfill", "beat", "--from", "2026-01-01T00:00:00Z", "--to", "2026-02-01T00:00:00Z")
    assert (code, out["reason"]) == (2, "backfill_too_large")


def run_main(args: list[str], cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return taskkernel(*args, cwd=cwd, stdin=stdin, timeout=60)


def test_simulate_runs_in_a_fresh_process_without_a_workspace(tmp_path: Path) -> None:
    spec = {"schedule": {"cron": "30 1 * * *", "tz": "America/New_York", "misfire": "latest_once",
                         "catchup_window": "1h"},
            "from": "2026-10-31T00:00:00Z", "to": "2026-11-02T12:00:00Z",
            "down": [["2026-11-02T06:00:00Z", "2026-11-02T07:00:00Z"]], "processes": 2}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    res = run_main(["schedule", "simulate", "spec.json"], tmp_path)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == {
        "fired": [
            {"dedup_key": "2026-10-31T01:30", "nominal": "2026-10-31T05:30:00Z", "fired_at": "2026-10-31T05:30:00Z"},
            {"dedup_key": "2026-11-01T01:30", "nominal": "2026-11-01T05:30:00Z", "fired_at": "2026-11-01T05:30:00Z"},
            {"dedup_key": "2026-11-02T01:30", "nominal": "2026-11-02T06:30:00Z", "fired_at": "2026-11-02T07:00:00Z"},
        ],
        "missed": [{"dedup_key": "2026-11-01T01:30", "nominal": "2026-11-01T06:30:00Z", "reason": "duplicate"}],
    }
    assert not any(tmp_path.glob("*.db")) and not (tmp_path / ".taskkernel").exists()


def test_simulate_reads_stdin_and_rejects_bad_files(tmp_path: Path) -> None:
    doc = {"schedule": {"every": "1h"}, "from": "2026-01-01T00:00:00Z", "to": "2026-01-01T02:00:00Z"}
    res = run_main(["schedule", "simulate", "-"], tmp_path, stdin=json.dumps(doc))
    assert res.returncode == 0 and len(json.loads(res.stdout)["fired"]) == 2
    (tmp_path / "bad.json").write_text("{not json")
    res = run_main(["schedule", "simulate", "bad.json"], tmp_path)
    assert res.returncode == 65 and json.loads(res.stdout)["reason"] == "invalid_simulation"
    (tmp_path / "bad2.json").write_text(json.dumps({**doc, "schedule": {"cron": "61 * * * *"}}))
    res = run_main(["schedule", "simulate", "bad2.json"], tmp_path)
    assert res.returncode == 65 and json.loads(res.stdout)["reason"] == "invalid_spec"
    res = run_main(["schedule", "simulate"], tmp_path)
    assert res.returncode == 64
