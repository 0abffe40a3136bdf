"""`taskkernel fcop migrate --to g3` through the real CLI: a G2 root becomes G3 whole (fcop never sees a mix), each
task lands in the stage the kernel holds it in, the old tree is kept byte for byte, the folder records follow
their files (nothing is ingested twice), and a link, a non-owner or a wrong generation leaves the tree as it was."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.cli_support import CLI, cli_env, run

fcop_v3 = pytest.importorskip("fcop.compatibility.v3.project", reason="fcop is a dev dependency (the oracle)")
from fcop.core.filename import (  # noqa: E402
    parse_issue_filename,
    parse_report_filename,
    parse_review_filename,
    parse_task_filename,
)
from fcop.lifecycle.detect import detect_topology, find_workspace_root  # noqa: E402
from fcop.lifecycle.events import MIGRATION_TOOL_NAME, read_events  # noqa: E402
from fcop.lifecycle.state import Stage  # noqa: E402
from fcop.lifecycle.transitions import validate_transition  # noqa: E402

from tests.fcop_oracle import snapshot  # noqa: E402

STAGES = ("inbox", "active", "review", "done", "archive")
FIELD = ("fcop-d3e870a", "docs-agents-0411ffc", "docs-agents-353783a")


def _fixtures() -> Path:
    """``<repo>/../shared/fixtures`` (CI clones the repo beside a copy of shared/), else $TASKKERNEL_FIXTURES."""
    beside = Path(__file__).resolve().parent.parent.parent / "shared" / "fixtures"
    if beside.is_dir():
        return beside
    return Path(os.environ.get("TASKKERNEL_FIXTURES", "/work/shared/fixtures"))


# -- the oracle and the tree ----------------------------------------------------------------------------------

_READERS: dict[str, tuple[tuple[str, ...], Any]] = {  # kind -> (folders fcop reads, strict loader -> id)
    "tasks": (("tasks", "log/tasks", *(f"_lifecycle/{s}" for s in STAGES)),
              lambda p: parse_task_filename(p.name) and fcop_v3._load_task_strict(p, is_archived=False).task_id),
    "reports": (("reports", "log/reports"), lambda p: parse_report_filename(p.name)
                and fcop_v3._load_report_strict(p, is_archived=False).filename),
    "issues": (("issues", "log/issues"),
               lambda p: parse_issue_filename(p.name) and fcop_v3._load_issue_strict(p).issue_id),
    "reviews": (("reviews", "log/reviews"), lambda p: parse_review_filename(p.name)
                and fcop_v3._load_review_strict(p, is_archived=False).review_id),
}


def fcop_sees(project: Path) -> dict[str, set[str]]:
    """What fcop's strict loaders accept, file by file (``Project.list_tasks`` stops at the first GBK file):
    ids per kind, plus the names of the files it cannot decode."""
    root = find_workspace_root(project)
    seen: dict[str, set[str]] = {kind: set() for kind in [*_READERS, "undecodable"]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for kind, (folders, load) in _READERS.items():
            for path in (p for f in folders if (root / f).is_dir() for p in (root / f).iterdir() if p.is_file()):
                try:
                    found = load(path)
                except UnicodeDecodeError:
                    seen["undecodable"].add(path.name)
                    continue
                except Exception:  # noqa: BLE001, S112 - fcop does not accept the file (before or after)
                    continue
                if found:
                    seen[kind].add(str(found))
    return seen


def topology(project: Path) -> str:
    return detect_topology(project).topology.value


def project_state(project: Path) -> dict[str, str]:
    """Everything but the database files (SQLite touches its -wal/-shm when merely opened)."""
    return {rel: v for rel, v in snapshot(project).items() if not rel.startswith(".taskkernel/")}


def leftovers(project: Path) -> list[str]:
    """Temp roots or backups a refused migration must not leave."""
    return sorted(p.name for p in [*project.rglob(".*.migrate-*"), *(project / ".taskkernel").glob("migrate-*")])


def migrate(project: Path, *extra: str) -> Any:
    return run("fcop", "migrate", "--to", "g3", *extra, cwd=project)


def field_project(tmp_path: Path, fixture: str, *, imported: bool = True) -> Path:
    """A copy of a real G2 workspace at its real path (fcop/ or docs/agents/), writable as a checkout is, then
    `taskkernel init` and (``imported``) `taskkernel fcop import`: migrate takes only a root the kernel read."""
    project = tmp_path / "proj"
    shutil.copytree(_fixtures() / "fcop-field" / fixture, project)
    for path in [project, *project.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    r = run("init", str(project), cwd=tmp_path)
    assert r.code == 0, r.err
    if imported:
        assert run("fcop", "import", cwd=project).code == 0
    return project


def kernel_view(project: Path) -> tuple[dict[str, str], int]:
    """(task id -> state, number of events)."""
    tasks = run("task", "list", cwd=project)
    log = run("log", cwd=project)
    assert tasks.code == 0 and log.code == 0, tasks.err + log.err
    return {t["task_id"]: t["state"] for t in tasks.json}, len(log.out.splitlines())


def transition_problems(root: Path) -> list[str]:
    """Events in TASK files that are neither an fcop edge nor fcop's migration baseline, events after the
    baseline that do not start where the one before ended, and chains that end elsewhere than the file's stage."""
    problems = []
    for path in root.glob("_lifecycle/*/TASK-*"):
        try:
            events = read_events(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            continue
        base = next((i for i, e in enumerate(events) if e.tool == MIGRATION_TOOL_NAME), None)
        for i, e in enumerate(events):
            if i == base:
                if (e.from_stage, e.by) != (None, "migration"):
                    problems.append(f"{path.name}: baseline {e}")
            elif e.tool != MIGRATION_TOOL_NAME:
                try:
                    validate_transition(e.from_stage, e.to_stage, tool=e.tool)
                except Exception as exc:  # noqa: BLE001
                    problems.append(f"{path.name}: {exc}")
            if base is not None and i > base and e.from_stage != events[i - 1].to_stage:
                problems.append(f"{path.name}: event {i} starts at {e.from_stage}, not {events[i - 1].to_stage}")
        if events and events[-1].to_stage.value != path.parent.name:
            problems.append(f"{path.name}: the chain ends at {events[-1].to_stage.value}, not {path.parent.name}")
    return problems


# -- the real workspaces --------------------------------------------------------------------------------------

@pytest.mark.parametrize("fixture", FIELD)
def test_a_field_workspace_becomes_g3_whole_after_the_kernel_took_it_in(tmp_path: Path, fixture: str) -> None:
    project = field_project(tmp_path, fixture)
    for _ in range(2):  # the second pass shows the kernel is steady on this G2 root before anything moves
        assert run("up", "--once", cwd=project).code == 0
    assert topology(project) == "v2"
    steady = run("verify", cwd=project)
    assert steady.code == 0, steady.out
    root = find_workspace_root(project)
    before, tree, states, whole = fcop_sees(project), snapshot(root), kernel_view(project), project_state(project)

    dry = migrate(project, "--dry-run")
    assert dry.code == 0, dry.err
    plan = dry.json
    assert project_state(project) == whole and not leftovers(project), "a dry run writes nothing"
    moves = {m["from"]: m for m in plan["moves"]}
    assert not any(rel.startswith(("tasks/", "log/")) for rel in tree.keys() - moves.keys() if tree[rel] != "dir")
    for m in moves.values():
        if m["kind"] == "task" and m["stage_from"] == "kernel":
            assert m["stage"] == states[0][parse_task_filename(m["from"].rsplit("/", 1)[-1]).task_id]
    assert sum(plan["counts"].values()) == len(moves) and plan["unchanged"] + len(moves) == sum(
        1 for v in tree.values() if v != "dir")

    done = migrate(project)
    assert done.code == 0, done.err
    out = done.json
    assert (out["status"], out["moved"], out["swap"]) == ("ok", len(moves), "exchange")
    assert [m["to"] for m in out["moves"]] == [m["to"] for m in plan["moves"]]
    assert topology(project) == "v3"
    after = fcop_sees(project)
    for kind in ("tasks", "reports", "issues", "reviews", "undecodable"):
        assert before[kind] <= after[kind], (kind, before[kind] - after[kind])
    assert transition_problems(root) == []
    backup = Path(out["backup"])
    assert backup.is_relative_to(project / ".taskkernel") and snapshot(backup) == tree, "the old tree, byte for byte"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fcop = fcop_v3.Project(project)
        for m in out["moves"]:
            name = m["to"].rsplit("/", 1)[-1]
            if m["kind"] == "task" and parse_task_filename(name) and name not in after["undecodable"]:
                assert fcop.read_task(name).path == root / m["to"], "fcop finds it in its stage"

    again = run("up", "--once", cwd=project)
    assert again.code == 0, again.out
    assert kernel_view(project) == states, "no task created, moved or duplicated; no event appended"
    verify = run("verify", cwd=project)
    assert verify.code == 0, verify.out
    assert topology(project) == "v3"


@pytest.mark.parametrize("fixture", FIELD)
def test_a_field_workspace_is_migrated_only_after_the_kernel_read_it(tmp_path: Path, fixture: str) -> None:
    """Before the import an open task's stage could only be guessed (fcop's own migrator inboxes them all): refused,
    nothing changed; after it each task goes to the stage the import read from its files (review, active...)."""
    project = field_project(tmp_path, fixture, imported=False)
    before, tree = fcop_sees(project), project_state(project)
    r = migrate(project)
    assert (r.code, r.json["reason"]) == (2, "not_imported") and project_state(project) == tree
    assert run("fcop", "import", cwd=project).code == 0
    states, _ = kernel_view(project)
    r = migrate(project)
    assert r.code == 0, r.err
    assert topology(project) == "v3"
    tasks = {Path(m["from"]).name[:17]: m["stage"] for m in r.json["moves"] if m["kind"] == "task"}
    assert {t: stage for t, stage in tasks.items() if t in states} == states, "the stage the import read"
    assert all(before[k] <= v for k, v in fcop_sees(project).items())
    assert transition_problems(find_workspace_root(project)) == []


def test_fcop_never_sees_a_mixed_or_missing_root_while_migrate_runs(tmp_path: Path) -> None:
    """The root is G2 or G3 at every instant. fcop's detect_topology resolves fcop/ anew for each folder it looks
    at, so the one call during which the exchange happens may mix the two trees and say mixed or empty (a reader's
    own race, which no writer can prevent): calls during which fcop/ stayed the same folder must all say v2, then
    v3 (with a single exchange, the same folder before and after a call means it did not change during it)."""
    project = field_project(tmp_path, "fcop-d3e870a")
    root = project / "fcop"
    seen: list[tuple[str, bool]] = []  # (topology, fcop/ was the same folder before and after the call)
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            folder = os.stat(root).st_ino
            found = topology(project)
            seen.append((found, os.stat(root).st_ino == folder))

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        proc = subprocess.run([*CLI, "fcop", "migrate", "--to", "g3"], cwd=project, env=cli_env(),
                              capture_output=True, text=True, timeout=120)
    finally:
        stop.set()
        poller.join()
    assert proc.returncode == 0, proc.stderr
    steady = [found for found, same in seen if same]
    assert len(seen) - len(steady) <= 1, "the root is exchanged once"
    assert steady[0] == "v2" and steady[-1] == "v3" and set(steady) == {"v2", "v3"}, sorted(set(steady))
    assert "v2" not in steady[steady.index("v3"):], "one switch, from v2 to v3"


# -- a small workspace whose every case is known ----------------------------------------------------------

def envelope(path: Path, front: dict[str, Any], body: str = "Do it.") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"{k}: {json.dumps(v) if isinstance(v, list) else v}" for k, v in front.items()]
    path.write_text("---\nprotocol: fcop\nversion: 1\n" + "\n".join(lines) + f"\n---\n{body}\n", encoding="utf-8")


