"""The tools the server lists: each one's name, title, description, argument and result models, and hints.

Free of the SDK and of the kernel, so `taskkernel mcp` answers ``initialize`` and ``tools/list`` before the kernel
is opened (server.py); tools.py holds what each tool does.
"""

from __future__ import annotations

from dataclasses import dataclass

from taskkernel.coordinator.mcp import schemas as S


@dataclass(frozen=True)
class Tool:
    name: str
    title: str
    description: str
    args: type[S.Args]
    result: type[S.Out]
    read_only: bool
    destructive: bool = False


def _task_tool(verb: str, what: str, args: type[S.Args] = S.TaskArgs, destructive: bool = False) -> Tool:
    name = {"claim": "claim_task", "submit": "submit_task", "approve": "approve_task", "reject": "reject_task",
            "archive": "archive_task", "retry": "retry_task"}[verb]
    return Tool(name, f"{verb.capitalize()} a task", what, args, S.CommandOut, False, destructive)


_COMMAND_NOTE = (" Reads the task's revision and round itself; pass expect_rev/round to refuse if it moved "
                 "(stale_task_revision / stale_round). A refusal is an error result whose reason says why.")

TOOLS: tuple[Tool, ...] = (
    Tool("whoami", "Who am I", "The principal your credential stands for now (role, agent, the task and round "
         "it is scoped to), your own session for add_progress/resume, and the output budget.", S.NoArgs,
         S.WhoamiOut, True),
    Tool("list_tasks", "List tasks", "Tasks in id order, one page at a time: filter by state (blocked: active "
         "tasks whose latest report is blocked), assigned_to_me "
         "(you drive them), waiting_for_my_review (in review, you decide), root or parent. Continue with "
         "next_cursor (same filters).", S.ListTasksArgs, S.ListTasksOut, True),
    Tool("get_task", "Read a task", "A task's document, its reports with their bodies (and a done report's diff "
         "when the task has its own git worktree), its children and its newest history. A long body is cut: "
         "body_next gives the get_task arguments that read on.",
         S.GetTaskArgs, S.GetTaskOut, True),
    Tool("create_task", "Create a task", "A new task for a role of the team, sent by your role. An identical "
         "create by you replays (one task); pass idempotency_key for a deliberate twin.", S.CreateTaskArgs,
         S.CommandOut, False),
    _task_tool("claim", "Take an inbox task you drive: it becomes active and a round starts." + _COMMAND_NOTE),
    Tool("report", "Report on a task", "Report on your active task: status done|blocked|in_progress|aborted, "
         "a body and artifacts (paths or URLs). Retrying the same report replays it; a different report in the "
         "same round is new." + _COMMAND_NOTE, S.ReportArgs, S.CommandOut, False),
    _task_tool("submit", "Send your active task to review (needs a done report of this round)." + _COMMAND_NOTE),
    _task_tool("approve", "Approve a task in review (its done authority): it becomes done." + _COMMAND_NOTE),
    _task_tool("reject", "Send a task in review back to work with a reason: a new round starts." + _COMMAND_NOTE,
               S.RejectArgs),
    _task_tool("archive", "Archive a done task (its archive authority), with an optional reason." + _COMMAND_NOTE,
               S.ArchiveArgs, destructive=True),
    _task_tool("retry", "Try an active or in-review task again (ADMIN or its done authority): its round's block is "
               "lifted and a new run of its driver (active) or done authority (review) is due; retry_cannot_help "
               "says what to fix when a run cannot help." + _COMMAND_NOTE, S.RetryArgs),
    Tool("read_inputs", "Read what you were told", "The instructions people (or your leader) gave your task "
         "since you last read, in the order they were accepted; each is consumed once read. Every result carries "
         "pending_inputs while some wait: read them before you report done (a submit waits for them).",
         S.NoArgs, S.ReadInputsOut, False),
    Tool("say_to_task", "Tell a task's agent something", "Give an instruction to the agent working a task (ADMIN, "
         "its done authority or sender; a run's credential for its own children): message/steer reach it at its "
         "next tool call, queue at its next run, answer answers its question. A run is queued when none works "
         "the task.", S.SayArgs, S.SayOut, False),
    Tool("interrupt_task", "Stop a task's running agent", "Stop the running agent of a task (TERM, grace, KILL; "
         "its worktree kept) and resume it with message as its newest instruction.", S.InterruptArgs,
         S.InterruptOut, False, True),
    Tool("add_progress", "Record progress", "A progress checkpoint in your session (text, completed tool calls, "
         "done): the anchor resume continues from after a compaction.", S.AddProgressArgs, S.ProgressOut, False),
    Tool("resume", "Where to resume", "The resume answer for your session: the anchor (the last checkpoint before "
         "the latest compaction) and the instructions accepted after it, which take priority. anchor null "
         "(no_safe_anchor): nothing is resumed automatically.", S.ResumeArgs, S.ResumeOut, True),
    Tool("check_action", "Check a planned action", "The execution gate's verdict for an action you plan on your "
         "task (operation, entity, tool, the session inputs it is based on, the grant that permits it), judged "
         "against the session log now, without performing it. allowed: perform would pass.", S.ActionArgs,
         S.CheckActionOut, True),
    Tool("perform", "Perform a protected action", "A protected action of the driver on its active task, through "
         "the execution gate: on PASS it is authorized and the coordinator performs the tool; otherwise "
         "gate_blocked / gate_insufficient_evidence and nothing runs." + _COMMAND_NOTE, S.PerformArgs,
         S.CommandOut, False, True),
    Tool("usage", "Usage", "Units of work, wall time, tokens and cost per owner (root task, task, role, feature "
         "or agent), largest first.", S.UsageArgs, S.UsageOut, True),
)
TOOL_NAMES = tuple(t.name for t in TOOLS)
