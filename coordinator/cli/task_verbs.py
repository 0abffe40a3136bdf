"""`taskkernel task create|claim|report|submit|approve|reject|reopen|archive|amend|retry|merge`: one call per action.

Each verb reads the task's revision and round itself and derives its idempotency key (kernel/verbs.py, documented
in docs/cli.md "Task verbs"); output and exit codes are `submit`'s: 0 accepted/replayed, 2 rejected with the
reason code, 64 usage, 65 unreadable input. `task merge` is no kernel command: it runs the coordinator's merge of an
approved task (coordinator/worktrees/effects.py) and prints ``{"status": "merged", …}`` or the refusal."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from taskkernel.coordinator.cli.common import Exit, emit, fail, get_ctx, say, warn
from taskkernel.coordinator.cli.common import reject as refuse

if TYPE_CHECKING:
    from taskkernel.kernel.verbs import TaskVerbs, VerbOutcome

PRIORITIES = ("P0", "P1", "P2", "P3")
RISKS = ("low", "medium", "high", "irreversible")
REPORT_STATUSES = ("done", "blocked", "in_progress", "aborted")

# Options every verb on an existing task shares.
EXPECT_REV = typer.Option(None, "--expect-rev", min=1, help="Refuse (stale_task_revision) unless the task is at "
                          "this revision.")
ROUND = typer.Option(None, "--round", min=0, help="Refuse (stale_round) unless the task is in this round.")
KEY = typer.Option(None, "--key", help="Idempotency key (default: derived from you, the verb, the task, the round "
                   "and the content, so a retry replays).")
BODY = typer.Option(None, "--body", help="Text of the body.")
BODY_FILE = typer.Option(None, "--body-file", help="Read the body from this file (- for stdin).")


def attach(app: typer.Typer) -> None:
    for name, command in (("create", create), ("claim", claim), ("report", report), ("submit", submit),
                          ("approve", approve), ("reject", reject), ("reopen", reopen), ("archive", archive),
                          ("amend", amend), ("retry", retry), ("merge", merge)):
        app.command(name)(command)


def _verbs(ctx: typer.Context) -> tuple[TaskVerbs, Any]:
    from taskkernel.kernel.verbs import TaskVerbs

    c = get_ctx(ctx)
    c.current_database()  # refused while the schema is behind (or ahead of) this code
    principal = c.principal()
    return TaskVerbs(c.kernel()), principal


def _body(text: str | None, path: Path | None) -> str | None:
    if text is not None and path is not None:
        fail(Exit.USAGE, "give --body or --body-file, not both")
    if path is None:
        return text
    try:
        return sys.stdin.read() if str(path) == "-" else path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        fail(Exit.DATAERR, f"cannot read the body from {path}: {exc}")


def _finish(outcome: VerbOutcome) -> None:
    """Print the result as `submit` does and exit with its code."""
    _show(outcome)
    raise typer.Exit(int(Exit.REJECTED if outcome.result.status == "rejected" else Exit.OK))


def _show(outcome: VerbOutcome) -> None:
    result = outcome.result
    emit(outcome.wire(), generic=False)
    colour = {"accepted": "green", "replayed": "cyan", "rejected": "red"}[result.status]
    (warn if result.status == "rejected" else say)((result.status, colour), f" {result.reason or ''} "
                                                                         f"{result.message}")
    if outcome.hint:
        warn("to grant it: ", outcome.hint)


def _resolved(ctx: typer.Context, task_id: str) -> str:
    """The kernel's id for ``task_id``: a migrated task's FCoP 4 file id acts on its task (docs/fcop4.md)."""
    from taskkernel.coordinator.fcop4.aliases import resolve_task_id

    return resolve_task_id(get_ctx(ctx).database(), task_id)


def _act(ctx: typer.Context, verb: str, task_id: str, payload: dict[str, Any] | None, expect_rev: int | None,
         round_: int | None, key: str | None) -> None:
    verbs, principal = _verbs(ctx)
    _finish(verbs.act(principal, verb, _resolved(ctx, task_id), payload, expect_rev=expect_rev, round_=round_,
                      key=key))


def create(ctx: typer.Context,
           to: str = typer.Option(..., "--to", help="The role the task is for."),
           subject: str = typer.Option(..., "--subject", help="One line: what is to be done."),
           body: str | None = BODY, body_file: Path | None = BODY_FILE,
           parent: str | None = typer.Option(None, "--parent", help="The parent task (a branch of it)."),
           priority: str | None = typer.Option(None, "--priority", help="P0 (most urgent) to P3; default P2."),
           risk: str | None = typer.Option(None, "--risk", help="low (default), medium, high or irreversible."),
           ref: list[str] | None = typer.Option(None, "--ref", help="A task or file this one refers to; repeat."),
           key: str | None = KEY) -> None:
    """Create a task, sent by your role."""
    if priority is not None and priority.upper() not in PRIORITIES:
        fail(Exit.USAGE, f"--priority {priority!r}: choose one of {', '.join(PRIORITIES)}")
    if risk is not None and risk.lower() not in RISKS:
        fail(Exit.USAGE, f"--risk {risk!r}: choose one of {', '.join(RISKS)}")
    payload: dict[str, Any] = {"recipient": to.upper(), "subject": subject}
    text = _body(body, body_file)
    optional = {"body": text, "parent": parent, "priority": priority and priority.upper(),
                "risk_level": risk and risk.lower(), "references": ref or None}
    payload.update({k: v for k, v in optional.items() if v is not None})
    verbs, principal = _verbs(ctx)
    _finish(verbs.create(principal, payload, key=key))


def claim(ctx: typer.Context, task_id: str, expect_rev: int | None = EXPECT_REV, round_: int | None = ROUND,
          key: str | None = KEY) -> None:
    """Claim a task of your role: it becomes active and a new round starts."""
    _act(ctx, "claim", task_id, None, expect_rev, round_, key)


def report(ctx: typer.Context, task_id: str,
           status: str = typer.Option(..., "--status", help="done, blocked, in_progress or aborted."),
           body: str | None = BODY, body_file: Path | None = BODY_FILE,
           artifact: list[str] | None = typer.Option(None, "--artifact", help="A path or URL of what the work "
                                                     "produced; repeat."),
           then_submit: bool = typer.Option(False, "--submit", help="After a done report, submit the task for "
                                            "review in the same call."),
           expect_rev: int | None = EXPECT_REV, round_: int | None = ROUND, key: str | None = KEY) -> None:
    """Report on the current round of a task (evidence; the task does not move)."""
    if status not in REPORT_STATUSES:
        fail(Exit.USAGE, f"--status {status!r}: choose one of {', '.join(REPORT_STATUSES)}")
    if then_submit and status != "done":
        fail(Exit.USAGE, "--submit needs --status done: only a done report can be submitted for review")
    payload: dict[str, Any] = {"status": status, "body": _body(body, body_file) or ""}
    if artifact:
        payload["artifacts"] = artifact
    verbs, principal = _verbs(ctx)
    task_id = _resolved(ctx, task_id)
    outcome = verbs.act(principal, "report", task_id, payload, expect_rev=expect_rev, round_=round_, key=key)
    if not then_submit or outcome.result.status == "rejected":
        _finish(outcome)
    _show(outcome)  # the report's line first; the submit's is the last, as scripts read it
    _finish(verbs.act(principal, "submit", task_id, None, round_=round_))


def submit(ctx: typer.Context, task_id: str, expect_rev: int | None = EXPECT_REV, round_: int | None = ROUND,
           key: str | None = KEY) -> None:
    """Submit a task for review (needs a done report of the current round)."""
    _act(ctx, "submit", task_id, None, expect_rev, round_, key)


def approve(ctx: typer.Context, task_id: str, expect_rev: int | None = EXPECT_REV, round_: int | None = ROUND,
            key: str | None = KEY) -> None:
    """Approve a task in review: it is done."""
    _act(ctx, "approve", task_id, None, expect_rev, round_, key)


def reject(ctx: typer.Context, task_id: str,
           reason: str = typer.Option(..., "--reason", help="What must change: the driver reads it."),
           expect_rev: int | None = EXPECT_REV, round_: int | None = ROUND, key: str | None = KEY) -> None:
    """Send a task in review back to work, with the reason (a new round starts)."""
    _act(ctx, "reject", task_id, {"reason": reason}, expect_rev, round_, key)


def reopen(ctx: typer.Context, task_id: str,
           reason: str | None = typer.Option(None, "--reason", help="Why the done task goes back to work."),
           expect_rev: int | None = EXPECT_REV, round_: int | None = ROUND, key: str | None = KEY) -> None:
    """Reopen a done task (a new round starts)."""
    _act(ctx, "reopen", task_id, {"reason": reason} if reason else None, expect_rev, round_, key)


def archive(ctx: typer.Context, task_id: str,
            reason: str | None = typer.Option(None, "--reason", help="Why (default: \"archived\")."),
            expect_rev: int | None = EXPECT_REV, round_: int | None = ROUND, key: str | None = KEY) -> None:
    """Archive a done task."""
    _act(ctx, "archive", task_id, {"reason": reason or "archived"}, expect_rev, round_, key)


def amend(ctx: typer.Context, task_id: str,
          subject: str | None = typer.Option(None, "--subject", help="A new subject."),
          body: str | None = BODY, body_file: Path | None = BODY_FILE,
          priority: str | None = typer.Option(None, "--priority", help="P0 to P3."),
          risk: str | None = typer.Option(None, "--risk", help="low, medium, high or irreversible."),
          ref: list[str] | None = typer.Option(None, "--ref", help="Replace the references; repeat."),
          expect_rev: int | None = EXPECT_REV, round_: int | None = ROUND, key: str | None = KEY) -> None:
    """Change a task's subject, body, priority, risk or references (the revision moves on)."""
    if priority is not None and priority.upper() not in PRIORITIES:
        fail(Exit.USAGE, f"--priority {priority!r}: choose one of {', '.join(PRIORITIES)}")
    if risk is not None and risk.lower() not in RISKS:
        fail(Exit.USAGE, f"--risk {risk!r}: choose one of {', '.join(RISKS)}")
    changes = {"subject": subject, "body": _body(body, body_file), "priority": priority and priority.upper(),
               "risk_level": risk and risk.lower(), "references": ref or None}
    payload = {k: v for k, v in changes.items() if v is not None}
    if not payload:
        fail(Exit.USAGE, "amend needs at least one of --subject, --body, --body-file, --priority, --risk, --ref")
    _act(ctx, "amend", task_id, payload, expect_rev, round_, key)


