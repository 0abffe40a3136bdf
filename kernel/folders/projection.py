"""Projection: after every accepted task event, the TASK file sits in the stage the kernel says.

Move first, then append to `transitions:` (so front matter never claims a stage the path does not
have), each under the task's lock, never overwriting another file. Tasks created through the CLI
get a TASK file written in the canonical G3 form. The ledger (`ledger/tasks.jsonl`) and the
per-role views (`ledger/views/<ROLE>.todo.md`) are rebuilt from the read model; all of it can be
regenerated from events at any time (`taskkernel verify --repair`).

Every write goes through `kernel.fcop.safeio`: a symlinked stage, `.locks/`, `ledger/` or file is
refused (`symlink_refused`) and reported with its path; nothing outside the workspace is touched.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from kernel.canonical import utc_now_iso
from kernel.commands import EffectRule, TaskCommandKernel
from kernel.fcop import (
    EnvelopeKind,
    FcopError,
    FcopFilename,
    FcopReason,
    FcopWorkspace,
    TaskDraft,
    Transition,
    append_transition,
    locked,
    move_no_overwrite,
    read_envelope,
    rewrite,
    write_new,
)
from kernel.fcop.detect import STAGES
from kernel.fcop.safeio import list_dir, lstat, read_bytes, report
from kernel.fcop.writer import render_task
from kernel.folders.tracking import FileTracker, Origin
from kernel.store.schema import tasks

PROJECT_EFFECT = "fcop_project"
PROJECT_RULE = EffectRule(PROJECT_EFFECT, frozenset({
    "task_created", "task_adopted", "task_claimed", "task_submitted", "task_approved", "task_rejected",
    "task_reopened", "task_archived", "task_force_archived"}))
MAX_FILE_BYTES = 4 * 2**20


class Projection:
    def __init__(self, kernel: TaskCommandKernel, fcop: FcopWorkspace, tracker: FileTracker) -> None:
        self.kernel = kernel
        self.fcop = fcop
        self.tracker = tracker
        self.dirty = True  # the ledger needs a rebuild

    def __call__(self, effect_key: str, payload: dict[str, Any]) -> None:
        with self.kernel.db.read() as conn:
            event = self.kernel.store.event_at(conn, payload["global_pos"])
        by = str(event.data.get("by", "kernel")) if event else "kernel"
        self.place(payload["task_id"], by=by, tool=payload["event_type"])

    def place(self, task_id: str, *, by: str = "kernel", tool: str = "taskkernel") -> Path | None:
        """Put the task's file in its stage; returns where it is (None if the task is unknown).

        A refusal (a symlinked stage or lock folder, a changed file) is logged and raised: the effect
        is retried later and the file stays where it is."""
        self.dirty = True  # the ledger follows the read model, whether or not the file could move
        try:
            return self._place(task_id, by, tool)
        except FcopError as exc:
            report(exc, "project", task_id=task_id)
            raise

    def _place(self, task_id: str, by: str, tool: str) -> Path | None:
        doc = self.kernel.task(task_id)
        if doc is None:
            return None
        stage = doc["state"]
        with locked(self.fcop.lock_dir / f"{task_id}.lock"):
            current = self.find(task_id)
            if current is None:
                path = self._write_new(doc, by)
                if stage != "inbox":
                    self._append(path, task_id, "inbox", stage, by, tool)
            elif current.parent != self.fcop.stage_dir(stage):
                old = current.parent.name
                path = move_no_overwrite(current, self.fcop.stage_dir(stage) / current.name)
                self._append(path, task_id, old if old in STAGES else None, stage, by, tool,
                             moved_from=self.fcop.relative(current))
            else:
                path = current
                env = read_envelope(path, max_bytes=MAX_FILE_BYTES)
                last = env.transitions[-1].to if env.transitions else None  # type: ignore[union-attr]
                if last != stage:  # an agent moved it and the kernel accepted: record the move
                    self._append(path, task_id, last, stage, by, tool)
        return path

    def find(self, task_id: str) -> Path | None:
        """The task's TASK file: a regular file, looked up without following any symlink."""
        rel = self.tracker.task_file(task_id)
        if rel and Path(rel).name.startswith(f"{task_id}-") and _is_file(self.fcop.root / rel):
            return self.fcop.root / rel
        for directory in [self.fcop.stage_dir(s) for s in STAGES] + [self.fcop.root / "tasks"]:
            try:
                entries = list_dir(directory)
            except (FileNotFoundError, FcopError):  # absent, or refused: the write that follows reports it
                continue
            hits = sorted(name for name, st in entries
                          if name.startswith(f"{task_id}-") and name.endswith(".md") and stat.S_ISREG(st.st_mode))
            if hits:
                return directory / hits[0]
        return None

    def _write_new(self, doc: dict[str, Any], by: str) -> Path:
        _, day, seq = doc["task_id"].split("-")
        name = FcopFilename(kind=EnvelopeKind.TASK, date=day, sequence=int(seq), sender=doc["sender"],
                            recipient=doc["recipient"])
        draft = TaskDraft(sender=doc["sender"], recipient=doc["recipient"], subject=doc["subject"],
                          body=doc["body"] + "\n", priority=doc["priority"], thread_key=doc["thread_key"],
                          parent=doc["parent"], references=tuple(doc["references"]),
                          extra={"risk_level": doc["risk_level"]}, by=by)
        path = self.fcop.stage_dir("inbox") / name.render()
        sha = write_new(path, render_task(draft))
        self.tracker.record(self.fcop.relative(path), sha, doc["task_id"], Origin.PROJECTED)
        return path

    def _append(self, path: Path, task_id: str, from_stage: str | None, to: str, by: str, tool: str, *,
                moved_from: str | None = None) -> None:
        event = Transition.model_validate({"at": utc_now_iso().replace("Z", "+00:00"), "from": from_stage,
                                           "to": to, "by": by, "tool": tool})
        sha = append_transition(path, event)
        self.tracker.record(self.fcop.relative(path), sha, task_id, Origin.PROJECTED, moved_from=moved_from)

    # -- ledger ------------------------------------------------------------------------------
    def refresh_ledger(self) -> int:
        """Rebuild ledger/tasks.jsonl and views/<ROLE>.todo.md when anything moved; returns files written."""
        if not self.dirty:
            return 0
        with self.kernel.db.read() as conn:
            docs = [json.loads(r[0]) for r in conn.execute(sa.select(tasks.c.doc).order_by(tasks.c.task_id))]
        ledger = self.fcop.root / "ledger"
        files = {ledger / "tasks.jsonl": "".join(
            json.dumps({k: d[k] for k in ("task_id", "state", "revision", "round", "sender", "recipient", "subject",
                                          "parent", "root", "thread_key", "priority", "risk_level")},
                       ensure_ascii=False) + "\n" for d in docs)}
        roles = sorted({d["authority"]["driver"] for d in docs} | {d["authority"]["done_authority"] for d in docs})
        files.update({ledger / "views" / f"{role}.todo.md": _todo(role, docs) for role in roles})
        written, refused = 0, set()
        for path, text in files.items():
            try:
                written += _write_if_changed(path, text)
            except FcopError as exc:  # a symlinked ledger/ or view: skip it, the rest is still written
                if exc.path not in refused:
                    refused.add(exc.path)
                    report(exc, "ledger")
        self.dirty = bool(refused)  # a refused view is tried again next pass (and reported again)
        return written