def small_g2(tmp_path: Path) -> Path:
    """tasks/: two open tasks and a README; log/: an archived task, its report, a report on a task nobody knows
    (refused, with its reason note) and a loose file; shared/ and reviews/ that must not change."""
    project = tmp_path / "proj"
    root = project / "fcop"
    task = {"sender": "ADMIN", "recipient": "PM", "priority": "P2", "subject": "Open work"}
    envelope(root / "tasks" / "TASK-20260501-001-ADMIN-to-PM.md", task)
    envelope(root / "tasks" / "TASK-20260501-002-ADMIN-to-PM.md", {**task, "subject": "Still waiting"})
    envelope(root / "log" / "tasks" / "TASK-20260430-001-ADMIN-to-PM.md", {**task, "subject": "Old work"})
    report = {"sender": "PM", "recipient": "ADMIN", "priority": "P2", "status": "done"}
    envelope(root / "log" / "reports" / "REPORT-20260430-001-PM-to-ADMIN.md",
             {**report, "references": ["TASK-20260430-001"]}, "Done.")
    envelope(root / "log" / "reports" / "REPORT-20260430-002-PM-to-ADMIN.md",
             {**report, "references": ["TASK-20250101-009"]}, "About nothing we know.")
    (root / "tasks" / "README.md").write_text("How we work.\n", encoding="utf-8")
    (root / "log" / "notes.txt").write_text("Loose notes.\n", encoding="utf-8")
    (root / "shared").mkdir()
    (root / "shared" / "TEAM.md").write_text("Team.\n", encoding="utf-8")
    (root / "reviews").mkdir()
    (root / "fcop.json").write_text(json.dumps({"mode": "preset", "team": "dev-team", "leader": "PM",
                                                "roles": ["PM", "DEV", "QA", "OPS"], "version": 1}))
    assert run("init", str(project), cwd=tmp_path).code == 0
    assert run("fcop", "import", cwd=project).code == 0
    return project


