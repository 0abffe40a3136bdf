"""The import, `verify` and the import report agree on which files exist, through the real CLI.

Teams file work in batch folders (`tasks/<sprint>/`, `log/tasks/<date>/`, `_lifecycle/archive/<month>/`): the
import takes them, so `verify` must look exactly there, or each task imported from one is `folder_drift` for
ever. And a file the import did not read (a link, a FIFO, a file over the size limit, an unreadable one) may be
history the kernel lacks: the import runs once, so its report is where the owner learns of it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.cli_support import CLI, Run, cli_env, run, run_tty
from tests.test_fcop_import import task

FIELD = Path(__file__).parent / "fixtures" / "fcop-field"
BATCH = "2026-05-13"
OPEN = "TASK-20260513-015-ADMIN-to-ME-glama-badge-into-readme.md"  # in tasks/2026-05-13/, reported done
STATES = {"TASK-20260513-001": "archive", "TASK-20260513-002": "archive", "TASK-20260513-014": "active",
          "TASK-20260513-015": "review", "TASK-20260514-001": "inbox"}


def field_project(tmp_path: Path) -> Path:
    """The real G2 workspace with batch folders (tests/fixtures/fcop-field/README.md), `taskkernel init`ed."""
    project = tmp_path / "proj"
    shutil.copytree(FIELD / "g2-nested", project)
    assert run("init", ".", cwd=project).code == 0
    return project


def problems(project: Path) -> tuple[int, list[tuple[str, str]]]:
    """`verify`'s exit code and its problems as (reason, task id)."""
    r = run("verify", cwd=project)
    return r.code, [(p["reason"], p.get("task_id", "")) for p in r.json["problems"]]


def states(project: Path) -> dict[str, str]:
    return {t["task_id"]: t["state"] for t in run("task", "list", cwd=project).json}


def files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_an_imported_g2_workspace_with_batch_folders_verifies_clean(tmp_path: Path) -> None:
    project = field_project(tmp_path)
    before = files(project / "fcop")
    r = run("fcop", "import", cwd=project)
    assert (r.code, r.json["status"], r.json["skipped"], r.json["kept"]) == (0, "ok", [], []), r.out + r.err
    assert states(project) == STATES
    assert problems(project) == (0, [])
    assert run("up", "--once", cwd=project).code == 0
    assert problems(project) == (0, [])
    after = files(project / "fcop")
    assert {rel for rel, data in before.items() if after.get(rel) != data} == set(), "G2 history is never moved"


def test_a_drift_in_a_g2_batch_folder_is_still_reported(tmp_path: Path) -> None:
    project = field_project(tmp_path)
    assert run("fcop", "import", cwd=project).code == 0
    own = project / "fcop" / "tasks" / BATCH / OPEN
    copy = project / "fcop" / "tasks" / "2026-05-14" / OPEN
    copy.parent.mkdir()
    shutil.copy2(own, copy)
    assert problems(project) == (2, [("folder_duplicate", "TASK-20260513-015")])
    copy.unlink()
    own.rename(own.with_name(OPEN.replace("-ADMIN-to-ME-", "-ADMIN-to-QA-")))  # the name no longer says its route
    assert problems(project) == (2, [("folder_drift", "TASK-20260513-015")])


def test_a_g3_task_in_a_batch_folder_below_its_stage_is_in_that_stage(tmp_path: Path) -> None:
    project = tmp_path / "g3"
    own = project / "fcop" / "_lifecycle" / "archive" / "2026-05" / "TASK-20260501-001-ADMIN-to-DEV.md"
    task(own, subject="Shipped")
    old = project / "fcop" / "history" / "2026-04" / "TASK-20260401-001-ADMIN-to-DEV.md"
    task(old, subject="Older history")
    assert run("init", ".", cwd=project).code == 0
    assert run("fcop", "import", cwd=project).code == 0
    assert states(project) == {"TASK-20260501-001": "archive", "TASK-20260401-001": "archive"}
    assert problems(project) == (0, [])
    assert run("up", "--once", cwd=project).code == 0
    assert own.is_file() and old.is_file(), "history stays where it is"
    own.write_text(own.read_text(encoding="utf-8").replace("Shipped", "Rewritten"), encoding="utf-8")
    assert problems(project) == (2, [("task_file_mismatch", "TASK-20260501-001")])
    own.write_text(own.read_text(encoding="utf-8").replace("Rewritten", "Shipped"), encoding="utf-8")
    moved = project / "fcop" / "_lifecycle" / "done" / "2026-05" / own.name
    moved.parent.mkdir(parents=True)
    own.rename(moved)
    assert problems(project) == (2, [("folder_drift", "TASK-20260501-001")])
    assert run("verify", "--repair", cwd=project).code == 0
    assert (project / "fcop" / "_lifecycle" / "archive" / own.name).is_file()
    assert problems(project) == (0, [])


