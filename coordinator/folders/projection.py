"""Projection: the kernel's events, written back as FCoP files (docs/fcop.md, "Transitions we write").

TASK files (G3): each lifecycle event of a task is one `transitions:` entry with that event's own
from/to, the acting role as `by`, its recorded time as `at`, fcop's tool name (ours for the edges fcop
lacks) and `kernel_event:` = the event's global position. A task's events are replayed in event order from
the last one its file carries, each moving the file to the event's stage and then appending (so front
matter never claims a stage the path does not have), all under the task's lock. A retried or
out-of-order relay therefore never writes an entry twice or a wrong edge, and several events relayed in
one pass still read inbox→active→review→done→archive.

G2 workspaces are never half-migrated: no file is moved or rewritten there and no `_lifecycle/` is made;
a task created through the kernel gets its TASK file once, in `tasks/`.

REPORT and REVIEW files: a report, approval or rejection that was not itself read from a file is written
into `reports/` / `reviews/`, recorded in `folder_files` just before it is published, so neither ingest
nor a retried effect takes it for new.

The kernel writes only its own TASK file (`find`): another file that takes a task's id is never moved
or written into, and a name it occupies is `target_exists` until ingest has dealt with it.

The ledger (`ledger/tasks.jsonl`) and the per-role views (`ledger/views/<ROLE>.todo.md`) are rebuilt
from the read model. Every write goes through `taskkernel.coordinator.fcop.safeio`: a symlinked stage, `.locks/`,
`ledger/` or file is refused (`symlink_refused`) and reported with its path.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import sqlalchemy as sa

from taskkernel.coordinator.fcop import (
    EnvelopeKind,
    FcopError,
    FcopFilename,
    FcopReason,
    FcopWorkspace,
    Generation,
    TaskDraft,
    TaskEnvelope,
    Transition,
    append_transition,
    locked,
    move_no_overwrite,
    parse_filename,
    read_envelope,
    write_new,
    write_report,
    write_review,
)
from taskkernel.coordinator.fcop.safeio import Staged, lstat, report, sha256_hex
from taskkernel.coordinator.fcop.scan import place_of, shown_state, task_files
from taskkernel.coordinator.fcop.writer import amend_task, render_task
from taskkernel.coordinator.folders.tracking import FileTracker, Origin, folder_files
from taskkernel.kernel.commands import EffectRule, TaskCommandKernel
from taskkernel.kernel.model.task import TARGET_STATE_OF_EVENT
from taskkernel.kernel.store.events import RecordedEvent
from taskkernel.kernel.store.schema import tasks

LEDGER_KEYS = ("task_id", "state", "revision", "round", "sender", "recipient", "subject", "parent", "root",
               "thread_key", "priority", "risk_level")
PROJECT_EFFECT = "fcop_project"
# fcop's tool for each edge of its table; ours (documented extensions) for the edges it lacks.
TOOL_OF_EVENT = {
    "task_created": "create_task", "task_claimed": "claim_task", "task_submitted": "submit_task",
    "task_approved": "approve_task", "task_rejected": "reject_task", "task_archived": "archive_task",
    "task_force_archived": "force_archive_task", "task_reopened": "reopen_task", "task_amended": "amend_task"}
BASELINE_TOOL = "fcop_migrate_v3"  # fcop's own {from: null} baseline: an adopted task's file written anew
EVENT_KEY = "kernel_event"  # extra key of an entry (and of a REPORT/REVIEW): the event's global position
RECORD_EVENTS = frozenset({"report_submitted", "task_approved", "task_rejected"})
# task_adopted is not projected: the import adopts a task from its file, which is already where its history
# put it (a later event, or `verify --repair`, rewrites a lost one). An import of thousands costs no effect.
PROJECT_RULE = EffectRule(PROJECT_EFFECT, frozenset({*TOOL_OF_EVENT, *RECORD_EVENTS}))
# Tools the projection wrote before entries carried kernel_event: such a file carries one entry per event.
LEGACY_TOOLS = frozenset({*TOOL_OF_EVENT, "create_task", "task_adopted", "taskkernel", "repair"})
MAX_FILE_BYTES = 4 * 2**20
OWN_ORIGINS = (Origin.PROJECTED.value, Origin.INGESTED.value)


@dataclass(frozen=True)
class _File:
    """The task's own file as the replay goes: where it is and the digest of its bytes."""

    path: Path
    sha256: str


