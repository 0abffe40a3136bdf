"""The prompt a spawned agent gets, built from the task rather than left for the agent to guess (docs/agents.md).

Its parts, each also a field of a role's own ``prompt`` template (PROMPT_FIELDS): the task's subject and body,
the chain of parents up to the root, the acceptance criteria (the body's "Acceptance"/"验收" section), why the
task came back when this round is a rework (the reject or reopen reason of the round, and a blocked report the
coordinator filed, such as a merge conflict), what a reviewer judges (the round's done report: its body and the
diffstat of the change, files and +/-), and how to report: the MCP tools, or the CLI verbs when MCP is off.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from taskkernel.coordinator.runners.ledger import Purpose

PARENTS_SHOWN = 5  # a deeper chain names its root and the nearest parents
_ACCEPTANCE = re.compile(r"^(#{1,6})\s*(?:\d+\s*[·.)]\s*)?(?:验收|acceptance|definition of done|done when)",
                         re.IGNORECASE)
_HEADING = re.compile(r"^(#{1,6})\s")
_EXCERPT = 300
DIFF_FILES_LISTED = 50  # what the report's event keeps of a diff's files

DEFAULT_TEMPLATE = """\
You are the {role} agent of a taskkernel team, working on task {task_id} (round {round}). {purpose}

# {subject}

{body}

## Where this task sits
{parents}

## Acceptance criteria
{acceptance}
{rework}{review}{resume}
## Working folder
{workdir}

## How to report
{how_to_report}
"""

# A run that continues the CLI's own conversation: the task, its criteria and the earlier work are in it already.
CONTINUE_TEMPLATE = """\
You are the {role} agent of a taskkernel team, continuing task {task_id} (round {round}) in this same conversation.
{purpose}
{rework}{review}{resume}
## Working folder
{workdir}

## How to report
{how_to_report}
"""

PURPOSES = {
    Purpose.EXECUTE: "Do the work the task asks for.",
    Purpose.REVIEW: "Review the work submitted for this task: approve it, or reject it with a reason.",
    Purpose.CHILDREN: "A child task of yours finished: read the children's outcome and decide what comes next.",
}


def acceptance_of(body: str) -> str | None:
    """The body's acceptance section (its heading's level ends it), without the heading line."""
    lines, out, level = body.splitlines(), [], 0
    for line in lines:
        if level:
            heading = _HEADING.match(line)
            if heading and len(heading.group(1)) <= level:
                break
            out.append(line)
        elif match := _ACCEPTANCE.match(line.strip()):
            level = len(match.group(1))
    text = "\n".join(out).strip()
    return text or None


def parents_of(doc: dict[str, Any], task: Callable[[str], dict[str, Any] | None]) -> list[dict[str, Any]]:
    """The task's ancestors, nearest first (a missing or cyclic link ends the chain)."""
    chain, seen, parent = [], {doc["task_id"]}, doc.get("parent")
    while parent and parent not in seen:
        seen.add(parent)
        found = task(parent)
        if found is None:
            break
        chain.append(found)
        parent = found.get("parent")
    return chain


def rework_reason(doc: dict[str, Any], history: Iterable[tuple[str, dict[str, Any]]]) -> str | None:
    """Why this round exists when it is not the first: the reject or reopen that started it, with the blocked
    reports of the round (a merge conflict the coordinator reported)."""
    if doc["round"] <= 1:
        return None
    why, blocked = None, []
    for event_type, data in history:
        if event_type in ("task_rejected", "task_reopened") and data.get("round") == doc["round"]:
            why = data.get("reason") or "no reason was given"
        elif event_type == "report_submitted" and data.get("round") == doc["round"] and data.get("status") == "blocked":
            blocked.append(str(data.get("body") or "").strip())
    if why is None:
        return None
    return "\n".join([f"This round is a rework. Round {doc['round'] - 1} came back because: {why}",
                      *(f"Reported since: {b}" for b in blocked if b)])


