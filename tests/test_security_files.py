"""Issue 9, item 4: no symlink anywhere. Every test plants links the way a hostile agent would, at a write
site under `fcop/` or `workspace/`, pointing at a victim outside the workspace; then runs the real operation
and checks that the victim's bytes and listing are unchanged and that the refusal was reported."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from taskkernel.coordinator.fcop import FcopError, FcopReason, Scanner, open_workspace, safeio, write_report
from taskkernel.coordinator.fcop.safeio import (
    confine,
    ensure_dir,
    list_dir,
    locked,
    move_no_overwrite,
    open_tmp,
    read_bytes,
    rewrite,
    sha256_hex,
    write_new,
)
from tests.cli_support import taskkernel
from tests.coord_support import make_workspace
from tests.test_folders import task_file

SECRET = b"precious\n"


def victim(where: Path) -> Path:
    """A folder outside the workspace with a file and a subfolder the attacker wants changed."""
    (where / "sub").mkdir(parents=True)
    (where / "secret.txt").write_bytes(SECRET)
    (where / "sub" / "keep.md").write_bytes(b"keep\n")
    return where


def snapshot(root: Path) -> dict[str, str]:
    """Every entry below ``root`` with its SHA-256 (files), ``dir`` or its link target; links never followed."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                out[rel] = f"link:{os.readlink(path)}"
            else:
                out[rel] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def refused(err: str) -> list[dict[str, Any]]:
    """The `fcop.refused` warnings a process logged (JSON lines on stderr)."""
    found = []
    for line in err.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if record.get("event") == "fcop.refused":
                found.append(record)
    return found


def expect_refusal(reason: FcopReason, action: Callable[[], object]) -> FcopError:
    with pytest.raises(FcopError) as exc:
        action()
    assert exc.value.reason is reason, exc.value
    return exc.value


# -- the safe layer itself ------------------------------------------------------------------------

def test_a_symlinked_folder_anywhere_below_the_root_is_refused(tmp_path: Path) -> None:
    outside = victim(tmp_path / "outside")
    before = snapshot(outside)
    ws = open_workspace(tmp_path / "p", create=True)
    (ws.root / "evil").symlink_to(outside)
    (ws.root / "_lifecycle" / "deep").symlink_to(outside / "sub")
    (ws.root / "dangling").symlink_to(outside / "made-by-us")
    (ws.root / "inbox.md").write_bytes(b"mine\n")
    os.rmdir(ws.root / "reports")
    (ws.root / "reports").symlink_to(outside)
    evil, deep = ws.root / "evil", ws.root / "_lifecycle" / "deep"
    attempts: list[Callable[[], object]] = [
        lambda: write_new(evil / "new.md", b"x"),
        lambda: write_new(deep / "new.md", b"x"),
        lambda: write_new(ws.root / "dangling" / "new.md", b"x"),        # must not make the link's target
        lambda: ensure_dir(ws.root / "dangling" / "a" / "b"),
        lambda: rewrite(evil / "secret.txt", b"x", expect_sha256=None),
        lambda: rewrite(evil / "secret.txt", b"x", expect_sha256=sha256_hex(SECRET)),
        lambda: move_no_overwrite(ws.root / "inbox.md", evil / "inbox.md"),
        lambda: move_no_overwrite(evil / "secret.txt", ws.root / "stolen.txt"),
        lambda: open_tmp(deep / "reserved.md"),
        lambda: read_bytes(evil / "secret.txt", 100),
        lambda: list_dir(evil),
        lambda: locked(evil / "x.lock").__enter__(),
        lambda: write_report(ws, sender="DEV", recipient="PM", task_id="TASK-20260101-001", body="b"),
    ]
    for attempt in attempts:
        err = expect_refusal(FcopReason.SYMLINK_REFUSED, attempt)
        assert err.path in (evil, deep, ws.root / "dangling", ws.root / "reports"), err.path  # the link is named
    assert snapshot(outside) == before
    assert (ws.root / "inbox.md").read_bytes() == b"mine\n" and not (ws.root / "stolen.txt").exists()


def test_the_target_file_itself_may_not_be_a_link(tmp_path: Path) -> None:
    outside = victim(tmp_path / "outside")
    before = snapshot(outside)
    ws = open_workspace(tmp_path / "p", create=True)
    link = ws.stage_dir("inbox") / "TASK-20260101-001-PM-to-DEV.md"
    link.symlink_to(outside / "secret.txt")
    expect_refusal(FcopReason.SYMLINK_REFUSED, lambda: rewrite(link, b"x", expect_sha256=None))
    expect_refusal(FcopReason.TARGET_EXISTS, lambda: write_new(link, b"x"))
    expect_refusal(FcopReason.SYMLINK_REFUSED, lambda: read_bytes(link, 100))
    lock = ws.lock_dir / "TASK-20260101-001.lock"
    ensure_dir(ws.lock_dir)
    lock.symlink_to(outside / "not-yet.lock")                          # dangling: O_CREAT would make it
    expect_refusal(FcopReason.SYMLINK_REFUSED, lambda: locked(lock).__enter__())
    assert snapshot(outside) == before and link.is_symlink()