@dataclass(frozen=True)
class _Step:
    """One lifecycle event as a transition."""

    event: RecordedEvent
    from_stage: str | None
    to: str
    tool: str

    def entry(self) -> Transition:
        return Transition.model_validate({"at": event_time(self.event), "from": self.from_stage, "to": self.to,
                                          "by": acting_role(self.event), "tool": self.tool,
                                          EVENT_KEY: self.event.global_pos})


def event_time(event: RecordedEvent) -> str:
    """The event's recorded time as fcop writes ``at`` (ISO-8601, ``+00:00``)."""
    return event.recorded_at.replace("Z", "+00:00")


def acting_role(event: RecordedEvent) -> str:
    """The role code of whoever made the command (never a token or agent id)."""
    return str(event.meta.get("role") or str(event.data.get("by", "SYSTEM")).split(":", 1)[0])


def born_from_file(event: RecordedEvent) -> bool:
    """The command was read from a file (ingest's ``file:`` keys): that file already says it."""
    return str(event.meta.get("command_id") or "").startswith("file:")


def lifecycle_steps(history: list[RecordedEvent]) -> list[_Step]:
    """The task's events that move it (or amend it in place), in event order, each with its own edge."""
    steps, state = [], None
    for ev in history:
        if ev.type == "task_created":
            step = _Step(ev, None, "inbox", TOOL_OF_EVENT[ev.type])
        elif ev.type == "task_adopted":
            step = _Step(ev, None, str(ev.data.get("state", "inbox")), BASELINE_TOOL)
        elif ev.type in TARGET_STATE_OF_EVENT:
            step = _Step(ev, ev.data.get("from", state), TARGET_STATE_OF_EVENT[ev.type].value, TOOL_OF_EVENT[ev.type])
        elif ev.type == "task_amended" and state is not None:
            step = _Step(ev, state, state, TOOL_OF_EVENT[ev.type])
        else:
            continue
        steps.append(step)
        state = step.to
    return steps


