"""The board's FastAPI application: the API, the pages, the static files, the event hub's lifetime and the error
envelope (a refusal's reason code, or a fault's stable code with the traceback in the CLI log; never a traceback
to a client)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.trustedhost import TrustedHostMiddleware

from taskkernel import __version__
from taskkernel.coordinator.web import api, pages
from taskkernel.coordinator.web.auth import Refused
from taskkernel.coordinator.web.models import Health
from taskkernel.coordinator.web.state import Board
from taskkernel.kernel.logging import get_logger
from taskkernel.kernel.reasons import ReasonCode

log = get_logger(__name__)
STATIC = Path(__file__).parent / "static"


def create_app(board: Board) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await board.hub.start()
        try:
            yield
        finally:
            await board.hub.stop()

    app = FastAPI(title="taskkernel board", version=__version__, lifespan=lifespan,
                  openapi_url="/api/openapi.json", docs_url="/api/docs", redoc_url=None)
    app.state.board = board
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=board.hosts)
    app.include_router(api.router)
    app.include_router(pages.router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/healthz", response_model=Health, tags=["health"])
    async def healthz(request: Request) -> Any:
        """Liveness and the database: ok, the version, the dialect and the log's last committed position."""
        return await api.health(request)

    @app.exception_handler(Refused)
    async def on_refused(request: Request, exc: Refused) -> Response:
        if not request.url.path.startswith("/api") and exc.status == 401 and request.method == "GET":
            target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            return RedirectResponse(f"/login?{urlencode({'next': target})}", 303)
        if not request.url.path.startswith("/api"):
            return pages.error_page(request, exc.status, exc.reason, exc.message)
        return api.refusal_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def on_http(request: Request, exc: StarletteHTTPException) -> Response:
        """An unknown route or method, in the board's envelope (reason ``not_found`` / ``method_not_allowed``)."""
        reason = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return JSONResponse({"status": "rejected", "reason": reason, "message": str(exc.detail)}, exc.status_code,
                            headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def on_invalid(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        where = ".".join(str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path"))
        return JSONResponse({"status": "rejected", "reason": ReasonCode.INVALID_COMMAND.value,
                             "message": f"{where + ': ' if where else ''}{first.get('msg')}"}, 400)

    @app.exception_handler(Exception)
    async def on_fault(request: Request, exc: Exception) -> Response:
        from taskkernel.coordinator.cli.faults import classify, write_traceback

        code, message, _ = classify(exc)
        path = write_traceback(exc, str(board.ws.root) if board.ws else None, "serve")
        log.error("serve.fault", code=code, message=message, path=request.url.path)
        return JSONResponse({"status": "error", "code": code,
                             "message": f"{message}{f' (details in {path})' if path else ''}"}, 500)

    return app
