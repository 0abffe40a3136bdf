"""Kernel commands: init, token, submit, task, log (and `log --follow`, `task watch`: streams that poll the event
store by global position, never building the command kernel)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import typer

from taskkernel.coordinator.cli import steer, task_verbs
from taskkernel.coordinator.cli.common import Exit, emit, fail, fail_config, get_ctx, reject, say, show, warn
from taskkernel.coordinator.cli.output import dumps, human_mode, oneline, table_of
from taskkernel.coordinator.config import ConfigError
from taskkernel.coordinator.config_template import AGENT_CHOICES
from taskkernel.coordinator.fcop import FcopError
from taskkernel.coordinator.workspace import DEFAULT_TEAM, TEAM_PRESETS, init_workspace
from taskkernel.kernel.credentials import (
    CREDENTIAL_ID_LEN,
    REVOKED_BY_OWNER,
    hashes_named,
    issue_token,
    list_credentials,
    revoke_hash,
    token_hash,
)
from taskkernel.kernel.model.ids import TASK_ID_RE
from taskkernel.kernel.model.principal import LOCAL_OWNER
from taskkernel.kernel.model.task import TARGET_STATE_OF_EVENT, TaskState, task_stream
from taskkernel.kernel.private import write_private
from taskkernel.kernel.reasons import KernelError, ReasonCode
from taskkernel.kernel.store.events import RecordedEvent
from taskkernel.kernel.text import terminal_text

STATES = (*(s.value for s in TaskState), "blocked")  # = kernel.queries.LIST_STATES (not imported: no SQLAlchemy here)
POLL_SECONDS = 0.2  # how often `log --follow` and `task watch` look for new events
WATCH_ENDS = frozenset({TaskState.DONE.value, TaskState.ARCHIVE.value})  # where `task watch` stops

task_app = typer.Typer(no_args_is_help=True, help="Tasks: list and show them, and act on them in one call.")
token_app = typer.Typer(no_args_is_help=True, help="Credentials.")


def register(app: typer.Typer) -> None:
    app.command("init")(init)
    app.command("submit")(submit)
    app.command("log")(log)
    app.add_typer(task_app, name="task")
    app.add_typer(token_app, name="token")


def init(ctx: typer.Context, directory: Path = typer.Argument(Path("."), help="Workspace root."),
         team: str = typer.Option(None, "--team", show_default=False,
                                  help=f"Team preset: {', '.join(TEAM_PRESETS)} (default for a new FCoP "
                                       f"workspace: {DEFAULT_TEAM})."),
         agents: str = typer.Option(None, "--agents", show_default=False,
                                    help=f"Run every role of the team on this agent CLI: {', '.join(AGENT_CHOICES)} "
                                         "(without it, no role runs until you add its table)."),
         fcop: str = typer.Option(None, "--fcop", show_default=False,
                                  help="FCoP generation of a new workspace: g3 (default: dated file names people "
                                       "and agents write by hand) or g4 (fcop 4's Core and fcop-mcp 4's tools; "
                                       "docs/fcop4.md).")) -> None:
    """Create the workspace: .taskkernel/kernel.db, taskkernel.toml and, in a project without any, the FCoP
    folders. An existing FCoP workspace (fcop/ or docs/agents/) is left exactly as it is. Inside a git
    repository, .taskkernel/ is added to .gitignore. With --agents, taskkernel.toml runs every role on that CLI."""
    if team is not None and team not in TEAM_PRESETS:
        fail(Exit.USAGE, f"unknown team preset {team!r}; choose one of {', '.join(TEAM_PRESETS)}")
    if agents is not None and agents not in AGENT_CHOICES:
        fail(Exit.USAGE, f"--agents {agents!r}: choose one of {', '.join(AGENT_CHOICES)}")
    if fcop is not None and fcop not in ("g3", "g4"):
        fail(Exit.USAGE, f"--fcop {fcop!r}: choose g3 or g4")
    c = get_ctx(ctx)
    try:
        done = init_workspace(directory, team, c.db_url or os.environ.get("TASKKERNEL_DB"), agents, fcop)
    except FcopError as exc:  # both fcop/ and docs/agents/: nothing was written
        fail(Exit.REJECTED, str(exc), reason=exc.reason.value)
    except ConfigError as exc:  # the existing taskkernel.toml cannot be used
        fail_config(exc)
    except ValueError as exc:  # --team against the team already named; an unreadable fcop.json or [team]
        fail(Exit.USAGE, str(exc))
    except OSError as exc:
        fail(Exit.INTERNAL, f"cannot create the workspace at {directory}: {exc}")
    ws, t = done.workspace, done.team
    c.workspace_path = str(ws.root)
    c.database(writes=True)
    if ws.require_token and not ws.owner_token_path.exists():
        owner_token = issue_token(c.database(), LOCAL_OWNER.role, LOCAL_OWNER.agent)
        with contextlib.suppress(FileExistsError):  # a concurrent init wrote it first: theirs stands
            write_private(ws.owner_token_path, (owner_token + "\n").encode("ascii"))
    emit({"status": "ok", "workspace": str(ws.root), "database": c.database().url, "fcop_root": str(done.fcop_root),
          "fcop_created": done.laid_out, "team": t.name, "leader": t.leader, "roles": t.roles,
          "team_source": t.source, "gitignored": done.gitignored,
          "runners": {role.upper(): spec.runner for role, spec in ws.config.roles.items()}}, generic=False)
    where = "laid out" if done.laid_out else "found (left as it is)"
    say(("workspace ready", "green"), f" at {ws.root}; FCoP folder {done.fcop_root} {where}")
    say(f"team {t.name} from {t.source}: leader {t.leader}, roles {', '.join(t.roles)}")
    if done.gitignored:
        say("added .taskkernel/ to .gitignore (database, run logs and worktrees are never committed)")
    if agents is not None and ws.config.roles:
        say(f"roles {', '.join(r.upper() for r in ws.config.roles)} run {agents}: `taskkernel doctor` says what is "
            "still missing (the CLI on PATH, a credential), then `taskkernel up`")
    if done.note:
        say(("note:", "yellow"), f" {done.note}")


@token_app.command("issue")
def token_issue(ctx: typer.Context, role: str = typer.Argument(..., help="Role code, e.g. DEV."),
                agent: str = typer.Option(None, "--agent", help="Agent name (default: the role in lower case)."),
                task: str = typer.Option(None, "--task", help="Scope the credential to one task."),
                round_: int = typer.Option(None, "--round", help="Scope the credential to one round of --task.")
                ) -> None:
    """Print a new credential (the token alone, one line)."""
    if round_ is not None and task is None:
        fail(Exit.USAGE, "--round needs --task")
    c = get_ctx(ctx)
    c.database(writes=True)
    c.require_admin("issuing credentials")
    token = issue_token(c.database(), role.upper(), agent, task_id=task, round=round_)
    sys.stdout.write(token + "\n")


@token_app.command("list")
def token_list(ctx: typer.Context) -> None:
    """Every credential (id, role, agent, scope, issued, revoked): never a secret."""
    c = get_ctx(ctx)
    c.require_admin("listing credentials")
    rows = list_credentials(c.database())
    emit(rows)  # on a terminal: the generic table (no column ever holds a secret)
    say(f"{len(rows)} credential(s), {sum(1 for r in rows if r['revoked_at'] is None)} live")


@token_app.command("revoke")
def token_revoke(ctx: typer.Context, ident: str = typer.Argument(
        ..., metavar="ID", help="A credential id from `token list` (8+ hex digits), or the token itself.")) -> None:
    """Revoke a credential: every later use of it is actor_unverified."""
    c = get_ctx(ctx)
    c.database(writes=True)
    c.require_admin("revoking credentials")
    db = c.database()
    found = hashes_named(db, ident)
    if not found:
        reject("not_found", f"no credential {ident!r} (see `taskkernel token list`)")
    if len(found) > 1:
        fail(Exit.USAGE, f"{ident!r} names {len(found)} credentials; give more digits")
    if c.used_token is not None and token_hash(c.used_token) == found[0]:
        reject("own_credential", "that is the credential this command runs with; revoke it from another one")
    revoked = revoke_hash(db, found[0], REVOKED_BY_OWNER)
    emit({"status": "ok", "id": found[0][:CREDENTIAL_ID_LEN], "revoked": revoked}, generic=False)
    say(("revoked", "green") if revoked else ("already revoked", "yellow"), f" {found[0][:CREDENTIAL_ID_LEN]}")


def submit(ctx: typer.Context, source: str = typer.Argument("-", metavar="[FILE|-]",
                                                            help="Command JSON file, or - for stdin.")) -> None:
    """Submit one command (JSON) to the TaskCommandKernel."""
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8-sig")
        raw = json.loads(text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        fail(Exit.DATAERR, f"cannot read a JSON command from {source}: {exc}")
    c = get_ctx(ctx)
    c.current_database()  # refused while the schema is behind (or ahead of) this code
    kernel = c.kernel()
    command = raw if isinstance(raw, dict) else {"type": None, "payload": raw}
    caller = c.try_principal()
    if isinstance(caller, KernelError):  # the shape is still judged first: a malformed command says so
        result = kernel.submit(command, None, external=True)
        if result.reason == ReasonCode.ACTOR_UNVERIFIED.value:
            result = result.model_copy(update={"reason": caller.reason.value, "message": caller.message})
    else:
        result = kernel.submit(command, caller, external=True)
    emit(result.wire(), generic=False)
    colour = {"accepted": "green", "replayed": "cyan", "rejected": "red"}[result.status]
    (warn if result.status == "rejected" else say)((result.status, colour), f" {result.reason or ''} {result.message}")
    raise typer.Exit(int(Exit.REJECTED if result.status == "rejected" else Exit.OK))


def _event_json(ev: RecordedEvent) -> dict[str, Any]:
    return {"global_pos": ev.global_pos, "stream": ev.stream_id, "version": ev.stream_version, "type": ev.type,
            "schema_version": ev.schema_version, "data": ev.data, "meta": ev.meta, "recorded_at": ev.recorded_at,
            "hash": ev.hash}


@task_app.command("show")
def task_show(ctx: typer.Context, task_id: str) -> None:
    """A task's current state, reports and history."""
    from taskkernel.coordinator.fcop4.aliases import resolve_task_id
    from taskkernel.coordinator.showing import task_show as show_document

    db = get_ctx(ctx).database()
    doc = show_document(db, resolve_task_id(db, task_id))  # an FCoP 4 file's id answers for its task
    if doc is None:
        reject("task_not_found", f"{task_id} does not exist (see `taskkernel task list`)")
    emit(doc, _render_task)


