"""Real FCoP workspaces, with fcop 4.0.5 as the oracle: `init` + `up --once` import their history without losing
a task, a report or a byte, and everything written is what FCoP's own readers accept.

Each workspace is copied once per module (at the path real projects have it: `fcop/` or `docs/agents/`), then
`taskkernel init .`, three `up --once` passes and `verify` run on it through the real CLI."""

from __future__ import annotations

import fcntl
import json
import os
import pickle
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from tests.cli_support import Run, run
from tests.fcop_oracle import (
    WORKSPACES,
    Accepted,
    accepted,
    attached_ids,
    chain_problems,
    copy_workspace,
    fcop_root,
    named_outside_references,
    show_tasks,
    topology,
    tree,
)

ALL = sorted(WORKSPACES)
G2 = [name for name in ALL if name != "generated-v3"]
KERNEL_FILE = re.compile(r"(TASK|REPORT|REVIEW)-\d{8}-\d+-.+\.md")


@dataclass
class Imported:
    name: str
    project: Path
    root: Path  # the FCoP root (fcop/ or docs/agents/), as fcop finds it in the original copy
    accepted: list[Accepted]  # what fcop accepts in the original copy
    named_elsewhere: dict[str, tuple[str, str]]
    trees: list[dict[str, str]]  # original, after init, after each of three passes
    topologies: list[str]  # the same moments
    runs: list[Run]  # init, up, up, up, verify
    shows: dict[str, dict[str, Any] | None]

    def tasks(self) -> dict[str, Accepted]:
        """Per task id, the file that becomes the task: the first by file name."""
        out: dict[str, Accepted] = {}
        for a in sorted((a for a in self.accepted if a.kind == "TASK"), key=lambda a: PurePosixPath(a.rel).name):
            out.setdefault(a.id, a)
        return out