def test_every_file_the_import_did_not_read_is_in_its_report(tmp_path: Path) -> None:
    project = field_project(tmp_path)
    tasks, outside = project / "fcop" / "tasks", tmp_path / "outside"
    task(outside / "TASK-20260515-001-ADMIN-to-ME.md", recipient="ME", subject="Behind a folder link")
    with open(tasks / "TASK-20260515-002-ADMIN-to-ME.md", "wb") as big:
        big.truncate(60 * 2**20)
    os.mkfifo(tasks / BATCH / "TASK-20260515-003-ADMIN-to-ME.md")
    (tasks / BATCH / "TASK-20260515-004-ADMIN-to-ME.md").symlink_to(outside / "TASK-20260515-001-ADMIN-to-ME.md")
    (tasks / "2026-05-15").symlink_to(outside, target_is_directory=True)
    (tasks / "TASK-20260515-005-ADMIN-to-ME.md").write_bytes(b"---\nprotocol: fcop\n\0binary\n")
    (tasks / "TASK-20260515-006-ADMIN-to-ME.md").write_bytes(
        "---\nprotocol: fcop\nversion: 1\nsender: ADMIN\nrecipient: ME\nsubject: 旧编码\n---\n正文\n".encode("gbk"))
    skipped = {"tasks/TASK-20260515-002-ADMIN-to-ME.md": "file_too_large",
               f"tasks/{BATCH}/TASK-20260515-003-ADMIN-to-ME.md": "not_regular_file",
               f"tasks/{BATCH}/TASK-20260515-004-ADMIN-to-ME.md": "symlink_refused",
               "tasks/2026-05-15": "symlink_refused"}

    dry = run_tty("fcop", "import", "--dry-run", cwd=project)  # a person at a terminal
    assert dry.code == 0 and "incomplete: 4 file(s) or folder(s) not read" in dry.err, dry.out + dry.err
    for rel, reason in skipped.items():
        assert f"  {rel}: {reason} (" in dry.err, dry.err

    r = run("fcop", "import", cwd=project)  # a script: one JSON document
    assert (r.code, r.json["status"]) == (0, "incomplete"), r.out + r.err
    assert {s["file"]: s["reason"] for s in r.json["skipped"]} == skipped
    assert all(s["message"] for s in r.json["skipped"])
    assert [(k["file"], k["reason"]) for k in r.json["kept"]] == [("tasks/TASK-20260515-005-ADMIN-to-ME.md",
                                                                  "binary_file")]
    assert [w["file"] for w in r.json["warnings"] if w["warning"] == "legacy_encoding"] == [
        "tasks/TASK-20260515-006-ADMIN-to-ME.md"]
    assert states(project) == {**STATES, "TASK-20260515-006": "inbox"}, "nothing else is lost"

    run("up", "--once", cwd=project)  # later passes leave history where it is: nothing is quarantined
    assert not (project / "fcop" / "_quarantine").exists()
    assert (tasks / BATCH / "TASK-20260515-004-ADMIN-to-ME.md").is_symlink()
    assert (tasks / "TASK-20260515-002-ADMIN-to-ME.md").stat().st_size == 60 * 2**20
    assert problems(project) == (0, [])


def run_unprivileged(*args: str, cwd: Path) -> Run:
    """The CLI as a user who may not read a file of mode 0: root reads anything, so it runs without the
    capabilities that let it (setpriv)."""
    prefix = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--"] if os.geteuid() == 0 else []
    proc = subprocess.run([*prefix, *CLI, *args], cwd=cwd, capture_output=True, text=True, env=cli_env(), timeout=120)
    return Run(proc.returncode, proc.stdout, proc.stderr)


@pytest.mark.skipif(os.geteuid() == 0 and shutil.which("setpriv") is None, reason="root reads a file whatever its mode")
def test_an_unreadable_file_or_folder_is_in_the_import_report(tmp_path: Path) -> None:
    project = field_project(tmp_path)
    locked_file = project / "fcop" / "tasks" / "TASK-20260515-001-ADMIN-to-ME.md"
    task(locked_file, recipient="ME")
    locked_dir = project / "fcop" / "log" / "tasks" / "2026-05-15"
    task(locked_dir / "TASK-20260515-002-ADMIN-to-ME.md", recipient="ME")
    locked_file.chmod(0)
    locked_dir.chmod(0)
    try:
        r = run_unprivileged("fcop", "import", cwd=project)
    finally:
        locked_dir.chmod(0o755)
    assert (r.code, r.json["status"]) == (0, "incomplete"), r.out + r.err
    assert {s["file"]: s["reason"] for s in r.json["skipped"]} == {
        "tasks/TASK-20260515-001-ADMIN-to-ME.md": "io_error", "log/tasks/2026-05-15": "io_error"}
    assert states(project) == STATES