def _render_task(doc: dict[str, Any]) -> None:
    from taskkernel.kernel.queries import shown_state

    say(f"{doc['task_id']} ", (shown_state(doc), "bold"),
        f" rev {doc['revision']} round {doc['round']}: {oneline(doc['subject'])}")
    if doc["blocked"]:
        b = doc["blocked"]
        say(("blocked", "red"), f" by {b['by']} at {b['at']} (report {b['report_id']}): {oneline(b['reason'])}")
    if merge := doc.get("merge"):
        if merge["status"] == "merged":
            say(("merged", "green"), f" into {merge['base']} at {merge['commit'][:12]} ({merge['how']}, {merge['at']})")
        else:
            say(("merge failed", "red"), f": {oneline(merge['error'])} (fix it, then `taskkernel task merge "
                f"{doc['task_id']}`)")
    if doc.get("inputs_pending"):
        say(("inputs pending", "yellow"), f": {doc['inputs_pending']} instruction(s) its agent has not read; it is "
            f"not submitted for review until it has (`taskkernel task inputs {doc['task_id']}`)")
    show(table_of({k: doc.get(k) for k in ("sender", "recipient", "priority", "risk_level", "parent", "root",
                                          "thread_key", "assignee", "lease") if doc.get(k) is not None}))
    if doc.get("body"):
        say(doc["body"])  # its lines kept; `say` escapes its control characters (kernel/text.py)
    if doc.get("reports"):
        show(table_of([{k: v for k, v in r.items() if k not in ("diff", "body")} for r in doc["reports"]],
                      title="reports"))
    for report in doc.get("reports", ()):
        if report.get("body"):  # what the report says, as a block: its lines kept, under the terminal rule
            say((f"report {report['report_id']}", "bold"), f" ({report['status']} by {report['by']}, "
                f"round {report['round']}):")
            say(report["body"])
        if report.get("diff"):
            _render_diff(report)
    if doc.get("records"):
        show(table_of(doc["records"], title="records"))
    show(table_of(doc["history"], title="history"))