class Projection:
    def __init__(self, kernel: TaskCommandKernel, fcop: FcopWorkspace, tracker: FileTracker) -> None:
        self.kernel = kernel
        self.fcop = fcop
        self.tracker = tracker
        self.dirty = True  # the ledger needs a rebuild

    def __call__(self, effect_key: str, payload: dict[str, Any]) -> None:
        with self.kernel.db.read() as conn:
            event = self.kernel.store.event_at(conn, payload["global_pos"])
        if event is not None and event.type in RECORD_EVENTS and not born_from_file(event):
            self.write_record(payload["task_id"], event)
        self.place(payload["task_id"])

    def place(self, task_id: str) -> Path | None:
        """Bring the task's own file in line with its events; returns where it is (None if the task is unknown,
        or has no file to write in a G2 workspace).

        A refusal (a symlinked stage or lock folder, a changed file, a name another file holds) is logged and
        raised: the effect is retried later and the file stays where it is. A file that moved between the look
        for it and the move (``source_missing``: another coordinator sharing the workspace, or a person) is looked
        for once more at once, where it is now."""
        self.dirty = True  # the ledger follows the read model, whether or not the file could move
        try:
            try:
                return self._place(task_id)
            except FcopError as exc:
                if exc.reason is not FcopReason.SOURCE_MISSING:
                    raise
                return self._place(task_id)
        except FcopError as exc:
            report(exc, "project", task_id=task_id)
            raise

    def _place(self, task_id: str) -> Path | None:
        doc = self.kernel.task(task_id)
        if doc is None:
            return None
        with locked(self.fcop.lock_dir / f"{task_id}.lock"):
            steps = lifecycle_steps(self.kernel.history(task_id))
            own = self._find(task_id, (doc["sender"], doc["recipient"]))
            if self.fcop.generation is Generation.G2:  # state lives in the kernel and the ledger
                if own is None and steps and steps[0].event.type == "task_created":
                    return self._write_new(steps[0], self.fcop.inbox_dir).path
                return own
            current = self._replay(own, steps)
            if current is not None and steps:  # all carried: a file moved by hand goes back (verify --repair)
                current = self._move(current, steps[-1])
            return current.path if current else None

    def _replay(self, own: Path | None, steps: list[_Step]) -> _File | None:
        current, carried, tail = (None, 0, []) if own is None else _carried(own, steps)
        pending = [s for s in steps if s.event.global_pos > carried]
        recorded = _recorded_by_author(pending, tail)
        for step in pending:
            if current is None:  # no file yet (or it is gone): written from the task's first event
                current = self._write_new(step, self.fcop.stage_dir(step.to))
            elif step.event.type == "task_adopted" or step.event.global_pos in recorded:
                continue  # the file already says it
            else:
                current = self._append(self._move(current, step), step)
        return current

    def _move(self, current: _File, step: _Step) -> _File:
        if shown_state(*place_of(self.fcop.relative(current.path))) == step.to:  # already where its state shows
            return current
        path = move_no_overwrite(current.path, self.fcop.stage_dir(step.to) / current.path.name)
        self.tracker.record(self.fcop.relative(path), current.sha256, _task_id(step), Origin.PROJECTED,
                            moved_from=self.fcop.relative(current.path))
        return _File(path, current.sha256)

    def _append(self, current: _File, step: _Step) -> _File:
        entry = step.entry()
        if step.event.type == "task_amended":
            sha = amend_task(current.path, step.event.data["changes"], entry, expect_sha256=current.sha256)
        else:
            sha = append_transition(current.path, entry, expect_sha256=current.sha256)
        self.tracker.record(self.fcop.relative(current.path), sha, _task_id(step), Origin.PROJECTED)
        return _File(current.path, sha)

    def _write_new(self, step: _Step, directory: Path) -> _File:
        """The task's own file, in the canonical form, from its first event. A name another file already holds
        is ``target_exists``: never written into."""
        data = step.event.data
        _, day, seq = data["task_id"].split("-")
        name = FcopFilename(kind=EnvelopeKind.TASK, date=day, sequence=int(seq), sender=data["sender"],
                            recipient=data["recipient"])
        draft = TaskDraft(sender=data["sender"], recipient=data["recipient"], subject=data["subject"],
                          body=data["body"] + "\n", priority=data["priority"], thread_key=data["thread_key"],
                          parent=data["parent"], references=tuple(data["references"]),
                          extra={"risk_level": data["risk_level"]})
        path = directory / name.render()
        sha = write_new(path, render_task(draft, creation=step.entry()))
        self.tracker.record(self.fcop.relative(path), sha, data["task_id"], Origin.PROJECTED)
        return _File(path, sha)

    # -- the task's own file --------------------------------------------------------------------
    def find(self, task_id: str) -> Path | None:
        """The task's own TASK file (None if the task is unknown or has none yet)."""
        doc = self.kernel.task(task_id)
        return None if doc is None else self._find(task_id, (doc["sender"], doc["recipient"]))

    def _find(self, task_id: str, route: tuple[str, str]) -> Path | None:
        """What folder_files records as the task's TASK file (taken in or written), named with its id and its
        route; else (nothing recorded is there) the first file by name with that id and route that folder_files
        does not record as refused, quarantined or kept. Another file with the id is never the task's."""
        with self.kernel.db.read() as conn:
            rows = conn.execute(sa.select(folder_files.c.rel, folder_files.c.origin).where(
                folder_files.c.task_id == task_id).order_by(folder_files.c.updated_at.desc())).all()
        for rel, origin in rows:
            if origin in OWN_ORIGINS and _names(PurePosixPath(rel).name, task_id, route) \
                    and _is_file(self.fcop.root / rel):
                return self.fcop.root / rel
        found = [f.path for f, name in task_files(self.fcop).get(task_id, ())
                 if (name.sender, name.recipient) == route]
        for path in sorted(found, key=lambda p: (os.fsencode(p.name), os.fsencode(str(p)))):
            tracked = self.tracker.get(self.fcop.relative(path))
            if tracked is None or tracked.origin.value in OWN_ORIGINS:
                return path
        return None

    # -- REPORT and REVIEW files ----------------------------------------------------------------
    def write_record(self, task_id: str, event: RecordedEvent) -> Path | None:
        """The REPORT (report_submitted) or REVIEW (task_approved / task_rejected) file of one event, written
        once: recorded in folder_files just before it is published, so a retry finds it."""
        doc = self.kernel.task(task_id)
        if doc is None:
            return None
        mark = f"{EVENT_KEY}:{event.global_pos}"
        with locked(self.fcop.lock_dir / f"{task_id}.lock"):
            earlier = self._marked(task_id, mark)
            done = next((self.fcop.root / rel for rel in earlier if _is_file(self.fcop.root / rel)), None)
            if done is not None:
                return done

            def claim(path: Path, data: bytes) -> None:  # under the numbering lock, before the file appears
                self._forget(self._marked(task_id, mark))  # an attempt that never published
                self.tracker.record(self.fcop.relative(path), sha256_hex(data), task_id, Origin.PROJECTED, note=mark)

            role, extra = acting_role(event), {EVENT_KEY: event.global_pos}
            if event.type == "report_submitted":
                body = str(event.data.get("body") or "")
                body = body if body.endswith("\n") or not body else body + "\n"
                if event.data.get("artifacts"):  # the evidence a reviewer opens, in the file they read
                    body += ("\n" if body else "") + "## Artifacts\n\n" + "".join(
                        f"- {a}\n" for a in event.data["artifacts"])
                return write_report(self.fcop, sender=role, recipient=doc["sender"], task_id=task_id,
                                    body=body,
                                    status=event.data["status"], priority=doc["priority"], extra=extra,
                                    references=[str(r) for r in event.data.get("references") or ()],
                                    before_publish=claim).path
            reason = None if event.type == "task_approved" else str(event.data.get("reason") or "rejected")
            return write_review(self.fcop, reviewer=role, subject_ref=task_id,
                                decision="approved" if reason is None else "rejected", rationale=reason,
                                body=f"{reason}\n" if reason else "", decided_at=event_time(event), extra=extra,
                                before_publish=claim).path

    def _marked(self, task_id: str, mark: str) -> list[str]:
        with self.kernel.db.read() as conn:
            return list(conn.execute(sa.select(folder_files.c.rel).where(
                folder_files.c.task_id == task_id, folder_files.c.origin == Origin.PROJECTED.value,
                folder_files.c.note == mark)).scalars())

    def _forget(self, rels: list[str]) -> None:
        if rels:
            with self.kernel.db.write() as uow:
                uow.conn.execute(folder_files.delete().where(folder_files.c.rel.in_(rels)))

    # -- ledger ------------------------------------------------------------------------------
    def refresh_ledger(self) -> int:
        """Rebuild ledger/tasks.jsonl and views/<ROLE>.todo.md when anything moved; returns files written. The
        ledger is written as the tasks are read, one document at a time (``safeio.Staged``): nothing holds its
        whole text."""
        if not self.dirty:
            return 0
        try:
            with locked(self.fcop.lock_dir / "ledger.lock", wait=False) as held:
                # another coordinator on this folder writes it now, or was stopped while it did: this pass goes
                # on without waiting for it, and the next one writes the ledger (still dirty)
                return self._write_ledger() if held else 0
        except FcopError as exc:  # a symlinked or irregular lock: reported, tried again next pass
            report(exc, "ledger")
            return 0

    def _write_ledger(self) -> int:
        """Under the ledger lock: coordinators sharing this folder (hosts on one store) write in turn, each from
        the store as it is when it holds the lock, so a later writer never puts an older ledger in place and
        none sees its staged file replaced by the other's."""
        out = _LedgerFiles(self.fcop.root / "ledger")
        try:
            with self.kernel.db.read() as conn:
                rows = conn.execute(sa.select(tasks.c.doc).order_by(tasks.c.task_id).execution_options(yield_per=500))
                for (text,) in rows:
                    d = json.loads(text)
                    out.ledger(json.dumps({k: d[k] for k in LEDGER_KEYS}, ensure_ascii=False) + "\n")
                    driver, judge = d["authority"]["driver"], d["authority"]["done_authority"]
                    out.view(driver).view(judge)
                    if d["state"] in ("inbox", "active"):
                        out.todo(driver, f"- [{d['state']}] {d['task_id']} (round {d['round']}, {d['priority']}): "
                                         f"{d['subject']}\n")
                    elif d["state"] == "review":
                        out.review(judge, f"- {d['task_id']} from {d['recipient']}: {d['subject']}\n")
            written = out.commit()
        finally:
            out.discard()
        self.dirty = bool(out.refused)  # a refused view is tried again next pass (and reported again)
        return written