def submit(project: Path, kind: str, task_id: str, **payload: Any) -> None:
    doc = run("task", "show", task_id, cwd=project).json
    command = {"type": kind, "task_id": task_id, "thread_key": doc["thread_key"], "expected_revision": doc["revision"],
               "round": doc["round"], "idempotency_key": f"test:{kind}:{task_id}", "payload": payload}
    r = run("submit", cwd=project, stdin=json.dumps(command))
    assert r.code == 0, r.out


def records(project: Path) -> dict[str, tuple[str, str]]:
    with sqlite3.connect(project / ".taskkernel" / "kernel.db") as conn:
        return {rel: (sha, origin) for rel, sha, origin in conn.execute("SELECT rel, sha256, origin FROM folder_files")}


def test_each_task_goes_where_the_kernel_holds_it_and_every_record_follows_its_file(tmp_path: Path) -> None:
    project = small_g2(tmp_path)
    assert run("up", "--once", cwd=project).code == 0
    submit(project, "claim", "TASK-20260501-001")
    assert run("up", "--once", cwd=project).code == 0
    root = project / "fcop"
    note = "_reason.REPORT-20260430-002-PM-to-ADMIN.md.txt"
    assert (root / "log" / "reports" / note).is_file(), "the unknown task's report was refused with a note"
    tracked_before, states = records(project), kernel_view(project)
    assert states[0]["TASK-20260501-001"] == "active"

    r = migrate(project)
    assert r.code == 0, r.err
    where = {m["from"]: (m["to"], m.get("stage_from")) for m in r.json["moves"]}
    assert where == {
        "tasks/TASK-20260501-001-ADMIN-to-PM.md": ("_lifecycle/active/TASK-20260501-001-ADMIN-to-PM.md", "kernel"),
        "tasks/TASK-20260501-002-ADMIN-to-PM.md": ("_lifecycle/inbox/TASK-20260501-002-ADMIN-to-PM.md", "kernel"),
        "log/tasks/TASK-20260430-001-ADMIN-to-PM.md": ("_lifecycle/archive/TASK-20260430-001-ADMIN-to-PM.md",
                                                       "kernel"),
        "log/reports/REPORT-20260430-001-PM-to-ADMIN.md": ("reports/REPORT-20260430-001-PM-to-ADMIN.md", None),
        "log/reports/REPORT-20260430-002-PM-to-ADMIN.md": ("reports/REPORT-20260430-002-PM-to-ADMIN.md", None),
        f"log/reports/{note}": (f"reports/{note}", None),
        "tasks/README.md": ("shared/g2-legacy/tasks/README.md", None),
        "log/notes.txt": ("shared/g2-legacy/log/notes.txt", None),
    }
    assert topology(project) == "v3" and not (root / "tasks").exists() and not (root / "log").exists()
    assert (root / "shared" / "TEAM.md").read_text() == "Team.\n" and (root / "reviews").is_dir()
    tracked = records(project)
    assert len(tracked) == len(tracked_before) and not any(rel.startswith(("tasks/", "log/")) for rel in tracked)
    for old, (new, _) in where.items():
        if old in tracked_before:
            sha, origin = tracked[new]
            assert origin == tracked_before[old][1] and sha == hashlib.sha256((root / new).read_bytes()).hexdigest()
    assert transition_problems(root) == []
    assert run("up", "--once", cwd=project).code == 0
    assert kernel_view(project) == states and records(project) == tracked, "nothing taken in again"
    assert (root / "reports" / note).is_file(), "the note still describes its file"
    assert run("verify", cwd=project).code == 0

    submit(project, "submit_report", "TASK-20260501-001", status="done", body="Done.")  # the work goes on in G3
    submit(project, "submit", "TASK-20260501-001")
    assert run("up", "--once", cwd=project).code == 0
    moved = root / "_lifecycle" / "review" / "TASK-20260501-001-ADMIN-to-PM.md"
    assert [(e.from_stage, e.to_stage.value) for e in read_events(moved.read_text())][-2:] == [
        (None, "active"), (Stage.ACTIVE, "review")], "the baseline stands for the claim: nothing replayed before it"
    assert transition_problems(root) == [] and run("verify", cwd=project).code == 0


