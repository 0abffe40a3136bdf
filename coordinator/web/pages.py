"""The board's HTML pages (server-rendered Jinja2, a little JavaScript in static/board.js for the live feed and the
buttons), sign-in and sign-out.

A page shows the buttons its viewer's role may use (the kernel still judges every click): approve, reject and
reopen for the task's done_authority (and retry, on an active or in-review task), archive for its
archive_authority, a grant for ADMIN where an approval needs one, pause and resume on schedules, cancel on a root
task's active goal; to whoever may instruct a task in work, a message box for its agent, comments on the lines of
its newest diff (sent at once, anchored to the line) and, while its agent runs, an interrupt button; to the
authority deciding a review, comments on the lines of the diff gathered into the rejection's reason. Every form
carries the sign-in's CSRF token.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio.to_thread
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from taskkernel import __version__
from taskkernel.coordinator.inbox import waiting
from taskkernel.coordinator.web import reads
from taskkernel.coordinator.web.api import RISKS, session_inputs_for
from taskkernel.coordinator.web.auth import COOKIE, CSRF_FIELD, Caller, Refused, check_same_origin
from taskkernel.coordinator.web.state import Board, board_of
from taskkernel.kernel.credentials import token_hash
from taskkernel.kernel.goals import GoalService
from taskkernel.kernel.instructions import IN_WORK, check_instructor
from taskkernel.kernel.model.commands import CommandType
from taskkernel.kernel.model.principal import LOCAL_OWNER
from taskkernel.kernel.queries import TaskQueryError
from taskkernel.kernel.reasons import ReasonCode
from taskkernel.kernel.usage import GROUPINGS
from taskkernel.kernel.verbs import grant_hint

router = APIRouter(include_in_schema=False)
templates = Jinja2Templates(directory=Path(__file__).parent / "templates")
NEEDS_LIMIT = 100


def render(request: Request, name: str, caller: Caller | None, status: int = 200, **context: Any) -> HTMLResponse:
    return templates.TemplateResponse(request, name, {
        "caller": caller, "csrf": caller.csrf if caller else None, "version": __version__,
        "log_position": getattr(request.state, "log_position", None),
        "signed_in": caller is not None and caller.via == "cookie", **context}, status_code=status)


async def page(request: Request, name: str, caller: Caller | None, status: int = 200, **context: Any
               ) -> HTMLResponse:
    """``render`` in a worker thread: a board of 250 cards takes ~10 ms to render, which the event loop (and every
    open event stream) would otherwise wait for."""
    return await anyio.to_thread.run_sync(lambda: render(request, name, caller, status, **context))


async def reading(request: Request) -> tuple[Board, Caller | None]:
    """The board and the reader of a page, and the log's position before the page reads anything: the page's live
    feed starts right after it (``data-log-position``), so nothing committed meanwhile is missed."""
    board = board_of(request)
    caller = board.gate.reader(request)
    request.state.log_position = await anyio.to_thread.run_sync(reads.log_position, board.db)
    return board, caller


def error_page(request: Request, status: int, reason: str, message: str) -> HTMLResponse:
    return render(request, "error.html", None, status, reason=reason, message=message)


def may(caller: Caller | None, role: str | None) -> bool:
    """Whether the caller's role is ``role`` (an authority of the task) or an unscoped ADMIN."""
    if caller is None:
        return False
    p = caller.principal
    return p.is_admin or (p.task_id is None and p.role == role)


templates.env.globals["may"] = may


@router.get("/", response_class=HTMLResponse)
async def board_page(request: Request, role: str | None = None, root: str | None = None,
                     risk: str | None = None) -> Response:
    board, caller = await reading(request)
    if risk and risk not in RISKS:
        raise Refused(400, ReasonCode.INVALID_COMMAND.value, f"{risk!r} is not a risk level; choose one of "
                      f"{', '.join(RISKS)}")
    filters = reads.Filters(role.upper() if role else None, root or None, risk or None)
    try:
        columns = await anyio.to_thread.run_sync(reads.board, board.db, board.grant_sessions, filters)
    except TaskQueryError as exc:
        raise Refused(400, ReasonCode.INVALID_COMMAND.value, str(exc)) from None
    return await page(request, "board.html", caller, columns=columns, filters=filters, risks=RISKS,
                  roles=_team_roles(board))


def _team_roles(board: Any) -> list[str]:
    """The team's roles for the role filter (none when the team cannot be read: the filter still takes any)."""
    from taskkernel.coordinator.config import ConfigError

    try:
        return list(board.ws.team().roles) if board.ws is not None else []
    except (ConfigError, ValueError, OSError):
        return []