def _render_diff(report: dict[str, Any]) -> None:
    """A done report's diffstat (docs/agents.md): the range, the totals, a line per file, the patch file."""
    d = report["diff"]
    if "error" in d:
        say(("diff", "bold"), f" of {report['report_id']}: not recorded ({oneline(d['error'])})")
        return
    say(("diff", "bold"), f" of {report['report_id']} ({d['branch']} against {d['base']}, {d['range']}): "
        f"{d['files_changed']} file(s) changed, +{d['insertions']} -{d['deletions']}; patch {d['patch']}")
    for f in d.get("files", ()):
        binary = f"binary, {f['bytes']} bytes" if "bytes" in f else "binary"
        say(f"  {oneline(f['path'])} | " + (binary if f.get("binary") else f"+{f['insertions']} -{f['deletions']}"))
    if d["files_changed"] > len(d.get("files", ())):
        say(f"  … {d['files_changed'] - len(d.get('files', ()))} more in the patch")
    if d.get("protected"):  # what the agent wrote over the coordinator's own files: never merged, worth a look
        say(("left out", "red"), f": {d['protected_count']} path(s) of the coordinator's own files the agent wrote")
        for p in d["protected"]:
            say(f"  {oneline(p['path'])} ({p['reason']})")


@task_app.command("diff")
def task_diff(ctx: typer.Context, task_id: str,
              round_: int | None = typer.Option(None, "--round", min=0, max=2**31,
                                                help="The done report of this round (default: the latest round "
                                                     "with a recorded diff).")) -> None:
    """The patch a task's done report recorded, checked against its recorded SHA-256 (like `gh pr diff`)."""
    from taskkernel.coordinator.cli import output
    from taskkernel.coordinator.fcop4.aliases import resolve_task_id
    from taskkernel.kernel.queries import PatchRefused, recorded_patch

    c = get_ctx(ctx)
    ws = c.workspace()  # the patch files live in its evidence folder
    task_id = resolve_task_id(c.database(), task_id)  # a migrated task's FCoP 4 file id names its task
    found = recorded_patch(c.database(), ws.root, ws.state_dir / "evidence", task_id, round_)
    if isinstance(found, PatchRefused):
        reject(found.code, found.message, task_id=task_id)
    text = found.patch.decode("utf-8", errors="replace")
    if output.json_asked():  # asked for (a pipe alone gets the patch itself, as `gh pr diff` prints it)
        emit({"task_id": found.task_id, "round": found.round, "report_id": found.report_id, "patch": text,
              "patch_sha256": found.patch_sha256, "files": found.files})
    elif sys.stdout.isatty():  # a patch is data: it may not drive the terminal (its lines and tabs kept)
        sys.stdout.write(terminal_text(text, lines=True) + ("" if text.endswith("\n") else "\n"))
    else:  # byte for byte what was recorded, for `git apply` and friends
        sys.stdout.flush()
        sys.stdout.buffer.write(found.patch)
    sys.stdout.flush()