# -- refusals: the tree stays as it was -------------------------------------------------------------------------

@pytest.mark.parametrize("plant", ["shared/link.md", "log/reports/elsewhere", "tasks/dangling.md", "fcop.json", "."])
def test_a_symlink_anywhere_refuses_the_migration(tmp_path: Path, plant: str) -> None:
    project = small_g2(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.md").write_text("not yours\n")
    link = (project / "fcop" / plant)
    if plant == ".":  # the root itself
        shutil.move(project / "fcop", outside / "fcop")
        target = outside / "fcop"
    else:
        link.unlink(missing_ok=True)
        target = {"log/reports/elsewhere": outside, "tasks/dangling.md": tmp_path / "missing.md"}.get(
            plant, outside / "secret.md")
    link.symlink_to(target)
    before, beyond = project_state(project), snapshot(outside)
    for extra in (("--dry-run",), ()):
        r = migrate(project, *extra)
        assert (r.code, r.json["reason"]) == (2, "symlink_refused"), r.out
        assert project_state(project) == before and snapshot(outside) == beyond and not leftovers(project)


def test_refusals_leave_the_tree_as_it_was(tmp_path: Path) -> None:
    project = small_g2(tmp_path)
    root = project / "fcop"
    token = run("token", "issue", "DEV", cwd=project).out.strip()
    (root / "reports").mkdir()
    shutil.copy(root / "log" / "reports" / "REPORT-20260430-001-PM-to-ADMIN.md", root / "reports")
    (root / "reports" / "REPORT-20260430-001-PM-to-ADMIN.md").write_text("---\nother: bytes\n---\n")
    before = project_state(project)

    def refused(expect: tuple[int, str | None], *args: str) -> dict[str, Any]:
        r = run(*args, cwd=project)
        body = r.json
        assert (r.code, body.get("reason", body.get("code"))) == expect, r.out
        assert project_state(project) == before and not leftovers(project)
        return dict(body)

    refused((64, "usage"), "fcop", "migrate", "--to", "g5")
    assert run("fcop", "migrate", cwd=project).code == 64
    refused((2, "role_not_authorized"), "--token", token, "fcop", "migrate", "--to", "g3")
    clash = refused((2, "target_exists"), "fcop", "migrate", "--to", "g3")
    assert clash["conflicts"] == [{"to": "reports/REPORT-20260430-001-PM-to-ADMIN.md",
                                   "from": ["log/reports/REPORT-20260430-001-PM-to-ADMIN.md",
                                            "reports/REPORT-20260430-001-PM-to-ADMIN.md"]}]
    (root / "_lifecycle").mkdir()
    before = project_state(project)
    refused((2, "mixed_workspace"), "fcop", "migrate", "--to", "g3")
    shutil.rmtree(root / "tasks")
    shutil.rmtree(root / "log")
    before = project_state(project)
    refused((2, "already_g3"), "fcop", "migrate", "--to", "g3")
    (root / "fcop.json").write_text(json.dumps({"protocol_version": "4.0"}))
    before = project_state(project)
    refused((2, "unsupported_workspace_generation"), "fcop", "migrate", "--to", "g3")


# -- in one process: the two-rename fallback and a tree that changes underneath --------------------------------

def _plan(project: Path):  # type: ignore[no-untyped-def]
    from taskkernel.coordinator.cli.common import CliContext
    from taskkernel.coordinator.folders import migrate as migration

    db = CliContext(workspace_path=str(project)).database()
    return migration, db, migration.plan(project, project / ".taskkernel", migration.known_states(db),
                                         migration.tracked_origins(db))


def test_without_renameat2_two_renames_do_the_swap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project = small_g2(tmp_path)
    tree = snapshot(project / "fcop")
    migration, db, plan = _plan(project)
    monkeypatch.setattr(migration, "_renameat2_exchange", lambda *_: False)
    result = migration.apply(plan, db)
    assert result.swap == "rename" and topology(project) == "v3" and snapshot(result.backup) == tree
    assert not list(project.glob(".fcop.migrate-*"))


def test_a_commit_that_fails_after_the_swap_swaps_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project = small_g2(tmp_path)
    assert run("up", "--once", cwd=project).code == 0
    migration, db, plan = _plan(project)
    before, tracked = project_state(project), records(project)
    write = db.write

    @contextlib.contextmanager
    def write_then_fail_to_commit() -> Iterator[Any]:
        with write() as uow:
            yield uow
            assert topology(project) == "v3", "swapped inside the transaction"
            raise sa.exc.OperationalError("COMMIT", {}, Exception("disk I/O error"))

    monkeypatch.setattr(db, "write", write_then_fail_to_commit)
    with pytest.raises(sa.exc.OperationalError):
        migration.apply(plan, db)
    assert topology(project) == "v2" and project_state(project) == before and not leftovers(project)
    assert records(project) == tracked, "the records were rolled back with the swap"


def test_a_tree_that_changes_while_the_new_root_is_built_is_left_alone(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    project = small_g2(tmp_path)
    migration, db, plan = _plan(project)
    build = migration._build

    def build_then_write(p: Any, staged: Path) -> None:
        build(p, staged)
        (project / "fcop" / "tasks" / "TASK-20260501-003-ADMIN-to-PM.md").write_text("an agent was still at work\n")

    monkeypatch.setattr(migration, "_build", build_then_write)
    before = project_state(project)
    with pytest.raises(migration.MigrateRefused) as refused:
        migration.apply(plan, db)
    assert refused.value.reason == "content_changed"
    assert refused.value.extra["changed"] == ["tasks/TASK-20260501-003-ADMIN-to-PM.md"]
    after = project_state(project)
    assert after.pop("fcop/tasks/TASK-20260501-003-ADMIN-to-PM.md") and after == before and not leftovers(project)
    assert topology(project) == "v2"
