"""Who is calling the board, and whether a change may go ahead (docs/web.md, "Signing in").

Two ways to carry a credential: ``Authorization: Bearer <token>`` (scripts; a browser never adds it by itself, so
no CSRF check is needed) or the session cookie a sign-in sets (``tk_session``: HttpOnly, SameSite=Strict, Path=/;
Secure behind HTTPS). A cookie stands for a token held in this server's memory, never sent back to the browser;
every request authenticates that token again, so a credential revoked while someone is signed in stops working at
their next click, and a restart signs everyone out. A change made with the cookie must carry the sign-in's CSRF
token (``X-CSRF-Token`` header or a ``csrf_token`` form field) and, when the browser names one, an Origin of this
server: else 403 ``csrf_failed``. No credential on a change: 401 ``actor_unverified``, decided before the
request's body is read. Without a credential the board reads; with ``[serve] require_login = true`` it does not even
do that. Sign-ins are bounded per principal and in all, and no one's sign-in makes room for another's.
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
TOO_MANY_SIGN_INS = "too_many_sign_ins"
SIGN_IN_SECONDS = 12 * 3600
MAX_SIGN_INS = 1000  # in all: memory stays bounded whatever a client does
MAX_SIGN_INS_EACH = 20  # of one principal: its own oldest is dropped past this, never anyone else's


class Refused(Exception):
    """A request the board refuses before any command: HTTP ``status`` with a reason code and a message."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message


@dataclass(frozen=True)
class SignIn:
    token: str
    csrf: str
    expires: float
    principal: str  # who signed in (``Principal.provenance``: a run's token is its own principal)


class SignIns:
    """The server's sign-ins: cookie value -> the token it stands for and its CSRF token.

    Bounded without letting one credential sign the others out: a principal holds at most ``each`` sign-ins (its
    own oldest is dropped for a new one), and when ``most`` are held a new principal's sign-in is refused (503
    ``too_many_sign_ins``) rather than dropping someone else's."""

    def __init__(self, lifetime: float = SIGN_IN_SECONDS, most: int = MAX_SIGN_INS,
                 each: int = MAX_SIGN_INS_EACH) -> None:
        self.lifetime, self.most, self.each = lifetime, most, each
        self._by_id: dict[str, SignIn] = {}  # in the order made, so in the order they expire
        self._by_principal: dict[str, dict[str, None]] = {}  # principal -> its sign-ins, oldest first
        self._lock = threading.Lock()

    def create(self, token: str, principal: str) -> tuple[str, SignIn]:
        """A new sign-in for ``principal`` (past ``each``, its own oldest is dropped); Refused (503
        ``too_many_sign_ins``) when the server holds ``most`` and only another principal's could make room."""
        sid = secrets.token_urlsafe(32)
        now = time.monotonic()
        entry = SignIn(token, secrets.token_urlsafe(32), now + self.lifetime, principal)
        with self._lock:
            while self._by_id:  # the ended ones first: they are the oldest
                first = next(iter(self._by_id))
                if self._by_id[first].expires >= now:
                    break
                self._forget(first)
            own = self._by_principal.get(principal, {})
            while len(own) >= self.each:
                self._forget(next(iter(own)))
            if len(self._by_id) >= self.most:
                raise Refused(503, TOO_MANY_SIGN_INS, f"this board holds {self.most} sign-ins, the most it keeps; "
                              f"sign in again when some have ended ({self.lifetime / 3600:g} hours after they began, "
                              "at sign-out or at a restart), or send Authorization: Bearer <token>")
            self._by_id[sid] = entry
            self._by_principal.setdefault(principal, {})[sid] = None
        return sid, entry

    def get(self, sid: str | None) -> SignIn | None:
        if not sid:
            return None
        with self._lock:
            entry = self._by_id.get(sid)
            if entry is not None and entry.expires < time.monotonic():
                self._forget(sid)
                return None
            return entry

    def drop(self, sid: str | None) -> None:
        with self._lock:
            self._forget(sid or "")

    def _forget(self, sid: str) -> None:
        entry = self._by_id.pop(sid, None)
        if entry is None:
            return
        own = self._by_principal[entry.principal]
        del own[sid]
        if not own:
            del self._by_principal[entry.principal]


@dataclass(frozen=True)
class Caller:
    """An authenticated caller: who, and how the credential came (``bearer`` or ``cookie``)."""

    principal: Principal
    via: str
    csrf: str | None = None  # the sign-in's CSRF token (cookie callers)


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

    def actor(self, request: Request) -> Caller:
        """The caller of a change: a credential is required (401 otherwise). Called before the request's body is
        read: a request without a credential is refused without taking its body."""
        found = self.caller(request)
        if found is None:
            raise Refused(401, ReasonCode.ACTOR_UNVERIFIED.value, "no credential: sign in at /login (or send "
                          "Authorization: Bearer <token>) to act; without one the board is read-only")
        return found

    def check_csrf(self, request: Request, caller: Caller, sent: str | None) -> None:
        """A change made with the cookie must prove it came from a page of this board: the sign-in's CSRF token
        (the header, else ``sent``: the body's field) and, when the browser sends one, this server's Origin."""
        if caller.via != "cookie":
            return
        check_same_origin(request)
        sent = request.headers.get(CSRF_HEADER) or sent or ""
        if not caller.csrf or not hmac.compare_digest(sent.encode(), caller.csrf.encode()):
            raise Refused(403, CSRF_FAILED, f"missing or wrong CSRF token: send the {CSRF_HEADER} header (or "
                          f"the {CSRF_FIELD} form field) of this sign-in")

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