@task_app.command("list")
def task_list(ctx: typer.Context,
              state: str | None = typer.Option(None, "--state", help=(
                  f"Only tasks in this state: {', '.join(STATES)}. blocked: active tasks whose latest report of "
                  "the round is blocked; active: the active tasks that are not blocked.")),
              role: str | None = typer.Option(None, "--role",
                                              help="Only tasks addressed to this role (the recipient)."),
              limit: int = typer.Option(50, "--limit", help="Tasks per page (1 to 1000)."),
              cursor: str | None = typer.Option(None, "--cursor",
                                                help="Continue after the page that printed this cursor."),
              every: bool = typer.Option(False, "--all", help="Every task, streamed (JSON: one line per task)."),
              ) -> None:
    """Tasks in task id order, one page at a time (JSON: an array; with --all, JSON lines)."""
    from taskkernel.kernel.queries import TaskQueryError, iter_tasks, page_tasks

    if state and state not in STATES:
        fail(Exit.USAGE, f"--state {state!r} is not a task state; choose one of {', '.join(STATES)}")
    role = role.upper() if role else None
    db = get_ctx(ctx).database()
    try:
        if every:
            with contextlib.closing(iter_tasks(db, state, role, after=cursor)) as stream:
                _stream_tasks(stream)
            return
        page = page_tasks(db, state=state, role=role, limit=limit, after=cursor)
    except TaskQueryError as exc:
        fail(Exit.USAGE, str(exc))
    emit(page.rows, _render_tasks)
    if page.next_cursor is not None:  # the stable line scripts read (stderr in JSON mode; see docs/cli.md)
        say(f"next page: --cursor {page.next_cursor}")


