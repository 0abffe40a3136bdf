"""The board's JSON API under ``/api`` (docs/web.md): the CLI's documents over HTTP, and the board's actions.

Reads run in worker threads (a slow database never blocks the event loop or the event feed). A refusal before any
command (no credential 401, a credential that stands for nobody 401, CSRF 403, a listing asked wrongly 400) is
``{"status": "rejected", "reason", "message"}``; a command's refusal is its own document (``submit``'s for a task
verb) with 404 or 409 (coordinator/web/actions.py).
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

import anyio.to_thread
from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import JSONResponse
from fastapi.sse import EventSourceResponse, ServerSentEvent

from taskkernel import __version__
from taskkernel.coordinator.inbox import waiting
from taskkernel.coordinator.runners.live import MAX_READ
from taskkernel.coordinator.web import reads
from taskkernel.coordinator.web.auth import CSRF_FIELD, Caller, Refused
from taskkernel.coordinator.web.events import LIVE
from taskkernel.coordinator.web.models import (
    ActionOutcome,
    CommandOutcome,
    EventSummary,
    Health,
    HostView,
    InstructionOutcome,
    InterruptOutcome,
    LiveOutput,
    NeedsYou,
    RunRow,
    SayBody,
    ScheduleView,
    SessionInput,
    SessionSummary,
    TaskDocument,
    TaskRow,
    UsageReport,
)
from taskkernel.coordinator.web.state import Board, board_of
from taskkernel.kernel.logging import get_logger
from taskkernel.kernel.model.principal import LOCAL_OWNER
from taskkernel.kernel.queries import DEFAULT_LIMIT, MAX_LIMIT, TaskQueryError, page_tasks
from taskkernel.kernel.reasons import ReasonCode
from taskkernel.kernel.sessionlog import SessionLogError, SessionReason
from taskkernel.kernel.usage import GROUPINGS, since_utc

log = get_logger(__name__)
router = APIRouter(prefix="/api")
INBOX_LIMIT = 100
RECHECK_SECONDS = 2.0  # an open event stream authenticates its credential again at most this long after the last
RISKS = ("low", "medium", "high", "irreversible")
REFUSALS: dict[int | str, dict[str, Any]] = {
    401: {"description": "no credential (a change), or one that stands for nobody; reason actor_unverified or "
                         "the credential's own code"},
    403: {"description": "a signed-in change without this sign-in's CSRF token: reason csrf_failed"},
    413: {"description": "a body over 4 MiB: reason payload_too_large"},
}
ACTED = REFUSALS | {404: {"description": "no such task"}, 409: {"description": "refused: reason says why"}}
# A change's body is read by the route, after its credential (``acting``): declared here for the schema only.
JSON_BODY = {"requestBody": {"required": False, "content": {"application/json": {"schema": {
    "type": "object", "additionalProperties": True}}}}}


def reader(request: Request) -> Caller | None:
    """The caller of a read, checked before a response starts (a dependency: the event stream's too)."""
    return board_of(request).gate.reader(request)


async def acting(request: Request) -> tuple[Board, Caller, dict[str, Any]]:
    """The board, the caller of a change and the change's JSON body, in that order: a request without a live
    credential is refused (401) before a byte of its body is read, then the body (a JSON object, empty for none)
    and, for a sign-in's cookie, its CSRF token (header or the body's ``csrf_token``, which is taken out)."""
    board = board_of(request)
    caller = board.gate.actor(request)
    raw = await request.body()
    try:
        fields = json.loads(raw) if raw.strip() else {}
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError; RecursionError: nested too deep
        raise Refused(400, ReasonCode.INVALID_COMMAND.value, "the body is not JSON") from None
    if fields is None:
        fields = {}
    if not isinstance(fields, dict):
        raise Refused(400, ReasonCode.INVALID_COMMAND.value, "the body must be a JSON object")
    csrf = fields.pop(CSRF_FIELD, None)
    board.gate.check_csrf(request, caller, csrf if isinstance(csrf, str) else None)
    return board, caller, fields


def refusal_response(exc: Refused) -> JSONResponse:
    return JSONResponse({"status": "rejected", "reason": exc.reason, "message": exc.message}, exc.status)


def answer(status: int, doc: dict[str, Any]) -> JSONResponse:
    return JSONResponse(doc, status)


@router.get("/tasks", response_model=list[TaskRow], responses={400: {"description": "a bad filter or cursor"}})
async def list_tasks(request: Request,
                     state: str | None = None, role: str | None = None, root: str | None = None,
                     risk: str | None = None,
                     limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = DEFAULT_LIMIT,
                     cursor: str | None = None) -> Any:
    """`taskkernel task list`: the tasks of one page in task id order; the next page's cursor is in the
    ``X-Next-Cursor`` header and a ``Link: <…>; rel="next"`` header (none on the last page)."""
    board = board_of(request)
    board.gate.reader(request)
    if risk is not None and risk not in RISKS:
        raise Refused(400, ReasonCode.INVALID_COMMAND.value, f"{risk!r} is not a risk level; choose one of "
                      f"{', '.join(RISKS)}")
    try:
        page = await anyio.to_thread.run_sync(lambda: page_tasks(
            board.db, state=state, role=role.upper() if role else None, root=root, risk=risk, limit=limit,
            after=cursor))
    except TaskQueryError as exc:
        raise Refused(400, ReasonCode.INVALID_COMMAND.value, str(exc)) from None
    if page.next_cursor is not None:
        headers = {"X-Next-Cursor": page.next_cursor,
                   "Link": f'<{request.url.include_query_params(cursor=page.next_cursor)}>; rel="next"'}
    else:
        headers = {}
    return JSONResponse(page.rows, headers=headers)  # exactly `task list`'s array: the model only documents it


@router.get("/tasks/{task_id}", response_model=TaskDocument,
            responses={404: {"description": "no such task: reason task_not_found"}})
async def show_task(request: Request, task_id: str) -> Any:
    """`taskkernel task show`: the task's document and history."""
    board = board_of(request)
    board.gate.reader(request)
    doc = await anyio.to_thread.run_sync(reads.task_show, board.db, task_id)
    if doc is None:
        raise Refused(404, ReasonCode.TASK_NOT_FOUND.value, f"{task_id} does not exist")
    return JSONResponse(doc)  # exactly `task show`'s document: the model only documents it


@router.get("/tasks/{task_id}/page", include_in_schema=False)
async def task_page_data(request: Request, task_id: str) -> Any:
    """Everything the task page shows (timeline, report bodies and patches, children, gate verdicts, grants,
    usage, runs) as JSON, for scripts."""
    board = board_of(request)
    caller = board.gate.reader(request)
    found = await anyio.to_thread.run_sync(reads.task_page, board.db, board.ws, board.session_log, board.inputs,
                                           task_id, caller.principal if caller else None)
    if found is None:
        raise Refused(404, ReasonCode.TASK_NOT_FOUND.value, f"{task_id} does not exist")
    return found


@router.get("/tasks/{task_id}/live", response_model=LiveOutput,
            responses={400: {"description": "a bad cursor or limit"}, 404: {"description": "no such task"}})
async def live_output(request: Request, task_id: str, after: str | None = None,
                      limit: Annotated[int, Query(ge=1, le=MAX_READ)] = reads.LIVE_SHOWN) -> Any:
    """The live output of the task's agents (typed run events, redacted when stored), oldest first: those stored
    after the cursor ``after`` (``RUN_ID:N``, the ``cursor`` of the previous answer), or without it the newest."""
    board = board_of(request)
    board.gate.reader(request)
    cursor = reads.parse_live_cursor(after) if after is not None else None
    if after is not None and cursor is None:
        raise Refused(400, ReasonCode.INVALID_COMMAND.value, f"after {after!r} is not a cursor RUN_ID:N")
    found = await anyio.to_thread.run_sync(reads.live_output, board.db, task_id, cursor, limit)
    if found is None:
        raise Refused(404, ReasonCode.TASK_NOT_FOUND.value, f"{task_id} does not exist")
    return found


@router.post("/tasks/{task_id}/grant", response_model=ActionOutcome, responses=REFUSALS, openapi_extra=JSON_BODY)
async def grant(request: Request, task_id: str) -> Any:
    """Grant a permission on the task (``{"permission": "approve"}``) into the grant session, as the refusal's hint
    says: `taskkernel session accept admin --kind allow …`. ADMIN only (the session log's rule)."""
    board, caller, body = await acting(request)
    permission = body.get("permission", "approve")
    status, doc = await anyio.to_thread.run_sync(board.actions.grant, caller.principal, task_id, str(permission))
    return answer(status, doc)


@router.post("/tasks/{task_id}/say", response_model=InstructionOutcome, responses=ACTED, openapi_extra={
    "requestBody": {"required": True, "content": {"application/json": {"schema": SayBody.model_json_schema()}}}})
async def say(request: Request, task_id: str) -> Any:
    """Tell the task's agent something (``{"text", "mode", "question_id", "input_id", "anchor"}``; ``anchor``
    ``PATH:LINE``, a line of its change: an inline comment on its diff), as `taskkernel task say`: ADMIN, the task's
    done authority or its sender, while it is in the inbox or active."""
    board, caller, body = await acting(request)
    status, doc = await anyio.to_thread.run_sync(board.actions.say, caller.principal, task_id, body)
    return answer(status, doc)


@router.post("/tasks/{task_id}/interrupt", response_model=InterruptOutcome, responses=ACTED,
             openapi_extra=JSON_BODY)
async def interrupt(request: Request, task_id: str) -> Any:
    """Stop the task's running agent (``{"message"}``: the resumed run's newest instruction), as `taskkernel task
    interrupt`."""
    board, caller, body = await acting(request)
    status, doc = await anyio.to_thread.run_sync(board.actions.interrupt, caller.principal, task_id, body)
    return answer(status, doc)


@router.post("/tasks/{task_id}/{verb}", response_model=CommandOutcome, responses=ACTED, openapi_extra=JSON_BODY)
async def task_verb(request: Request, task_id: str, verb: str) -> Any:
    """A task verb (claim, report, submit, approve, reject, reopen, archive, amend, retry) with the verb's fields as the
    JSON body (``{"reason": "…"}`` for reject), answered like `taskkernel submit`."""
    board, caller, fields = await acting(request)
    status, doc = await anyio.to_thread.run_sync(board.actions.task_verb, caller.principal, task_id, verb, fields)
    return answer(status, doc)


@router.post("/schedules/{name}/{verb}", response_model=ActionOutcome, responses=REFUSALS, openapi_extra=JSON_BODY)
async def schedule_action(request: Request, name: str, verb: str) -> Any:
    """Pause or resume a schedule (its creator, or ADMIN)."""
    board, caller, _ = await acting(request)
    status, doc = await anyio.to_thread.run_sync(board.actions.schedule, caller.principal, name, verb)
    return answer(status, doc)


@router.post("/goals/{goal_id}/cancel", response_model=ActionOutcome, responses=REFUSALS, openapi_extra=JSON_BODY)
async def cancel_goal(request: Request, goal_id: str) -> Any:
    """Cancel an active goal (the root task's authority)."""
    board, caller, _ = await acting(request)
    status, doc = await anyio.to_thread.run_sync(board.actions.cancel_goal, caller.principal, goal_id)
    return answer(status, doc)


@router.get("/runs", response_model=dict[str, list[RunRow]])
async def runs(request: Request) -> Any:
    """Runs now (elapsed, timeout), retries due, recent failures with their last log lines."""
    board = board_of(request)
    board.gate.reader(request)
    return await anyio.to_thread.run_sync(reads.runs_view, board.db, board.ws)


@router.get("/hosts", response_model=list[HostView])
async def hosts(request: Request) -> Any:
    """The team's machines on this store, as `taskkernel hosts`: heartbeat, live, roles, slots, running runs."""
    from taskkernel.coordinator.hosts import listing

    board = board_of(request)
    board.gate.reader(request)
    return await anyio.to_thread.run_sync(listing, board.db)


@router.get("/schedules", response_model=list[ScheduleView])
async def schedules(request: Request) -> Any:
    """Every schedule: next fires, watermark, recent outcomes (missed ones with their reasons)."""
    board = board_of(request)
    board.gate.reader(request)
    found = await anyio.to_thread.run_sync(reads.schedules_view, board.db)
    return JSONResponse(found)  # `schedule show`'s documents whole: the model only documents them


@router.get("/usage", response_model=UsageReport, responses={400: {"description": "a bad by or since"}})
async def usage(request: Request, by: str = "root", since: str | None = None) -> Any:
    """`taskkernel usage --by …`, plus spend per owner per day."""
    board = board_of(request)
    board.gate.reader(request)
    if by not in GROUPINGS:
        raise Refused(400, ReasonCode.INVALID_COMMAND.value, f"by must be one of {', '.join(GROUPINGS)}")
    since_iso = since_utc(since) if since else None
    if since and since_iso is None:
        raise Refused(400, ReasonCode.INVALID_COMMAND.value, f"since {since!r} is neither an ISO time nor an age "
                      "such as 30m, 24h, 7d")
    return await anyio.to_thread.run_sync(reads.usage_view, board.db, by, since_iso)


@router.get("/sessions", response_model=list[SessionSummary])
async def sessions(request: Request) -> Any:
    """The session logs the signed-in caller may read (ADMIN: all), as `taskkernel session list`."""
    board = board_of(request)
    caller = board.gate.reader(request)
    if caller is None:
        raise Refused(401, ReasonCode.ACTOR_UNVERIFIED.value, "a session log is read by its owner or ADMIN: sign in")
    return await anyio.to_thread.run_sync(board.session_log.sessions, caller.principal)


@router.get("/sessions/{session}/inputs", response_model=list[SessionInput])
async def session_inputs(request: Request, session: str) -> Any:
    """A session's inputs in acceptance order; readable by its owner or ADMIN (signed in)."""
    board = board_of(request)
    found = await session_inputs_for(board, board.gate.reader(request), session)
    return JSONResponse(found)  # exactly `session export`'s records (unsigned): the model only documents them


async def session_inputs_for(board: Board, caller: Caller | None, session: str) -> list[dict[str, Any]]:
    """A session's inputs for a reader who may read them (its owner or ADMIN, signed in): else 401, 403, or 404
    ``unknown_session``."""
    if caller is None:
        raise Refused(401, ReasonCode.ACTOR_UNVERIFIED.value, "a session log is read by its owner or ADMIN: sign in")
    try:
        board.session_log.check_read(session, caller.principal)
    except SessionLogError as exc:
        raise Refused(403, exc.reason.value, exc.message) from None
    found = await anyio.to_thread.run_sync(reads.session_inputs, board.session_log, session)
    if found is None:
        raise Refused(404, SessionReason.UNKNOWN_SESSION.value, f"no session {session!r}")
    return found


@router.get("/needs-you", response_model=NeedsYou)
async def needs_you(request: Request, role: str | None = None) -> Any:
    """`taskkernel inbox`: reviews to decide, approvals that need a grant, blocked tasks. Signed in: your role's
    (ADMIN: every role, or ``role``); not signed in: every role."""
    board = board_of(request)
    caller = board.gate.reader(request)
    principal = caller.principal if caller else None
    who = role.upper() if role else None
    if principal is not None and not principal.is_admin:
        if who is not None and who != principal.role:
            raise Refused(403, ReasonCode.ROLE_NOT_AUTHORIZED.value, "only an unscoped ADMIN may look at another "
                          f"role's inbox (caller: {principal.id}, asked for {who})")
        who = principal.role
    found = await anyio.to_thread.run_sync(functools.partial(
        waiting, board.db, board.grant_sessions, who, principal or LOCAL_OWNER, INBOX_LIMIT, workspace=board.ws))
    return {"status": "ok", "role": who, **found}


@router.get("/events", response_class=EventSourceResponse, responses={200: {"model": EventSummary}})
async def events(request: Request, caller: Annotated[Caller | None, Depends(reader)],
                 last_event_id: Annotated[str | None, Header()] = None,
                 after: int | None = None, live: str | None = None) -> AsyncIterator[ServerSentEvent]:
    """One server-sent event per committed event (``id:`` its global position, ``data:`` an EventSummary, the
    default event name ``message``); ``Last-Event-ID`` (or ``after``) replays what was missed first. An event named
    ``reset`` says more was missed than is replayed: reload what you show. With ``live`` (a task id), an event named
    ``live`` says that task's agents printed more: fetch ``/api/tasks/{id}/live`` after your cursor."""
    board = board_of(request)
    last_seen = after
    if last_event_id is not None and last_event_id.isdigit():
        last_seen = int(last_event_id)
    checked = time.monotonic()
    async for item in board.hub.follow(last_seen, RECHECK_SECONDS, live):
        if caller is not None and time.monotonic() - checked >= RECHECK_SECONDS:
            try:  # a credential revoked (or a sign-in ended) while the stream is open ends the stream
                await anyio.to_thread.run_sync(lambda: board.gate.reader(request, heartbeat=False))
                checked = time.monotonic()
            except Refused:
                return
            except Exception as exc:  # noqa: BLE001 - the store, not the credential, failed: keep the stream
                log.warning("event_stream_recheck_failed", error=f"{type(exc).__name__}: {exc}"[:300])
        if item["type"] == "idle":
            continue
        if item["type"] == "reset":
            yield ServerSentEvent(id=str(item["global_pos"]), event="reset", data=item)  # a reconnect resumes here
        elif item["type"] in ("state_changed", LIVE):  # no event of the log: no id, a reconnect's position stays
            yield ServerSentEvent(event=item["type"], data=item)
        else:
            yield ServerSentEvent(id=str(item["global_pos"]), data=item)


async def health(request: Request) -> Health:
    board: Board = board_of(request)
    position = await anyio.to_thread.run_sync(reads.log_position, board.db)
    return Health(status="ok", version=__version__, database=board.db.dialect, log_position=position)