def _task_id(step: _Step) -> str:
    return step.event.stream_id.split(":", 1)[1]


def _names(name: str, task_id: str, route: tuple[str, str]) -> bool:
    """A TASK file name with this id and this sender/recipient."""
    parsed = parse_filename(name) if name.startswith("TASK-") else None
    return parsed is not None and parsed.kind is EnvelopeKind.TASK and parsed.id == task_id \
        and (parsed.sender, parsed.recipient) == route


def _carried(path: Path, steps: list[_Step]) -> tuple[_File, int, list[tuple[str | None, str]]]:
    """The file as read, the last event it carries (0: none) and the (from, to) of the entries others wrote
    after it. A file the projection wrote before entries carried ``kernel_event`` (every entry one of our old
    tools) carries one entry per event: its first events are taken as carried, not written again."""
    env = read_envelope(path, max_bytes=MAX_FILE_BYTES)
    if not isinstance(env, TaskEnvelope):
        raise FcopError(FcopReason.INVALID_FIELD_VALUE, "not a TASK file", path)
    last, carried = -1, 0
    for i, t in enumerate(env.transitions):
        mark = (t.model_extra or {}).get(EVENT_KEY)
        if isinstance(mark, int) and not isinstance(mark, bool):
            last, carried = i, max(carried, mark)
    if last < 0 and env.transitions and steps and all(t.tool in LEGACY_TOOLS for t in env.transitions):
        return _File(path, env.sha256), steps[min(len(env.transitions), len(steps)) - 1].event.global_pos, []
    return _File(path, env.sha256), carried, [(t.from_stage, t.to) for t in env.transitions[last + 1:]]