def _stream_tasks(rows: Iterator[dict[str, Any]]) -> None:
    """Every task as it is read: JSON lines, or one line per task on a terminal (no table held in memory)."""
    from taskkernel.kernel.queries import shown_state

    count = 0
    human = human_mode()
    for row in rows:
        count += 1
        if human:
            say(f"{row['task_id']}  {shown_state(row):<7} rev {row['revision']} round {row['round']}  "
                f"{row['sender']}→{row['recipient']}  {oneline(row['subject'])}")
        else:
            sys.stdout.write(dumps(row) + "\n")
    say(f"{count} task(s)")


def _render_tasks(rows: list[dict[str, Any]]) -> None:
    from rich.table import Table
    from rich.text import Text

    from taskkernel.kernel.queries import shown_state

    table = Table("task", "state", "rev", "round", "route", "subject")
    for d in rows:
        table.add_row(Text(d["task_id"]), Text(shown_state(d)), str(d["revision"]), str(d["round"]),
                      Text(oneline(f"{d['sender']}→{d['recipient']}")), Text(oneline(d["subject"])))
    show(table)
    say(f"{len(rows)} task(s)")


def log(ctx: typer.Context, stream: str = typer.Option(None, "--stream", help="Only this stream, e.g. task:ID."),
        from_pos: int = typer.Option(1, "--from", min=1, max=2**53, help="First global position."),
        follow: bool = typer.Option(False, "--follow", "-f", help=(
            "Then keep printing events as they commit, until SIGINT/SIGTERM (exit 0)."))) -> None:
    """Events in global (commit) order (JSON: one line per event)."""
    if stream and TASK_ID_RE.match(stream):  # a bare task id names its stream
        stream = f"task:{stream}"
    from taskkernel.kernel.queries import event_reader
    from taskkernel.kernel.store.events import log_end

    db = get_ctx(ctx).database()
    store = event_reader()
    with _quiet_stop() if follow else contextlib.nullcontext(_Stop()) as stop:
        with db.read() as conn:
            end = log_end(conn)[0]  # first: every position up to it has committed (they commit in order)
            events = store.read_stream(conn, stream) if stream else store.read_all(conn, from_pos)
            for ev in events:
                if ev.global_pos > end:
                    break
                if ev.global_pos >= from_pos:
                    _print_event(ev)
        if follow:
            _follow(db, max(end, from_pos - 1), stream, stop, _print_and_go_on)


def _print_event(ev: RecordedEvent) -> None:
    """One event: a JSON line for scripts, a readable line on a terminal (flushed: a stream is read live)."""
    if human_mode():
        say(f"{ev.global_pos:>6} {oneline(ev.stream_id)} v{ev.stream_version} {ev.type} by "
            f"{oneline(str(ev.data.get('by') or ev.meta.get('actor', '-')))} at {ev.recorded_at}")
    else:
        sys.stdout.write(dumps(_event_json(ev)) + "\n")
        sys.stdout.flush()


def _print_and_go_on(ev: RecordedEvent) -> bool:
    _print_event(ev)
    return True


class _Stop:
    """Set by SIGINT/SIGTERM while a stream follows the log: the stream ends quietly with exit 0."""

    requested = False


@contextlib.contextmanager
def _quiet_stop() -> Iterator[_Stop]:
    """For the whole of a follow: SIGINT and SIGTERM stop it quietly with exit 0, at the latest one poll interval
    later; a reader that went away (a closed pipe) ends it the same way."""
    stop = _Stop()

    def handler(signum: int, frame: object) -> None:
        stop.requested = True

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    except BrokenPipeError:
        with contextlib.suppress(OSError):  # nobody reads any more: nothing left to say, not even at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(0) from None
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
    if stop.requested:
        raise typer.Exit(0)