@router.get("/tasks/{task_id}", response_class=HTMLResponse)
async def task_page(request: Request, task_id: str) -> Response:
    board, caller = await reading(request)
    found = await anyio.to_thread.run_sync(reads.task_page, board.db, board.ws, board.session_log, board.inputs,
                                           task_id, caller.principal if caller else None)
    if found is None:
        raise Refused(404, ReasonCode.TASK_NOT_FOUND.value, f"{task_id} does not exist")
    doc = found["task"]
    instructs = reads.allowed(check_instructor, caller.principal if caller else None, doc)
    driver_running = any(r["state"] == "running" and r["role"] == doc["authority"]["driver"] for r in found["runs"])
    goal = None
    if doc["root"] == task_id:
        service = GoalService(board.db, board.kernel.store)
        goal_id = await anyio.to_thread.run_sync(service.active_goal, task_id)
        goal = await anyio.to_thread.run_sync(service.show, goal_id) if goal_id else None
    authority = doc["authority"]
    can = {
        "decide": doc["state"] == "review" and may(caller, authority.get("done_authority")),
        "reopen": doc["state"] == "done" and may(caller, authority.get("done_authority")),
        "retry": doc["state"] in ("active", "review") and may(caller, authority.get("done_authority")),
        "archive": doc["state"] == "done" and may(caller, authority.get("archive_authority")),
        "grant": doc["state"] == "review" and doc["risk_level"] in ("high", "irreversible") and caller is not None
        and caller.principal.is_admin,
        "cancel_goal": goal is not None and may(caller, authority.get("done_authority")),
        "say": instructs and doc["state"] in IN_WORK,
        "interrupt": instructs and driver_running,
    }
    return await page(request, "task.html", caller, page=found, task=doc, goal=goal, can=can,
                      comment_on=commented_report(found["reports"]) if can["say"] or can["decide"] else None,
                      timeline=timeline_rows(found), live_shown=reads.LIVE_SHOWN,
                      grant_command=grant_hint(CommandType.APPROVE, task_id))


def commented_report(reports: list[dict[str, Any]]) -> str | None:
    """The report whose diff lines take comments: the newest with a patch that has a line to anchor one to (an
    older round's lines may no longer be where its diff says)."""
    for r in reversed(reports):
        if any(line["anchor"] for line in (r.get("patch") or {}).get("lines", ())):
            return str(r["report_id"])
    return None


def timeline_rows(found: dict[str, Any]) -> list[dict[str, Any]]:
    """The task's events and the instructions given to its agent, in the order they happened (``instruction``:
    None for an event)."""
    rows = [{**e, "instruction": None} for e in found["timeline"]]
    rows += [{"at": i["received_at"], "instruction": i} for i in found["instructions"]]
    return sorted(rows, key=lambda row: row["at"] or "")


@router.get("/tasks/{task_id}/file", response_class=PlainTextResponse)
async def task_file(request: Request, task_id: str) -> Response:
    """The task's FCoP TASK file (front matter and body), as text."""
    board = board_of(request)
    board.gate.reader(request)
    text = await anyio.to_thread.run_sync(reads.task_file, board.db, board.ws, task_id)
    if text is None:
        raise Refused(404, ReasonCode.TASK_NOT_FOUND.value, f"{task_id} does not exist")
    return PlainTextResponse(text, media_type="text/markdown; charset=utf-8")


@router.get("/runs", response_class=HTMLResponse)
async def runs_page(request: Request) -> Response:
    board, caller = await reading(request)
    from taskkernel.coordinator.hosts import listing

    view = await anyio.to_thread.run_sync(reads.runs_view, board.db, board.ws)
    hosts = await anyio.to_thread.run_sync(listing, board.db)
    return await page(request, "runs.html", caller, runs=view, hosts=hosts)


@router.get("/schedules", response_class=HTMLResponse)
async def schedules_page(request: Request) -> Response:
    board, caller = await reading(request)
    view = await anyio.to_thread.run_sync(reads.schedules_view, board.db)
    return await page(request, "schedules.html", caller, schedules=view)


@router.get("/usage", response_class=HTMLResponse)
async def usage_page(request: Request, by: str = "root") -> Response:
    board, caller = await reading(request)
    if by not in GROUPINGS:
        raise Refused(400, ReasonCode.INVALID_COMMAND.value, f"by must be one of {', '.join(GROUPINGS)}")
    view = await anyio.to_thread.run_sync(reads.usage_view, board.db, by, None)
    return await page(request, "usage.html", caller, usage=view, groupings=list(GROUPINGS), chart=chart(view))


