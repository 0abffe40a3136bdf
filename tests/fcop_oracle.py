"""fcop 4.0.5 as the oracle for real FCoP workspaces: which files its strict loaders accept, its topology and
its transition table; plus the fixture copies, tree hashes and batched `task show` the acceptance tests use."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fcop.compatibility.v3 import project as fcop_v3
from fcop.core.filename import parse_report_filename, parse_review_filename, parse_task_filename
from fcop.core.frontmatter import parse_frontmatter_raw
from fcop.lifecycle.detect import detect_topology, find_workspace_root
from fcop.lifecycle.events import read_events
from fcop.lifecycle.transitions import IllegalTransitionError, validate_transition

from tests.cli_support import cli_env


def _fixtures() -> Path:
    """``<repo>/../shared/fixtures`` (CI clones the repo beside a copy of shared/), else $TASKKERNEL_FIXTURES."""
    beside = Path(__file__).resolve().parent.parent.parent / "shared" / "fixtures"
    if beside.is_dir():
        return beside
    return Path(os.environ.get("TASKKERNEL_FIXTURES", "/work/shared/fixtures"))


FIXTURES = _fixtures()
# name -> (fixture folder, where it goes in the project): each keeps the path real projects have it at
WORKSPACES: dict[str, tuple[tuple[str, str], ...]] = {
    "fcop-d3e870a": (("fcop-field/fcop-d3e870a", "."),),
    "docs-agents-0411ffc": (("fcop-field/docs-agents-0411ffc", "."),),
    "docs-agents-353783a": (("fcop-field/docs-agents-353783a", "."),),
    "r1-g2-archive": (("fcop-field/repro/r1-g2-archive", "."),),
    "r2-dup-id": (("fcop-field/repro/r2-dup-id", "."),),
    "tetris-en-v1": (("fcop/tetris-en-v1/tasks", "docs/agents/tasks"),
                     ("fcop/tetris-en-v1/reports", "docs/agents/reports")),
    "generated-v3": (("fcop/generated-v3", "fcop"),),
}
STAGES = ("inbox", "active", "review", "done", "archive")
FOLDERS = {"TASK": ("tasks", "log/tasks", *(f"_lifecycle/{s}" for s in STAGES)),
           "REPORT": ("reports", "log/reports"), "REVIEW": ("reviews", "log/reviews")}
# documented extension edges (docs): taskkernel's own lifecycle events beyond fcop's table, and fcop's migration
EXTENSION_TOOLS = frozenset({"force_archive_task", "reopen_task", "amend_task", "fcop_migrate_v3"})
TASK_ID = re.compile(r"TASK-\d{8}-\d{3,}")


def copy_workspace(name: str, project: Path) -> None:
    """The fixture's files, writable (the shared copies are read-only), at their real paths below ``project``."""
    for src, dst in WORKSPACES[name]:
        shutil.copytree(FIXTURES / src, project / dst, dirs_exist_ok=True)
    for path in [project, *project.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)


def task_id_in(text: str | None) -> str | None:
    """``TASK-YYYYMMDD-NNN`` out of an id, a file name or a path (``docs/agents/log/tasks/TASK-…-A-to-B.md``)."""
    m = TASK_ID.search(text or "")
    return m.group(0) if m else None


def tree(project: Path) -> dict[str, str]:
    """Relative path -> sha256 of every regular file, without the kernel's private state."""
    out = {}
    for path in project.rglob("*"):
        rel = path.relative_to(project).as_posix()
        if path.is_file() and not path.is_symlink() and rel != "taskkernel.toml" and not rel.startswith(
                ".taskkernel/"):
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def snapshot(root: Path) -> dict[str, str]:
    """Every entry under ``root`` byte for byte: a file's sha256, ``dir`` for a folder, ``link:<target>``."""
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder, name)
            rel = path.relative_to(root).as_posix()
            out[rel] = (f"link:{os.readlink(path)}" if path.is_symlink() else "dir" if path.is_dir()
                        else hashlib.sha256(path.read_bytes()).hexdigest())
    return out


def topology(project: Path) -> str:
    return detect_topology(project).topology.value


def fcop_root(project: Path) -> Path:
    return find_workspace_root(project)


@dataclass(frozen=True)
class Accepted:
    """A file fcop's strict loader accepts. ``task_id``: the task it is (TASK), answers (REPORT) or reviews."""

    kind: str
    rel: str  # relative to the FCoP root
    id: str  # TASK-/REPORT- id, or the REVIEW's stem
    task_id: str | None
    sender: str = ""
    recipient: str = ""
    subject: str | None = None
    parent: str | None = None

    @property
    def folder(self) -> str:
        return self.rel.rsplit("/", 1)[0]