@pytest.fixture(scope="module")
def imported(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Imported:
    """Built once per run even under xdist: the first worker to need a workspace builds it, the others read it."""
    name, base = request.param, tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # pytest-N/, this run's only
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cache = shared / f"{name}.pickle"
        if not cache.exists():
            cache.write_bytes(pickle.dumps(_import(name, shared / name)))
        return pickle.loads(cache.read_bytes())  # written by this run, just above or by another worker


def _import(name: str, project: Path) -> Imported:
    copy_workspace(name, project)
    root = fcop_root(project)
    found = accepted(root)
    named = named_outside_references(root)
    trees, topologies, runs = [tree(project)], [topology(project)], []
    for args in (("init", "."), ("up", "--once"), ("up", "--once"), ("up", "--once")):
        runs.append(run(*args, cwd=project))
        trees.append(tree(project))
        topologies.append(topology(project))
    runs.append(run("verify", cwd=project))
    ids = sorted({a.task_id for a in found if a.task_id} | {t for _, t in named.values()})
    return Imported(name, project, root, found, named, trees, topologies, runs, show_tasks(project, ids))


def each(names: list[str]) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("imported", names, indirect=True)


@each(ALL)
def test_init_and_every_pass_succeed(imported: Imported) -> None:
    init, *passes, _ = imported.runs
    assert init.code == 0, init.out + init.err
    for i, up in enumerate(passes, 1):
        assert (up.code, up.json["status"]) == (0, "ok"), f"pass {i}: {up.out}{up.err[-2000:]}"


@each(ALL)
def test_fcop_topology_is_never_mixed_and_never_changes(imported: Imported) -> None:
    original = "v3" if imported.name == "generated-v3" else "v2"
    moments = ["original", "after init", "after pass 1", "after pass 2", "after pass 3"]
    assert dict(zip(moments, imported.topologies, strict=True)) == dict.fromkeys(moments, original)


@each(G2)
def test_a_g2_workspace_keeps_every_file_byte_for_byte(imported: Imported) -> None:
    original, *later = imported.trees
    prefix = imported.root.relative_to(imported.project).as_posix() + "/"

    def kernel_own(rel: str) -> bool:
        inner = PurePosixPath(rel[len(prefix):]) if rel.startswith(prefix) else None
        return inner is not None and "_lifecycle" not in inner.parts and (
            inner.parts[0] in ("ledger", ".locks") or re.fullmatch(r"_reason\..+\.txt", inner.name) is not None
            or KERNEL_FILE.fullmatch(inner.name) is not None
            or (inner.as_posix() == "fcop.json" and rel not in original))

    for moment, after in zip(["init", "pass 1", "pass 2", "pass 3"], later, strict=True):
        assert {rel for rel, digest in original.items() if after.get(rel) != digest} == set(), \
            f"after {moment}: files moved, removed or changed"
        assert sorted(rel for rel in set(after) - set(original) if not kernel_own(rel)) == [], \
            f"after {moment}: files that are not the kernel's own appeared"
    assert sorted(p.relative_to(imported.project).as_posix()
                  for p in imported.project.rglob("_lifecycle") if p.is_dir()) == []


@each(ALL)
def test_every_task_fcop_accepts_is_in_the_kernel_as_its_file_shows(imported: Imported) -> None:
    tasks = imported.tasks()
    missing = sorted(tid for tid in tasks if imported.shows.get(tid) is None)
    assert missing == [], "tasks fcop reads but `task show` does not know"
    wrong = {}
    for tid, a in tasks.items():
        doc = imported.shows[tid] or {}
        folder = a.folder
        states = {folder.split("/")[1]} if folder.startswith("_lifecycle/") else \
            {"archive"} if folder == "log/tasks" else {"inbox", "active", "review"}
        got = (doc["state"] in states, doc["sender"], doc["recipient"], doc["subject"] if a.subject else None,
               doc["parent"] if a.parent in tasks else None)
        want = (True, a.sender, a.recipient, a.subject, a.parent if a.parent in tasks else None)
        if got != want:
            wrong[tid] = {"file": a.rel, "state": doc["state"], "kernel": got, "file_says": want}
    assert wrong == {}


@each(ALL)
def test_every_report_fcop_accepts_is_attached_to_its_task(imported: Imported) -> None:
    lost = {a.rel: (a.id, a.task_id, sorted(listed)) for a in imported.accepted if a.kind == "REPORT"
            and a.id not in (listed := attached_ids(imported.shows.get(a.task_id or "")))}
    assert lost == {}, "report file -> (report id, its task, what `task show` lists for that task)"


@each(ALL)
def test_every_review_of_a_task_fcop_accepts_is_attached_to_it(imported: Imported) -> None:
    lost = {a.rel: (a.id, a.task_id) for a in imported.accepted
            if a.kind == "REVIEW" and a.task_id and a.id not in attached_ids(imported.shows.get(a.task_id))}
    assert lost == {}


@each(ALL)
def test_reports_naming_their_task_outside_references_are_attached(imported: Imported) -> None:
    known = imported.tasks()
    lost = {rel: (rid, tid) for rel, (rid, tid) in imported.named_elsewhere.items()
            if tid in known and rid not in attached_ids(imported.shows.get(tid))}
    assert lost == {}, "report file -> (report id, the task its ref_task/in_reply_to/task_id names)"


@each(ALL)
def test_every_transition_written_is_an_fcop_chain(imported: Imported) -> None:
    original, final = set(imported.trees[0].values()), imported.trees[-1]
    written = [rel for rel, digest in final.items()  # new bytes: a file only moved was not written
               if PurePosixPath(rel).name.startswith("TASK-") and rel.endswith(".md") and digest not in original]
    problems = {rel: p for rel in written if (p := chain_problems(imported.project / rel))}
    assert problems == {}


@each(ALL)
def test_three_passes_leave_the_tree_of_one(imported: Imported) -> None:
    first, third = imported.trees[2], imported.trees[4]
    changed = {rel: (first.get(rel, "absent"), third.get(rel, "absent"))
               for rel in set(first) | set(third) if first.get(rel) != third.get(rel)}
    assert changed == {}, "path -> (after pass 1, after pass 3)"


@each(ALL)
def test_verify_exits_0_after_the_import(imported: Imported) -> None:
    verify = imported.runs[-1]
    assert (verify.code, verify.json["status"]) == (0, "ok"), verify.json.get("problems")


@each(["r2-dup-id"])
def test_init_without_fcop_json_writes_a_team_of_the_roles_the_files_use(imported: Imported) -> None:
    fcop_json = imported.root / "fcop.json"  # takes precedence; else the team init wrote to taskkernel.toml
    team = json.loads(fcop_json.read_text(encoding="utf-8")) if fcop_json.is_file() else \
        tomllib.loads((imported.project / "taskkernel.toml").read_text(encoding="utf-8")).get("team", {})
    assert {"PM", "DEV"} <= set(team["roles"]) <= {"ADMIN", "PM", "DEV"}, team


# -- what the kernel writes itself --------------------------------------------------------------------------

def _kernel_reports(project: Path) -> int:
    listed = run("task", "list", cwd=project)
    assert listed.code == 0, listed.err
    return sum(len(doc["reports"]) for doc in show_tasks(project, [t["task_id"] for t in listed.json]).values()
               if doc)


def test_the_demo_writes_fcop_chains_and_a_report_file_per_report(tmp_path: Path) -> None:
    demo = tmp_path / "demo"
    r = run("demo", "--dir", str(demo), cwd=tmp_path)
    assert r.code == 0, r.err
    root = demo / "fcop"
    problems = {p.relative_to(root).as_posix(): pr for p in root.rglob("TASK-*.md") if (pr := chain_problems(p))}
    assert problems == {}
    files = sorted(p.name for p in root.rglob("REPORT-*.md"))
    assert len(files) == _kernel_reports(demo), files
    assert len([a for a in accepted(root) if a.kind == "REPORT"]) == len(files), "fcop refuses a REPORT we wrote"


def test_cli_reports_and_decisions_become_report_and_review_files(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    assert run("init", str(ws), cwd=tmp_path).code == 0
    assert run("up", "--once", cwd=ws).code == 0
    created = run("submit", cwd=ws, stdin=json.dumps({"type": "create_task", "idempotency_key": "c1", "payload": {
        "sender": "ADMIN", "recipient": "PM", "subject": "Ship it", "body": "Do it."}})).json
    tid, revision, round_ = created["task_id"], created["revision"], created["round"]
    for kind, payload in (("claim", {}), ("submit_report", {"status": "done", "body": "Did it."}), ("submit", {}),
                          ("approve", {})):
        r = run("submit", cwd=ws, stdin=json.dumps({
            "type": kind, "task_id": tid, "thread_key": tid, "expected_revision": revision, "round": round_,
            "idempotency_key": f"k-{kind}", "payload": payload}))
        assert r.json["status"] == "accepted", r.out
        revision, round_ = r.json["revision"], r.json["round"]
    assert run("up", "--once", cwd=ws).code == 0
    root = ws / "fcop"
    found = accepted(root)
    assert [(a.kind, a.task_id) for a in found if a.kind != "TASK"] == [("REPORT", tid), ("REVIEW", tid)]
    assert [(a.rel, chain_problems(root / a.rel)) for a in found if a.kind == "TASK"] == [
        (f"_lifecycle/done/{tid}-ADMIN-to-PM.md", [])]
    assert _kernel_reports(ws) == 1


def test_a_payload_fcop_could_not_read_back_is_refused_at_submit(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    assert run("init", str(ws), cwd=tmp_path).code == 0
    r = run("submit", cwd=ws, stdin=json.dumps({"type": "create_task", "idempotency_key": "big", "payload": {
        "sender": "ADMIN", "recipient": "PM", "subject": "Big", "body": "x" * (2 << 20)}}))
    assert (r.code, r.json["status"], r.json["reason"]) == (2, "rejected", "payload_too_large")


# -- import and migrate as their own operations ---------------------------------------------------------------

def _r1(tmp_path: Path) -> Path:
    project = tmp_path / "r1"
    copy_workspace("r1-g2-archive", project)
    assert run("init", ".", cwd=project).code == 0
    return project


def _r1_history_is_in(project: Path) -> None:
    shows = show_tasks(project, ["TASK-20260501-001", "TASK-20260501-002"])
    assert [(d or {}).get("state") for d in shows.values()] == ["archive", "archive"]
    assert shows["TASK-20260501-002"]["parent"] == "TASK-20260501-001"  # type: ignore[index]
    assert "REPORT-20260501-001" in attached_ids(shows["TASK-20260501-001"])


def test_fcop_import_dry_run_writes_nothing_then_import_takes_the_history(tmp_path: Path) -> None:
    project = _r1(tmp_path)
    before = tree(project)
    dry = run("fcop", "import", "--dry-run", cwd=project)
    assert dry.code == 0, dry.out + dry.err
    assert tree(project) == before
    assert run("task", "list", cwd=project).json == []
    real = run("fcop", "import", cwd=project)
    assert real.code == 0, real.out + real.err
    _r1_history_is_in(project)
    after = tree(project)
    assert {rel: d for rel, d in before.items() if after.get(rel) != d} == {}


def test_fcop_migrate_to_g3_converts_the_whole_workspace(tmp_path: Path) -> None:
    project = _r1(tmp_path)
    assert run("up", "--once", cwd=project).code == 0
    root = project / "fcop"
    before, ids_before = tree(project), {(a.kind, a.id) for a in accepted(root)}
    dry = run("fcop", "migrate", "--to", "g3", "--dry-run", cwd=project)
    assert dry.code == 0, dry.out + dry.err
    assert (tree(project), topology(project)) == (before, "v2")
    migrated = run("fcop", "migrate", "--to", "g3", cwd=project)
    assert migrated.code == 0, migrated.out + migrated.err
    assert topology(project) == "v3"
    after = accepted(root)
    assert ids_before <= {(a.kind, a.id) for a in after}, "a task or report fcop read before is gone"
    assert {a.id: (a.folder, chain_problems(root / a.rel)) for a in after if a.kind == "TASK"} == {
        "TASK-20260501-001": ("_lifecycle/archive", []), "TASK-20260501-002": ("_lifecycle/archive", [])}
    assert run("verify", cwd=project).code == 0
    assert run("up", "--once", cwd=project).json["status"] == "ok"
    assert topology(project) == "v3"
    _r1_history_is_in(project)
