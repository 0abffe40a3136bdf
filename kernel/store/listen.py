"""PostgreSQL LISTEN/NOTIFY for this process: one listening connection per database, shared by every subscriber.

A commit that appends events notifies ``COMMIT_CHANNEL`` (kernel/store/chain.py, in the statement that seals the
chain head); the scheduler notifies its own channel on schedule changes. ``subscribe`` registers a callback for a
channel: a thread of this module holds one autocommit connection per database URL, LISTENs on every channel
subscribed to, and calls each channel's callbacks with a notification's payload, in that thread (a callback hands
over to its loop, e.g. ``loop.call_soon_threadsafe``, and must not block). Each time the connection starts to
LISTEN on a channel (the first subscription, a reconnection) the channel's callbacks are called once with ``None``:
what was notified before is not known, so a subscriber reads again; from ``subscribe`` on, no notification is
missed without such a call.

A lost connection (a restarted server, ``pg_terminate_backend``, a network error) is logged once
(``listen_failed``), re-opened with back-off (LISTEN_RETRY_S doubling up to LISTEN_RETRY_MAX_S), and said once more
when it is back (``listen_recovered``). Subscribers keep a slow poll of their own for the time without a connection.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from taskkernel.kernel.logging import get_logger
from taskkernel.kernel.store.chain import COMMIT_CHANNEL

log = get_logger(__name__)
WAIT_S = 0.2  # longest wait for a notification before the thread looks for new channels or its end
LISTEN_RETRY_S = 0.1  # first wait before re-opening a lost connection; doubled at each failure
LISTEN_RETRY_MAX_S = 2.0

Callback = Callable[[str | None], object]  # a notification's payload; None: notifications may have been missed


class Subscription:
    """One callback on one channel; ``close`` ends it (the connection closes with the last subscription)."""

    def __init__(self, listener: _Listener, channel: str, callback: Callback) -> None:
        self._listener = listener
        self.channel = channel
        self.callback = callback

    @property
    def listening(self) -> bool:
        """Whether the connection is up and LISTENs on this channel (notifications reach the callback)."""
        return self.channel in self._listener.active

    def wait_listening(self, timeout: float) -> bool:
        """Wait until ``listening`` (a test, or a caller that must not miss the next commit); False at timeout."""
        deadline = time.monotonic() + timeout
        while not self.listening:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    def close(self) -> None:
        self._listener.remove(self)


class _Listener:
    """The thread and connection LISTENing for one database URL."""

    def __init__(self, conninfo: str, connect_args: dict[str, Any]) -> None:
        self.conninfo = conninfo  # the registry's key (holds the password: never logged)
        self.connect_args = connect_args  # as the engine connects: the same host list, password, options
        self.subscriptions: list[Subscription] = []
        self.active: set[str] = set()  # channels LISTENed on the open connection
        self.schema: str | None = None  # the connection's current_schema()
        self.connected = False  # the current attempt got a connection
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="taskkernel-listen", daemon=True)

    def add(self, sub: Subscription) -> None:
        with self._lock:
            self.subscriptions.append(sub)

    def remove(self, sub: Subscription) -> None:
        with _registry_lock, self._lock:
            if sub in self.subscriptions:
                self.subscriptions.remove(sub)
            if not self.subscriptions:
                self._stop.set()
                if _listeners.get(self.conninfo) is self:
                    del _listeners[self.conninfo]

    def _callbacks(self, channel: str | None) -> list[Callback]:
        with self._lock:
            return [s.callback for s in self.subscriptions if channel is None or s.channel == channel]

    def _run(self) -> None:
        delay, failed = LISTEN_RETRY_S, False
        while not self._stop.is_set():
            self.connected = False
            try:
                self._serve(recovered=failed)
                return
            except Exception as exc:  # noqa: BLE001 - any loss of the connection: said once, re-opened
                if self.connected:  # it was up: a new failure, said again, and the back-off starts over
                    delay, failed = LISTEN_RETRY_S, False
                if self._stop.is_set():  # closed while it failed: nothing to say
                    return
                if not failed:
                    log.warning("listen_failed", error=self._redacted(f"{type(exc).__name__}: {exc}")[:300],
                                retry_max_s=LISTEN_RETRY_MAX_S)
                failed = True
            self._stop.wait(delay)
            delay = min(delay * 2, LISTEN_RETRY_MAX_S)

    def _redacted(self, text: str) -> str:
        """A driver's error without the password (libpq may quote the connection string it refused)."""
        password = self.connect_args.get("password")
        return text.replace(str(password), "***") if password else text

    def _serve(self, recovered: bool) -> None:
        import psycopg
        from psycopg import sql

        with psycopg.connect(**self.connect_args, autocommit=True, connect_timeout=10, keepalives=1,
                             keepalives_idle=10, keepalives_interval=5, keepalives_count=3,
                             application_name=application_name(os.getpid())) as conn:
            self.schema = str(conn.execute("SELECT current_schema()").fetchone()[0])  # type: ignore[index]
            self.connected = True
            try:
                if recovered:
                    log.info("listen_recovered")
                while not self._stop.is_set():
                    with self._lock:
                        wanted = {s.channel for s in self.subscriptions}
                    for channel in wanted - self.active:
                        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                        self.active.add(channel)
                        for callback in self._callbacks(channel):  # what was notified before is not known
                            _call(callback, None)
                    for note in conn.notifies(timeout=WAIT_S):
                        for callback in self._callbacks(note.channel):
                            _call(callback, note.payload)
            finally:
                self.active = set()