def retry(ctx: typer.Context, task_id: str,
          reason: str | None = typer.Option(None, "--reason", help="Why another run should do better (recorded)."),
          expect_rev: int | None = EXPECT_REV, round_: int | None = ROUND, key: str | None = KEY) -> None:
    """Try an active or in-review task again: lift its round's block and make a new run due (ADMIN or the task's
    done authority); refused, with what to fix, where a run cannot help."""
    _act(ctx, "retry", task_id, {"reason": reason} if reason else None, expect_rev, round_, key)


def merge(ctx: typer.Context, task_id: str) -> None:
    """Merge an approved task's reviewed commit into its base now, as `up` does on approval: after a merge that
    failed (a local edit in the base's checkout) once the cause is fixed (ADMIN or the task's done authority)."""
    from taskkernel.coordinator.worktrees.effects import MERGED, WORKTREE_EFFECT, WorktreeEffects
    from taskkernel.coordinator.worktrees.manager import Worktrees
    from taskkernel.kernel.outbox import dead_letters, retry_dead_letter

    c = get_ctx(ctx)
    db = c.current_database()
    principal, kernel, root = c.principal(), c.kernel(), c.workspace().root
    task_id = _resolved(ctx, task_id)
    doc = kernel.task(task_id)
    if doc is None:
        refuse("task_not_found", f"{task_id} does not exist (see `taskkernel task list`)")
    if principal.task_id is not None:  # a run's token: merging into the base is a person's (or a tool's) decision
        refuse("role_not_authorized", f"merge of {task_id} needs an unscoped credential, not a run's token",
               task_id=task_id)
    if not principal.is_admin and principal.role != doc["authority"]["done_authority"]:
        refuse("role_not_authorized", f"merge of {task_id} needs done_authority ({doc['authority']['done_authority']})"
               f" or ADMIN, not {principal.role}", task_id=task_id)
    approvals = [ev.global_pos for ev in kernel.history(task_id)
                 if ev.type == "task_approved" and ev.data.get("from") == "review"]
    if doc["state"] != "done" or not approvals:
        refuse("illegal_transition", f"{task_id} is {doc['state']}: only an approved (done) task is merged",
               task_id=task_id)
    excludes = c.workspace().config.worktrees.patterns()
    outcome = WorktreeEffects(kernel, Worktrees(db, root, excludes), {}).merge_approved(doc, approvals[-1])
    if outcome.status != MERGED:
        refuse(outcome.reason or "merge_failed", outcome.message, task_id=task_id)
    for letter in dead_letters(db):  # the effect that gave up on this merge: run again, it finds the merge done
        if letter["task_id"] == task_id and letter["effect"] == WORKTREE_EFFECT:
            retry_dead_letter(db, letter["effect_key"], principal.id)
    emit({"status": "merged", "task_id": task_id, "branch": outcome.branch, "base": outcome.base,
          "commit": outcome.commit, "how": outcome.how, "message": outcome.message}, generic=False)
    say(("merged", "green"), f" {task_id}: {outcome.message}")
