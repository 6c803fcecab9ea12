"""``activity_context()``: what an activity body may ask of the engine while it runs.

* ``is_cancelled()`` — was its run cancelled: sealed by ``cancel_workflow_execution``, asked to
  cancel cooperatively (``request_cancellation``), or terminated? One read of the run row (no
  history load), so a long body can poll it and stop early. A body that stops early raises, and
  that is recorded as a failed attempt like any other (retried per its policy while the run is
  live, so make the stop non-retryable or let the workflow's cancel branch decide).
* ``heartbeat()`` — renew the attempt's lease now. The engine already renews the lease of a body
  without ``start_to_close`` while it runs; a ``start_to_close`` stays the attempt's deadline
  and is never extended.

The runtime sets the context around every claimed body (``Runtime.execute``, the one body path:
Celery tasks, adopted tasks, eager runs, embedded mode) in a context variable, so it is per
thread and per attempt.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import timedelta

from harvest_celery._errors import NotInActivity
from harvest_celery._store import tasks
from harvest_celery._store.records import Claim, utcnow
from harvest_celery._store.store import Store


class ActivityContext:
    """The running attempt: ``execution_id``, ``activity_id``, ``activity_name``, ``attempt``."""

    def __init__(self, store: Store, claim: Claim, lease: float) -> None:
        self._store = store
        self._claim = claim
        self._lease = lease
        self.execution_id = claim.execution_id
        self.activity_id = claim.activity_id
        self.activity_name = claim.activity_name
        self.attempt = claim.attempt

    def is_cancelled(self) -> bool:
        """True once the run is sealed by a cancel, a cooperative cancellation is requested, or
        the run was terminated (or is gone)."""
        return self._store.cancelled(self.execution_id)

    def heartbeat(self) -> None:
        """Renew this attempt's lease (a ``start_to_close`` deadline is never extended)."""
        if self._claim.start_to_close is not None:
            return
        now = utcnow()
        with self._store.begin() as tx:
            tasks.renew_lease(
                tx,
                self.execution_id,
                self.activity_id,
                self.attempt,
                now,
                now + timedelta(seconds=self._lease + 5),
            )


_CURRENT: ContextVar[ActivityContext | None] = ContextVar("harvest_activity_context", default=None)


def activity_context() -> ActivityContext:
    """The context of the activity attempt running in this thread; ``NotInActivity`` outside
    one."""
    current = _CURRENT.get()
    if current is None:
        raise NotInActivity("harvest_celery.activity_context()")
    return current


@contextmanager
def running(store: Store, claim: Claim, lease: float) -> Iterator[ActivityContext]:
    """Set the context for the body of ``claim`` (the runtime's side)."""
    context = ActivityContext(store, claim, lease)
    token = _CURRENT.set(context)
    try:
        yield context
    finally:
        _CURRENT.reset(token)