def test_workspace_folder_and_its_subfolders_are_checked(tmp_path: Path) -> None:
    outside = victim(tmp_path / "outside")
    before = snapshot(outside)
    project = tmp_path / "project"
    project.mkdir()
    confine(project)
    (project / "workspace").symlink_to(outside)
    expect_refusal(FcopReason.SYMLINK_REFUSED,
                   lambda: rewrite(project / "workspace" / "secret.txt", b"x", expect_sha256=None))
    (project / "workspace").unlink()
    (project / "workspace").mkdir()
    (project / "workspace" / "a").symlink_to(outside / "sub")
    expect_refusal(FcopReason.SYMLINK_REFUSED,
                   lambda: rewrite(project / "workspace" / "a" / "keep.md", b"x", expect_sha256=None))
    assert snapshot(outside) == before


def test_a_planted_temp_name_is_never_opened_and_temp_names_are_exclusive(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    outside = victim(tmp_path / "outside")
    before = snapshot(outside)
    ws = open_workspace(tmp_path / "p", create=True)
    target = ws.root / "notes.txt"
    (ws.root / ".notes.txt.tmp").symlink_to(outside / "secret.txt")   # the old fixed temp name
    rewrite(target, b"one\n", expect_sha256=None)
    # An attacker who guesses the next random name gets O_EXCL's refusal: the layer draws another name.
    names = iter(["0" * 16, "0" * 16, "1" * 16])
    monkeypatch.setattr(safeio.secrets, "token_hex", lambda _n: next(names))
    (ws.root / f".notes.txt.{'0' * 16}.tmp").symlink_to(outside / "secret.txt")
    rewrite(target, b"two\n", expect_sha256=sha256_hex(b"one\n"))
    assert target.read_bytes() == b"two\n" and snapshot(outside) == before
    assert sorted(p.name for p in ws.root.iterdir() if p.name.startswith(".notes")) == [
        ".notes.txt.0000000000000000.tmp", ".notes.txt.tmp"]               # the planted links, untouched
    monkeypatch.setattr(safeio.secrets, "token_hex", lambda _n: "0" * 16)
    expect_refusal(FcopReason.IO_ERROR, lambda: write_new(ws.root / "notes.txt", b"three\n"))
    assert target.read_bytes() == b"two\n" and snapshot(outside) == before


def test_a_folder_swapped_for_a_link_after_mkdir_is_caught_on_reopen(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    outside = victim(tmp_path / "outside")
    before = snapshot(outside)
    ws = open_workspace(tmp_path / "p", create=True)
    real_mkdir = os.mkdir

    def racing_mkdir(name: str, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        real_mkdir(name, mode, dir_fd=dir_fd)
        os.rmdir(name, dir_fd=dir_fd)                                  # the attacker wins the race
        os.symlink(str(outside), name, dir_fd=dir_fd)

    monkeypatch.setattr(os, "mkdir", racing_mkdir)
    expect_refusal(FcopReason.SYMLINK_REFUSED, lambda: write_new(ws.root / "ledger" / "views" / "PM.todo.md", b"x"))
    assert snapshot(outside) == before


def test_a_linked_fcop_root_is_refused(tmp_path: Path) -> None:
    outside = victim(tmp_path / "outside")
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "fcop").symlink_to(outside)
    expect_refusal(FcopReason.SYMLINK_REFUSED, lambda: open_workspace(tmp_path / "p", create=True))


def test_scans_never_follow_a_linked_folder_and_report_it_once(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    outside = victim(tmp_path / "outside")
    (outside / "TASK-20260101-001-ADMIN-to-PM.md").write_bytes(b"---\nprotocol: fcop\n---\nbait\n")
    ws = open_workspace(tmp_path / "p", create=True)
    os.rmdir(ws.stage_dir("active"))
    ws.stage_dir("active").symlink_to(outside)
    (ws.stage_dir("inbox") / "nested").symlink_to(outside)
    reports: list[tuple[str, str | None]] = []
    monkeypatch.setattr("taskkernel.coordinator.fcop.scan.report",
                        lambda exc, op: reports.append((exc.reason.value, exc.path)))
    scanner = Scanner(ws, settle_s=0, grace_s=0)
    for _ in range(3):
        batch = scanner.scan()
        assert not batch.ready and not batch.invalid and not batch.pending
    assert sorted(reports) == sorted([("symlink_refused", ws.stage_dir("active")),
                                      ("symlink_refused", ws.stage_dir("inbox") / "nested")])


# -- through the real CLI, in separate processes ---------------------------------------------------

AGENT = """
    import json, os, subprocess, sys
    def run(*args, stdin=None):
        return subprocess.run([{python!r}, "-m", "taskkernel", *args], input=stdin,
                              capture_output=True, text=True)
    task = json.loads(run("task", "show", os.environ["TASKKERNEL_TASK_ID"]).stdout)
    revision = task["revision"]
    for n, plan in enumerate(json.load(open({plans!r}))):
        cmd = {{"type": "perform", "task_id": task["task_id"], "thread_key": task["thread_key"],
               "expected_revision": revision, "round": task["round"], "idempotency_key": f"plant-{{n}}",
               "payload": plan}}
        result = json.loads(run("submit", stdin=json.dumps(cmd)).stdout.strip().splitlines()[-1])
        print(json.dumps(result))
        if result["status"] == "rejected":
            sys.exit(5)
        revision = result["revision"]
"""


def write_plan(path: str) -> dict[str, Any]:
    """A plan the gate passes: one basis and one grant cover the entity `file:notes`, whatever the path."""
    return {"operation": "write", "entity": "file:notes", "tool": "write_file",
            "args": {"path": path, "content": "pwned\n"}, "based_on_event": "m1", "permission_event": "g1"}


def test_authorized_write_file_never_writes_through_a_planted_link(tmp_path: Path) -> None:
    outside = victim(tmp_path / "outside")
    before = snapshot(outside)
    plans, agent = tmp_path / "plans.json", tmp_path / "agent.py"
    plans.write_text(json.dumps([write_plan(p) for p in ("notes.txt", "linked.txt", "sub/deep.txt")]))
    agent.write_text(textwrap.dedent(AGENT.format(python=sys.executable, plans=str(plans))))
    ws = make_workspace(tmp_path / "ws", {"DEV": {"runner": "command", "argv": [sys.executable, str(agent)],
                                                 "max_attempts": 1}})
    work = ws.root / "workspace"
    (work / ".notes.txt.tmp").symlink_to(outside / "secret.txt")   # the temp name the old writer reused
    (work / "linked.txt").symlink_to(outside / "secret.txt")       # the target itself
    (work / "sub").symlink_to(outside / "sub")                     # a parent folder inside workspace/
    for input_id, kind, payload in (("m1", "message", {"entity": "file:notes", "text": "Write the notes"}),
                                    ("g1", "allow", {"permission": "write", "scope": "file:*", "principal": "DEV"})):
        r = taskkernel("session", "accept", "admin", "--kind", kind, "--input-id", input_id,
                       "--payload", json.dumps(payload), cwd=ws.root)
        assert r.returncode == 0, r.stderr
    task_file(ws.root, "TASK-20261130-001-ADMIN-to-DEV.md", recipient="DEV", subject="Write the notes")
    up = taskkernel("up", str(ws.root), "--once", cwd=tmp_path)
    assert "Traceback" not in up.stderr, up.stderr
    assert snapshot(outside) == before
    assert (work / "notes.txt").read_bytes() == b"pwned\n", "the authorized write itself still happens"
    assert (work / ".notes.txt.tmp").is_symlink() and (work / "linked.txt").is_symlink()
    reported = {(r["op"], r["reason"], r["path"]) for r in refused(up.stderr)}
    assert ("write_file", "symlink_refused", str(work / "linked.txt")) in reported, up.stderr
    assert ("write_file", "symlink_refused", str(work / "sub")) in reported, up.stderr


def imported(ws_root: Path, cwd: Path) -> None:
    """The first pass imports the workspace as history; what is planted after it is live input."""
    assert taskkernel("up", str(ws_root), "--once", cwd=cwd).returncode == 0


def plant_folder(ws_root: Path, rel: str, target: Path) -> Path:
    link = ws_root / "fcop" / rel
    if link.is_dir():
        shutil.rmtree(link)
    link.symlink_to(target)
    return link


def test_up_refuses_linked_quarantine_stage_views_and_reports_and_keeps_working(tmp_path: Path) -> None:
    victims = {rel: victim(tmp_path / "outside" / rel.replace("/", "_"))
               for rel in ("_quarantine", "_lifecycle/active", "ledger/views", "reports")}
    (victims["_lifecycle/active"] / "TASK-20261130-003-ADMIN-to-OPS.md").write_text(  # bait: adopt and move me
        "---\nprotocol: fcop\nversion: 1\nsender: ADMIN\nrecipient: OPS\nsubject: bait\n---\nbait\n")
    (victims["reports"] / "REPORT-20261130-001-OPS-to-ADMIN.md").write_bytes(b"not front matter\n")
    before = {rel: snapshot(v) for rel, v in victims.items()}
    ws = make_workspace(tmp_path / "ws", {"OPS": {"runner": "command", "max_attempts": 1,   # the task stays active
                                                  "argv": [sys.executable, "-c", "raise SystemExit(3)"]}})
    imported(ws.root, tmp_path)
    links = {rel: plant_folder(ws.root, rel, v) for rel, v in victims.items()}
    bad = task_file(ws.root, "TASK-20261130-002-ADMIN-to-OPS.md")
    bad.write_bytes(b"---\nprotocol: [unclosed\n---\n")              # malformed: ingest wants to quarantine it
    task_file(ws.root, "TASK-20261130-001-ADMIN-to-OPS.md", recipient="OPS", subject="Restart it")
    up = taskkernel("up", str(ws.root), "--once", cwd=tmp_path)
    assert "Traceback" not in up.stderr, up.stderr
    assert {rel: snapshot(v) for rel, v in victims.items()} == before
    assert bad.read_bytes() == b"---\nprotocol: [unclosed\n---\n", "the malformed file stays where it was"
    assert (ws.root / "fcop" / "_lifecycle" / "inbox" / "TASK-20261130-001-ADMIN-to-OPS.md").is_file()
    ledger = (ws.root / "fcop" / "ledger" / "tasks.jsonl").read_text()
    assert '"state": "active"' in ledger, "the coordinator kept working: the ledger shows the claim"
    reported = {(r["op"], r["reason"], r["path"]) for r in refused(up.stderr)}
    for op, rel in (("scan", "_lifecycle/active"), ("scan", "reports"), ("quarantine", "_quarantine"),
                    ("project", "_lifecycle/active"), ("ledger", "ledger/views")):
        assert (op, "symlink_refused", str(links[rel])) in reported, (op, rel, up.stderr)
    status = json.loads(up.stdout.strip().splitlines()[-1])  # refused writes are not an ok run
    assert (up.returncode, status["status"]) == (1, "degraded"), up.stdout
    assert {(f["stage"], f["error"]) for f in status["failed_stages"]} >= {
        ("quarantine_refused", "symlink_refused"), ("project_refused", "symlink_refused"),
        ("ledger_refused", "symlink_refused")}
    again = taskkernel("up", str(ws.root), "--once", cwd=tmp_path)  # refused writes are retried, not forgotten
    assert ("ledger_refused", "symlink_refused") in {
        (f["stage"], f["error"]) for f in json.loads(again.stdout.strip().splitlines()[-1])["failed_stages"]}
    assert {rel: snapshot(v) for rel, v in victims.items()} == before


def test_up_refuses_linked_locks_and_ledger(tmp_path: Path) -> None:
    victims = {rel: victim(tmp_path / "outside" / rel.strip(".")) for rel in (".locks", "ledger")}
    before = {rel: snapshot(v) for rel, v in victims.items()}
    ws = make_workspace(tmp_path / "ws", {"OPS": {"runner": "scripted"}})
    imported(ws.root, tmp_path)
    links = {rel: plant_folder(ws.root, rel, v) for rel, v in victims.items()}
    task_file(ws.root, "TASK-20261130-001-ADMIN-to-OPS.md", recipient="OPS", subject="Restart it")
    up = taskkernel("up", str(ws.root), "--once", cwd=tmp_path)
    assert "Traceback" not in up.stderr, up.stderr
    assert "run_started_before_projection" not in up.stderr  # a refused projection never holds a run back
    assert {rel: snapshot(v) for rel, v in victims.items()} == before
    reported = {(r["op"], r["reason"], r["path"]) for r in refused(up.stderr)}
    assert ("project", "symlink_refused", str(links[".locks"])) in reported, up.stderr
    # the ledger is written under .locks/ledger.lock (coordinators sharing the folder write it in turn): refused there
    assert ("ledger", "symlink_refused", str(links[".locks"])) in reported, up.stderr
    links[".locks"].unlink()
    again = taskkernel("up", str(ws.root), "--once", cwd=tmp_path)  # with the locks its own, at the linked ledger/
    assert ("ledger", "symlink_refused", str(links["ledger"])) in {
        (r["op"], r["reason"], r["path"]) for r in refused(again.stderr)}, again.stderr
    assert {rel: snapshot(v) for rel, v in victims.items()} == before
