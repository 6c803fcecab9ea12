"""Waiting without polling: Postgres ``LISTEN``/``NOTIFY``.

A transaction that closes a run (or settles what a waiter waits for) issues ``NOTIFY`` on the
``harvest_runs`` channel with the run's id; Postgres delivers it only once that transaction
commits. One listening connection per process (a daemon thread) wakes every waiter of that id,
so 64 threads waiting on ``result()`` hold one connection, not 64. A waiter still re-reads the
run every ``fallback`` seconds (a slow poll), so a lost notification — the listener reconnecting
after a database restart — costs latency, never correctness.

The same connection also listens on ``harvest_runs_started`` once a decision worker's sweeper
subscribes (``starts()``): a start written inside an application's transaction announces itself
there, and the sweeper claims and dispatches it at once (``_store.starts``). A lost announcement
costs ``Timings.redispatch_after``: the run's decision request is durable.

And on ``harvest_limits_due`` once a sweeper's waker subscribes (``dues()``): a transaction that
writes a rate limit's next token time earlier than the row had announces it there (payload: the
time, in seconds since the epoch), and a waker sleeping past it re-aims (``_runtime.waker``). A
lost one costs at most a sweep interval: the waker re-reads the earliest due time after every
sweep.

``LISTEN`` needs a session of its own, which a transaction pooler (PgBouncer in transaction
mode) does not give: its notifications are lost. ``listen_url`` points the listening connection
at Postgres directly; without one, a URL marked ``pooled`` gets a ``PollingListener``: nothing
listens, waiters re-read every ``fallback`` seconds, and it says so in the log once per process.
The listening connection is always made with psycopg2 (its ``poll``/``notifies`` interface),
whichever driver the URL names.
"""

from __future__ import annotations

import logging
import os
import select
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from harvest_celery._store import sql

log = logging.getLogger("harvest_celery")

CHANNEL = sql.RUNS_CHANNEL
STARTS_CHANNEL = sql.STARTS_CHANNEL
DUES_CHANNEL = sql.DUES_CHANNEL


class StartFeed:
    """The announcements of starts made in applications' transactions, for one subscriber (a
    sweeper): ``ready`` is set when some arrived (or the subscriber is told to look)."""

    def __init__(self) -> None:
        self.ready = threading.Event()
        # bounded: a subscriber that stopped draining loses the oldest (the sweeper's lost-message
        # pass requests them), never the process's memory
        self._items: deque[str] = deque(maxlen=10_000)

    def push(self, payload: str) -> None:
        self._items.append(payload)
        self.ready.set()

    def drain(self) -> list[str]:
        out = []
        while self._items:
            out.append(self._items.popleft())
        return out


class DueFeed:
    """Rate-limit due times, for one subscriber (a waker) aiming at ``target`` (a wall-clock
    time; None: nothing due): ``ready`` is set when an earlier one is announced, or when the
    subscriber is told to look again (``poke``)."""

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.target: float | None = None

    def offer(self, due: float) -> None:
        target = self.target
        if target is None or due < target:
            self.ready.set()

    def poke(self) -> None:
        self.ready.set()


