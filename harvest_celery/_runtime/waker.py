"""The waker: releases rate-limited rows when their token is due (docs/flow-control.md).

Each sweeper runs one, a daemon thread beside it. It reads the earliest due time of a waiting
row by the database's clock (``_store.rates.earliest_due``) and sleeps until then. It is woken
earlier by a NOTIFY on ``harvest_limits_due`` when a transaction anywhere writes an earlier due
time (the process's listener, ``_store.listener``), by its sweeper after every pass, and by
``stop()``. Without a listening connection (a pooled URL with no ``listen_url``, or SQLite) the
sleep is a timed wait until the earliest due time it read, and a due time another process writes
meanwhile is read after the next sweep. Either way it never waits for the sweep tick to release
what is due, which would release a rate limit's starts in bursts at tick boundaries.

At a due time it settles each due limit in a transaction of its own, the limit row locked with
SKIP LOCKED (``_store.limits.wake``): one token gives one release, whichever waker comes first.
When a timed sleep ends, it first settles the limit it slept for, before reading anything: a
read first would make every release of a busy rate later by one transaction (the lateness
accumulates, since the next token is spaced from the release).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from harvest_celery._store import limits, rates
from harvest_celery._store.listener import DueFeed
from harvest_celery._store.records import utcnow
from harvest_celery._store.store import Store
from harvest_celery._store.tx import Tx

log = logging.getLogger("harvest_celery")

IDLE = 60.0  # the sleep when nothing is due: a NOTIFY or the sweeper's poke ends it sooner
RETRY = 0.005  # a due limit another transaction held, or a due row locked by its own run
FAILED = 1.0  # after a failed pass (the database away): the next try


class Waker:
    def __init__(self, store: Store, after_commit: Callable[[Tx], None]) -> None:
        self.store = store
        self._after_commit = after_commit
        self._stop = threading.Event()
        self._feed = DueFeed()
        self._thread: threading.Thread | None = None
        self._target: tuple[str, str] | None = None  # the limit due first, as last read

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="harvest-waker", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._feed.poke()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def poke(self) -> None:
        """Look again now (the sweeper, after each pass: a due time written by a process whose
        NOTIFY this one cannot hear)."""
        self._feed.poke()

    def _loop(self) -> None:
        listener = self.store.listener
        feed = listener.dues() if listener is not None else DueFeed()
        self._feed = feed
        try:
            while not self._stop.is_set():
                feed.ready.clear()  # before the read: a NOTIFY after it is not missed
                try:
                    due = self.release_due()
                except Exception:  # noqa: BLE001 - the sweeper's backstop meanwhile; retry
                    log.exception("waker: releasing rate-limited rows failed")
                    due = (FAILED, None)
                wait, feed.target = due
                if wait > 0 and not feed.ready.wait(wait) and self._target is not None:
                    self._wake_target()
        finally:
            if listener is not None:
                listener.unsubscribe(feed)

    def release_due(self) -> tuple[float, float | None]:
        """Settle every limit whose token is due; then how long to sleep, and the due time
        (seconds since the epoch, the database's clock) it sleeps until (None: nothing due)."""
        while not self._stop.is_set():
            with self.store.begin() as tx:
                found = rates.next_due(tx)
                ready = rates.due_limits(tx) if found is not None and found[0] <= 0 else []
            if found is None:
                self._target = None
                return IDLE, None
            due, self._target = (found[0], found[1]), (found[2], found[3])
            if not ready:
                return max(due[0], RETRY), due[1]
            released = 0
            for name, digest in ready:
                released += self._wake(name, digest)
            if not released:
                return RETRY, due[1]  # held by another transaction (it settles), or locked rows
        return 0.0, None

    def _wake_target(self) -> None:
        """The limit it slept for, settled at once (``_loop``); a failure is left to the read."""
        target, self._target = self._target, None
        if target is None:
            return
        try:
            self._wake(*target)
        except Exception:  # noqa: BLE001 - release_due reads and retries next
            log.exception("waker: releasing a rate-limited row failed")

    def _wake(self, name: str, digest: str) -> int:
        with self.store.begin() as tx:
            released = limits.wake(tx, name, digest, utcnow())
        self._after_commit(tx)
        return released or 0
