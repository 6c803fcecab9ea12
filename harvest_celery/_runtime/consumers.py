"""Which queues live workers consume, and what a run waits on because nobody does.

A read-surface helper (``harvest show``, ``GET /workflows/{id}``, ``Harvest.stuck``), never on the
hot path: asking the workers is a broadcast (``inspect().active_queues()``) that takes its whole
reply timeout, so the answer is cached per ``QueueConsumers`` for ``ttl`` seconds, refreshed by one
caller at a time. A broker error answers None (unknown) and never raises; no reply at all means
no live worker, an empty set.

``waiting_hints`` is the pure part: open activity rows and a pending decision request against a
set of consumed queues.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from datetime import datetime, timezone
from typing import Any

from harvest_celery._core.names import TaskStatus

log = logging.getLogger("harvest_celery")

DEFAULT_TTL = 15.0  # seconds an answer is reused
DEFAULT_TIMEOUT = 1.0  # seconds the broadcast waits for worker replies
FAILURE_TTL = 5.0  # seconds an "unknown" (broker error) is reused, so a dead broker is not hammered

Inspector = Callable[[], Mapping[str, Any] | None]


def consumed_queues(replies: Mapping[str, Any] | None) -> frozenset[str]:
    """The queue names in an ``active_queues()`` reply (``{worker: [{"name": ...}, ...]}``).
    ``None`` (no worker replied) is the empty set; malformed entries are skipped."""
    names: set[str] = set()
    for queues in (replies or {}).values():
        for queue in queues if isinstance(queues, list) else ():
            name = queue.get("name") if isinstance(queue, Mapping) else None
            if isinstance(name, str) and name:
                names.add(name)
    return frozenset(names)


class QueueConsumers:
    """The queues live workers consume, as a Celery app's workers answer, cached.

    ``inspector`` (tests) replaces the broadcast; ``clock`` is a monotonic clock."""

    def __init__(
        self,
        app: Any,
        *,
        ttl: float = DEFAULT_TTL,
        timeout: float = DEFAULT_TIMEOUT,
        inspector: Inspector | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.app = app
        self.ttl = ttl
        self.timeout = timeout
        self._inspector = inspector or self._active_queues
        self._clock = clock
        self._lock = threading.Lock()
        self._answer: frozenset[str] | None = None
        self._expires = float("-inf")

    def queues(self) -> frozenset[str] | None:
        """Every queue some live worker consumes (empty: no worker answered); None when the
        broker could not be asked. Never raises."""
        with self._lock:  # one refresh at a time; the others wait for its answer
            if self._clock() < self._expires:
                return self._answer
            try:
                answer: frozenset[str] | None = consumed_queues(self._inspector())
            except Exception as exc:  # noqa: BLE001 - a read surface degrades to "unknown"
                log.warning("cannot ask the workers which queues they consume: %s", exc)
                answer = None
            self._answer = answer
            self._expires = self._clock() + (self.ttl if answer is not None else min(self.ttl, FAILURE_TTL))
            return answer

    def forget(self) -> None:
        """Drop the cached answer (the next ``queues()`` asks the workers)."""
        with self._lock:
            self._expires = float("-inf")

    def _active_queues(self) -> Mapping[str, Any] | None:
        # A connection of our own that tries once: the app's pooled one retries for seconds.
        with self.app.connection_for_read() as conn:
            conn.ensure_connection(max_retries=1, timeout=self.timeout)
            replies: Mapping[str, Any] | None = self.app.control.inspect(
                timeout=self.timeout, connection=conn
            ).active_queues()
            return replies


# ── the pure part: what a run waits on ─────────────────────────────────────────────────────────
def waiting_hints(
    rows: Iterable[Mapping[str, Any]],
    consumed: Collection[str],
    now: datetime,
    *,
    scheduled_at: Mapping[int, datetime] | None = None,
    decision: tuple[str, datetime] | None = None,
    slots: Mapping[tuple[str, str], tuple[int, int | None]] | None = None,
) -> list[dict[str, Any]]:
    """One hint per ``waiting`` row, held back by a limit (``{"kind": "slot", ..., "in_use",
    "concurrency"}`` from ``slots``, ``(activity, limit_digest) → (in_use, concurrency)``,
    read from Postgres: it needs no worker's answer), one per open (``scheduled``) activity row
    whose queue is not in ``consumed``, then one for a pending decision request
    ``(queue, since)`` whose queue is not.

    An activity waits since its ``ActivityScheduled`` was recorded (``scheduled_at``, by the
    row's ``event_seq``) for a first attempt, since its previous attempt started for a retry,
    and since ``dispatched_at`` when neither is known. (``dispatched_at`` alone is not the wait:
    the sweeper moves it forward each time it re-sends a message nobody takes.)"""
    scheduled_at = scheduled_at or {}
    hints: list[dict[str, Any]] = []
    for row in rows:
        if row.get("status") == TaskStatus.WAITING.value:
            hints.append(slot_hint(row, now, (slots or {}).get(_limit_of(row), (0, None))))
            continue
        if row.get("status") != TaskStatus.SCHEDULED.value or row.get("queue") in consumed:
            continue
        since = (
            scheduled_at.get(row.get("event_seq", -1))
            if row.get("attempt", 1) <= 1
            else row.get("started_at")
        )
        hints.append(
            {
                "kind": "activity",
                "activity": row.get("activity_name"),
                "queue": row.get("queue"),
                "waiting_seconds": _seconds(now, since or row.get("dispatched_at")),
            }
        )
    if decision is not None and decision[0] not in consumed:
        hints.append(
            {"kind": "decision", "queue": decision[0], "waiting_seconds": _seconds(now, decision[1])}
        )
    return hints


def _limit_of(row: Mapping[str, Any]) -> tuple[str, str]:
    return (str(row.get("activity_name")), str(row.get("limit_digest") or ""))


def slot_hint(row: Mapping[str, Any], now: datetime, usage: tuple[int, int | None]) -> dict[str, Any]:
    """A row a limit holds back: waiting since it was dispatched (written ``waiting``)."""
    in_use, concurrency = usage
    return {
        "kind": "slot",
        "activity": row.get("activity_name"),
        "queue": row.get("queue"),
        "waiting_seconds": _seconds(now, row.get("dispatched_at")),
        "in_use": in_use,
        "concurrency": concurrency,
    }


def _seconds(now: datetime, since: datetime | None) -> float:
    if since is None:
        return 0.0
    if since.tzinfo is None:  # SQLite hands back naive datetimes; everything here is UTC
        since = since.replace(tzinfo=timezone.utc)
    return round(max(0.0, (now - since).total_seconds()), 1)


__all__ = ["QueueConsumers", "consumed_queues", "slot_hint", "waiting_hints"]