def accepted(root: Path) -> list[Accepted]:
    """Every TASK, REPORT and REVIEW fcop accepts, file by file (``Project.list_*`` stops at a GBK file)."""
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for kind, folders in FOLDERS.items():
            for folder in folders:
                if (root / folder).is_dir():
                    out += [a for p in sorted((root / folder).iterdir()) if (a := _load(kind, root, p)) is not None]
    return out


def _load(kind: str, root: Path, path: Path) -> Accepted | None:
    rel, archived = path.relative_to(root).as_posix(), path.parent.parent.name == "log"
    try:
        if kind == "TASK" and path.is_file() and parse_task_filename(path.name):
            t = fcop_v3._load_task_strict(path, is_archived=archived)
            return Accepted(kind, rel, t.task_id, t.task_id, t.sender, t.recipient, t.frontmatter.subject,
                            task_id_in(t.frontmatter.parent))
        if kind == "REPORT" and path.is_file() and (name := parse_report_filename(path.name)):
            r = fcop_v3._load_report_strict(path, is_archived=archived)
            return Accepted(kind, rel, f"REPORT-{name.date}-{name.sequence:03d}", task_id_in(r.task_id), r.reporter,
                            r.recipient)
        if kind == "REVIEW" and path.is_file() and parse_review_filename(path.name):
            v = fcop_v3._load_review_strict(path, is_archived=archived)
            return Accepted(kind, rel, v.review_id, task_id_in(v.subject_ref), v.reviewer_role)
    except Exception:  # noqa: BLE001 - whatever fcop raises, it does not accept the file
        return None
    return None


def named_outside_references(root: Path) -> dict[str, tuple[str, str]]:
    """REPORTs fcop refuses for lacking ``references:`` that name their task by ref_task/in_reply_to/task_id:
    rel -> (REPORT id, task id)."""
    out = {}
    for folder in FOLDERS["REPORT"]:
        for path in sorted((root / folder).glob("REPORT-*.md")):
            name = parse_report_filename(path.name)
            try:
                fm = parse_frontmatter_raw(path.read_text(encoding="utf-8"))
            except Exception:  # noqa: BLE001 - not UTF-8 or no front matter: not a report anyone reads
                continue
            named = [task_id_in(v) for k in ("ref_task", "in_reply_to", "task_id") if isinstance(v := fm.get(k), str)]
            if name and not fm.get("references") and any(named):
                rel = path.relative_to(root).as_posix()
                out[rel] = (f"REPORT-{name.date}-{name.sequence:03d}", next(t for t in named if t))
    return out


def chain_problems(path: Path) -> list[str]:
    """Why a TASK file's ``transitions:`` is not an fcop chain: an edge outside fcop's table (extension tools
    aside), an event not starting where the previous one ended, or a last stage other than the file's folder."""
    try:
        events = read_events(path.read_text(encoding="utf-8"))
    except Exception as exc:  # noqa: BLE001 - unreadable events are a problem in themselves
        return [f"unreadable: {type(exc).__name__}: {exc}"]
    problems = []
    for i, e in enumerate(events):
        if e.tool not in EXTENSION_TOOLS:
            try:
                validate_transition(e.from_stage, e.to_stage, tool=e.tool)
            except IllegalTransitionError as exc:
                problems.append(str(exc))
        if i and e.from_stage != events[i - 1].to_stage:
            problems.append(f"event {i} starts at {e.from_stage} but the one before ended at {events[i - 1].to_stage}")
    if events and path.parent.parent.name == "_lifecycle" and events[-1].to_stage.value != path.parent.name:
        problems.append(f"last event ends at {events[-1].to_stage.value}, the file is in {path.parent.name}/")
    return problems


_SHOW = """
import contextlib, io, json, sys
from taskkernel.coordinator.cli.app import main
out = {}
for task_id in sys.argv[1:]:
    buf, code = io.StringIO(), 0
    with contextlib.redirect_stdout(buf):
        try:
            main(["task", "show", task_id])
        except SystemExit as exc:
            code = exc.code
    out[task_id] = json.loads(buf.getvalue().splitlines()[-1]) if code == 0 else None
print(json.dumps(out))
"""


def show_tasks(project: Path, task_ids: list[str]) -> dict[str, dict[str, Any] | None]:
    """`taskkernel task show ID` for many ids in one process (the real CLI entry point, called once per id)."""
    proc = subprocess.run([sys.executable, "-c", _SHOW, *task_ids], cwd=project, env=cli_env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def attached_ids(doc: dict[str, Any] | None) -> set[str]:
    """Ids of the files a task document lists: its reports and its imported records."""
    doc = doc or {}
    return {r["report_id"] for r in doc.get("reports", [])} | {r["record_id"] for r in doc.get("records", [])}


def reason_notes(root: Path) -> dict[str, str]:
    """Every ``_reason.<name>.txt`` note below the root: rel -> text."""
    return {p.relative_to(root).as_posix(): p.read_text(encoding="utf-8") for p in root.rglob("_reason.*.txt")}