def submitted_work(doc: dict[str, Any], history: Iterable[tuple[str, dict[str, Any]]]) -> str | None:
    """What a reviewer judges: the round's latest done report, its body and the diffstat of its change (the diff the
    coordinator recorded: files with +/-, the totals, or why git could not take it); None without one."""
    done: Mapping[str, Any] | None = None
    for event_type, data in history:
        if event_type == "report_submitted" and data.get("round") == doc["round"] and data.get("status") == "done":
            done = data
    if done is None:
        return None
    lines = [f"Done report of round {doc['round']} by {done.get('by') or 'the driver'}:", "",
             str(done.get("body") or "").strip() or "(no body)"]
    diff = done.get("diff")
    if isinstance(diff, Mapping):
        lines += ["", *diffstat(diff)]
    return "\n".join(lines)


def diffstat(diff: Mapping[str, Any]) -> list[str]:
    """A recorded diff as `git diff --stat` would sum it up: one line per file, then the totals."""
    if diff.get("error"):
        return [f"Diff: none recorded ({diff['error']})"]
    files = diff.get("files") or []
    shown = [f"  {f.get('path')} | " + ("binary" if f.get("binary") else
                                        f"+{f.get('insertions', 0)} -{f.get('deletions', 0)}")
             for f in files[:DIFF_FILES_LISTED]]
    total = int(diff.get("files_changed") or len(files))
    if total > len(shown):
        shown.append(f"  … {total - len(shown)} more file(s)")
    return [f"Diff {diff.get('range') or ''}".rstrip() + ":", *shown,
            f"  {total} file(s) changed, +{diff.get('insertions', 0)} -{diff.get('deletions', 0)}"]


def how_to_report(task_id: str, mcp: bool) -> str:
    if mcp:
        return (f"Use the tools of the `taskkernel` MCP server: `get_task` (task_id {task_id}) reads the task, "
                "its reports and children; `add_progress` records a checkpoint. When the work is done, call "
                "`report` with status \"done\", a body saying what you did and how you checked it, and your "
                "artifacts, then `submit_task`. If you cannot finish, `report` with status \"blocked\" and the "
                "reason. A reviewer uses `approve_task`, or `reject_task` with a reason.")
    return (f"Use the taskkernel CLI (your credential is in TASKKERNEL_TOKEN): `taskkernel task show {task_id}` "
            f"reads the task; when the work is done, `taskkernel task report {task_id} --status done --body "
            "\"what you did and how you checked it\" --submit`; if you cannot finish, `--status blocked` with the "
            f"reason. A reviewer uses `taskkernel task approve {task_id}` or `taskkernel task reject {task_id} "
            "--reason \"...\"`.")


def prompt_fields(doc: dict[str, Any], purpose: Purpose, role: str, *, task: Callable[[str], dict[str, Any] | None],
                  history: Iterable[tuple[str, dict[str, Any]]], mcp: bool, workdir: str) -> dict[str, str]:
    """Every field a template may name (PROMPT_FIELDS), filled from the task as it is now."""
    events = list(history)  # read twice: the rework and the submitted work
    chain = parents_of(doc, task)
    shown = chain if len(chain) <= PARENTS_SHOWN else [*chain[:PARENTS_SHOWN - 1], chain[-1]]
    lines = [f"- {p['task_id']} ({p['state']}, {p['recipient']}): {p['subject']} — {_excerpt(p['body'])}"
             for p in shown]
    if len(chain) > PARENTS_SHOWN:
        lines.insert(PARENTS_SHOWN - 1, f"- … {len(chain) - PARENTS_SHOWN} more between")
    rework = rework_reason(doc, events)
    submitted = submitted_work(doc, events) if purpose is Purpose.REVIEW else None
    return {
        "task_id": doc["task_id"], "subject": doc["subject"], "body": doc["body"] or "(no body)",
        "round": str(doc["round"]), "role": role,
        "purpose": PURPOSES[purpose],
        "parents": "\n".join(lines) if lines else "It is a root task (no parent).",
        "acceptance": acceptance_of(doc["body"] or "") or "None stated apart from the body above.",
        "rework": f"\n## Why this task came back\n{rework}\n" if rework else "",
        "review": f"\n## The work to review\n{submitted}\n" if submitted else "",
        "how_to_report": how_to_report(doc["task_id"], mcp), "workdir": workdir, "resume": "",
    }


