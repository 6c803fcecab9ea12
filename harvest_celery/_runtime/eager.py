"""Eager activity execution (Temporal's eager activities are the precedent).

When a worker thread takes a decision — inline, on a completion it records, or in a
``harvest.decide`` task — and that decision schedules an activity on a queue this worker
consumes, the activity runs here, in the same
thread, instead of going to the broker and back: it goes through the same claim as every other
path (``ActivityStarted`` commits before the body; a refused claim runs nothing) — taken in the
decision's own write when that decision was written by this thread (``EagerClaim``: no claim
statement, no commit of its own), else by the claim statement — at most
``Settings.eager_max_chain`` in a row, and never when the current or the next attempt has a
deadline (the chain would run under the first message's time limit). No message is sent for
it. If this process dies before the body, the attempt is recovered as any lost attempt is: a
row claimed in the decision's write has its lease expire (``StartToCloseTimeout``, retried per
policy, as for a worker killed between claim and body); a row still ``scheduled`` is re-sent by
the sweeper after ``Timings.redispatch_after``.

Eager runs look to Celery code as delivered ones do: ``celery_compat.EagerAttempt`` makes the
attempt the current task and sends ``task_prerun`` (after the claim), ``task_failure`` and
``task_postrun``. Eager runs stay visible: with task events on (``-E``), the worker sends ``task-received``,
``task-started`` and ``task-succeeded``/``task-failed`` under the attempt's real task id, so
Flower shows them as it shows delivered tasks.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from harvest_celery._runtime import claim as claims
from harvest_celery._runtime import sentry
from harvest_celery._runtime.celery_compat import EagerAttempt
from harvest_celery._runtime.messages import activity_task_id
from harvest_celery._runtime.metrics import METRICS
from harvest_celery._runtime.outcomes import stops_the_worker
from harvest_celery._runtime.runtime import Runtime
from harvest_celery._store.records import Dispatch


def run_chain(
    app: Any,
    hostname: str | None,
    runtime: Runtime,
    take: Callable[[], Dispatch | None],
    wrap: Callable[[Callable[[Any], Any]], Callable[[Any], Any]],
) -> int:
    """Run every activity the scope holds back, one after another; returns how many ran."""
    ran = 0
    with ExitStack() as stack:
        events = None
        while (dispatch := take()) is not None:
            if events is None and runtime.task_events_on():
                events = stack.enter_context(app.events.default_dispatcher(hostname=hostname))
            _run_one(app, hostname, events, runtime, dispatch, wrap)
            ran += 1
    return ran


def _run_one(
    app: Any,
    hostname: str | None,
    events: Any,
    runtime: Runtime,
    d: Dispatch,
    wrap: Callable[[Callable[[Any], Any]], Callable[[Any], Any]],
) -> None:
    task_id = activity_task_id(d.execution_id, d.activity_id, d.attempt)
    args = [d.execution_id, d.activity_id, d.attempt]
    fn = runtime.registry.activity(d.activity_name).fn
    assert fn is not None
    if events is not None:
        events.send(
            "task-received",
            uuid=task_id,
            name=d.activity_name,
            args=repr(args),
            kwargs="{}",
            root_id=task_id,
            parent_id=None,
            retries=d.attempt - 1,
            eta=None,
            expires=None,
            routing_key=d.queue,
            exchange="",
            eager=True,
        )
        events.send("task-started", uuid=task_id)  # the dispatcher adds this process's pid
    started = time.monotonic()
    # what Celery's tracer does around a delivered body (current_task, the signals), in order
    # the run span current (tracing on): Celery's instrumentation parents the eager task span on
    # it, as a delivered message's headers would
    with runtime.trace_context(d.execution_id), EagerAttempt(app, d, task_id, args, hostname) as attempt:
        claimed = claims.claim_dispatch(runtime, d)
        attempt.prerun()  # after the claim, before the body; harvest's own hook skips it
        ran, error = claims.run_claimed(runtime, claimed, wrap(fn))
        METRICS.inc("activity_eager", {"queue": d.queue})
        if error is not None and stops_the_worker(runtime, error):
            raise error  # the worker is shutting down: the chain stops here
        shown = attempt.outcome(runtime, ran, error)
        del error  # what Celery may see is ``shown`` (redacted under celery_error_detail="type")
        if shown is not None:  # no task raises it: Sentry hears of it from here
            sentry.capture_attempt(d.execution_id, d.activity_name, d.attempt, shown, task_id)
    if events is None or not ran:
        return
    if shown is None:
        events.send("task-succeeded", uuid=task_id, result="None", runtime=time.monotonic() - started)
    else:
        events.send(
            "task-failed",
            uuid=task_id,
            exception=repr(shown),
            traceback="".join(traceback.format_exception(shown)),
        )
