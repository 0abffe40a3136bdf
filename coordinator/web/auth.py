"""Who is calling the board, and whether a change may go ahead (docs/web.md, "Signing in").

Two ways to carry a credential: ``Authorization: Bearer <token>`` (scripts; a browser never adds it by itself, so
no CSRF check is needed) or the session cookie a sign-in sets (``tk_session``: HttpOnly, SameSite=Strict, Path=/;
Secure behind HTTPS). A cookie stands for the credential it signed in with, known to the store by hashes only
(table ``sign_ins``, shared by every server on the store; the token never goes back to the browser); every request
authenticates that credential again, so a credential revoked while someone is signed in stops working at their
next click, on every server; a restart signs no one out. A change made with the cookie must carry the sign-in's CSRF
token (``X-CSRF-Token`` header or a ``csrf_token`` form field) and, when the browser names one, an Origin of this
server: else 403 ``csrf_failed``. No credential on a change: 401 ``actor_unverified``, decided before the
request's body is read. Without a credential the board reads; with ``[serve] require_login = true`` it does not even
do that. Sign-ins are bounded per principal and in all, and no one's sign-in makes room for another's.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import timedelta
from urllib.parse import urlsplit

import sqlalchemy as sa
from fastapi import Request

from taskkernel.coordinator.runners.ledger import authenticate_agent_hashed
from taskkernel.coordinator.tables import sign_ins
from taskkernel.kernel.credentials import authenticate_hashed, checked_hash
from taskkernel.kernel.model.principal import Principal
from taskkernel.kernel.reasons import KernelError, ReasonCode
from taskkernel.kernel.store.clock import iso, store_now
from taskkernel.kernel.store.db import Database

COOKIE = "tk_session"
CSRF_HEADER = "X-CSRF-Token"
CSRF_FIELD = "csrf_token"
CSRF_FAILED = "csrf_failed"
TOO_MANY_SIGN_INS = "too_many_sign_ins"
SIGN_IN_SECONDS = 12 * 3600
MAX_SIGN_INS = 1000  # in all: the table stays bounded whatever a client does
MAX_SIGN_INS_EACH = 20  # of one principal: its own oldest is dropped past this, never anyone else's


class Refused(Exception):
    """A request the board refuses before any command: HTTP ``status`` with a reason code and a message."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message


@dataclass(frozen=True)
class SignIn:
    token_hash: str  # the stored hash of the credential it signed in with: authenticated again at every request
    csrf: str
    expires_at: str
    principal: str  # who signed in (``Principal.provenance``: a run's token is its own principal)


def _sid_hash(sid: str) -> str:
    return hashlib.sha256(sid.encode()).hexdigest()


def csrf_of(sid: str) -> str:
    """A sign-in's CSRF token, derived from its cookie (which a page of another site cannot read) so that no
    server stores it: the table's hash of the cookie does not give it either."""
    return hashlib.sha256(f"taskkernel csrf\x1f{sid}".encode()).hexdigest()


class SignIns:
    """The sign-ins of every board on the store (table ``sign_ins``): any server answers a person signed in on
    another, and a restart signs no one out. A row holds the SHA-256 of the cookie and of the credential.

    Bounded without letting one credential sign the others out: a principal holds at most ``each`` sign-ins (its
    own oldest is dropped for a new one), and when ``most`` are live a new principal's sign-in is refused (503
    ``too_many_sign_ins``) rather than dropping someone else's. The bounds hold across servers: they are decided
    in one write transaction."""

    def __init__(self, db: Database, lifetime: float = SIGN_IN_SECONDS, most: int = MAX_SIGN_INS,
                 each: int = MAX_SIGN_INS_EACH) -> None:
        self.db, self.lifetime, self.most, self.each = db, lifetime, most, each

    def create(self, token_hash: str, principal: str) -> tuple[str, SignIn]:
        """A new sign-in for ``principal`` (past ``each``, its own oldest is dropped); Refused (503
        ``too_many_sign_ins``) when ``most`` are live and only another principal's could make room."""
        sid = secrets.token_urlsafe(32)
        with self.db.write() as uow:
            conn = uow.conn
            now = store_now(conn)  # every server on the store times sign-ins by one clock
            at, expires = iso(now), iso(now + timedelta(seconds=self.lifetime))
            conn.execute(sign_ins.delete().where(sign_ins.c.expires_at < at))  # the ended ones make room first
            own = conn.execute(sa.select(sign_ins.c.sid_hash).where(sign_ins.c.principal == principal)
                               .order_by(sign_ins.c.created_at, sign_ins.c.sid_hash)).scalars().all()
            if len(own) >= self.each:
                conn.execute(sign_ins.delete().where(sign_ins.c.sid_hash.in_(own[:len(own) - self.each + 1])))
            if conn.execute(sa.select(sa.func.count()).select_from(sign_ins)).scalar_one() >= self.most:
                raise Refused(503, TOO_MANY_SIGN_INS, f"this board holds {self.most} sign-ins, the most it keeps; "
                              f"sign in again when some have ended ({self.lifetime / 3600:g} hours after they began, "
                              "or at sign-out), or send Authorization: Bearer <token>")
            conn.execute(sign_ins.insert().values(sid_hash=_sid_hash(sid), token_hash=token_hash,
                                                  principal=principal, created_at=at, expires_at=expires))
        return sid, SignIn(token_hash, csrf_of(sid), expires, principal)

    def get(self, sid: str | None) -> SignIn | None:
        """The live sign-in a cookie stands for (None: none, or it ended)."""
        if not sid:
            return None
        with self.db.read() as conn:
            row = conn.execute(sa.select(sign_ins.c.token_hash, sign_ins.c.expires_at, sign_ins.c.principal)
                               .where(sign_ins.c.sid_hash == _sid_hash(sid))).first()
            if row is None or row.expires_at < iso(store_now(conn)):
                return None
        return SignIn(row.token_hash, csrf_of(sid), row.expires_at, row.principal)

    def drop(self, sid: str | None) -> None:
        """Sign out: on every server at once."""
        if sid:
            with self.db.write() as uow:
                uow.conn.execute(sign_ins.delete().where(sign_ins.c.sid_hash == _sid_hash(sid)))


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
            return Caller(self._authenticate(entry.token_hash, heartbeat), "cookie", entry.csrf)
        except Refused:
            with contextlib.suppress(sa.exc.SQLAlchemyError):  # a busy store: refused all the same, dropped later
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
        """The principal a presented token stands for; Refused (401 with the kernel's reason) otherwise."""
        try:
            hashed = checked_hash(token)
        except KernelError as exc:
            raise Refused(401, exc.reason.value, exc.message) from None
        return self._authenticate(hashed, heartbeat)

    def _authenticate(self, hashed: str, heartbeat: bool) -> Principal:
        try:
            return authenticate_agent_hashed(self.db, hashed) if heartbeat else authenticate_hashed(self.db, hashed)
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