def build_prompt(template: str | None, fields: dict[str, str]) -> str:
    """The role's template (checked against PROMPT_FIELDS when the file was read), else the default. A template
    that does not place ``{resume}`` gets it at its end: a resumed run must never start over for want of a field."""
    text = (template or DEFAULT_TEMPLATE).format(**fields)
    if template and "{resume}" not in template and fields.get("resume"):
        text = text.rstrip("\n") + "\n" + fields["resume"]
    return text


@dataclass(frozen=True)
class Told:
    """An instruction as a prompt quotes it."""

    seq: int | None
    kind: str
    text: str
    by: str | None = None
    question_id: str | None = None
    anchor: str | None = None  # `path:line` it is about


@dataclass(frozen=True)
class Resumption:
    """What a run's prompt says of the runs before it (seed 002): the last progress anchor (None: no safe one, and
    ``no_anchor_why`` says why), the instructions delivered to this run now (new), those given to an earlier run
    after the anchor (their work may be unfinished) and those before it (history: never acted on again)."""

    anchor_text: str | None
    anchor_seq: int | None
    completed_tool_calls: int
    no_anchor_why: str | None
    new: list[Told]
    after_anchor: list[Told]
    history: list[Told]
    undeliverable: str | None = None  # the session does not replay: nothing was delivered, and why


HISTORY_SHOWN = 10  # older instructions quoted at most (the newest)
_QUOTED = 200


def resume_section(r: Resumption) -> str:
    """The prompt's resume part: where to continue from, what is new, what is history."""
    parts = []
    if r.anchor_text is not None:
        parts += ["", "## Resuming this task: do not start over",
                  f"An earlier run of this task recorded progress. Its last checkpoint (#{r.anchor_seq}) says:",
                  *(f"> {line}" for line in r.anchor_text.splitlines() or [""]),
                  f"Tool calls completed before it: {r.completed_tool_calls}. Continue from there: look at the "
                  "working folder for what is already done before doing anything again."]
    else:
        parts += ["", "## Fresh start", f"No safe progress anchor ({r.no_anchor_why}): start from the task above, "
                  "but earlier runs may have left work in the working folder: look before redoing anything."]
    if r.undeliverable:
        parts += ["", f"Instructions could not be delivered: {r.undeliverable}. A person has to look at them."]
    if r.new:
        parts += ["", "## New instructions (in the order they were given; act on each)",
                  *(f"{n}. {_told(t)}" for n, t in enumerate(r.new, 1))]
    if r.after_anchor:
        parts += ["", "## Given to an earlier run after that checkpoint (their work may be unfinished: check the "
                  "working folder before repeating any of it)", *(f"- {_told(t)}" for t in r.after_anchor)]
    if r.history:
        shown = r.history[-HISTORY_SHOWN:]
        given = "handled before the checkpoint" if r.anchor_text is not None else "given to earlier runs"
        parts += ["", f"## History ({given}: never act on these again)",
                  *(f"> #{t.seq} {t.kind}: {_excerpt(t.text)[:_QUOTED]}" for t in shown)]
        if len(r.history) > len(shown):
            parts.append(f"> … and {len(r.history) - len(shown)} older")
    return "\n".join(parts) + "\n"


def _told(t: Told) -> str:
    about = f"answer to {t.question_id}" if t.question_id else t.kind
    where = f"On {t.anchor}: " if t.anchor else ""
    return f"({about} #{t.seq}{f', from {t.by}' if t.by else ''}) {where}{t.text}"


def _excerpt(text: str) -> str:
    flat = " ".join((text or "").split())
    return flat if len(flat) <= _EXCERPT else flat[:_EXCERPT - 1] + "…"