def _follow(db: Any, after: int, stream: str | None, stop: _Stop, on_event: Callable[[RecordedEvent], bool],
            deadline: float | None = None, each_poll: Callable[[], None] | None = None) -> bool:
    """Poll the event store every POLL_SECONDS for the events past global position ``after`` (only ``stream``'s
    when given) and hand each to ``on_event`` in commit order. True as soon as ``on_event`` says False (enough);
    False at ``deadline``; a stop request ends the command (exit 0). Each poll reads the log's end first, then
    the events up to it: positions are handed out under the writer lock and commit in order, so every position
    up to the end has committed and none is skipped or repeated, and a poll costs the events since the last one."""
    from taskkernel.kernel.queries import event_reader
    from taskkernel.kernel.store.events import log_end

    store = event_reader()
    while not stop.requested:
        with db.read() as conn:
            end = log_end(conn)[0]
            if end > after:
                for ev in store.read_all(conn, after + 1, batch=1000, stream_prefix=stream):
                    if ev.global_pos > end:
                        break
                    if (stream is None or ev.stream_id == stream) and not on_event(ev):
                        return True
                after = end
        if each_poll is not None:
            each_poll()
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(POLL_SECONDS)
    raise typer.Exit(0)


@task_app.command("watch")
def task_watch(ctx: typer.Context, task_id: str,
               timeout: float | None = typer.Option(None, "--timeout", min=0, help=(
                   "Give up after this many seconds: exit 1 (error code timeout) unless the task is done or "
                   "archived by then."))) -> None:
    """Follow a task until it is done or archived: its events so far, then each as it commits (JSON: one line
    per event); exit 0 when it gets there, or on SIGINT/SIGTERM."""
    from taskkernel.coordinator.fcop4.aliases import resolve_task_id
    from taskkernel.kernel.queries import task_document, task_history

    deadline = None if timeout is None else time.monotonic() + timeout
    db = get_ctx(ctx).database()
    task_id = resolve_task_id(db, task_id)  # a migrated task's FCoP 4 file id follows its task
    if task_document(db, task_id) is None:
        reject("task_not_found", f"{task_id} does not exist (see `taskkernel task list`)")
    watched = _Watched()
    live = _LiveOutput(db, task_id)
    with _quiet_stop() as stop:
        for ev in task_history(db, task_id):
            if not watched.show(ev):
                say(f"{task_id} is {watched.state}")
                return
        live.show_new()
        if _follow(db, watched.at, task_stream(task_id), stop, watched.show, deadline, each_poll=live.show_new):
            live.show_new()
            say(f"{task_id} is {watched.state}")
            return
    fail(Exit.INTERNAL, f"{task_id} is still {watched.state} after {timeout:g} s (--timeout): not done or archived",
         error="timeout", task_id=task_id, state=watched.state)


class _LiveOutput:
    """A watched task's agents' live output: its run events not shown yet, printed as `runs follow` prints them."""

    def __init__(self, db: Any, task_id: str) -> None:
        import sqlalchemy as sa

        from taskkernel.coordinator.tables import run_events

        self.db, self.task_id = db, task_id
        self.after: tuple[str, int] | None = None  # the last event shown
        with db.read() as conn:  # a database from before migration 0008 has no live output to show
            self.kept = sa.inspect(conn).has_table(run_events.name)

    def show_new(self) -> None:
        from taskkernel.coordinator.cli.runs import print_run_event
        from taskkernel.coordinator.runners.live import read_events

        if not self.kept:
            return
        for event in read_events(self.db, task_id=self.task_id, after=self.after, limit=1000):
            print_run_event(event)
            self.after = (event["run_id"], event["n"])
        sys.stdout.flush()


class _Watched:
    """A watched task's lifecycle state, followed from its events as they are printed (so the last event is
    always shown before the watch ends)."""

    def __init__(self) -> None:
        self.state: str = TaskState.INBOX.value
        self.at = 0  # the global position of the last event shown

    def show(self, ev: RecordedEvent) -> bool:
        """Print the event; False once the task is where a watch ends."""
        _print_event(ev)
        target = TARGET_STATE_OF_EVENT.get(ev.type)
        if ev.type in ("task_created", "task_adopted"):
            self.state = str(ev.data.get("state", TaskState.INBOX.value))
        elif target is not None:
            self.state = target.value
        self.at = ev.global_pos
        return self.state not in WATCH_ENDS


task_verbs.attach(task_app)  # create, claim, report, submit, approve, reject, reopen, archive, amend
steer.attach(task_app)  # say, interrupt, inputs