def _recorded_by_author(pending: list[_Step], tail: list[tuple[str | None, str]]) -> set[int]:
    """Events read from a file whose author already wrote their entry (an agent's fcop tool does): matched from
    the end, the newest entries being the newest events', so an older entry with the same edge is never taken."""
    recorded, j = set(), len(tail) - 1
    for step in reversed(pending):
        if j >= 0 and born_from_file(step.event) and tail[j] == (step.from_stage, step.to):
            recorded.add(step.event.global_pos)
            j -= 1
    return recorded


class _LedgerFiles:
    """The ledger, written as the tasks come, and the views, whose few lines (open tasks only) are kept until the
    commit writes them one file at a time: one staged file per role would hold two descriptors each, and a team
    of some hundred roles would run out. A file that cannot be written (a symlinked ledger/ or view) is reported
    once and skipped, the rest are still written."""

    def __init__(self, ledger: Path) -> None:
        self.folder = ledger
        self.refused: set[Path | None] = set()
        self.staged = self._open(ledger / "tasks.jsonl")
        self.views: dict[str, tuple[list[str], list[str]]] = {}  # role -> (to-do lines, to-review lines)

    def ledger(self, line: str) -> None:
        if self.staged is not None:
            self.staged.write(line)

    def view(self, role: str) -> _LedgerFiles:
        self.views.setdefault(role, ([], []))
        return self

    def todo(self, role: str, line: str) -> None:
        self.views[role][0].append(line)

    def review(self, role: str, line: str) -> None:
        self.views[role][1].append(line)

    def commit(self) -> int:
        written = self._commit(self.staged)
        for role in sorted(self.views):
            todo, review = self.views[role]
            staged = self._open(self.folder / "views" / f"{role}.todo.md")
            if staged is None:
                continue
            try:
                staged.write(f"# {role}: what is waiting for you\n\nGenerated by taskkernel from its event log; do "
                             "not edit.\n\n## To do\n\n" + ("".join(todo) or "- nothing\n") + "\n## To review\n\n"
                             + ("".join(review) or "- nothing\n"))
            except OSError as exc:  # a full disk: this view is refused, the others are still tried
                self._refuse(FcopError(FcopReason.IO_ERROR, f"cannot write: {exc.strerror}", staged.path))
                staged.discard()
                continue
            written += self._commit(staged)
        return written

    def discard(self) -> None:
        if self.staged is not None:
            self.staged.discard()

    def _open(self, path: Path) -> Staged | None:
        try:
            return Staged(path)
        except FcopError as exc:
            self._refuse(exc)
            return None

    def _commit(self, staged: Staged | None) -> int:
        try:
            return int(staged is not None and staged.commit())
        except FcopError as exc:
            self._refuse(exc)
            return 0

    def _refuse(self, exc: FcopError) -> None:
        if exc.path not in self.refused:
            self.refused.add(exc.path)
            report(exc, "ledger")


def _is_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(lstat(path).st_mode)
    except (FileNotFoundError, FcopError):
        return False
