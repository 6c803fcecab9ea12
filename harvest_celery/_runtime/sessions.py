"""Warm replays kept per process (``SessionCache``): the flat decision cost in history length."""

from __future__ import annotations

import threading
from collections import OrderedDict

from harvest_celery._core.engine import Session


class SessionCache:
    """Warm replays by execution id (LRU). A session is taken out for a decision and put back
    only after that decision committed, so two threads never share one."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[str, Session] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, execution_id: str) -> Session | None:
        with self._lock:
            return self._items.pop(execution_id, None)

    def __contains__(self, execution_id: str) -> bool:
        return execution_id in self._items

    def put(self, execution_id: str, session: Session) -> None:
        """Keep ``session`` (just committed: the newest) for its run; a replay it replaces is
        closed, never dropped open."""
        with self._lock:
            replaced = self._items.pop(execution_id, None)
            self._items[execution_id] = session
            evicted = [] if replaced is None or replaced is session else [replaced]
            while len(self._items) > self.size:
                evicted.append(self._items.popitem(last=False)[1])
        for old in evicted:
            old.close()

    def restore(self, execution_id: str, session: Session) -> None:
        """Put back a session taken out and left untouched — unless a newer one took its
        place meanwhile (a decision by another thread): then this one is stale and closed."""
        with self._lock:
            stale = execution_id in self._items
            if not stale:
                self._items[execution_id] = session
        if stale:
            session.close()

    def __len__(self) -> int:
        return len(self._items)