class Listener:
    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        self._lock = threading.Lock()
        self._waiters: dict[str, list[threading.Event]] = {}
        self._feeds: list[StartFeed] = []
        self._dues: list[DueFeed] = []
        self._poke: tuple[int, int] | None = None  # a pipe that wakes the listening thread
        self._pid = -1
        self.connected = threading.Event()
        self.listening_starts = threading.Event()
        self.listening_dues = threading.Event()

    def starts(self) -> StartFeed:
        """Subscribe to start announcements (the listening connection adds the channel)."""
        feed = StartFeed()
        with self._lock:
            self._ensure_thread()
            self._feeds.append(feed)
            poke = self._poke
        if poke is not None:
            os.write(poke[1], b"s")
        return feed

    def dues(self) -> DueFeed:
        """Subscribe to rate-limit due times (the listening connection adds the channel)."""
        feed = DueFeed()
        with self._lock:
            self._ensure_thread()
            self._dues.append(feed)
            poke = self._poke
        if poke is not None:
            os.write(poke[1], b"d")
        return feed

    def unsubscribe(self, feed: StartFeed | DueFeed) -> None:
        with self._lock:
            if isinstance(feed, DueFeed):
                if feed in self._dues:
                    self._dues.remove(feed)
            elif feed in self._feeds:
                self._feeds.remove(feed)

    @contextmanager
    def watch(self, execution_id: str) -> Iterator[threading.Event]:
        """An event set whenever ``execution_id`` is notified (register before reading the run,
        so a notification between the read and the wait is not missed)."""
        event = threading.Event()
        with self._lock:
            self._ensure_thread()
            self._waiters.setdefault(execution_id, []).append(event)
        try:
            yield event
        finally:
            with self._lock:
                events = self._waiters.get(execution_id, [])
                if event in events:
                    events.remove(event)
                if not events:
                    self._waiters.pop(execution_id, None)

    def _ensure_thread(self) -> None:
        if self._pid != os.getpid():  # one listener per process; a forked child starts its own
            self._pid = os.getpid()
            self.connected.clear()
            self.listening_starts.clear()
            self.listening_dues.clear()
            self._feeds = []  # a forked child's subscribers are its own, not its parent's
            self._dues = []
            self._poke = os.pipe()
            os.set_blocking(self._poke[0], False)
            threading.Thread(target=self._run, name="harvest-listen", daemon=True).start()

    def _wake(self, execution_id: str) -> None:
        with self._lock:
            for event in self._waiters.get(execution_id, []):
                event.set()

    def _wake_all(self) -> None:
        with self._lock:
            for events in self._waiters.values():
                for event in events:
                    event.set()

    def _started(self, payload: str) -> None:
        with self._lock:
            for feed in self._feeds:
                feed.push(payload)

    def _due(self, payload: str) -> None:
        try:
            due = float(payload)
        except ValueError:
            log.warning("ignoring a malformed %s notification: %r", DUES_CHANNEL, payload[:200])
            return
        with self._lock:
            for feed in self._dues:
                feed.offer(due)

    def _wake_dues(self) -> None:
        with self._lock:
            for feed in self._dues:
                feed.poke()

    def _run(self) -> None:
        backoff = 0.5
        while True:
            try:
                self._listen()
            except Exception as exc:  # noqa: BLE001 - reconnect; waiters poll meanwhile
                log.warning("harvest listener lost its connection (%s); reconnecting", exc)
            self.connected.clear()
            self.listening_starts.clear()
            self.listening_dues.clear()
            self._wake_all()  # whatever was notified while we were away: look again
            self._wake_dues()
            threading.Event().wait(backoff)
            backoff = min(backoff * 2, 10.0)

    def _listen(self) -> None:
        url = sa.engine.make_url(self.database_url).set(drivername="postgresql+psycopg2")
        engine = sa.create_engine(url, poolclass=NullPool)
        conn: Any = engine.raw_connection()
        try:
            dbapi = conn.dbapi_connection
            dbapi.autocommit = True
            with dbapi.cursor() as cursor:
                cursor.execute(sql.LISTEN_RUNS)
            self.connected.set()
            poke = self._poke
            assert poke is not None
            while True:
                if self._feeds and not self.listening_starts.is_set():
                    with dbapi.cursor() as cursor:
                        cursor.execute(sql.LISTEN_STARTS)
                    self.listening_starts.set()
                if self._dues and not self.listening_dues.is_set():
                    with dbapi.cursor() as cursor:
                        cursor.execute(sql.LISTEN_DUES)
                    self.listening_dues.set()
                    self._wake_dues()  # a due time written before the LISTEN: look again
                ready, _, _ = select.select([dbapi, poke[0]], [], [], 5.0)
                if poke[0] in ready:
                    _drain_pipe(poke[0])
                dbapi.poll()  # also notices a dead connection (raises)
                while dbapi.notifies:
                    notice = dbapi.notifies.pop(0)
                    if notice.channel == STARTS_CHANNEL:
                        self._started(notice.payload)
                    elif notice.channel == DUES_CHANNEL:
                        self._due(notice.payload)
                    else:
                        self._wake(notice.payload)
        finally:
            conn.close()
            engine.dispose()


def _drain_pipe(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


class PollingListener:
    """No ``LISTEN`` (a pooled URL and no ``listen_url``): the same interface as ``Listener``,
    whose events are never set by a notification, so every waiter polls at its ``fallback``
    interval and the sweeper finds transactional starts by its lost-message pass. The first use
    in a process logs that this is so."""

    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        self.connected = threading.Event()
        self.listening_starts = threading.Event()
        self._told = -1

    def _tell(self) -> None:
        if self._told != os.getpid():
            self._told = os.getpid()
            log.warning(
                "harvest: the database URL is pooled and no listen_url is set, so nothing "
                "LISTENs: result() polls at its fallback interval, and a start in an "
                "application's transaction on a Connection or DB-API connection is dispatched "
                "by the sweeper's lost-message pass (Timings.redispatch_after). Set listen_url "
                "to a direct Postgres URL to be woken at once (docs/operations.md#pgbouncer)."
            )

    def starts(self) -> StartFeed:
        self._tell()
        return StartFeed()

    def dues(self) -> DueFeed:
        """Never notified: the waker sleeps until the earliest due time it read (a timed wait)."""
        return DueFeed()

    def unsubscribe(self, feed: StartFeed | DueFeed) -> None:
        pass

    @contextmanager
    def watch(self, execution_id: str) -> Iterator[threading.Event]:
        self._tell()
        yield threading.Event()


_SHARED: dict[str, Listener] = {}
_SHARED_LOCK = threading.Lock()


def listener_for(database_url: str) -> Listener:
    """The process's one listener for this database, shared by every ``Store`` on it."""
    with _SHARED_LOCK:
        listener = _SHARED.get(database_url)
        if listener is None:
            listener = _SHARED[database_url] = Listener(database_url)
        return listener


def listener_of(database_url: str, listen_url: str | None, pooled: bool) -> Listener | PollingListener:
    """What listens for a store on ``database_url``: on ``listen_url`` when given; none (polling)
    when the URL is pooled; otherwise on the URL itself."""
    if listen_url is not None:
        return listener_for(listen_url)
    if pooled:
        return PollingListener(database_url)
    return listener_for(database_url)