def _call(callback: Callback, payload: str | None) -> None:
    """A callback's failure is its own (e.g. its event loop closed as it was being closed): the connection and the
    other subscribers go on."""
    try:
        callback(payload)
    except Exception as exc:  # noqa: BLE001
        log.info("listen_callback_failed", error=f"{type(exc).__name__}: {exc}"[:300])


_listeners: dict[str, _Listener] = {}
_registry_lock = threading.Lock()


def _forget_after_fork() -> None:
    """A forked child has none of its parent's threads: its first subscription starts its own listener."""
    global _registry_lock
    _listeners.clear()
    _registry_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


def application_name(pid: int) -> str:
    """What the listening connection of process ``pid`` is called in ``pg_stat_activity``."""
    return f"taskkernel listen {pid}"


def conninfo_of(url: Any) -> str:
    """The key of a SQLAlchemy URL's listener (one per database and options, such as the schema)."""
    import sqlalchemy as sa

    return sa.make_url(url).render_as_string(hide_password=False)


def connect_args_of(url: Any) -> dict[str, Any]:
    """psycopg's connection arguments for a SQLAlchemy URL, made as the engine makes them (a password with spaces,
    several hosts): rendering the URL back to a libpq string loses both."""
    import sqlalchemy as sa
    from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg

    _, params = PGDialect_psycopg().create_connect_args(sa.make_url(url))
    return dict(params)


def subscribe(url: Any, channel: str, callback: Callback) -> Subscription:
    """Call ``callback`` with the payload of each notification on ``channel`` of the database at ``url``
    (and with None when the connection starts to listen on it), until the subscription is closed."""
    return _subscribe(url, channel, lambda _listener: callback)


def on_commit(url: Any, wake: Callable[[], object]) -> Subscription:
    """Call ``wake`` after every commit that appended events to the store at ``url`` (by any process), and when
    the connection starts to listen; commits to a store in another schema of the same database are ignored."""

    def commits_of(listener: _Listener) -> Callback:
        def _commit(payload: str | None) -> None:
            if payload is None or payload.partition(" ")[2] == listener.schema:  # "<end> <schema>"
                wake()

        return _commit

    return _subscribe(url, COMMIT_CHANNEL, commits_of)


def _subscribe(url: Any, channel: str, callback_for: Callable[[_Listener], Callback]) -> Subscription:
    conninfo = conninfo_of(url)
    with _registry_lock:
        listener = _listeners.get(conninfo)
        start = listener is None
        if listener is None:
            listener = _listeners[conninfo] = _Listener(conninfo, connect_args_of(url))
        sub = Subscription(listener, channel, callback_for(listener))
        listener.add(sub)
    if start:
        listener._thread.start()
    return sub
