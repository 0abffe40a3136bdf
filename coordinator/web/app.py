"""The board's FastAPI application: the API, the pages, the static files, the event hub's lifetime and the error
envelope (a refusal's reason code, or a fault's stable code with the traceback in the CLI log; never a traceback
to a client). The security headers and the body limit of every response and request are serving.py's
(``Hardened``, around whatever `taskkernel serve` and `taskkernel mcp --transport http` serve)."""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import ClientDisconnect

from taskkernel import __version__
from taskkernel.coordinator.serving import content_security_policy
from taskkernel.coordinator.web import api, pages
from taskkernel.coordinator.web.auth import Refused
from taskkernel.coordinator.web.models import Health
from taskkernel.coordinator.web.state import Board
from taskkernel.kernel.logging import get_logger
from taskkernel.kernel.reasons import ReasonCode

log = get_logger(__name__)
STATIC = Path(__file__).parent / "static"
DOCS_CDN = "https://cdn.jsdelivr.net"  # where FastAPI's Swagger UI page takes its script and styles


def create_app(board: Board) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await board.hub.start()
        try:
            yield
        finally:
            await board.hub.stop()

    app = FastAPI(title="taskkernel board", version=__version__, lifespan=lifespan,
                  openapi_url="/api/openapi.json", docs_url=None, redoc_url=None)
    app.state.board = board
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=board.hosts)
    app.include_router(api.router)
    app.include_router(pages.router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/healthz", response_model=Health, tags=["health"])
    async def healthz(request: Request) -> Any:
        """Liveness and the database: ok, the version, the dialect and the log's last committed position."""
        return await api.health(request)

    @app.get("/api/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        """Swagger UI for the schema, with the one relaxed policy: its script and styles from the CDN, its inline
        start-up script by hash, its inline styles (Swagger UI sets them); still never framed."""
        return api_docs(app)

    @app.exception_handler(ClientDisconnect)
    async def on_disconnect(request: Request, exc: ClientDisconnect) -> Response:
        """The body stopped: the client left, or it passed the size limit and was answered 413 already."""
        return Response(status_code=400)

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


def api_docs(app: FastAPI) -> HTMLResponse:
    page = get_swagger_ui_html(openapi_url=str(app.openapi_url), title=f"{app.title} - API")
    inline = re.findall(r"<script>(.*?)</script>", bytes(page.body).decode(), re.S)
    hashes = " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(s.encode()).digest()).decode()}'" for s in inline)
    page.headers["content-security-policy"] = content_security_policy({
        "script-src": f"{DOCS_CDN} {hashes}", "style-src": f"{DOCS_CDN} 'unsafe-inline'",
        "img-src": "https://fastapi.tiangolo.com"})
    return page
