"""Who is calling the board, and whether a change may go ahead (docs/web.md, "Signing in").

Two ways to carry a credential: ``Authorization: Bearer <token>`` (scripts; a browser never adds it by itself, so
no CSRF check is needed) or the session cookie a sign-in sets (``tk_session``: HttpOnly, SameSite=Strict, Path=/;
Secure behind HTTPS). A cookie stands for a token held in this server's memory, never sent back to the browser;
every request authenticates that token again, so a credential revoked while someone is signed in stops working at
their next click, and a restart signs everyone out. A change made with the cookie must carry the sign-in's CSRF
token (``X-CSRF-Token`` header or a ``csrf_token`` form field) and, when the browser names one, an Origin of this
server: else 403 ``csrf_failed``. No credential on a change: 401 ``actor_unverified``. Without a credential the
board reads; with ``[serve] require_login = true`` it does not even do that.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from fastapi import Request

from taskkernel.coordinator.runners.ledger import authenticate_agent
from taskkernel.kernel.credentials import authenticate
from taskkernel.kernel.model.principal import Principal
from taskkernel.kernel.reasons import KernelError, ReasonCode
from taskkernel.kernel.store.db import Database

COOKIE = "tk_session"
CSRF_HEADER = "X-CSRF-Token"
CSRF_FIELD = "csrf_token"
CSRF_FAILED = "csrf_failed"
SIGN_IN_SECONDS = 12 * 3600
MAX_SIGN_INS = 1000  # oldest dropped past this: memory stays bounded whatever a client does


@dataclass(frozen=True)
class SignIn:
    token: str
    csrf: str
    expires: float


class SignIns:
    """The server's sign-ins: cookie value -> the token it stands for and its CSRF token."""

    def __init__(self, lifetime: float = SIGN_IN_SECONDS) -> None:
        self.lifetime = lifetime
        self._by_id: dict[str, SignIn] = {}
        self._lock = threading.Lock()

    def create(self, token: str) -> tuple[str, SignIn]:
        sid = secrets.token_urlsafe(32)
        entry = SignIn(token, secrets.token_urlsafe(32), time.monotonic() + self.lifetime)
        with self._lock:
            self._by_id[sid] = entry
            while len(self._by_id) > MAX_SIGN_INS:
                self._by_id.pop(next(iter(self._by_id)))
        return sid, entry

    def get(self, sid: str | None) -> SignIn | None:
        if not sid:
            return None
        with self._lock:
            entry = self._by_id.get(sid)
            if entry is not None and entry.expires < time.monotonic():
                del self._by_id[sid]
                return None
            return entry

    def drop(self, sid: str | None) -> None:
        with self._lock:
            self._by_id.pop(sid or "", None)


@dataclass(frozen=True)
class Caller:
    """An authenticated caller: who, and how the credential came (``bearer`` or ``cookie``)."""

    principal: Principal
    via: str
    csrf: str | None = None  # the sign-in's CSRF token (cookie callers)


class Refused(Exception):
    """A request the board refuses before any command: HTTP ``status`` with a reason code and a message."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message


class Gatekeeper:
    """Resolves a request's caller and checks the CSRF rule for changes."""

    def __init__(self, db: Database, sign_ins: SignIns, require_login: bool) -> None:
        self.db = db
        self.sign_ins = sign_ins
        self.require_login = require_login

    def caller(self, request: Request, heartbeat: bool = True) -> Caller | None:
        """The caller, None without a credential; a credential that stands for nobody is refused (401).
        ``heartbeat``: a run's token counts as its agent being alive (not when an open stream re-checks it)."""
        header = request.headers.get("authorization")
        if header is not None:
            scheme, _, token = header.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise Refused(401, ReasonCode.ACTOR_UNVERIFIED.value, "Authorization must be 'Bearer <token>'")
            return Caller(self.authenticate(token.strip(), heartbeat), "bearer")
        sid = request.cookies.get(COOKIE)
        entry = self.sign_ins.get(sid)
        if entry is None:
            return None
        try:
            return Caller(self.authenticate(entry.token, heartbeat), "cookie", entry.csrf)
        except Refused:
            self.sign_ins.drop(sid)  # revoked since sign-in: signed out
            raise

    def reader(self, request: Request, heartbeat: bool = True) -> Caller | None:
        """The caller of a read: anyone, unless the server requires a sign-in."""
        found = self.caller(request, heartbeat)
        if found is None and self.require_login:
            raise Refused(401, ReasonCode.ACTOR_UNVERIFIED.value, "this board requires signing in ([serve] "
                          "require_login): sign in at /login or send Authorization: Bearer <token>")
        return found

    def actor(self, request: Request, form_csrf: str | None = None) -> Caller:
        """The caller of a change: a credential is required, and a cookie's change must prove it came from a
        page of this board (CSRF token; Origin when the browser sends one)."""
        found = self.caller(request)
        if found is None:
            raise Refused(401, ReasonCode.ACTOR_UNVERIFIED.value, "no credential: sign in at /login (or send "
                          "Authorization: Bearer <token>) to act; without one the board is read-only")
        if found.via == "cookie":
            check_same_origin(request)
            sent = request.headers.get(CSRF_HEADER) or form_csrf or ""
            if not found.csrf or not hmac.compare_digest(sent.encode(), found.csrf.encode()):
                raise Refused(403, CSRF_FAILED, f"missing or wrong CSRF token: send the {CSRF_HEADER} header (or "
                              f"the {CSRF_FIELD} form field) of this sign-in")
        return found

    def authenticate(self, token: str, heartbeat: bool = True) -> Principal:
        try:
            return authenticate_agent(self.db, token) if heartbeat else authenticate(self.db, token)
        except KernelError as exc:
            raise Refused(401, exc.reason.value, exc.message) from None



def check_same_origin(request: Request) -> None:
    """A browser's POST names its page's origin: one from another site is refused (403 csrf_failed). The Host it
    is compared with was checked by the server's host allow-list (app.py), so a rebound DNS name cannot pass."""
    origin = request.headers.get("origin")
    if origin is None:  # not sent by every browser for a same-origin post: the CSRF token still decides
        return
    host = request.headers.get("host", "")
    if urlsplit(origin).netloc != host:
        raise Refused(403, CSRF_FAILED, f"a request from {origin} is not from this board ({host})")