def _todo(role: str, docs: list[dict[str, Any]]) -> str:
    drive = [d for d in docs if d["authority"]["driver"] == role and d["state"] in ("inbox", "active")]
    judge = [d for d in docs if d["authority"]["done_authority"] == role and d["state"] == "review"]
    lines = [f"# {role}: what is waiting for you", "", "Generated by taskkernel from its event log; do not edit.", ""]
    lines += ["## To do", ""] + [f"- [{d['state']}] {d['task_id']} (round {d['round']}, {d['priority']}): "
                                 f"{d['subject']}" for d in drive] + ([] if drive else ["- nothing"])
    lines += ["", "## To review", ""] + [f"- {d['task_id']} from {d['recipient']}: {d['subject']}"
                                        for d in judge] + ([] if judge else ["- nothing"])
    return "\n".join(lines) + "\n"


def _is_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(lstat(path).st_mode)
    except (FileNotFoundError, FcopError):
        return False


def _write_if_changed(path: Path, text: str) -> int:
    data = text.encode("utf-8")
    try:
        if read_bytes(path, len(data))[0] == data:
            return 0
    except FileNotFoundError:
        pass
    except FcopError as exc:
        if exc.reason is not FcopReason.FILE_TOO_LARGE:  # larger than the new text: it differs
            raise
    rewrite(path, data, expect_sha256=None)
    return 1

