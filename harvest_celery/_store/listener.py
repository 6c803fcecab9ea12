"""Waiting without polling: Postgres ``LISTEN``/``NOTIFY``.

A transaction that closes a run (or settles what a waiter waits for) issues ``NOTIFY`` on the
``harvest_runs`` channel with the run's id; Postgres delivers it only once that transaction
commits. One listening connection per process (a daemon thread) wakes every waiter of that id,
so 64 threads waiting on ``result()`` hold one connection, not 64. A waiter still re-reads the
run every ``fallback`` seconds (a slow poll), so a lost notification — the listener reconnecting
after a database restart — costs latency, never correctness.
"""

from __future__ import annotations

import logging
import os
import select
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

log = logging.getLogger("harvest_celery")

CHANNEL = "harvest_runs"
NOTIFY = sa.text("SELECT pg_notify('harvest_runs', :execution_id)")


class Listener:
    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        self._lock = threading.Lock()
        self._waiters: dict[str, list[threading.Event]] = {}
        self._pid = -1
        self.connected = threading.Event()

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

    def _run(self) -> None:
        backoff = 0.5
        while True:
            try:
                self._listen()
            except Exception as exc:  # noqa: BLE001 - reconnect; waiters poll meanwhile
                log.warning("harvest listener lost its connection (%s); reconnecting", exc)
            self.connected.clear()
            self._wake_all()  # whatever was notified while we were away: look again
            threading.Event().wait(backoff)
            backoff = min(backoff * 2, 10.0)

    def _listen(self) -> None:
        engine = sa.create_engine(self.database_url, poolclass=NullPool)
        conn: Any = engine.raw_connection()
        try:
            dbapi = conn.dbapi_connection
            dbapi.autocommit = True
            with dbapi.cursor() as cursor:
                cursor.execute(f"LISTEN {CHANNEL}")
            self.connected.set()
            while True:
                ready, _, _ = select.select([dbapi], [], [], 5.0)
                dbapi.poll()  # also notices a dead connection (raises)
                if not ready:
                    continue
                while dbapi.notifies:
                    self._wake(dbapi.notifies.pop(0).payload)
        finally:
            conn.close()
            engine.dispose()


_SHARED: dict[str, Listener] = {}
_SHARED_LOCK = threading.Lock()


def listener_for(database_url: str) -> Listener:
    """The process's one listener for this database, shared by every ``Store`` on it."""
    with _SHARED_LOCK:
        listener = _SHARED.get(database_url)
        if listener is None:
            listener = _SHARED[database_url] = Listener(database_url)
        return listener