def chart(view: dict[str, Any], width: int = 640, height: int = 160) -> dict[str, Any]:
    """Spend per day as stacked bars, one colour per owner (the top five; the rest as "other"): SVG geometry."""
    owners = [r["owner"] for r in view["rows"][:5]]
    days = sorted({d["day"] for d in view["days"]})
    per_day: dict[str, dict[str, float]] = {day: {} for day in days}
    metric = "cost_usd" if any(d["cost_usd"] for d in view["days"]) else "tokens"
    for d in view["days"]:
        key = d["owner"] if d["owner"] in owners else "other"
        per_day[d["day"]][key] = per_day[d["day"]].get(key, 0) + d[metric]
    top = max((sum(v.values()) for v in per_day.values()), default=0) or 1
    bar = width / max(len(days), 1)
    bars = []
    for i, day in enumerate(days):
        y = float(height)
        for j, owner in enumerate([*owners, "other"]):
            value = per_day[day].get(owner, 0)
            if value:
                h = value / top * (height - 20)
                y -= h
                bars.append({"x": i * bar + 2, "y": y, "w": max(bar - 4, 1), "h": h, "series": j % 6,
                             "title": f"{day} {owner}: {value:g}"})
    return {"bars": bars, "days": days, "owners": [*owners, "other"], "metric": metric, "top": top,
            "width": width, "height": height}


@router.get("/sessions", response_class=HTMLResponse)
async def sessions_page(request: Request) -> Response:
    board, caller = await reading(request)
    listed = [] if caller is None else await anyio.to_thread.run_sync(board.session_log.sessions, caller.principal)
    return await page(request, "sessions.html", caller, sessions=listed, session=None, inputs=[])


@router.get("/sessions/{session}", response_class=HTMLResponse)
async def session_page(request: Request, session: str) -> Response:
    board, caller = await reading(request)
    inputs = await session_inputs_for(board, caller, session)
    return await page(request, "sessions.html", caller, sessions=None, session=session, inputs=inputs)


@router.get("/needs-you", response_class=HTMLResponse)
async def needs_page(request: Request) -> Response:
    board, caller = await reading(request)
    principal = caller.principal if caller else LOCAL_OWNER
    role = None if principal.is_admin else principal.role
    found = await anyio.to_thread.run_sync(functools.partial(
        waiting, board.db, board.grant_sessions, role, principal, NEEDS_LIMIT, workspace=board.ws))
    return await page(request, "needs.html", caller, needs=found, role=role)


@router.get("/login", response_class=HTMLResponse)
async def login_page(request: Request, next: str = "/") -> Response:
    return render(request, "login.html", None, next=_local(next), error=None)


@router.post("/login", response_class=HTMLResponse)
async def login(request: Request) -> Response:
    """Sign in with a token (form fields ``token``, ``next``; ADMIN's or a role's): a session cookie, never the
    token, goes back. Another site's page is refused before the form is read."""
    board = board_of(request)
    check_same_origin(request)  # another site may not sign a visitor in as its own credential (login CSRF)
    form = await request.form()
    token, target = str(form.get("token") or "").strip(), _local(str(form.get("next") or "/"))
    try:
        principal = await anyio.to_thread.run_sync(board.gate.authenticate, token)
        sid, _ = await anyio.to_thread.run_sync(board.sign_ins.create, token_hash(token), principal.provenance)
    except Refused as exc:
        return render(request, "login.html", None, exc.status, next=target, error=f"{exc.reason}: {exc.message}")
    response = RedirectResponse(target, 303)
    response.set_cookie(COOKIE, sid, max_age=int(board.sign_ins.lifetime), httponly=True, samesite="strict",
                        secure=request.url.scheme == "https", path="/")
    response.headers["X-Signed-In-As"] = principal.id
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    """Sign out (form field ``csrf_token``): the credential is checked before the form is read."""
    board = board_of(request)
    caller = board.gate.actor(request)
    sent = (await request.form()).get(CSRF_FIELD)
    board.gate.check_csrf(request, caller, sent if isinstance(sent, str) else None)
    await anyio.to_thread.run_sync(board.sign_ins.drop, request.cookies.get(COOKIE))
    response = RedirectResponse("/", 303)
    response.delete_cookie(COOKIE, path="/")
    return response


def _local(target: str) -> str:
    """A redirect target on this server only (``next`` never sends a browser elsewhere)."""
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not target.startswith("/") or target.startswith("//"):
        return "/"
    return target
