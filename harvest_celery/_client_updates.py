"""Updates: send a validated change to a live run and wait for the value its handler returns
(docs/concepts.md, "Updates")."""

from __future__ import annotations

import time
import uuid
from contextlib import nullcontext
from typing import Any

from harvest_celery._client_base import ClientBase
from harvest_celery._core import events as ev
from harvest_celery._core.engine import Activation
from harvest_celery._core.lifecycle import TERMINAL_STATUSES
from harvest_celery._core.validators import update_arg, validate
from harvest_celery._errors import UpdateFailed
from harvest_celery._store import updates
from harvest_celery._store.records import RunRow, utcnow

MAX_UPDATE_ID = 200


def check_update_id(update_id: Any) -> str:
    """A caller's update id: a non-empty string of at most 200 characters (``ValueError``)."""
    if not isinstance(update_id, str) or not update_id.strip() or len(update_id) > MAX_UPDATE_ID:
        raise ValueError(f"an update id is a non-empty string of at most {MAX_UPDATE_ID} characters")
    return update_id


def check_timeout(timeout: float | None) -> float | None:
    if timeout is not None and not timeout > 0:
        raise ValueError(f"an update timeout is a positive number of seconds, not {timeout!r}")
    return timeout


class Updates(ClientBase):
    """``Harvest.update``."""

    def update(
        self,
        execution_id: str,
        name: str,
        arg: Any = None,
        update_id: str | None = None,
        timeout: float | None = 30.0,
    ) -> Any:
        """Send update ``name`` with ``arg`` to the run and return what its handler
        (``ctx.set_update_handler``) returns. In one transaction under the run's lock, on its
        stored history: the run must be RUNNING and not sealed, paused, erased or nd-blocked
        (else ``InvalidState``); the handler must exist (else ``UnknownUpdate``); its validator
        runs on a replay built for the call (raising gives ``UpdateRejected``, and nothing is
        written); then ``UpdateAccepted`` is appended and a decision requested. This process
        must register the run's workflow. The call then waits (Postgres ``LISTEN``/``NOTIFY``)
        for the handler's ``UpdateCompleted``: its value, or ``UpdateFailed`` (the handler
        raised, or the run closed first, naming its status).

        ``update_id`` (default: a new one) makes the call idempotent: an id already accepted
        runs nothing, writes nothing, and waits for that update's outcome. ``timeout`` seconds
        without an outcome raise ``TimeoutError`` and leave the update accepted: call again
        with the same id to wait again. Raises ``PayloadNotSerializable`` for an ``arg`` that
        is not JSON and ``ValueError`` for a bad id or a ``timeout`` <= 0, before anything is
        read."""
        payload = update_arg(name, arg)
        update_id = check_update_id(update_id) if update_id is not None else uuid.uuid4().hex
        deadline = None if check_timeout(timeout) is None else time.monotonic() + float(timeout or 0)
        config = self.runtime.settings.engine

        def check(row: RunRow, history: list[ev.HistoryEvent]) -> None:
            definition = self.registry.workflow(row.workflow_type)
            activation = Activation(row.id, row.workflow_type, history, config, probe=True)
            validate(definition, activation, self.registry, name, payload)

        queue = self.runtime.settings.decision_queue
        with self.store.begin() as tx:
            run_id, _fresh = updates.accept(
                tx, execution_id, update_id, name, payload, utcnow(), queue, check
            )
        self._after(tx)
        return self._update_outcome(run_id, name, update_id, deadline, timeout)

    def _update_outcome(
        self, run_id: str, name: str, update_id: str, deadline: float | None, timeout: float | None
    ) -> Any:
        listener = self.store.listener if self._inline is None else None
        with listener.watch(run_id) if listener else nullcontext() as woken:
            while True:
                if self._inline is not None:
                    self.drain()
                status, done = self.store.update_outcome(run_id, update_id)
                if done is not None:
                    if done.error_type:
                        raise UpdateFailed(run_id, name, done.error_type, done.message)
                    return done.result
                if status in TERMINAL_STATUSES:  # an update open when the run closes fails
                    raise UpdateFailed(
                        run_id,
                        name,
                        "RunClosed",
                        f"the run ended {status} before update {update_id!r} completed",
                    )
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(
                        f"update {update_id!r} of execution {run_id!r} is accepted but not completed "
                        f"after {timeout}s: call again with the same update_id to wait again"
                    )
                wait = 1.0 if left is None else min(1.0, left)
                if woken is not None:
                    woken.wait(wait)
                    woken.clear()
                else:
                    time.sleep(min(wait, 0.05))
                    self.runtime.sweep_once()
